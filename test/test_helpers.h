// Shared helpers for the CPU tests: a relative CHECK (and, from random_model.h, random weights and batches).
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/rng.h"
#include "test/random_model.h"

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
