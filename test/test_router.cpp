// Tests of the DeepSeek-V3 router (docs/design.md §1.2): router_select against an independent brute force, ties, the
// correction bias (selection only), the aux-loss-free bias update, and the sequence-wise balance loss and its gradient.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "model/arena.h"
#include "model/router.h"
#include "test_helpers.h"


namespace {

Config router_config(int E, int G, int topk_group, int k, bool norm = true, float scale = 2.5f) {
    Config c;
    c.n_routed_experts = E;
    c.n_group = G;
    c.topk_group = topk_group;
    c.num_experts_per_tok = k;
    c.norm_topk_prob = norm;
    c.routed_scaling_factor = scale;
    validate_config(c);
    return c;
}

struct Selection {
    std::vector<int> idx;
    std::vector<float> w;
};

Selection run_router(const Config& c, const std::vector<float>& s, const std::vector<float>& b) {
    Selection r{std::vector<int>(c.num_experts_per_tok), std::vector<float>(c.num_experts_per_tok)};
    std::vector<float> scratch(c.n_routed_experts);
    router_select(c, s.data(), b.data(), scratch.data(), r.idx.data(), r.w.data());
    return r;
}

// Independent brute force. Over all subsets of topk_group groups (in increasing bit-mask order), keep the one with
// the largest sum of group scores, the first one found on ties. Among equal sums, the lexicographically smallest
// sorted index list wins, and that is also what "repeatedly take the best group, lower index on ties" gives:
// every max-sum subset holds all groups scoring above the topk_group-th best score v plus m of the groups scoring
// exactly v; the greedy rule takes the m lowest-indexed of those, and any other choice has, at the first index where
// the two differ, a larger index. (For fixed size, "first in bit-mask order" is not lexicographic order, so the
// subsets are compared explicitly.) Group score: fp32 sum of the two largest c in the group (the router's fp32
// arithmetic, docs/design.md §1.2), or the single value for one-expert groups; subset sums are in double (exact for these
// few fp32 values of similar size).
Selection brute_force(const Config& c, const std::vector<float>& s, const std::vector<float>& b) {
    const int E = c.n_routed_experts, G = c.n_group, per = E / G, k = c.num_experts_per_tok;
    std::vector<float> cc(E), gscore(G);
    for (int e = 0; e < E; e++) cc[e] = s[e] + b[e];
    for (int g = 0; g < G; g++) {
        std::vector<float> v(cc.begin() + g * per, cc.begin() + (g + 1) * per);
        std::sort(v.begin(), v.end(), std::greater<float>());
        gscore[g] = per >= 2 ? v[0] + v[1] : v[0];
    }
    std::vector<int> best_groups;
    double best_sum = -1e300;
    for (unsigned mask = 0; mask < (1u << G); mask++) {
        if (__builtin_popcount(mask) != c.topk_group) continue;
        std::vector<int> groups;
        double sum = 0.0;
        for (int g = 0; g < G; g++)
            if (mask >> g & 1) groups.push_back(g), sum += gscore[g];
        if (sum > best_sum || (sum == best_sum && groups < best_groups)) best_sum = sum, best_groups = groups;
    }
    std::vector<int> candidates;  // increasing index, so a stable sort by c keeps lower indices first on ties
    for (int g : best_groups)
        for (int e = g * per; e < (g + 1) * per; e++) candidates.push_back(e);
    std::stable_sort(candidates.begin(), candidates.end(), [&](int x, int y) { return cc[x] > cc[y]; });
    Selection r;
    r.idx.assign(candidates.begin(), candidates.begin() + k);
    double total = 0.0;
    for (int e : r.idx) total += s[e];
    for (int e : r.idx) r.w.push_back((float)((c.norm_topk_prob ? s[e] / total : s[e]) * c.routed_scaling_factor));
    return r;
}

// Indices exactly; weights to 1e-6 relative: the router sums k <= 8 fp32 values and divides and scales in fp32,
// at most ~(k+2) * 2^-24 ~ 6e-7 relative error against the double brute force.
void check_same(const Config& c, const std::vector<float>& s, const std::vector<float>& b) {
    Selection got = run_router(c, s, b), want = brute_force(c, s, b);
    REQUIRE(got.idx == want.idx);
    for (int j = 0; j < c.num_experts_per_tok; j++) CHECK_REL(got.w[j], want.w[j], 1e-6);
}

const int CONFIGS[][4] = {{8, 4, 2, 2}, {16, 4, 3, 5}, {6, 1, 1, 3}, {8, 8, 3, 3}};  // E, n_group, topk_group, k

}  // namespace

