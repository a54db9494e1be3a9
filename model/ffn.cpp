// SwiGLU feed-forward, forward and backward, through the shared GEMM and elementwise ops.
#include "ffn.h"

#include <vector>

#include "ops.h"

void swiglu_carve(Arena<float>& arena, int64_t M, int64_t I, SwigluActs& s) {
    s.g = arena.take(M * I);
    s.u = arena.take(M * I);
    s.a = arena.take(M * I);
}

// SwigluActs pointers may be offset views into larger buffers (one routed expert's rows).
void swiglu_ffn_forward(LinearPrecision precision, float* out, const SwigluActs& s, const float* x, const float* w_gate,
                        const float* w_up, const float* w_down, int64_t M, int64_t d, int64_t I) {
    if (M == 0) return;
    linear_forward(precision, s.g, x, w_gate, M, d, I);
    linear_forward(precision, s.u, x, w_up, M, d, I);
    swiglu_forward(s.a, s.g, s.u, M * I);
    linear_forward(precision, out, s.a, w_down, M, I, d);
}

void swiglu_ffn_backward(LinearPrecision precision, float* dx, float* dw_gate, float* dw_up, float* dw_down,
                         const float* dout, const SwigluActs& s, const float* x, const float* w_gate, const float* w_up,
                         const float* w_down, int64_t M, int64_t d, int64_t I, bool accumulate_dx) {
    if (M == 0) return;
    std::vector<float> da(M * I), dg(M * I), du(M * I);
    linear_backward(precision, da.data(), dw_down, dout, s.a, w_down, M, I, d, false);
    swiglu_backward(dg.data(), du.data(), da.data(), s.g, s.u, M * I);
    linear_backward(precision, dx, dw_gate, dg.data(), x, w_gate, M, d, I, accumulate_dx);
    linear_backward(precision, dx, dw_up, du.data(), x, w_up, M, d, I, true);
}
