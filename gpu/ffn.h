// SwiGLU feed-forward on the GPU, as model/ffn.h: out = W_down (silu(W_gate x) * (W_up x)), for the dense layers and
// the shared experts.
#pragma once
#include <cstdint>

#include "kernels/gemm_operands.cuh"

struct GpuModel;

struct GpuSwigluActs {
    float *g, *u;        // (M, I) W_gate x, W_up x
    float* a;            // (M, I) silu(g) * u, FP32 mode
    __nv_bfloat16* a16;  // (M, I) the same in BF16, BF16 mode: the down projection is its only reader
};

// s.a or s.a16 = silu(s.g) * s.u, n values
void swiglu(GpuModel& m, const GpuSwigluActs& s, int64_t n);
// SwiGLU's input gradients from da (n values) into the (n) buffers dg and du, as the gate and up projections'
// backward GEMMs read them: in the BF16 mode BF16 (in dg's and du's storage: the cast those GEMMs would make, fused),
// else FP32 (what FP32 GEMMs read and FP8 ones quantize, as the CPU does).
struct SwigluGrads {
    gpu::GemmInput dg, du;
};
SwigluGrads swiglu_backward(GpuModel& m, const GpuSwigluActs& s, const float* da, float* dg, float* du, int64_t n);
// x (M, d) -> out (M, d); W_gate, W_up (I, d), W_down (d, I)
void ffn_forward(GpuModel& m, float* out, const GpuSwigluActs& s, gpu::GemmInput x, const float* w_gate,
                 const float* w_up, const float* w_down, int64_t M, int64_t d, int64_t I);
// dout (M, d) -> dx (M, d) (= or +=); weight gradients +=. da, dg, du: (M, I) scratch.
void ffn_backward(GpuModel& m, float* dx, float* dw_gate, float* dw_up, float* dw_down, const float* dout,
                  const GpuSwigluActs& s, gpu::GemmInput x, const float* w_gate, const float* w_up,
                  const float* w_down, int64_t M, int64_t d, int64_t I, bool accumulate_dx, float* da, float* dg,
                  float* du);
