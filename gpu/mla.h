// Multi-head Latent Attention on the GPU, as model/mla.h (docs/design.md §1.1). The attention core runs on the
// tensor cores with q, k, v stored in BF16 (kernels/attention_bf16.cuh) in the BF16 and FP8 modes where the head
// dims allow, else in FP32 (kernels/attention.cuh); both keep the log-sum-exp of each row instead of the CPU's
// probabilities.
#pragma once
#include <cstdint>

#include "kernels/gemm_operands.cuh"
#include "model/params.h"

struct GpuModel;
struct Scratch;

struct GpuMLAActs {
    float *q_a, *q_a_rstd, *q_a_normed, *q;              // (N, q_lora), (N), (N, q_lora), (N, H*dqk) before RoPE
    float *kv_a, *c_kv, *c_kv_rstd, *c_kv_normed, *kv;   // (N, kv_lora + dr), (N, kv_lora), (N), .., (N, H*(dn+dv))
    float *q_heads, *k_heads;                            // (N, H, dqk) the FP32 attention's queries and keys
    __nv_bfloat16 *q_heads16, *k_heads16, *v_heads16;    // (N, H, dqk) x2, (N, H, dv) the tensor-core attention's
    float *o, *lse;                                      // (N, H*dv), (B, H, T)
    __nv_bfloat16 *q_a_normed16, *c_kv_normed16, *o16;   // BF16 copies of the GEMM inputs q_a_normed, c_kv_normed, o
};

// x (N, d) the normalised input -> out (N, d)
void mla_forward(GpuModel& m, const BlockWeights& w, GpuMLAActs& a, gpu::GemmInput x, float* out);
// dout (N, d) -> dx (N, d) overwritten; weight gradients accumulate into g.
void mla_backward(GpuModel& m, const BlockWeights& w, BlockWeights& g, const GpuMLAActs& a, gpu::GemmInput x,
                  const float* dout, float* dx, const Scratch& s);
