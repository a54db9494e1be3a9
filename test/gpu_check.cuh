// Shared by the test_gpu files: the pass/fail count and one line per check (test/test_gpu.cu says how the
// tolerances are chosen), with test/device_array.h's device arrays and error measure.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "test/device_array.h"

inline int passed = 0, failed = 0;

template <typename T>
void check(const std::string& name, const std::vector<T>& got, const std::vector<T>& want, double tol) {
    const double err = max_rel_error(got, want);
    const bool ok = err <= tol;
    printf("%-62s max err %9.2e  tol %6.0e  %s\n", name.c_str(), err, tol, ok ? "ok" : "FAIL");
    (ok ? passed : failed)++;
}
