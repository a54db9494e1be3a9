// Device memory and the error measure, for the checks of test_gpu and of the kernel lab (dev/cuda/).
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda_check.cuh"
#include "model/rng.h"

// A device copy of a host vector (or n values holding 0xFF bytes: NaN floats, -1 integers, so an output a kernel
// forgets to write shows), freed with the object. It starts `offset` elements into its allocation: offset 1 gives a
// pointer only sizeof(T)-aligned, like a tensor inside the one big parameter buffer. While an error of the kernel
// emulator unwinds the stack it stays allocated: cudaFree would first run the failed launch's other queued work.
template <typename T>
struct DeviceArray {
    T* allocation = nullptr;
    T* ptr = nullptr;
    size_t n = 0;
    explicit DeviceArray(size_t count, size_t offset = 0) : n(count) {
        CUDA_CHECK(cudaMalloc(&allocation, (n + offset > 0 ? n + offset : 1) * sizeof(T)));
        ptr = allocation + offset;
        poison();
    }
    explicit DeviceArray(const std::vector<T>& h, size_t offset = 0) : DeviceArray(h.size(), offset) { set(h); }
    ~DeviceArray() {
        if (std::uncaught_exceptions() == 0) CUDA_CHECK(cudaFree(allocation));
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    void set(const std::vector<T>& h) { CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
    void poison() { CUDA_CHECK(cudaMemset(ptr, 0xFF, (n > 0 ? n : 1) * sizeof(T))); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

// printf into a string
inline std::string fmt(const char* format, ...) {
    char text[256];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    return text;
}

inline std::vector<float> randn(size_t n, Rng& rng, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * rng.normal();
    return v;
}

// max_i |got_i - want_i| / max_i |want_i|: relative to the tensor's scale (a per-element relative error means
// nothing near zero). A NaN or Inf in got is an infinite error; so is a size mismatch.
template <typename A, typename B>
double max_rel_error(const std::vector<A>& got, const std::vector<B>& want) {
    double err = got.size() == want.size() ? 0.0 : INFINITY, scale = 0.0;
    for (size_t i = 0; i < got.size() && i < want.size(); i++) {
        const double e = std::isfinite((double)got[i]) ? std::fabs((double)got[i] - (double)want[i]) : INFINITY;
        if (!(e <= err)) err = e;  // keeps a NaN
        scale = std::fmax(scale, std::fabs((double)want[i]));
    }
    return scale > 0 ? err / scale : err;
}