TEST_CASE("router: router_select matches a brute force on random inputs") {
    Rng rng(11);
    for (const auto& cfg : CONFIGS)
        for (int variant = 0; variant < 3; variant++) {
            // plain (normalised, scaled 2.5), not normalised (scaled 2.5), normalised unscaled
            Config c = router_config(cfg[0], cfg[1], cfg[2], cfg[3], variant != 1, variant == 2 ? 1.0f : 2.5f);
            CAPTURE(cfg[0]); CAPTURE(cfg[1]); CAPTURE(cfg[2]); CAPTURE(cfg[3]); CAPTURE(variant);
            for (int trial = 0; trial < 2000; trial++) {
                std::vector<float> s(c.n_routed_experts), b(c.n_routed_experts);
                for (float& v : s) v = 1.0f / (1.0f + std::exp(-2.0f * rng.normal()));
                // no bias, a small bias (the balancing rule's scale), or a large one that reorders groups
                const float bias_scale = trial % 3 == 0 ? 0.0f : trial % 3 == 1 ? 0.02f : 0.5f;
                for (float& v : b) v = bias_scale * rng.normal();
                CAPTURE(trial);
                check_same(c, s, b);
            }
        }
}

TEST_CASE("router: ties among exactly equal scores break toward lower indices") {
    // Scores and biases on a coarse dyadic grid: every c and every group sum is exact, so ties are real ties.
    const float grid[] = {0.25f, 0.5f, 0.75f};
    Rng rng(12);
    for (const auto& cfg : CONFIGS) {
        Config c = router_config(cfg[0], cfg[1], cfg[2], cfg[3]);
        CAPTURE(cfg[0]); CAPTURE(cfg[1]); CAPTURE(cfg[2]); CAPTURE(cfg[3]);
        for (int trial = 0; trial < 2000; trial++) {
            std::vector<float> s(c.n_routed_experts), b(c.n_routed_experts, 0.0f);
            for (float& v : s) v = grid[rng.next_u64() % 3];
            if (trial % 2) for (float& v : b) v = 0.25f * (float)(rng.next_u64() % 2);
            CAPTURE(trial);
            check_same(c, s, b);
        }
        // all equal: the first k experts of the first groups, in index order, equal weights
        std::vector<float> s(c.n_routed_experts, 0.5f), b(c.n_routed_experts, 0.0f);
        Selection r = run_router(c, s, b);
        for (int j = 0; j < c.num_experts_per_tok; j++) {
            CHECK(r.idx[j] == j);
            CHECK_REL(r.w[j], 2.5 / c.num_experts_per_tok, 1e-6);
        }
    }
}

TEST_CASE("router: the correction bias changes the selection but not the weights") {
    Config c = router_config(8, 4, 2, 2);  // groups {0,1} {2,3} {4,5} {6,7}, scale 2.5
    const std::vector<float> s = {0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.1f, 0.3f, 0.2f};
    std::vector<float> b(8, 0.0f);
    // no bias: groups {0,1} (1.7) and {2,3} (1.3); experts 0, 1; w = s / (0.9 + 0.8) * 2.5
    Selection r = run_router(c, s, b);
    CHECK(r.idx == std::vector<int>{0, 1});
    CHECK_REL(r.w[0], 0.9 / 1.7 * 2.5, 1e-6);
    CHECK_REL(r.w[1], 0.8 / 1.7 * 2.5, 1e-6);
    // b_5 = 1: c_5 = 1.1 lifts group {4,5} to 1.6, so groups {0,1} and {4,5}; experts 5 (c 1.1) then 0 (c 0.9).
    // Weights from s alone: 0.1 / (0.1 + 0.9) * 2.5 = 0.25 and 2.25 (from c it would be 1.1 / 2.0 * 2.5 = 1.375).
    b[5] = 1.0f;
    r = run_router(c, s, b);
    CHECK(r.idx == std::vector<int>{5, 0});
    CHECK_REL(r.w[0], 0.25, 1e-6);
    CHECK_REL(r.w[1], 2.25, 1e-6);
    // without normalisation w = s * 2.5
    Config raw = router_config(8, 4, 2, 2, false);
    r = run_router(raw, s, b);
    CHECK(r.idx == std::vector<int>{5, 0});
    CHECK_REL(r.w[0], 0.1 * 2.5, 1e-6);
    CHECK_REL(r.w[1], 0.9 * 2.5, 1e-6);

    // A constant bias on every expert shifts every c and every group score equally: same selection, same weights,
    // bit for bit. Scores are multiples of 2^-10 and the shifts dyadic, so c = s + b and the group sums are exact
    // (no rounding can create or break a tie).
    Rng rng(13);
    for (const auto& cfg : CONFIGS) {
        Config cc = router_config(cfg[0], cfg[1], cfg[2], cfg[3]);
        for (int trial = 0; trial < 500; trial++) {
            std::vector<float> sc(cc.n_routed_experts);
            for (float& v : sc) v = (float)(1 + rng.next_u64() % 1023) / 1024.0f;
            Selection zero = run_router(cc, sc, std::vector<float>(cc.n_routed_experts, 0.0f));
            for (float shift : {0.25f, -0.375f, 3.0f}) {
                Selection shifted = run_router(cc, sc, std::vector<float>(cc.n_routed_experts, shift));
                CHECK(shifted.idx == zero.idx);
                CHECK(shifted.w == zero.w);
            }
        }
    }
}

