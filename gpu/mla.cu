// Multi-head Latent Attention on the GPU, forward and backward (model/mla.cpp step for step).
#include "gpu/model.h"

#include "kernels/attention.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "model/rope.h"

void mla_forward(GpuModel& m, const BlockWeights& w, GpuMLAActs& a, gpu::GemmInput x, float* out) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, H = c.num_attention_heads, dn = c.qk_nope_head_dim;
    const int64_t dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr, qr = c.q_lora_rank, kr = c.kv_lora_rank;
    const float eps = c.rms_norm_eps;
    // queries: (N, d) -> (N, H*dqk)
    if (qr > 0) {
        gpu::matmul_forward(m.matmul, a.q_a, x, weight_of(m, w.q_a), N, d, qr, false);
        gpu::rmsnorm_forward(a.q_a_normed, a.q_a_normed16, a.q_a_rstd, a.q_a, w.q_a_norm, N, qr, eps, m.stream);
        gpu::matmul_forward(m.matmul, a.q, {a.q_a_normed, a.q_a_normed16}, weight_of(m, w.q_b), N, qr, H * dqk,
                            false);
    } else {
        gpu::matmul_forward(m.matmul, a.q, x, weight_of(m, w.q), N, d, H * dqk, false);
    }
    // keys and values: (N, d) -> (N, kr + dr) -> c_kv (N, kr) -> (N, H*(dn+dv))
    gpu::matmul_forward(m.matmul, a.kv_a, x, weight_of(m, w.kv_a), N, d, kr + dr, false);
    gpu::copy_columns(a.c_kv, kr, a.kv_a, kr + dr, N, kr, m.stream);
    gpu::rmsnorm_forward(a.c_kv_normed, a.c_kv_normed16, a.c_kv_rstd, a.c_kv, w.kv_a_norm, N, kr, eps, m.stream);
    gpu::matmul_forward(m.matmul, a.kv, {a.c_kv_normed, a.c_kv_normed16}, weight_of(m, w.kv_b), N, kr,
                        H * (dn + dv), false);
    // per-head queries and keys with RoPE, then causal attention
    m.timer.mark("rope");
    const float scale = attention_softmax_scale(c);
    if (a.q_heads16) {
        gpu::rope_heads_forward_bf16(a.q_heads16, a.k_heads16, a.v_heads16, a.q, a.kv, a.kv_a, m.rope_cos, m.rope_sin,
                                     N, m.T, H, dn, dr, dv, kr, m.stream);
        m.timer.mark("attention forward");
        gpu::attention_forward_bf16(a.o, a.lse, a.q_heads16, a.k_heads16, a.v_heads16, dv, m.acts.B, m.T, (int)H,
                                    (int)dqk, (int)dv, scale, m.stream);
    } else {
        gpu::rope_heads_forward(a.q_heads, a.k_heads, a.q, a.kv, a.kv_a, m.rope_cos, m.rope_sin, N, m.T, H, dn, dr, dv,
                                kr, m.stream);
        m.timer.mark("attention forward");
        gpu::attention_forward(a.o, a.lse, a.q_heads, a.k_heads, a.kv + dn, dn + dv, m.acts.B, m.T, (int)H, (int)dqk,
                               (int)dv, scale, m.stream);
    }
    m.timer.mark("attention projections");
    if (a.o16) gpu::cast_to_bf16(a.o16, a.o, N * H * dv, m.stream);
    gpu::matmul_forward(m.matmul, out, {a.o, a.o16}, weight_of(m, w.o), N, H * dv, d, false);
}

void mla_backward(GpuModel& m, const BlockWeights& w, BlockWeights& g, const GpuMLAActs& a, gpu::GemmInput x,
                  const float* dout, float* dx, const Scratch& s) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, H = c.num_attention_heads, dn = c.qk_nope_head_dim;
    const int64_t dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr, qr = c.q_lora_rank, kr = c.kv_lora_rank;
    gpu::matmul_backward(m.matmul, s.d_o, g.o, dout, {a.o, a.o16}, weight_of(m, w.o), N, H * dv, d, false,
                         grad_accumulates(m, g.o));
    m.timer.mark("attention backward");
    const float scale = attention_softmax_scale(c);
    if (a.q_heads16) {
        gpu::cast_to_bf16(s.d_o16, s.d_o, N * H * dv, m.stream);
        gpu::attention_backward_bf16(s.dq_heads, s.dk_heads, s.dkv + dn, dn + dv, s.attn_d, s.d_o, s.d_o16,
                                     a.q_heads16, a.k_heads16, a.v_heads16, dv, a.o, a.lse, m.acts.B, m.T, (int)H,
                                     (int)dqk, (int)dv, scale, m.stream);
    } else {
        gpu::attention_backward(s.dq_heads, s.dk_heads, s.dkv + dn, s.attn_d, s.d_o, a.q_heads, a.k_heads, a.kv + dn,
                                dn + dv, a.o, a.lse, m.acts.B, m.T, (int)H, (int)dqk, (int)dv, scale, m.stream);
    }
    m.timer.mark("rope");
    gpu::rope_heads_backward(s.dq, s.dkv, s.dkv_a, s.dq_heads, s.dk_heads, m.rope_cos, m.rope_sin, N, m.T, H, dn, dr,
                             dv, kr, m.stream);
    // keys and values back to the input
    m.timer.mark("attention projections");
    gpu::matmul_backward(m.matmul, s.dc_kv_normed, g.kv_b, s.dkv, {a.c_kv_normed, a.c_kv_normed16},
                         weight_of(m, w.kv_b), N, kr, H * (dn + dv), false, grad_accumulates(m, g.kv_b));
    gpu::rmsnorm_backward(s.dc_kv, g.kv_a_norm, s.dc_kv_normed, a.c_kv, w.kv_a_norm, a.c_kv_rstd, N, kr, nullptr,
                          s.rms, m.stream, grad_accumulates(m, g.kv_a_norm));
    gpu::copy_columns(s.dkv_a, kr + dr, s.dc_kv, kr, N, kr, m.stream);
    gpu::matmul_backward(m.matmul, dx, g.kv_a, s.dkv_a, x, weight_of(m, w.kv_a), N, d, kr + dr, false,
                         grad_accumulates(m, g.kv_a));
    // queries back to the input (accumulating into dx)
    if (qr > 0) {
        gpu::matmul_backward(m.matmul, s.dq_a_normed, g.q_b, s.dq, {a.q_a_normed, a.q_a_normed16}, weight_of(m, w.q_b),
                             N, qr, H * dqk, false, grad_accumulates(m, g.q_b));
        gpu::rmsnorm_backward(s.dq_a, g.q_a_norm, s.dq_a_normed, a.q_a, w.q_a_norm, a.q_a_rstd, N, qr, nullptr, s.rms,
                              m.stream, grad_accumulates(m, g.q_a_norm));
        gpu::matmul_backward(m.matmul, dx, g.q_a, s.dq_a, x, weight_of(m, w.q_a), N, d, qr, true,
                             grad_accumulates(m, g.q_a));
    } else {
        gpu::matmul_backward(m.matmul, dx, g.q, s.dq, x, weight_of(m, w.q), N, d, H * dqk, true,
                             grad_accumulates(m, g.q));
    }
}
