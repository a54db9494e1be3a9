// Multi-head Latent Attention (docs/design.md §1.1), CPU reference, forward and backward.
//   q = W_qb RMSNorm(W_qa x) (or W_q x);  [c_kv | k_rope] = W_kva x;  [k_nope | v]_h = W_kvb RMSNorm(c_kv)
//   k_h = [k_nope_h ; RoPE(k_rope)] (one rope key shared by all heads),  q_h = [q_nope_h ; RoPE(q_rope_h)]
//   o_h = softmax(q_h k_h^T * scale, causal) v_h;  out = W_o concat_h(o_h)
#pragma once
#include <cstdint>

#include "arena.h"
#include "config.h"
#include "fp8.h"
#include "params.h"

// Saved activations of one MLA layer for a batch of B sequences of T tokens (N = B*T rows).
struct MLAActs {
    float* q_a;         // (N, q_lora)         low-rank query, before its norm
    float* q_a_rstd;    // (N)
    float* q_a_normed;  // (N, q_lora)
    float* q;           // (N, H*dqk)          before RoPE
    float* kv_a;        // (N, kv_lora + d_rope)
    float* c_kv;        // (N, kv_lora)        copy of the first kv_lora columns of kv_a
    float* c_kv_rstd;   // (N)
    float* c_kv_normed; // (N, kv_lora)
    float* kv;          // (N, H*(d_nope + d_v))
    float* q_heads;     // (N, H, dqk)         final queries (RoPE applied)
    float* k_heads;     // (N, H, dqk)         final keys
    float* probs;       // (B, H, T, T)        softmax probabilities (upper triangle zero)
    float* o;           // (N, H*d_v)          attention output before W_o
    float* rope_cos;    // (T, d_rope/2)       m cos(pos * inv_freq), m = YaRN magnitude
    float* rope_sin;    // (T, d_rope/2)
};

void mla_carve(Arena& arena, const Config& c, int B, int T, MLAActs& a);
// x (N, d) the normalised input -> out (N, d)
void mla_forward(const Config& c, Precision precision, const BlockWeights& w, MLAActs& a, const float* x,
                 float* out, int B, int T);
// dout (N, d) -> dx (N, d) overwritten; weight gradients accumulate into g.
void mla_backward(const Config& c, Precision precision, const BlockWeights& w, BlockWeights& g, const MLAActs& a,
                  const float* x, const float* dout, float* dx, int B, int T);

// Two parts of mla_backward, apart so the CUDA kernels can be checked against them. The attention core from the
// saved probabilities, in two deterministic passes: d_o (N, H*dv) -> dq_heads, dk_heads (N, H, dqk) overwritten,
// and dv into the v columns of dkv (N, H, dn + dv).
void attention_backward(const Config& c, const MLAActs& a, const float* d_o, float* dq_heads, float* dk_heads,
                        float* dkv, int B, int T);
// The head assembly undone: dq (N, H*dqk), the k_nope columns of dkv, and the rope-key columns of dkv_a
// (N, kv_lora + d_rope), summed over heads in head order. Other columns are left as they are.
void heads_backward(const Config& c, const MLAActs& a, const float* dq_heads, const float* dk_heads, float* dq,
                    float* dkv, float* dkv_a, int B, int T);
