// Finite-difference gradient checks of every parameter tensor of the tiny config (and variants: no q_lora, no MTP,
// a strong balance loss). For each tensor, the analytic gradient g is compared with the central difference of the
// loss along two directions u (g/|g| and a random unit vector): (L(p + eps u) - L(p - eps u)) / (2 eps) ~ g . u.
// The loss is fp32 with fp64 sums, so its noise is ~1e-7 relative; eps is chosen so the difference is well above
// that while curvature errors (O(eps^2)) stay below 1%. Perturbations that change an expert selection make the
// loss discontinuous; those are detected and retried with a smaller eps.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "test_helpers.h"

namespace {

struct Batch {
    int B = 2, T = 8;
    std::vector<int32_t> inputs, targets;
};

Batch make_batch(const Config& c, uint64_t seed) {
    Batch b;
    auto tokens = random_tokens((int64_t)b.B * (b.T + 1), c.vocab_size, seed);
    for (int s = 0; s < b.B; s++)
        for (int t = 0; t < b.T; t++) {
            b.inputs.push_back(tokens[s * (b.T + 1) + t]);
            b.targets.push_back(tokens[s * (b.T + 1) + t + 1]);
        }
    return b;
}

std::vector<int32_t> all_choices(const Model& m) {
    std::vector<int32_t> all;
    for (const BlockActs& a : m.acts.blocks) all.insert(all.end(), a.moe.chosen.begin(), a.moe.chosen.end());
    return all;
}

double loss_at(Model& m, const Batch& b) { return model_forward(m, b.inputs.data(), b.targets.data(), b.B, b.T, false).total; }

// Checks every trainable tensor; each failing one is reported by name.
void check_all_gradients(const Config& c, uint64_t seed) {
    Model m;
    model_init(m, c);
    randomize_for_test(m, seed);
    Batch batch = make_batch(c, seed + 1);
    model_zero_grads(m);
    model_forward(m, batch.inputs.data(), batch.targets.data(), batch.B, batch.T, false);
    const std::vector<int32_t> base_choice = all_choices(m);
    model_backward(m, 1.0f);
    Rng rng(seed + 2);
    int checked = 0;
    for (const ParamTensor& t : m.table.tensors) {
        if (!t.trainable) continue;
        const float* g = m.grads.data() + t.offset;
        double gnorm = 0.0;
        for (int64_t i = 0; i < t.numel; i++) gnorm += (double)g[i] * g[i];
        gnorm = sqrt(gnorm);
        REQUIRE_MESSAGE(gnorm > 0.0, "zero gradient for " << t.name);
        for (int direction = 0; direction < 2; direction++) {
            std::vector<float> u(t.numel);
            double unorm = 0.0;
            for (int64_t i = 0; i < t.numel; i++) {
                u[i] = direction == 0 ? g[i] : rng.normal();
                unorm += (double)u[i] * u[i];
            }
            double analytic = 0.0;
            for (int64_t i = 0; i < t.numel; i++) {
                u[i] = (float)(u[i] / sqrt(unorm));
                analytic += (double)g[i] * u[i];
            }
            float* p = m.params.data() + t.offset;
            std::vector<float> saved(p, p + t.numel);
            double numeric = 0.0;
            bool continuous = false;
            for (double eps = 1e-2; eps > 1e-5 && !continuous; eps /= 4) {
                for (int64_t i = 0; i < t.numel; i++) p[i] = saved[i] + (float)(eps * u[i]);
                double plus = loss_at(m, batch);
                bool same = all_choices(m) == base_choice;
                for (int64_t i = 0; i < t.numel; i++) p[i] = saved[i] - (float)(eps * u[i]);
                double minus = loss_at(m, batch);
                same = same && all_choices(m) == base_choice;
                numeric = (plus - minus) / (2 * eps);
                continuous = same;
            }
            std::copy(saved.begin(), saved.end(), p);
            REQUIRE_MESSAGE(continuous, "every perturbation of " << t.name << " changed an expert selection");
            // |g . u| <= |g|: the error is measured against |g|, the scale of the directional derivatives.
            double err = fabs(numeric - analytic) / gnorm;
            CHECK_MESSAGE(err < 1e-2, t.name << (direction ? " (random direction)" : " (gradient direction)")
                                             << ": analytic " << analytic << " numeric " << numeric);
            checked++;
        }
    }
    CHECK(checked > 20);
}

}  // namespace

TEST_CASE("gradcheck: tiny config (q_lora, dense + MoE with groups and shared experts, MTP, balance loss)") {
    check_all_gradients(load_config("tiny"), 11);
}

TEST_CASE("gradcheck: MLA without q_lora, no MTP, no shared experts, unnormalised gates") {
    Config c = load_config("tiny");
    c.q_lora_rank = 0;
    c.num_nextn_predict_layers = 0;
    c.n_shared_experts = 0;
    c.norm_topk_prob = false;
    check_all_gradients(c, 21);
}

TEST_CASE("gradcheck: strong balance loss, YaRN RoPE, every layer MoE") {
    Config c = load_config("tiny");
    c.aux_loss_alpha = 1.0f;
    c.first_k_dense_replace = 0;
    c.yarn_factor = 4.0f;
    c.yarn_original_max_position = 16;
    c.yarn_mscale = 1.0f;
    c.yarn_mscale_all_dim = 0.5f;
    check_all_gradients(c, 31);
}
