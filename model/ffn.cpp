// SwiGLU feed-forward, forward and backward.
#include "ffn.h"

#include <vector>

#include "ops.h"

void swiglu_carve(Arena& arena, int64_t M, int64_t I, SwigluActs& s) {
    s.g = arena.take<float>(M * I);
    s.u = arena.take<float>(M * I);
    s.a = arena.take<float>(M * I);
}

void ffn_forward(Precision p, float* out, const SwigluActs& s, const float* x, const float* w_gate, const float* w_up,
                 const float* w_down, int64_t M, int64_t d, int64_t I) {
    if (M == 0) return;
    linear_forward(p, s.g, x, w_gate, M, d, I);
    linear_forward(p, s.u, x, w_up, M, d, I);
    swiglu_forward(s.a, s.g, s.u, M * I);
    linear_forward(p, out, s.a, w_down, M, I, d);
}

void ffn_backward(Precision p, float* dx, float* dw_gate, float* dw_up, float* dw_down, const float* dout,
                  const SwigluActs& s, const float* x, const float* w_gate, const float* w_up, const float* w_down,
                  int64_t M, int64_t d, int64_t I, bool accumulate_dx) {
    if (M == 0) return;
    std::vector<float> da(M * I), dg(M * I), du(M * I);
    linear_backward(p, da.data(), dw_down, dout, s.a, w_down, M, I, d, false);
    swiglu_backward(dg.data(), du.data(), da.data(), s.g, s.u, M * I);
    linear_backward(p, dx, dw_gate, dg.data(), x, w_gate, M, d, I, accumulate_dx);
    linear_backward(p, dx, dw_up, du.data(), x, w_up, M, d, I, true);
}
