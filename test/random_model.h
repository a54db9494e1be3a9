// Random weights, batches and routing, for the CPU tests (test_helpers.h), the GPU tests and the benchmarks.
#pragma once
#include <cstdint>
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
