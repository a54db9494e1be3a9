// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/attention.cuh: the contract as plain loops.
//   forward:  s_ij = scale q_i.k_j (j <= i);  L_i = log sum_j exp(s_ij);  o_i = sum_j exp(s_ij - L_i) v_j
//   backward: D_i = dO_i . o_i;  P_ij = exp(s_ij - L_i);  dP_ij = dO_i . v_j;  dS_ij = P_ij (dP_ij - D_i) scale;
//             dq_i = sum_{j<=i} dS_ij k_j;  dk_j = sum_{i>=j} dS_ij q_i;  dv_j = sum_{i>=j} P_ij dO_i
// The forward's softmax is model/mla.cpp's attention_softmax_row (max, exp, sum, divide; L = max + log(sum)); the
// backward, as the kernel's, from q, k, v, o and L (not from stored probabilities as the CPU's). The BF16 versions
// (attention_forward_bf16, attention_backward_bf16) run the same FP32 loops on their BF16 inputs widened (the real
// BF16 kernels, with BF16 P and dS, are checked by test_gpu and on the kernel emulator).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/attention_tiles.cuh"
#include "kernels/common.cuh"
#include "model/mla.h"

namespace gpu {

// floats of scratch attention_backward needs (D, one per (b, h, t))
inline int64_t attention_backward_scratch_floats(int B, int T, int H) { return (int64_t)B * H * T; }

// The forward's loops: q, k (B*T, H, dqk), v rows strided by v_ld -> o (B*T, H, dv), lse (B, H, T)
inline void stand_in_attention_forward(float* o, float* lse, const float* q, const float* k, const float* v,
                                       int64_t v_ld, int B, int T, int H, int dqk, int dv, float scale) {
    std::vector<float> p(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                lse[((int64_t)b * H + h) * T + i] =
                    attention_softmax_row(p.data(), q + (((int64_t)b * T + i) * H + h) * dqk,
                                          k + ((int64_t)b * T * H + h) * dqk, (int64_t)H * dqk, i, dqk, scale);
                float* oi = o + (((int64_t)b * T + i) * H + h) * dv;
                for (int64_t e = 0; e < dv; e++) oi[e] = 0.0f;
                for (int j = 0; j <= i; j++) {
                    const float* vj = v + (((int64_t)b * T + j) * H + h) * v_ld;
                    for (int64_t e = 0; e < dv; e++) oi[e] += p[j] * vj[e];
                }
            }
}

// The backward's loops: D = dout . o; the products with dout_p (dout itself, or its BF16 rounding); v rows strided
// by v_ld, dv_out rows by dv_ld; scratch: D (B, H, T).
inline void stand_in_attention_backward(float* dq, float* dk, float* dv_out, int64_t dv_ld, float* scratch,
                                        const float* dout, const float* dout_p, const float* q, const float* k,
                                        const float* v, int64_t v_ld, const float* o, const float* lse, int B, int T,
                                        int H, int dqk, int dv, float scale) {
    std::vector<float> P((int64_t)T * T), dS((int64_t)T * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            auto row = [&](const float* base, int t, int64_t width) {
                return base + (((int64_t)b * T + t) * H + h) * width;
            };
            for (int i = 0; i < T; i++) {
                const float *qi = row(q, i, dqk), *doi = row(dout, i, dv), *dpi = row(dout_p, i, dv);
                const float* oi = row(o, i, dv);
                float D = 0.0f;
                for (int64_t e = 0; e < dv; e++) D += doi[e] * oi[e];
                scratch[((int64_t)b * H + h) * T + i] = D;
                const float L = lse[((int64_t)b * H + h) * T + i];
                for (int j = 0; j <= i; j++) {
                    const float *kj = row(k, j, dqk), *vj = row(v, j, v_ld);
                    float s = 0.0f, dp = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int64_t e = 0; e < dqk; e++) s += qi[e] * kj[e];
#pragma omp simd reduction(+ : dp)
                    for (int64_t e = 0; e < dv; e++) dp += dpi[e] * vj[e];
                    P[(int64_t)i * T + j] = expf(s * scale - L);
                    dS[(int64_t)i * T + j] = P[(int64_t)i * T + j] * (dp - D) * scale;
                }
            }
            for (int i = 0; i < T; i++) {
                float* dqi = dq + (((int64_t)b * T + i) * H + h) * dqk;
                for (int64_t e = 0; e < dqk; e++) dqi[e] = 0.0f;
                for (int j = 0; j <= i; j++) {
                    const float* kj = row(k, j, dqk);
                    for (int64_t e = 0; e < dqk; e++) dqi[e] += dS[(int64_t)i * T + j] * kj[e];
                }
            }
            for (int j = 0; j < T; j++) {
                float* dkj = dk + (((int64_t)b * T + j) * H + h) * dqk;
                float* dvj = dv_out + (((int64_t)b * T + j) * H + h) * dv_ld;
                for (int64_t e = 0; e < dqk; e++) dkj[e] = 0.0f;
                for (int64_t e = 0; e < dv; e++) dvj[e] = 0.0f;
                for (int i = j; i < T; i++) {
                    const float *qi = row(q, i, dqk), *dpi = row(dout_p, i, dv);
                    for (int64_t e = 0; e < dqk; e++) dkj[e] += dS[(int64_t)i * T + j] * qi[e];
                    for (int64_t e = 0; e < dv; e++) dvj[e] += P[(int64_t)i * T + j] * dpi[e];
                }
            }
        }
}

