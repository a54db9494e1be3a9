// SwiGLU feed-forward: out = W_down (silu(W_gate x) * (W_up x)), for the dense layers and the shared experts (width
// n_shared * moe_intermediate_size). The routed experts run the same three products per expert (model/moe.cpp).
#pragma once
#include <cstdint>

#include "arena.h"
#include "fp8.h"

struct SwigluActs {
    float* g;  // (M, I) W_gate x
    float* u;  // (M, I) W_up x
    float* a;  // (M, I) silu(g) * u
};

void swiglu_carve(Arena& arena, int64_t M, int64_t I, SwigluActs& s);
// x (M, d) -> out (M, d); W_gate, W_up (I, d), W_down (d, I)
void ffn_forward(Precision p, float* out, const SwigluActs& s, const float* x, const float* w_gate, const float* w_up,
                 const float* w_down, int64_t M, int64_t d, int64_t I);
// dout (M, d) -> dx (M, d) (=|+=); weight gradients +=.
void ffn_backward(Precision p, float* dx, float* dw_gate, float* dw_up, float* dw_down, const float* dout,
                  const SwigluActs& s, const float* x, const float* w_gate, const float* w_up, const float* w_down,
                  int64_t M, int64_t d, int64_t I, bool accumulate_dx);
