// Random weights, batches and routing, for the CPU tests (test_helpers.h), the GPU tests and the benchmarks; and
// the bounds of a BF16 step against the FP32 CPU model, which depend on the routing.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/rng.h"

// Random weights with some spread in the norm weights and router biases, so nothing sits at a special value.
inline void randomize_for_test(Model& m, uint64_t seed) {
    model_init_weights(m, seed);
    Rng rng(seed * 7 + 3);
    for (const ParamTensor& t : m.table.tensors) {
        float* p = m.params.data() + t.offset;
        if (t.shape.size() == 1)
            for (int64_t i = 0; i < t.numel; i++) p[i] = t.trainable ? 1.0f + 0.1f * rng.normal() : 0.01f * rng.normal();
        else
            for (int64_t i = 0; i < t.numel; i++) p[i] = 0.1f * rng.normal();
    }
}

inline std::vector<int32_t> random_tokens(int64_t n, int vocab, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = (int32_t)(rng.next_u64() % vocab);
    return tokens;
}

// N tokens routed to k distinct experts of E each, uniformly at random: (N*k) expert indices, token-major.
inline std::vector<int32_t> random_routing(int64_t N, int64_t k, int64_t E, Rng& rng) {
    std::vector<int32_t> chosen(N * k);
    for (int64_t t = 0; t < N; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t e;
            bool taken;
            do {
                e = (int32_t)(rng.next_u64() % (uint64_t)E);
                taken = false;
                for (int64_t i = 0; i < j; i++) taken |= chosen[t * k + i] == e;
            } while (taken);
            chosen[t * k + j] = e;
        }
    return chosen;
}

// A BF16 step against the FP32 CPU model: rounding moves the router's inputs by ~2^-9 relative, so a token whose
// k-th and (k+1)-th expert scores are that close legitimately changes experts. moved_assignments counts those
// moves (half the L1 distance between the two models' per-layer expert counts). A moved assignment replaces a
// token's contribution to two experts' gradients and changes that token's gradient upstream: measured on the kernel
// emulator (plain B=3 T=70: 3 of 420 assignments moved, 1 - cosine = 6.3e-3), ~2e-3 of cosine each. So the
// gradient's cosine with the CPU's must be >= 0.999 with the same routing (the GEMMs' and attention's rounding
// alone) less 3e-3 per moved assignment; and at most 1% of the assignments (plus one) may move: a bug moves many.
inline int64_t total_assignments(const std::vector<std::vector<int64_t>>& counts) {
    int64_t total = 0;
    for (const auto& layer : counts)
        for (int64_t n : layer) total += n;
    return total;
}
inline int64_t moved_assignments(const std::vector<std::vector<int64_t>>& got,
                                 const std::vector<std::vector<int64_t>>& want) {
    int64_t distance = 0;
    for (size_t l = 0; l < got.size() && l < want.size(); l++)
        for (size_t e = 0; e < got[l].size() && e < want[l].size(); e++) distance += std::llabs(got[l][e] - want[l][e]);
    return distance / 2;
}
inline int64_t bf16_max_moved(int64_t assignments) { return assignments / 100 + 1; }
inline double bf16_min_cosine(int64_t moved) { return 0.999 - 3e-3 * (double)moved; }

// An FP8 step against the CPU model's FP8 linear layers: an E4M3 step is 16x a BF16 one, and the GPU's BF16 elsewhere
// (the CPU's FP32) moves the values being quantized enough to flip some of their roundings, which moves the router's
// inputs further. Measured on the CPU (small, the trainer's initialisation, B=2 T=128): a 2^-8 perturbation of the
// weights moves 39 of 2048 assignments of the FP8 model and leaves its gradient at cosine 0.9895 (the FP32 model:
// 14, 0.9991). So up to 3% of the assignments (plus one) may move, and the cosine must be >= 0.98.
inline int64_t fp8_max_moved(int64_t assignments) { return 3 * assignments / 100 + 1; }
constexpr double FP8_MIN_COSINE = 0.98;

// The cosine above is over all tensors together, so one small tensor could be wrong and hide in it (a router weight
// carries ~2% of the gradient's norm). Each trainable tensor is therefore held to a relative L2 difference from the
// reference: 0.1 when no assignment moved; otherwise MOVED_MAX_TENSOR_ERROR, as the tokens that changed experts
// change the router's and those experts' gradients (measured worst: 0.47, a router weight in an FP8 step) while a
// gradient of the wrong sign (2) or a missing one (1) stays above.
constexpr double MOVED_MAX_TENSOR_ERROR = 0.75;

// How a low-precision step's gradients (got) agree with the reference's (want), over the trainable tensors: the
// cosine and the norm ratio of all of them together, and the worst tensor's relative L2 difference.
struct GradientAgreement {
    double cosine = 0.0, norm_ratio = 0.0;
    double worst_relative = 0.0;  // ||got - want|| / ||want|| of the worst tensor (a NaN is the worst)
    std::string worst_name;
};
inline GradientAgreement gradient_agreement(const ParamTable& table, const float* got, const float* want) {
    GradientAgreement a;
    double dot = 0.0, got_sq = 0.0, want_sq = 0.0;
    for (const ParamTensor& t : table.tensors) {
        if (!t.trainable) continue;
        double diff_sq = 0.0, tensor_sq = 0.0;
        for (int64_t i = t.offset; i < t.offset + t.numel; i++) {
            const double g = got[i], w = want[i];
            dot += g * w;
            got_sq += g * g;
            want_sq += w * w;
            diff_sq += (g - w) * (g - w);
            tensor_sq += w * w;
        }
        const double relative = tensor_sq > 0 ? std::sqrt(diff_sq / tensor_sq) : std::sqrt(diff_sq);
        if (!(relative <= a.worst_relative) && !std::isnan(a.worst_relative)) {
            a.worst_relative = relative;
            a.worst_name = t.name;
        }
    }
    a.cosine = dot / std::sqrt(got_sq * want_sq);
    a.norm_ratio = std::sqrt(got_sq / want_sq);
    return a;
}