namespace {
// The bias update on a model whose global expert counts (the same for every MoE block) are given; want_sign is
// the expected direction of each expert's move.
void check_bias_update(Config c, const std::vector<int64_t>& layer_counts, const std::vector<int>& want_sign) {
    std::string label = "E=" + std::to_string(c.n_routed_experts) + " counts";
    for (int64_t n : layer_counts) label += " " + std::to_string(n);
    INFO(label);
    c.bias_update_speed = 0.125f;  // dyadic: bias + gamma is exact, so the changes compare exactly
    Model m;
    model_init(m, c);
    randomize_for_test(m, 5);
    const int E = c.n_routed_experts;
    std::vector<std::vector<int64_t>> counts(c.num_blocks());
    for (int l = 0; l < c.num_blocks(); l++) {
        if (!c.is_moe_layer(l)) continue;
        for (int e = 0; e < E; e++) m.w.blocks[l].router_bias[e] = 0.5f * e - 1.0f;  // dyadic start values
        counts[l] = layer_counts;
        for (int e = 0; e < E; e++) m.expert_counts[l][e] = 3 + e;  // stale local counts, to be reset
    }
    const std::vector<float> before = m.params;
    model_update_router_bias(m, counts);
    for (const ParamTensor& t : m.table.tensors) {
        CAPTURE(t.name);
        if (t.name.find("e_score_correction_bias") != std::string::npos) {
            for (int e = 0; e < E; e++) CHECK(m.params[t.offset + e] - before[t.offset + e] == 0.125f * want_sign[e]);
        } else {  // everything else, the dense block included, is untouched
            const auto first = before.begin() + t.offset;
            CHECK(std::equal(first, first + t.numel, m.params.begin() + t.offset));
        }
    }
    for (int l = 0; l < c.num_blocks(); l++)
        for (int64_t n : m.expert_counts[l]) CHECK(n == 0);
}
}  // namespace

TEST_CASE("router: bias update moves each expert by gamma toward the mean load") {
    Config c = load_config("tiny");  // 8 experts; block 0 dense, blocks 1 and 2 (MTP) MoE
    REQUIRE(c.n_routed_experts == 8);
    REQUIRE(c.is_moe_layer(1));
    REQUIRE(!c.is_moe_layer(0));
    // mean 4: above the mean -gamma, below +gamma, at the mean unchanged
    check_bias_update(c, {3, 5, 4, 4, 0, 8, 4, 4}, {+1, -1, 0, 0, +1, -1, 0, 0});
    // mean 2.375 (not an integer): no expert sits at it
    check_bias_update(c, {2, 3, 0, 9, 1, 2, 2, 0}, {+1, -1, +1, -1, +1, +1, +1, +1});
    // perfectly balanced: nothing moves
    check_bias_update(c, {5, 5, 5, 5, 5, 5, 5, 5}, {0, 0, 0, 0, 0, 0, 0, 0});
    // An expert count that is not a power of two: the mean of a perfectly balanced load is still exactly the load,
    // so nothing may move. (A mean summed as count/6 in double, e.g. 7/6 six times = 7.000000000000001, would move
    // experts exactly at the mean by +-gamma; the rule compares E * count with the total in integers instead.)
    Config six = c;
    six.n_routed_experts = 6;
    six.n_group = 3;
    six.topk_group = 2;
    validate_config(six);
    check_bias_update(six, {7, 7, 7, 7, 7, 7}, {0, 0, 0, 0, 0, 0});
    check_bias_update(six, {1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0});
    check_bias_update(six, {3, 9, 7, 7, 7, 9}, {+1, -1, 0, 0, 0, -1});
}

