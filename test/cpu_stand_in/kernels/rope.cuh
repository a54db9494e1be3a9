// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/rope.cuh: the contract as plain loops, with the
// expressions of model/mla.cpp (the table in double, as the CPU; the rotation of its rope_rotate; the rope key's
// gradient summed over the heads in head order).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "model/config.h"
#include "model/rope.h"

namespace gpu {

// out (dr) = R x, or R^T x (inverse), rotating the pairs (x[2i], x[2i+1]) by table row (cos_row, sin_row): the
// kernel's rope_rotate_element for every r, written as model/mla.cpp's rope_rotate (so that the compiler fuses the
// same products into FMAs as in the CPU reference, and the results agree bit for bit)
inline void rope_rotate(float* out, const float* x, const float* cos_row, const float* sin_row, int64_t dr,
                        bool inverse) {
    for (int64_t i = 0; i < dr / 2; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1], co = cos_row[i], si = inverse ? -sin_row[i] : sin_row[i];
        out[2 * i] = x0 * co - x1 * si;
        out[2 * i + 1] = x0 * si + x1 * co;
    }
}

// cos_table, sin_table (T, dr/2) for positions 0..T-1 of config c
inline void rope_table(float* cos_table, float* sin_table, const Config& c, int64_t T, cudaStream_t stream) {
    const int64_t half = c.qk_rope_head_dim / 2;
    dev(cos_table, T * half, "rope_table cos");
    dev(sin_table, T * half, "rope_table sin");
    launch(stream, [=] {
        const double magnitude = rope_magnitude(c);
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < half; i++) {
                const double angle = t * rope_inv_freq(c, i);
                cos_table[t * half + i] = (float)(magnitude * cos(angle));
                sin_table[t * half + i] = (float)(magnitude * sin(angle));
            }
    });
}

inline void stand_in_store(float* out, float x) { *out = x; }
inline void stand_in_store(__nv_bfloat16* out, float x) { *out = __float2bfloat16_rn(x); }

// Both forwards: q_heads, k_heads (and v_heads, the v columns of kv, when given) as Out (FP32 or BF16)
template <typename Out>
inline void stand_in_rope_heads_forward(const std::string& name, Out* q_heads, Out* k_heads, Out* v_heads,
                                        const float* q, const float* kv, const float* kv_a, const float* cos_table,
                                        const float* sin_table, int64_t N, int64_t T, int64_t H, int64_t dn,
                                        int64_t dr, int64_t dv, int64_t kr, cudaStream_t stream) {
    const int64_t dqk = dn + dr, v_count = v_heads ? N * H * dv : 0;
    dev(q_heads, N * H * dqk, name + " q_heads");
    dev(k_heads, N * H * dqk, name + " k_heads");
    dev(v_heads, v_count, name + " v_heads");
    dev(q, N * H * dqk, name + " q");
    dev(kv, N * H * (dn + dv), name + " kv");
    dev(kv_a, N * (kr + dr), name + " kv_a");
    dev(cos_table, T * (dr / 2), name + " cos");
    dev(sin_table, T * (dr / 2), name + " sin");
    apart(name,
          {span(q_heads, N * H * dqk, "q_heads"), span(k_heads, N * H * dqk, "k_heads"),
           span(v_heads, v_count, "v_heads")},
          {span(q, N * H * dqk, "q"), span(kv, N * H * (dn + dv), "kv"), span(kv_a, N * (kr + dr), "kv_a"),
           span(cos_table, T * (dr / 2), "cos"), span(sin_table, T * (dr / 2), "sin")});
    launch(stream, [=] {
        std::vector<float> q_row(dqk), k_row(dqk);
        for (int64_t n = 0; n < N; n++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t nh = n * H + h;
                for (int64_t e = 0; e < dn; e++) {
                    q_row[e] = q[nh * dqk + e];
                    k_row[e] = kv[nh * (dn + dv) + e];
                }
                const float *cos_row = cos_table + (n % T) * (dr / 2), *sin_row = sin_table + (n % T) * (dr / 2);
                rope_rotate(q_row.data() + dn, q + nh * dqk + dn, cos_row, sin_row, dr, false);
                rope_rotate(k_row.data() + dn, kv_a + n * (kr + dr) + kr, cos_row, sin_row, dr, false);
                for (int64_t e = 0; e < dqk; e++) {
                    stand_in_store(q_heads + nh * dqk + e, q_row[e]);
                    stand_in_store(k_heads + nh * dqk + e, k_row[e]);
                }
                for (int64_t e = 0; v_heads && e < dv; e++)
                    stand_in_store(v_heads + nh * dv + e, kv[nh * (dn + dv) + dn + e]);
            }
    });
}

