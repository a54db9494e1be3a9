// Helpers shared by the kernels: launch sizes, the sigmoid, deterministic warp/block reductions.
// The reductions add in a fixed tree order that depends only on blockDim, so a kernel that uses them gives the
// same bits on every run (not the CPU reference's bits: its order is sequential, hence the tolerances in
// test/test_gpu.cu). Block sizes are multiples of 32, at most 1024.
#pragma once
#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/cuda_check.cuh"
#include "kernels/launch.cuh"
#include "model/fp8.h"  // Precision

namespace gpu {

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, capped well below the grid limit.
inline unsigned grid_stride_blocks(int64_t n, int threads) {
    const int64_t blocks = ceil_div(n, threads);
    return (unsigned)(blocks < 1 ? 1 : blocks > (1 << 20) ? (1 << 20) : blocks);
}

// *out = x, rounded to the nearest BF16 (ties to even) when out is BF16: for kernels that write either precision
__device__ inline void store_as(float* out, float x) { *out = x; }
__device__ inline void store_as(__nv_bfloat16* out, float x) { *out = __float2bfloat16_rn(x); }

// the same expression as model/ops.h's sigmoidf_ (expf: accurate to 2 ulp on the device, not __expf)
__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Butterfly (xor) reductions: every lane ends with the same bits, since a + b == b + a exactly.
template <typename T>
__device__ inline T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Sum / max over the whole block; every thread gets the result. Every thread of the block must call it.
// The first __syncthreads keeps a warp from overwriting `partial` while another still reads it from the
// previous call.
template <typename T, T (*warp_reduce)(T)>
__device__ inline T block_reduce(T v, T identity) {
    __shared__ T partial[32];
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