TEST_CASE("router: load imbalance is the largest expert count over the mean, per MoE block") {
    const Config c = load_config("tiny");  // 8 experts; block 0 dense, blocks 1 and 2 (MTP) MoE
    std::vector<std::vector<int64_t>> counts(c.num_blocks());
    counts[1] = {3, 5, 4, 4, 0, 8, 4, 4};  // mean 4, largest 8
    counts[2] = {0, 0, 0, 0, 0, 0, 0, 0};  // nothing routed
    CHECK(load_imbalance(c, counts) == std::vector<double>{2.0, 0.0});
    counts[2] = {5, 5, 5, 5, 5, 5, 5, 5};  // perfect balance
    counts[1] = {0, 0, 0, 0, 0, 0, 0, 16};  // every token to one expert: the worst, E
    CHECK(load_imbalance(c, counts) == std::vector<double>{8.0, 1.0});
    counts[1] = {2, 3, 0, 9, 1, 2, 2, 0};  // mean 19/8
    CHECK(load_imbalance(c, counts)[0] == doctest::Approx(9.0 / (19.0 / 8.0)).epsilon(1e-15));
}

namespace {
struct MoEFixture {
    Config c;
    Model m;
    int B = 2, T = 16, layer = 1;
    std::vector<float> storage, x, out;
    MoEActs a;

    explicit MoEFixture(float alpha) {
        c = load_config("tiny");
        c.aux_loss_alpha = alpha;
        model_init(m, c);
        randomize_for_test(m, 21);
        REQUIRE(c.is_moe_layer(layer));
        carve_arena(storage, [&](Arena& arena) { moe_carve(arena, c, B, T, a); });
        // rows like an RMSNorm output: unit mean square
        Rng rng(22);
        x.resize((size_t)B * T * c.hidden_size);
        for (float& v : x) v = rng.normal();
        out.resize(x.size());
    }
    const BlockWeights& w() const { return m.w.blocks[layer]; }
    double forward() {
        moe_forward(c, Precision::FP32, w(), a, x.data(), out.data(), B, T, local_comm(), true);
        return a.balance_loss;
    }
    // The router gradient of the balance loss alone (dout = 0).
    std::vector<float> balance_router_grad() {
        model_zero_grads(m);
        forward();
        std::vector<float> dout(x.size(), 0.0f), dx(x.size());
        moe_backward(c, Precision::FP32, w(), m.g.blocks[layer], a, x.data(), dout.data(), dx.data(), B, T, 1.0f,
                     local_comm());
        const float* g = m.g.blocks[layer].router;
        return std::vector<float>(g, g + (size_t)c.n_routed_experts * c.hidden_size);
    }
};
}  // namespace

TEST_CASE("router: balance loss matches a direct computation") {
    MoEFixture f(0.5f);
    const Config& c = f.c;
    const int E = c.n_routed_experts, k = c.num_experts_per_tok, d = c.hidden_size, N = f.B * f.T;
    const double loss = f.forward();
    // scores recomputed in double: s = sigmoid(W_router x); the fp32 ones agree to ~1e-6 (a 32-term fp32 dot product)
    std::vector<double> s((size_t)N * E);
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++) {
            double z = 0.0;
            for (int i = 0; i < d; i++) z += (double)f.w().router[e * d + i] * f.x[t * d + i];
            s[t * E + e] = 1.0 / (1.0 + std::exp(-z));
            CHECK_REL(f.a.scores[t * E + e], s[t * E + e], 1e-5);
        }
    // the chosen experts: the brute force on the forward's own scores and the block's bias
    std::vector<float> bias(f.w().router_bias, f.w().router_bias + E);
    int bias_nonzero = 0;
    for (float v : bias) bias_nonzero += v != 0.0f;
    REQUIRE(bias_nonzero > 0);  // randomize_for_test gives the bias a spread, so selection really uses it
    for (int t = 0; t < N; t++) {
        Selection want = brute_force(c, std::vector<float>(f.a.scores + t * E, f.a.scores + (t + 1) * E), bias);
        for (int j = 0; j < k; j++) REQUIRE(f.a.chosen[t * k + j] == want.idx[j]);
    }
    // L = mean over sequences of alpha sum_i f_i P_i; f_i = E/(kT) count_i, P_i = mean_t s_ti / sum_j s_tj
    double want = 0.0;
    for (int b = 0; b < f.B; b++) {
        std::vector<double> fi(E, 0.0), Pi(E, 0.0);
        for (int t = b * f.T; t < (b + 1) * f.T; t++) {
            for (int j = 0; j < k; j++) fi[f.a.chosen[t * k + j]] += (double)E / (k * f.T);
            const double total = std::accumulate(s.begin() + t * E, s.begin() + (t + 1) * E, 0.0);
            for (int e = 0; e < E; e++) Pi[e] += s[t * E + e] / total / f.T;
        }
        for (int e = 0; e < E; e++) want += c.aux_loss_alpha * fi[e] * Pi[e] / f.B;
    }
    MESSAGE("balance loss " << loss << " (direct " << want << ")");
    // 1e-5 relative: the only difference is the fp32 rounding of the scores (~1e-6 relative, see above)
    CHECK_REL(loss, want, 1e-5);
    CHECK(want > 0.1);  // alpha sum f P ~ alpha for a spread-out router: a real, non-trivial value
}

