// SwiGLU feed-forward on the GPU, forward and backward (model/ffn.cpp step for step).
#include "gpu/model.h"

#include "kernels/swiglu.cuh"

void swiglu(GpuModel& m, const GpuSwigluActs& s, int64_t n) {
    if (s.a16)
        gpu::swiglu_forward_bf16(s.a16, s.g, s.u, n, m.stream);
    else
        gpu::swiglu_forward(s.a, s.g, s.u, n, m.stream);
}

void ffn_forward(GpuModel& m, float* out, const GpuSwigluActs& s, gpu::GemmInput x, const float* w_gate,
                 const float* w_up, const float* w_down, int64_t M, int64_t d, int64_t I) {
    if (M == 0) return;
    gpu::matmul_forward(m.matmul, s.g, x, weight_of(m, w_gate), M, d, I, false);
    gpu::matmul_forward(m.matmul, s.u, x, weight_of(m, w_up), M, d, I, false);
    swiglu(m, s, M * I);
    gpu::matmul_forward(m.matmul, out, {s.a, s.a16}, weight_of(m, w_down), M, I, d, false);
}

SwigluGrads swiglu_backward(GpuModel& m, const GpuSwigluActs& s, const float* da, float* dg, float* du, int64_t n) {
    if (m.precision != Precision::BF16) {
        gpu::swiglu_backward(dg, du, da, s.g, s.u, n, m.stream);
        return {dg, du};
    }
    __nv_bfloat16 *dg16 = reinterpret_cast<__nv_bfloat16*>(dg), *du16 = reinterpret_cast<__nv_bfloat16*>(du);
    gpu::swiglu_backward_bf16(dg16, du16, da, s.g, s.u, n, m.stream);
    return {{nullptr, dg16}, {nullptr, du16}};
}

void ffn_backward(GpuModel& m, float* dx, float* dw_gate, float* dw_up, float* dw_down, const float* dout,
                  const GpuSwigluActs& s, gpu::GemmInput x, const float* w_gate, const float* w_up,
                  const float* w_down, int64_t M, int64_t d, int64_t I, bool accumulate_dx, float* da, float* dg,
                  float* du) {
    if (M == 0) return;
    gpu::matmul_backward(m.matmul, da, dw_down, dout, {s.a, s.a16}, weight_of(m, w_down), M, I, d, false,
                         grad_accumulates(m, dw_down));
    const SwigluGrads grads = swiglu_backward(m, s, da, dg, du, M * I);
    gpu::matmul_backward(m.matmul, dx, dw_gate, grads.dg, x, weight_of(m, w_gate), M, d, I, accumulate_dx,
                         grad_accumulates(m, dw_gate));
    gpu::matmul_backward(m.matmul, dx, dw_up, grads.du, x, weight_of(m, w_up), M, d, I, true,
                         grad_accumulates(m, dw_up));
}
