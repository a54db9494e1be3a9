// Elementwise glue, FP32:
//   copy_columns:  dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows, c < cols: a block of columns (the
//                  callers offset the pointers; MLA's c_kv out of kv_a and its gradient back; MTP's [enorm | hnorm])
//   put_rows:      dst[offsets[r] + c] = src[r * cols + c] for r < rows, c < cols: rows sent up together put in
//                  place (the router biases into the parameters)
//   add:           out[i] = a[i] + b[i]: the last residual add of a pipeline stage, whose norm the next computes
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int ELEMENTWISE_THREADS = 256;

// a thread block per row, threads along its columns: no division per value
static __global__ void copy_columns_kernel(float* dst, int64_t dst_ld, const float* src, int64_t src_ld,
                                           int64_t cols) {
    const int64_t r = blockIdx.x;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[r * dst_ld + c] = src[r * src_ld + c];
}

// dst and src point at the first copied column of row 0.
inline void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
    if (rows == 0 || cols == 0) return;
    launch_kernel(copy_columns_kernel, (unsigned)rows, ELEMENTWISE_THREADS, 0, stream, dst, dst_ld, src, src_ld, cols);
}

static __global__ void put_rows_kernel(float* dst, const int64_t* offsets, const float* src, int64_t cols) {
    const int64_t r = blockIdx.x;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[offsets[r] + c] = src[r * cols + c];
}

// offsets (rows) and src (rows, cols) on the device
inline void put_rows(float* dst, const int64_t* offsets, const float* src, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
    if (rows == 0 || cols == 0) return;
    launch_kernel(put_rows_kernel, (unsigned)rows, ELEMENTWISE_THREADS, 0, stream, dst, offsets, src, cols);
}

static __global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

inline void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int64_t blocks = std::min<int64_t>((n + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS, 4096);
    launch_kernel(add_kernel, (unsigned)blocks, ELEMENTWISE_THREADS, 0, stream, out, a, b, n);
}

}  // namespace gpu