TEST_CASE("router: balance loss gradient matches finite differences") {
    MoEFixture f(0.5f);
    const std::vector<float> g = f.balance_router_grad();
    const std::vector<int32_t> base_choice = f.a.chosen;
    float* W = f.m.w.blocks[f.layer].router;
    const size_t n = g.size();
    double gnorm = 0.0;
    for (float v : g) gnorm += (double)v * v;
    gnorm = std::sqrt(gnorm);
    REQUIRE(gnorm > 1e-4);
    Rng rng(23);
    std::vector<double> random_dir(n), unit_grad(n);
    for (size_t i = 0; i < n; i++) random_dir[i] = rng.normal(), unit_grad[i] = g[i] / gnorm;
    // Two unit directions: the gradient's own (the largest signal) and a random one.
    double rnorm = 0.0;
    for (double v : random_dir) rnorm += v * v;
    for (double& v : random_dir) v /= std::sqrt(rnorm);
    for (const std::vector<double>* u : {&unit_grad, &random_dir}) {
        double analytic = 0.0;
        for (size_t i = 0; i < n; i++) analytic += g[i] * (*u)[i];
        // The loss is a double sum of fp32 scores: relative noise ~1e-7 at most, ~5e-8 absolute at L ~ 0.5, so a
        // central difference with eps 1e-3 has noise below ~5e-5, against directional derivatives of ~5e-2 (along
        // g) and ~|g|/sqrt(256) ~ 3e-3 (random); the curvature error O(eps^2) is far smaller. 1e-2 relative thus
        // leaves a margin of 5x or more (measured agreement is ~1e-5). A perturbation that changes a selection makes
        // L jump; those are detected and retried with a smaller eps.
        bool done = false;
        for (double eps = 1e-3; eps > 1e-5 && !done; eps /= 4) {
            const std::vector<float> saved(W, W + n);
            double L[2];
            bool same = true;
            for (int side = 0; side < 2; side++) {
                for (size_t i = 0; i < n; i++) W[i] = (float)(saved[i] + (side ? -eps : eps) * (*u)[i]);
                L[side] = f.forward();
                same = same && f.a.chosen == base_choice;
            }
            std::copy(saved.begin(), saved.end(), W);
            if (!same) continue;
            const double fd = (L[0] - L[1]) / (2 * eps);
            MESSAGE("directional derivative " << analytic << " finite difference " << fd << " (eps " << eps << ")");
            CHECK_REL(fd, analytic, 1e-2);
            done = true;
        }
        CHECK_MESSAGE(done, "every eps changed the expert selection");
    }
}

TEST_CASE("router: balance loss with alpha 0 is zero, and so is its router gradient") {
    MoEFixture f(0.0f);
    const std::vector<float> g = f.balance_router_grad();
    CHECK(f.a.balance_loss == 0.0);
    for (float v : g) REQUIRE(v == 0.0f);
    // the same inputs with alpha > 0 do give a gradient (so the zero above is not vacuous)
    MoEFixture on(0.5f);
    const std::vector<float> g_on = on.balance_router_grad();
    CHECK(on.a.balance_loss > 0.0);
    CHECK(std::any_of(g_on.begin(), g_on.end(), [](float v) { return v != 0.0f; }));
}
