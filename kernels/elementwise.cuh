// Elementwise glue, FP32, a grid-stride loop of one thread per value:
//   copy_columns:  dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows, c < cols: a block of columns (the
//                  callers offset the pointers; MLA's c_kv out of kv_a and its gradient back; MTP's [enorm | hnorm])
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int ELEMENTWISE_THREADS = 256;

static __global__ void copy_columns_kernel(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                                           int64_t cols) {
    const int64_t n = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        dst[r * dst_ld + c] = src[r * src_ld + c];
    }
}

// dst and src point at the first copied column of row 0.
inline void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
    const int64_t n = rows * cols;
    if (n == 0) return;
    launch_kernel(copy_columns_kernel, grid_stride_blocks(n, ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, 0, stream, dst,
                  dst_ld, src, src_ld, rows, cols);
}

}  // namespace gpu
