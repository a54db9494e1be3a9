// The CPU reference against the independent PyTorch twin (test/ref/twin.py, written from docs/design.md, gradients
// by autograd), run live with Debian's python3-torch. Same weights and batch in, logits, losses, expert loads and
// every gradient compared. The twin computes in float64, so the differences measure this code's float32 rounding:
// with sums over at most a few hundred terms of O(1) values that is ~1e-6 relative, and 1e-4 leaves a wide margin
// while any real error (a wrong index, a missing term) is orders of magnitude larger.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "io/safetensors.h"
#include "test_helpers.h"

namespace {

// max |a - b| / max |b|
double relative_max_error(const float* a, const float* b, int64_t n) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; i++) {
        diff = std::max(diff, (double)fabsf(a[i] - b[i]));
        scale = std::max(scale, (double)fabsf(b[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

void compare_with_twin(const Config& c, uint64_t seed, int B, int T) {
    char dir_pattern[] = "/tmp/moe_twin_XXXXXX";
    REQUIRE(mkdtemp(dir_pattern) != nullptr);
    const std::string dir = dir_pattern;
    Model m;
    model_init(m, c);
    randomize_for_test(m, seed);
    std::vector<int32_t> tokens = random_tokens((int64_t)B * (T + 1), c.vocab_size, seed + 1), inputs, targets;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            inputs.push_back(tokens[b * (T + 1) + t]);
            targets.push_back(tokens[b * (T + 1) + t + 1]);
        }
    std::ofstream(dir + "/config.json") << config_to_json(c);
    std::vector<TensorView> views;
    for (const ParamTensor& t : m.table.tensors) views.push_back({t.name, DType::F32, t.shape, m.params.data() + t.offset});
    views.push_back({"tokens", DType::I32, {B, T + 1}, tokens.data()});
    safetensors_write(dir + "/in.safetensors", views, {});
    const std::string cmd = "/usr/bin/python3 test/ref/reference.py " + dir + "/config.json " + dir +
                            "/in.safetensors " + dir + "/out.safetensors";
    REQUIRE_MESSAGE(system(cmd.c_str()) == 0, "the PyTorch twin failed: " << cmd);

    model_zero_grads(m);
    LossParts loss = model_forward(m, inputs.data(), targets.data(), B, T, false);
    model_backward(m, 1.0f);
    SafetensorsReader ref(dir + "/out.safetensors");
    auto scalar = [&](const char* name) {
        float v;
        ref.read(name, DType::F32, {1}, &v);
        return (double)v;
    };
    CHECK_REL(loss.total, scalar("loss"), 1e-5);
    CHECK_REL(loss.main, scalar("loss_main"), 1e-5);
    CHECK_REL(loss.mtp, scalar("loss_mtp"), 1e-5);
    CHECK_REL(loss.balance, scalar("loss_balance"), 1e-4);
    const int64_t V = c.vocab_size;
    std::vector<float> logits((int64_t)B * T * V);
    ref.read("logits", DType::F32, {B, T, V}, logits.data());
    CHECK(relative_max_error(m.acts.logits, logits.data(), (int64_t)B * T * V) < 1e-5);
    for (int l = 0; l < c.num_blocks(); l++) {
        if (!c.is_moe_layer(l)) continue;
        std::vector<int32_t> counts(c.n_routed_experts);
        ref.read("expert_counts." + std::to_string(l), DType::I32, {c.n_routed_experts}, counts.data());
        for (int e = 0; e < c.n_routed_experts; e++) CHECK(counts[e] == m.acts.blocks[l].moe.plan.counts[e]);
    }
    int compared = 0;
    for (const ParamTensor& t : m.table.tensors) {
        if (!t.trainable) continue;
        std::vector<float> g(t.numel);
        ref.read("grad." + t.name, DType::F32, t.shape, g.data());
        double err = relative_max_error(m.grads.data() + t.offset, g.data(), t.numel);
        CHECK_MESSAGE(err < 1e-4, t.name << ": relative max error " << err);
        compared++;
    }
    CHECK(compared > 20);
    system(("rm -rf " + dir).c_str());
}

}  // namespace

TEST_CASE("reference: tiny config agrees with the PyTorch twin (q_lora, groups, shared experts, MTP)") {
    compare_with_twin(load_config("tiny"), 101, 2, 12);
}

TEST_CASE("reference: no q_lora, YaRN, unnormalised gates, all layers MoE, no MTP agree with the PyTorch twin") {
    Config c = load_config("tiny");
    c.q_lora_rank = 0;
    c.yarn_factor = 4.0f;
    c.yarn_original_max_position = 16;
    c.yarn_mscale_all_dim = 0.7f;
    c.norm_topk_prob = false;
    c.first_k_dense_replace = 0;
    c.num_nextn_predict_layers = 0;
    c.aux_loss_alpha = 0.3f;
    compare_with_twin(c, 202, 3, 9);
}
