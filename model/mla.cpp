// MLA forward and backward on the CPU. The attention core keeps the full probability matrix (B, H, T, T), as the
// readable reference; the GPU kernel uses online softmax instead. Backward runs in two deterministic passes:
// per query row (dq and dS), then per key row (dk and dv), so no two threads ever add into the same value.
#include "mla.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "ops.h"
#include "rope.h"

void mla_carve(Arena& arena, const Config& c, int B, int T, MLAActs& a) {
    const int64_t N = (int64_t)B * T, H = c.num_attention_heads, dqk = c.qk_head_dim();
    const int64_t qr = c.q_lora_rank, kr = c.kv_lora_rank, dr = c.qk_rope_head_dim;
    a.q_a = arena.take<float>(N * qr);
    a.q_a_rstd = arena.take<float>(qr > 0 ? N : 0);
    a.q_a_normed = arena.take<float>(N * qr);
    a.q = arena.take<float>(N * H * dqk);
    a.kv_a = arena.take<float>(N * (kr + dr));
    a.c_kv = arena.take<float>(N * kr);
    a.c_kv_rstd = arena.take<float>(N);
    a.c_kv_normed = arena.take<float>(N * kr);
    a.kv = arena.take<float>(N * H * (c.qk_nope_head_dim + c.v_head_dim));
    a.q_heads = arena.take<float>(N * H * dqk);
    a.k_heads = arena.take<float>(N * H * dqk);
    a.probs = arena.take<float>((int64_t)B * H * T * T);
    a.o = arena.take<float>(N * H * c.v_head_dim);
    a.rope_cos = arena.take<float>((int64_t)T * dr / 2);
    a.rope_sin = arena.take<float>((int64_t)T * dr / 2);
}

// Rotates x's interleaved pairs (dr values) by its position's cos and sin rows; inverse applies the transpose.
static inline void rope_rotate(float* out, const float* x, const float* cos_row, const float* sin_row, int dr,
                               bool inverse) {
    for (int i = 0; i < dr / 2; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1], co = cos_row[i], si = inverse ? -sin_row[i] : sin_row[i];
        out[2 * i] = x0 * co - x1 * si;
        out[2 * i + 1] = x0 * si + x1 * co;
    }
}

// One causal softmax row: p[j] = softmax_j(scale q . k_j) for j <= i, key j at k + j * k_stride (dqk values each).
static void attention_softmax_row(float* p, const float* q, const float* k, int64_t k_stride, int i, int64_t dqk,
                                  float scale) {
    float max_score = -INFINITY;
    for (int j = 0; j <= i; j++) {
        const float* kj = k + j * k_stride;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t e = 0; e < dqk; e++) s += q[e] * kj[e];
        p[j] = s * scale;
        max_score = std::max(max_score, p[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j <= i; j++) {
        p[j] = expf(p[j] - max_score);
        sum += p[j];
    }
    for (int j = 0; j <= i; j++) p[j] /= sum;
}

void mla_forward(const Config& c, Precision precision, const BlockWeights& w, MLAActs& a, const float* x,
                 float* out, int B, int T) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, H = c.num_attention_heads;
    const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr;
    const int64_t qr = c.q_lora_rank, kr = c.kv_lora_rank;

    // RoPE table for positions 0..T-1
    const double magnitude = rope_magnitude(c);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < dr / 2; i++) {
            double angle = t * rope_inv_freq(c, i);
            a.rope_cos[t * dr / 2 + i] = (float)(magnitude * cos(angle));
            a.rope_sin[t * dr / 2 + i] = (float)(magnitude * sin(angle));
        }

    // queries: (N, d) -> (N, H*dqk)
    if (qr > 0) {
        linear_forward(precision, a.q_a, x, w.q_a, N, d, qr);
        rmsnorm_forward(a.q_a_normed, a.q_a_rstd, a.q_a, w.q_a_norm, N, qr, c.rms_norm_eps);
        linear_forward(precision, a.q, a.q_a_normed, w.q_b, N, qr, H * dqk);
    } else {
        linear_forward(precision, a.q, x, w.q, N, d, H * dqk);
    }
    // keys and values: (N, d) -> (N, kr + dr) -> c_kv (N, kr) -> (N, H*(dn+dv))
    linear_forward(precision, a.kv_a, x, w.kv_a, N, d, kr + dr);
    copy_columns(a.c_kv, kr, a.kv_a, kr + dr, N, kr);
    rmsnorm_forward(a.c_kv_normed, a.c_kv_rstd, a.c_kv, w.kv_a_norm, N, kr, c.rms_norm_eps);
    linear_forward(precision, a.kv, a.c_kv_normed, w.kv_b, N, kr, H * (dn + dv));

    // assemble per-head queries and keys with RoPE
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int t = (int)(n % T);
        const float *cos_row = a.rope_cos + t * dr / 2, *sin_row = a.rope_sin + t * dr / 2;
        float k_rope[1024];  // dr <= 1024: validate_config
        rope_rotate(k_rope, a.kv_a + n * (kr + dr) + kr, cos_row, sin_row, (int)dr, false);
        for (int64_t h = 0; h < H; h++) {
            float* qh = a.q_heads + (n * H + h) * dqk;
            float* kh = a.k_heads + (n * H + h) * dqk;
            const float* qsrc = a.q + (n * H + h) * dqk;
            memcpy(qh, qsrc, dn * sizeof(float));
            rope_rotate(qh + dn, qsrc + dn, cos_row, sin_row, (int)dr, false);
            memcpy(kh, a.kv + (n * H + h) * (dn + dv), dn * sizeof(float));
            memcpy(kh + dn, k_rope, dr * sizeof(float));
        }
    }

    // causal attention, one (sequence, head, query) row per iteration
    const float scale = attention_softmax_scale(c);
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                float* p = a.probs + (((int64_t)b * H + h) * T + i) * T;
                attention_softmax_row(p, a.q_heads + (((int64_t)b * T + i) * H + h) * dqk,
                                      a.k_heads + ((int64_t)b * T * H + h) * dqk, H * dqk, i, dqk, scale);
                for (int j = i + 1; j < T; j++) p[j] = 0.0f;
                float* o = a.o + (((int64_t)b * T + i) * H + h) * dv;
                for (int64_t e = 0; e < dv; e++) o[e] = 0.0f;
                for (int j = 0; j <= i; j++) {
                    const float* v = a.kv + (((int64_t)b * T + j) * H + h) * (dn + dv) + dn;
                    for (int64_t e = 0; e < dv; e++) o[e] += p[j] * v[e];
                }
            }
    linear_forward(precision, out, a.o, w.o, N, H * dv, d);
}

