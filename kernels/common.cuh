// Helpers of the kernels: launch sizes, BF16 stores, the sigmoid, and warp and thread block reductions.
// The reductions add in a fixed tree that depends only on blockDim, so they give the same bits on every run. The CPU
// sums in sequence, hence the tests' tolerances. blockDim is a multiple of 32, at most 1024.
#pragma once
#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/cuda_check.cuh"
#include "kernels/launch.cuh"
#include "model/fp8.h"  // Precision

namespace gpu {

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Thread blocks for a grid-stride loop over n values: enough to fill the GPU, capped well below the grid limit.
inline unsigned grid_stride_blocks(int64_t n, int threads) {
    const int64_t blocks = ceil_div(n, threads);
    return (unsigned)(blocks < 1 ? 1 : blocks > (1 << 20) ? (1 << 20) : blocks);
}

// *out = x, rounded to the nearest BF16 (ties to even) when out is BF16
__device__ inline void store_as(float* out, float x) { *out = x; }
__device__ inline void store_as(__nv_bfloat16* out, float x) { *out = __float2bfloat16_rn(x); }

// model/ops.h's sigmoidf_; expf is accurate to 2 ulp, __expf is not
__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Butterfly (xor) reductions: every thread of the warp ends with the same bits, since a + b == b + a exactly.
template <typename T>
__device__ inline T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// The warps' results of a block reduction, one array per type for all of them. A __shared__ array is declared in
// a function that is not a template (docs/design.md §4).
static __device__ inline float* block_partials(float) {
    __shared__ float partial[32];
    return partial;
}
static __device__ inline double* block_partials(double) {
    __shared__ double partial[32];
    return partial;
}

// Sum or max over the thread block; every thread must call it, and every thread gets the result.
// The first __syncthreads stops a warp from overwriting `partial` while another still reads the previous call's.
template <typename T, T (*warp_reduce)(T)>
__device__ inline T block_reduce(T v, T identity) {
    T* partial = block_partials(T(0));
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_reduce(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return warp_reduce(lane < warps ? partial[lane] : identity);
}
template <typename T>
__device__ inline T block_sum(T v) {
    return block_reduce<T, warp_sum<T>>(v, T(0));
}
__device__ inline float block_max(float v) { return block_reduce<float, warp_max>(v, -INFINITY); }

}  // namespace gpu
