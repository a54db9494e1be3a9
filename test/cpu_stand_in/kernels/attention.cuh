// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/attention.cuh: the contract as plain loops.
//   forward:  s_ij = scale q_i.k_j (j <= i);  L_i = log sum_j exp(s_ij);  o_i = sum_j exp(s_ij - L_i) v_j
//   backward: D_i = dO_i . o_i;  P_ij = exp(s_ij - L_i);  dP_ij = dO_i . v_j;  dS_ij = P_ij (dP_ij - D_i) scale;
//             dq_i = sum_{j<=i} dS_ij k_j;  dk_j = sum_{i>=j} dS_ij q_i;  dv_j = sum_{i>=j} P_ij dO_i
// The forward's softmax is model/mla.cpp's attention_softmax_row (max, exp, sum, divide; L = max + log(sum)); the
// backward, as the kernel's, from q, k, v, o and L (not from stored probabilities as the CPU's). Precision::BF16
// runs the same FP32 loops (the real BF16 kernels are checked by test_gpu and on the kernel emulator).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common.cuh"
#include "model/mla.h"

namespace gpu {

// q, k (B*T, H, dqk); v value e of (n, h) at [(n*H + h)*v_ld + e] -> o (B*T, H, dv), lse (B, H, T)
inline void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, int64_t v_ld,
                              int B, int T, int H, int dqk, int dv, float scale, Precision, cudaStream_t stream) {
    const int64_t N = (int64_t)B * T;
    dev(o, N * H * dv, "attention_forward o");
    dev(lse, N * H, "attention_forward lse");
    dev(q, N * H * dqk, "attention_forward q");
    dev(k, N * H * dqk, "attention_forward k");
    dev_strided(v, N * H, v_ld, dv, "attention_forward v");
    apart("attention_forward", {span(o, N * H * dv, "o"), span(lse, N * H, "lse")},
          {span(q, N * H * dqk, "q"), span(k, N * H * dqk, "k"), span(v, (N * H - 1) * v_ld + dv, "v")});
    launch(stream, [=] {
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
    });
}

// floats of scratch attention_backward needs (D, one per (b, h, t))
inline int64_t attention_backward_scratch_floats(int B, int T, int H) { return (int64_t)B * H * T; }

// dout (B*T, H, dv) and the forward's inputs, o and lse -> dq, dk (B*T, H, dqk) and dv_out (strided by v_ld like
// v), all overwritten (dv_out's other columns untouched). scratch: D (B, H, T).
inline void attention_backward(float* dq, float* dk, float* dv_out, float* scratch, const float* dout, const float* q,
                               const float* k, const float* v, int64_t v_ld, const float* o, const float* lse, int B,
                               int T, int H, int dqk, int dv, float scale, Precision, cudaStream_t stream) {
    const int64_t N = (int64_t)B * T;
    dev(dq, N * H * dqk, "attention_backward dq");
    dev(dk, N * H * dqk, "attention_backward dk");
    dev_strided(dv_out, N * H, v_ld, dv, "attention_backward dv_out");
    dev(scratch, attention_backward_scratch_floats(B, T, H), "attention_backward scratch");
    dev(dout, N * H * dv, "attention_backward dout");
    dev(q, N * H * dqk, "attention_backward q");
    dev(k, N * H * dqk, "attention_backward k");
    dev_strided(v, N * H, v_ld, dv, "attention_backward v");
    dev(o, N * H * dv, "attention_backward o");
    dev(lse, N * H, "attention_backward lse");
    apart("attention_backward",
          {span(dq, N * H * dqk, "dq"), span(dk, N * H * dqk, "dk"), span(dv_out, (N * H - 1) * v_ld + dv, "dv_out"),
           span(scratch, N * H, "scratch")},
          {span(dout, N * H * dv, "dout"), span(q, N * H * dqk, "q"), span(k, N * H * dqk, "k"),
           span(v, (N * H - 1) * v_ld + dv, "v"), span(o, N * H * dv, "o"), span(lse, N * H, "lse")});
    launch(stream, [=] {
        std::vector<float> P((int64_t)T * T), dS((int64_t)T * T);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                auto row = [&](const float* base, int t, int64_t width) {
                    return base + (((int64_t)b * T + t) * H + h) * width;
                };
                for (int i = 0; i < T; i++) {
                    const float *qi = row(q, i, dqk), *doi = row(dout, i, dv), *oi = row(o, i, dv);
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
                        for (int64_t e = 0; e < dv; e++) dp += doi[e] * vj[e];
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
                    float* dvj = dv_out + (((int64_t)b * T + j) * H + h) * v_ld;
                    for (int64_t e = 0; e < dqk; e++) dkj[e] = 0.0f;
                    for (int64_t e = 0; e < dv; e++) dvj[e] = 0.0f;
                    for (int i = j; i < T; i++) {
                        const float *qi = row(q, i, dqk), *doi = row(dout, i, dv);
                        for (int64_t e = 0; e < dqk; e++) dkj[e] += dS[(int64_t)i * T + j] * qi[e];
                        for (int64_t e = 0; e < dv; e++) dvj[e] += P[(int64_t)i * T + j] * doi[e];
                    }
                }
            }
    });
}

}  // namespace gpu
