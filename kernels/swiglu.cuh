// SwiGLU gate, elementwise over n values, FP32 (docs/design.md §1.2):
//   forward:  out = silu(g) u,  silu(g) = g s,  s = sigmoid(g). swiglu_forward_bf16 writes out in BF16, since it
//             is only the input of the down projection's GEMM
//   backward: dg = dout u silu'(g) = dout u s (1 + g (1 - s)),  du = dout g s   (both overwritten).
//             swiglu_backward_bf16 writes them in BF16, the copies the gate and up projections' BF16 GEMMs read
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int SWIGLU_THREADS = 256;

__device__ inline float silu(float x) { return x / (1.0f + expf(-x)); }  // as model/ops.h

template <typename Out>
static __global__ void swiglu_forward_kernel(Out* out, const float* g, const float* u, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        store_as(out + i, silu(g[i]) * u[i]);
}

template <typename Out>
static __global__ void swiglu_backward_kernel(Out* dg, Out* du, const float* dout, const float* g, const float* u,
                                              int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float s = sigmoid(g[i]);
        store_as(dg + i, dout[i] * u[i] * s * (1.0f + g[i] * (1.0f - s)));
        store_as(du + i, dout[i] * g[i] * s);
    }
}

inline void swiglu_forward(float* out, const float* g, const float* u, int64_t n, cudaStream_t stream) {
    launch_kernel(swiglu_forward_kernel<float>, grid_stride_blocks(n, SWIGLU_THREADS), SWIGLU_THREADS, 0, stream, out,
                  g, u, n);
}
inline void swiglu_forward_bf16(__nv_bfloat16* out, const float* g, const float* u, int64_t n, cudaStream_t stream) {
    launch_kernel(swiglu_forward_kernel<__nv_bfloat16>, grid_stride_blocks(n, SWIGLU_THREADS), SWIGLU_THREADS, 0,
                  stream, out, g, u, n);
}

inline void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n,
                            cudaStream_t stream) {
    launch_kernel(swiglu_backward_kernel<float>, grid_stride_blocks(n, SWIGLU_THREADS), SWIGLU_THREADS, 0, stream, dg,
                  du, dout, g, u, n);
}
inline void swiglu_backward_bf16(__nv_bfloat16* dg, __nv_bfloat16* du, const float* dout, const float* g,
                                 const float* u, int64_t n, cudaStream_t stream) {
    launch_kernel(swiglu_backward_kernel<__nv_bfloat16>, grid_stride_blocks(n, SWIGLU_THREADS), SWIGLU_THREADS, 0,
                  stream, dg, du, dout, g, u, n);
}

}  // namespace gpu