// q (N, H*dqk), kv (N, H*(dn+dv)), kv_a (N, kr+dr) -> q_heads, k_heads (N, H, dqk): [nope ; R_t rope], the rope
// key (last dr columns of kv_a) shared by the heads; t = n mod T
inline void rope_heads_forward(float* q_heads, float* k_heads, const float* q, const float* kv, const float* kv_a,
                               const float* cos_table, const float* sin_table, int64_t N, int64_t T, int64_t H,
                               int64_t dn, int64_t dr, int64_t dv, int64_t kr, cudaStream_t stream) {
    stand_in_rope_heads_forward<float>("rope_heads_forward", q_heads, k_heads, nullptr, q, kv, kv_a, cos_table,
                                       sin_table, N, T, H, dn, dr, dv, kr, stream);
}

// As rope_heads_forward in BF16, plus v_heads (N, H, dv) = the v columns of kv: each value rounded once
inline void rope_heads_forward_bf16(__nv_bfloat16* q_heads, __nv_bfloat16* k_heads, __nv_bfloat16* v_heads,
                                    const float* q, const float* kv, const float* kv_a, const float* cos_table,
                                    const float* sin_table, int64_t N, int64_t T, int64_t H, int64_t dn, int64_t dr,
                                    int64_t dv, int64_t kr, cudaStream_t stream) {
    stand_in_rope_heads_forward("rope_heads_forward_bf16", q_heads, k_heads, v_heads, q, kv, kv_a, cos_table,
                                sin_table, N, T, H, dn, dr, dv, kr, stream);
}

// dq_heads, dk_heads (N, H, dqk) -> dq (N, H*dqk) overwritten; the k_nope columns of dkv overwritten (v columns
// untouched); the last dr columns of dkv_a overwritten with sum_h R_t^T dk_rope[n,h] in head order (the first kr
// untouched)
inline void rope_heads_backward(float* dq, float* dkv, float* dkv_a, const float* dq_heads, const float* dk_heads,
                                const float* cos_table, const float* sin_table, int64_t N, int64_t T, int64_t H,
                                int64_t dn, int64_t dr, int64_t dv, int64_t kr, cudaStream_t stream) {
    const int64_t dqk = dn + dr;
    dev(dq, N * H * dqk, "rope_heads_backward dq");
    dev(dkv, N * H * (dn + dv), "rope_heads_backward dkv");
    dev(dkv_a, N * (kr + dr), "rope_heads_backward dkv_a");
    dev(dq_heads, N * H * dqk, "rope_heads_backward dq_heads");
    dev(dk_heads, N * H * dqk, "rope_heads_backward dk_heads");
    dev(cos_table, T * (dr / 2), "rope_heads_backward cos");
    dev(sin_table, T * (dr / 2), "rope_heads_backward sin");
    apart("rope_heads_backward",
          {span(dq, N * H * dqk, "dq"), span(dkv, N * H * (dn + dv), "dkv"), span(dkv_a, N * (kr + dr), "dkv_a")},
          {span(dq_heads, N * H * dqk, "dq_heads"), span(dk_heads, N * H * dqk, "dk_heads"),
           span(cos_table, T * (dr / 2), "cos"), span(sin_table, T * (dr / 2), "sin")});
    launch(stream, [=] {
        std::vector<float> rotated(dr);
        for (int64_t n = 0; n < N; n++) {
            const float *cos_row = cos_table + (n % T) * (dr / 2), *sin_row = sin_table + (n % T) * (dr / 2);
            for (int64_t h = 0; h < H; h++) {
                const int64_t nh = n * H + h;
                for (int64_t e = 0; e < dn; e++) {
                    dq[nh * dqk + e] = dq_heads[nh * dqk + e];
                    dkv[nh * (dn + dv) + e] = dk_heads[nh * dqk + e];
                }
                rope_rotate(dq + nh * dqk + dn, dq_heads + nh * dqk + dn, cos_row, sin_row, dr, true);
            }
            float* dk_rope = dkv_a + n * (kr + dr) + kr;
            for (int64_t r = 0; r < dr; r++) dk_rope[r] = 0.0f;
            for (int64_t h = 0; h < H; h++) {
                rope_rotate(rotated.data(), dk_heads + (n * H + h) * dqk + dn, cos_row, sin_row, dr, true);
                for (int64_t r = 0; r < dr; r++) dk_rope[r] += rotated[r];
            }
        }
    });
}

}  // namespace gpu