// The ranges the forward reads and writes (q, k, v FP32 or BF16): inside live allocations, the outputs apart
template <typename In>
inline void stand_in_attention_forward_ranges(const std::string& name, float* o, float* lse, const In* q, const In* k,
                                              const In* v, int64_t v_ld, int B, int T, int H, int dqk, int dv) {
    const int64_t N = (int64_t)B * T;
    dev(o, N * H * dv, name + " o");
    dev(lse, N * H, name + " lse");
    dev(q, N * H * dqk, name + " q");
    dev(k, N * H * dqk, name + " k");
    dev_strided(v, N * H, v_ld, dv, name + " v");
    apart(name, {span(o, N * H * dv, "o"), span(lse, N * H, "lse")},
          {span(q, N * H * dqk, "q"), span(k, N * H * dqk, "k"), span(v, (N * H - 1) * v_ld + dv, "v")});
}

// The same for the backward (dv_out strided by dv_ld)
template <typename In>
inline void stand_in_attention_backward_ranges(const std::string& name, float* dq, float* dk, float* dv_out,
                                               int64_t dv_ld, float* scratch, const float* dout, const In* q,
                                               const In* k, const In* v, int64_t v_ld, const float* o,
                                               const float* lse, int B, int T, int H, int dqk, int dv) {
    const int64_t N = (int64_t)B * T;
    dev(dq, N * H * dqk, name + " dq");
    dev(dk, N * H * dqk, name + " dk");
    dev_strided(dv_out, N * H, dv_ld, dv, name + " dv_out");
    dev(scratch, attention_backward_scratch_floats(B, T, H), name + " scratch");
    dev(dout, N * H * dv, name + " dout");
    dev(q, N * H * dqk, name + " q");
    dev(k, N * H * dqk, name + " k");
    dev_strided(v, N * H, v_ld, dv, name + " v");
    dev(o, N * H * dv, name + " o");
    dev(lse, N * H, name + " lse");
    apart(name,
          {span(dq, N * H * dqk, "dq"), span(dk, N * H * dqk, "dk"), span(dv_out, (N * H - 1) * dv_ld + dv, "dv_out"),
           span(scratch, N * H, "scratch")},
          {span(dout, N * H * dv, "dout"), span(q, N * H * dqk, "q"), span(k, N * H * dqk, "k"),
           span(v, (N * H - 1) * v_ld + dv, "v"), span(o, N * H * dv, "o"), span(lse, N * H, "lse")});
}