void attention_backward(const Config& c, const MLAActs& a, const float* d_o, float* dq_heads, float* dk_heads,
                        float* dkv, int B, int T) {
    const int64_t H = c.num_attention_heads, dn = c.qk_nope_head_dim, dv = c.v_head_dim, dqk = c.qk_head_dim();
    const float scale = attention_softmax_scale(c);
    std::vector<float> d_scores((int64_t)B * H * T * T);
    // Pass 1, per query row i: dP_ij = do_i . v_j;  dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij) scale;
    // dq_i = sum_j dS_ij k_j
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const float* p = a.probs + (((int64_t)b * H + h) * T + i) * T;
                float* ds = d_scores.data() + (((int64_t)b * H + h) * T + i) * T;
                const float* doi = d_o + (((int64_t)b * T + i) * H + h) * dv;
                float weighted = 0.0f;
                for (int j = 0; j <= i; j++) {
                    const float* v = a.kv + (((int64_t)b * T + j) * H + h) * (dn + dv) + dn;
                    float dp = 0.0f;
#pragma omp simd reduction(+ : dp)
                    for (int64_t e = 0; e < dv; e++) dp += doi[e] * v[e];
                    ds[j] = dp;
                    weighted += p[j] * dp;
                }
                float* dq = dq_heads + (((int64_t)b * T + i) * H + h) * dqk;
                for (int64_t e = 0; e < dqk; e++) dq[e] = 0.0f;
                for (int j = 0; j <= i; j++) {
                    ds[j] = p[j] * (ds[j] - weighted) * scale;
                    const float* k = a.k_heads + (((int64_t)b * T + j) * H + h) * dqk;
                    for (int64_t e = 0; e < dqk; e++) dq[e] += ds[j] * k[e];
                }
            }
    // Pass 2, per key row j: dk_j = sum_{i>=j} dS_ij q_i;  dv_j = sum_{i>=j} P_ij do_i
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int j = 0; j < T; j++) {
                float* dk = dk_heads + (((int64_t)b * T + j) * H + h) * dqk;
                float* dvj = dkv + (((int64_t)b * T + j) * H + h) * (dn + dv) + dn;
                for (int64_t e = 0; e < dqk; e++) dk[e] = 0.0f;
                for (int64_t e = 0; e < dv; e++) dvj[e] = 0.0f;
                for (int i = j; i < T; i++) {
                    int64_t row = (((int64_t)b * H + h) * T + i) * T + j;
                    const float* q = a.q_heads + (((int64_t)b * T + i) * H + h) * dqk;
                    const float* doi = d_o + (((int64_t)b * T + i) * H + h) * dv;
                    for (int64_t e = 0; e < dqk; e++) dk[e] += d_scores[row] * q[e];
                    for (int64_t e = 0; e < dv; e++) dvj[e] += a.probs[row] * doi[e];
                }
            }
}

