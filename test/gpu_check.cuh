// Shared by the test_gpu files: device buffers, the error measure and the pass/fail count (see test/test_gpu.cu for
// the tolerances and how they are chosen).
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "model/rng.h"

inline int passed = 0, failed = 0;

// A device copy of a host vector (or n uninitialised values), freed on scope exit. It starts `offset` elements into
// its allocation: offset 1 gives a pointer only sizeof(T)-aligned, like a tensor inside the one big parameter buffer.
template <typename T>
struct Dev {
    T* allocation = nullptr;
    T* ptr = nullptr;
    size_t n = 0;
    explicit Dev(size_t count, size_t offset = 0) : n(count) {
        CUDA_CHECK(cudaMalloc(&allocation, (n + offset > 0 ? n + offset : 1) * sizeof(T)));
        ptr = allocation + offset;
    }
    explicit Dev(const std::vector<T>& h, size_t offset = 0) : Dev(h.size(), offset) { set(h); }
    ~Dev() { CUDA_CHECK(cudaFree(allocation)); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    void set(const std::vector<T>& h) { CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
    void poison() { CUDA_CHECK(cudaMemset(ptr, 0xFF, n * sizeof(T))); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

inline std::string fmt(const char* format, ...) {
    char buf[256];
    va_list args;
    va_start(args, format);
    vsnprintf(buf, sizeof buf, format, args);
    va_end(args);
    return buf;
}

template <typename T>
void check(const std::string& name, const std::vector<T>& got, const std::vector<T>& want, double tol) {
    double err = got.size() == want.size() ? 0.0 : INFINITY, scale = 0.0;
    for (size_t i = 0; i < got.size() && i < want.size(); i++) {
        double e = std::isfinite((double)got[i]) ? std::fabs((double)got[i] - (double)want[i]) : INFINITY;
        if (!(e <= err)) err = e;  // keeps a NaN
        scale = std::max(scale, std::fabs((double)want[i]));
    }
    if (scale > 0) err /= scale;
    const bool ok = err <= tol;
    printf("%-62s max err %9.2e  tol %6.0e  %s\n", name.c_str(), err, tol, ok ? "ok" : "FAIL");
    (ok ? passed : failed)++;
}

inline std::vector<float> randn(size_t n, Rng& rng, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * rng.normal();
    return v;
}