// q, k (B*T, H, dqk); v value e of (n, h) at [(n*H + h)*v_ld + e] -> o (B*T, H, dv), lse (B, H, T)
inline void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, int64_t v_ld,
                              int B, int T, int H, int dqk, int dv, float scale, cudaStream_t stream) {
    stand_in_attention_forward_ranges("attention_forward", o, lse, q, k, v, v_ld, B, T, H, dqk, dv);
    launch(stream, [=] { stand_in_attention_forward(o, lse, q, k, v, v_ld, B, T, H, dqk, dv, scale); });
}

// As attention_forward, on BF16 q, k, v
inline void attention_forward_bf16(float* o, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, int64_t v_ld, int B, int T, int H, int dqk, int dv,
                                   float scale, cudaStream_t stream) {
    if (!attention_on_tensor_cores(Precision::BF16, dqk, dv))
        stand_in::violation("attention_forward_bf16: head dims above ATTN_BF16_MAX_DIM");
    stand_in_attention_forward_ranges("attention_forward_bf16", o, lse, q, k, v, v_ld, B, T, H, dqk, dv);
    const int64_t n = (int64_t)B * T * H;
    launch(stream, [=] {
        stand_in_attention_forward(o, lse, stand_in_widen(q, n * dqk).data(),
                                   stand_in_widen(k, n * dqk).data(),
                                   stand_in_widen(v, (n - 1) * v_ld + dv).data(), v_ld, B, T, H, dqk, dv,
                                   scale);
    });
}

// dout (B*T, H, dv) and the forward's inputs, o and lse -> dq, dk (B*T, H, dqk) and dv_out (strided by v_ld like
// v), all overwritten (dv_out's other columns untouched). scratch: D (B, H, T).
inline void attention_backward(float* dq, float* dk, float* dv_out, float* scratch, const float* dout, const float* q,
                               const float* k, const float* v, int64_t v_ld, const float* o, const float* lse, int B,
                               int T, int H, int dqk, int dv, float scale, cudaStream_t stream) {
    stand_in_attention_backward_ranges("attention_backward", dq, dk, dv_out, v_ld, scratch, dout, q, k, v, v_ld, o, lse,
                                       B, T, H, dqk, dv);
    launch(stream, [=] {
        stand_in_attention_backward(dq, dk, dv_out, v_ld, scratch, dout, dout, q, k, v, v_ld, o, lse, B, T, H, dqk, dv,
                                    scale);
    });
}

// As attention_backward on BF16 q, k, v (v strided by v_ld) and dout16 (the BF16 copy of dout, which D still
// reads in FP32 with o); dv_out strided by dv_ld.
inline void attention_backward_bf16(float* dq, float* dk, float* dv_out, int64_t dv_ld, float* scratch,
                                    const float* dout, const __nv_bfloat16* dout16, const __nv_bfloat16* q,
                                    const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t v_ld, const float* o,
                                    const float* lse, int B, int T, int H, int dqk, int dv, float scale,
                                    cudaStream_t stream) {
    if (!attention_on_tensor_cores(Precision::BF16, dqk, dv))
        stand_in::violation("attention_backward_bf16: head dims above ATTN_BF16_MAX_DIM");
    stand_in_attention_backward_ranges("attention_backward_bf16", dq, dk, dv_out, dv_ld, scratch, dout, q, k, v, v_ld,
                                       o, lse, B, T, H, dqk, dv);
    const int64_t n = (int64_t)B * T * H;
    dev(dout16, n * dv, "attention_backward_bf16 dout16");
    apart("attention_backward_bf16",
          {span(dq, n * dqk, "dq"), span(dk, n * dqk, "dk"), span(dv_out, (n - 1) * dv_ld + dv, "dv_out")},
          {span(dout16, n * dv, "dout16")});
    launch(stream, [=] {
        stand_in_attention_backward(dq, dk, dv_out, dv_ld, scratch, dout,
                                    stand_in_widen(dout16, n * dv).data(),
                                    stand_in_widen(q, n * dqk).data(),
                                    stand_in_widen(k, n * dqk).data(),
                                    stand_in_widen(v, (n - 1) * v_ld + dv).data(), v_ld, o, lse, B, T, H,
                                    dqk, dv, scale);
    });
}

}  // namespace gpu