void heads_backward(const Config& c, const MLAActs& a, const float* dq_heads, const float* dk_heads, float* dq,
                    float* dkv, float* dkv_a, int B, int T) {
    const int64_t N = (int64_t)B * T, H = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
    const int64_t dv = c.v_head_dim, dqk = dn + dr, kr = c.kv_lora_rank;
    // The rope tables hold m cos and m sin; rotating back by the transpose also carries m: d/dx (m R x) = m R^T.
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int t = (int)(n % T);
        const float *cos_row = a.rope_cos + t * dr / 2, *sin_row = a.rope_sin + t * dr / 2;
        float* dk_rope = dkv_a + n * (kr + dr) + kr;
        for (int64_t e = 0; e < dr; e++) dk_rope[e] = 0.0f;
        for (int64_t h = 0; h < H; h++) {
            const float* dqh = dq_heads + (n * H + h) * dqk;
            const float* dkh = dk_heads + (n * H + h) * dqk;
            float* dqdst = dq + (n * H + h) * dqk;
            memcpy(dqdst, dqh, dn * sizeof(float));
            rope_rotate(dqdst + dn, dqh + dn, cos_row, sin_row, (int)dr, true);
            memcpy(dkv + (n * H + h) * (dn + dv), dkh, dn * sizeof(float));
            float rotated[1024];
            rope_rotate(rotated, dkh + dn, cos_row, sin_row, (int)dr, true);
            for (int64_t e = 0; e < dr; e++) dk_rope[e] += rotated[e];
        }
    }
}

void mla_backward(const Config& c, Precision precision, const BlockWeights& w, BlockWeights& g, const MLAActs& a,
                  const float* x, const float* dout, float* dx, int B, int T) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, H = c.num_attention_heads;
    const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr;
    const int64_t qr = c.q_lora_rank, kr = c.kv_lora_rank;
    std::vector<float> d_o(N * H * dv), dq_heads(N * H * dqk), dk_heads(N * H * dqk), dkv(N * H * (dn + dv));
    std::vector<float> dq(N * H * dqk), dkv_a(N * (kr + dr));
    linear_backward(precision, d_o.data(), g.o, dout, a.o, w.o, N, H * dv, d, false);
    attention_backward(c, a, d_o.data(), dq_heads.data(), dk_heads.data(), dkv.data(), B, T);
    heads_backward(c, a, dq_heads.data(), dk_heads.data(), dq.data(), dkv.data(), dkv_a.data(), B, T);

    // keys and values back to the input
    std::vector<float> dc_kv_normed(N * kr), dc_kv(N * kr);
    linear_backward(precision, dc_kv_normed.data(), g.kv_b, dkv.data(), a.c_kv_normed, w.kv_b, N, kr, H * (dn + dv),
                    false);
    rmsnorm_backward(dc_kv.data(), g.kv_a_norm, dc_kv_normed.data(), a.c_kv, w.kv_a_norm, a.c_kv_rstd, N, kr, false);
    copy_columns(dkv_a.data(), kr + dr, dc_kv.data(), kr, N, kr);
    linear_backward(precision, dx, g.kv_a, dkv_a.data(), x, w.kv_a, N, d, kr + dr, false);

    // queries back to the input (accumulating into dx)
    if (qr > 0) {
        std::vector<float> dq_a_normed(N * qr), dq_a(N * qr);
        linear_backward(precision, dq_a_normed.data(), g.q_b, dq.data(), a.q_a_normed, w.q_b, N, qr, H * dqk, false);
        rmsnorm_backward(dq_a.data(), g.q_a_norm, dq_a_normed.data(), a.q_a, w.q_a_norm, a.q_a_rstd, N, qr, false);
        linear_backward(precision, dx, g.q_a, dq_a.data(), x, w.q_a, N, d, qr, true);
    } else {
        linear_backward(precision, dx, g.q, dq.data(), x, w.q, N, d, H * dqk, true);
    }
}
