// Shared helpers for the CPU tests: a tiny model with random weights, a random batch, a relative CHECK.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
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

// CHECK that got is within rel * |want| of want. (doctest::Approx is not used: it also allows rel * max(1, |got|),
// an absolute slack that would make checks of small values vacuous.)
#define CHECK_REL(got, want, rel)                                                                              \
    CHECK_MESSAGE(std::fabs((double)(got) - (double)(want)) <= (rel) * std::fabs((double)(want)),           \
                  "got " << fmt9(got) << ", want " << fmt9(want))
inline std::string fmt9(double v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}
