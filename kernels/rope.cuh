// RoPE and the per-head assembly of MLA's queries and keys (docs/design.md §1.1), FP32; the CPU's is model/mla.cpp.
//   table:    cos[t][i] = m cos(t f_i),  sin[t][i] = m sin(t f_i)  (T, dr/2);  f_i = rope_inv_freq, m = rope_magnitude
//   forward:  q_heads[n,h] = [q_nope[n,h] ; R_t q_rope[n,h]],  k_heads[n,h] = [k_nope[n,h] ; R_t k_rope[n]]
//             k_nope comes from kv; k_rope, the last dr columns of kv_a, is ONE key per token shared by all heads.
//             R_t rotates the interleaved pairs (x[2i], x[2i+1]) by table row t = n mod T, which carries m.
//   BF16:     the same q_heads and k_heads, and v_heads[n,h] = kv's v columns (N, H, dv), each rounded once to BF16
//   backward: dq[n,h] = [dq_nope ; R_t^T dq_rope];  dkv's k_nope columns = dk_nope;
//             dkv_a's last dr columns = sum_h R_t^T dk_rope[n,h], in head order. R^T carries m, as R does.
// The table is made on the device in double with model/rope.h's functions, as the CPU does: one definition of the
// frequencies, no host copy. An entry is the CPU's float, or rarely one float ulp off: CUDA's double cos, sin and
// pow are within 1-2 ulp of glibc's. test_gpu allows that ulp.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "model/config.h"
#include "model/rope.h"

namespace gpu {

constexpr int ROPE_THREADS = 256;  // the table's
constexpr int ROPE_ROW_THREADS = 64;  // per token and head

// Element r < dr of R x, or of R^T x when inverse, for pairs (x[2i], x[2i+1]) and the table entry of pair i = r / 2,
// (co, si) = (m cos a, m sin a): the expressions of model/mla.cpp's rope_rotate.
__device__ inline float rope_rotate_element(const float* x, int64_t r, float co, float si, bool inverse) {
    const float x0 = x[r & ~int64_t(1)], x1 = x[r | 1], s = inverse ? -si : si;
    return (r & 1) ? x0 * s + x1 * co : x0 * co - x1 * s;
}

static __global__ void rope_table_kernel(float* cos_table, float* sin_table, Config c, int64_t T) {
    const int64_t half = c.qk_rope_head_dim / 2, n = T * half;
    const double magnitude = rope_magnitude(c);
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(idx / half), i = (int)(idx % half);
        const double angle = t * rope_inv_freq(c, i);
        cos_table[idx] = (float)(magnitude * cos(angle));
        sin_table[idx] = (float)(magnitude * sin(angle));
    }
}

// The kernels below take a thread block per token and head, grid (T, B, H) (per token, grid (T, B)): token
// n = b T + t, at position t, with no division per element; the threads step along the row.

// e < dqk = dn + dr, and with v_heads also dqk <= e < dqk + dv for v's values
template <typename Out>
static __global__ void rope_heads_forward_kernel(Out* q_heads, Out* k_heads, Out* v_heads, const float* q,
                                                 const float* kv, const float* kv_a, const float* cos_table,
                                                 const float* sin_table, int64_t T, int64_t H, int64_t dn, int64_t dr,
                                                 int64_t dv, int64_t kr) {
    const int64_t t = blockIdx.x, n = blockIdx.y * T + t, nh = n * H + blockIdx.z;
    const int64_t dqk = dn + dr, width = dqk + (v_heads ? dv : 0);
    const float *co = cos_table + t * (dr / 2), *si = sin_table + t * (dr / 2);
    for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
        const int64_t at = nh * dqk + e;
        if (e < dn) {
            store_as(q_heads + at, q[at]);  // q (N, H*dqk) and q_heads (N, H, dqk) have the same layout
            store_as(k_heads + at, kv[nh * (dn + dv) + e]);
        } else if (e < dqk) {
            const int64_t r = e - dn;
            store_as(q_heads + at, rope_rotate_element(q + nh * dqk + dn, r, co[r / 2], si[r / 2], false));
            store_as(k_heads + at, rope_rotate_element(kv_a + n * (kr + dr) + kr, r, co[r / 2], si[r / 2], false));
        } else {
            store_as(v_heads + nh * dv + (e - dqk), kv[nh * (dn + dv) + dn + (e - dqk)]);
        }
    }
}

// e < dqk: dq, and the k_nope part of dkv
static __global__ void rope_heads_backward_q_kernel(float* dq, float* dkv, const float* dq_heads, const float* dk_heads,
                                                    const float* cos_table, const float* sin_table, int64_t T,
                                                    int64_t H, int64_t dn, int64_t dr, int64_t dv) {
    const int64_t t = blockIdx.x, nh = (blockIdx.y * T + t) * H + blockIdx.z, dqk = dn + dr;
    const float *co = cos_table + t * (dr / 2), *si = sin_table + t * (dr / 2);
    for (int64_t e = threadIdx.x; e < dqk; e += blockDim.x) {
        const int64_t at = nh * dqk + e;
        if (e < dn) {
            dq[at] = dq_heads[at];
            dkv[nh * (dn + dv) + e] = dk_heads[at];
        } else {
            const int64_t r = e - dn;
            dq[at] = rope_rotate_element(dq_heads + nh * dqk + dn, r, co[r / 2], si[r / 2], true);
        }
    }
}

// per token, r < dr: the shared rope key's gradient, summed over the heads in order (as the CPU)
static __global__ void rope_heads_backward_k_kernel(float* dkv_a, const float* dk_heads, const float* cos_table,
                                                    const float* sin_table, int64_t T, int64_t H, int64_t dn,
                                                    int64_t dr, int64_t kr) {
    const int64_t t = blockIdx.x, n = blockIdx.y * T + t, dqk = dn + dr;
    for (int64_t r = threadIdx.x; r < dr; r += blockDim.x) {
        const float co = cos_table[t * (dr / 2) + r / 2], si = sin_table[t * (dr / 2) + r / 2];
        float sum = 0.0f;
        for (int64_t h = 0; h < H; h++) sum += rope_rotate_element(dk_heads + (n * H + h) * dqk + dn, r, co, si, true);
        dkv_a[n * (kr + dr) + kr + r] = sum;
    }
}

// (T, B, H) for the N = B T tokens
inline dim3 rope_grid(int64_t N, int64_t T, int64_t H) { return dim3((unsigned)T, (unsigned)(N / T), (unsigned)H); }

// cos_table, sin_table (T, dr/2) for positions 0..T-1 of config c (dr = qk_rope_head_dim)
inline void rope_table(float* cos_table, float* sin_table, const Config& c, int64_t T, cudaStream_t stream) {
    const int64_t n = T * (c.qk_rope_head_dim / 2);
    if (n == 0) return;
    launch_kernel(rope_table_kernel, grid_stride_blocks(n, ROPE_THREADS), ROPE_THREADS, 0, stream, cos_table, sin_table,
                  c, T);
}

// q (N, H*dqk) before RoPE, kv (N, H*(dn+dv)), kv_a (N, kr+dr) -> q_heads, k_heads (N, H, dqk); N = B*T rows,
// token n at position n mod T; the tables (T, dr/2) from rope_table.
inline void rope_heads_forward(float* q_heads, float* k_heads, const float* q, const float* kv, const float* kv_a,
                               const float* cos_table, const float* sin_table, int64_t N, int64_t T, int64_t H,
                               int64_t dn, int64_t dr, int64_t dv, int64_t kr, cudaStream_t stream) {
    if (N * H == 0) return;
    launch_kernel(rope_heads_forward_kernel<float>, rope_grid(N, T, H), ROPE_ROW_THREADS, 0, stream, q_heads, k_heads,
                  (float*)nullptr, q, kv, kv_a, cos_table, sin_table, T, H, dn, dr, dv, kr);
}

// rope_heads_forward in BF16, plus v_heads (N, H, dv) = kv's v columns: the inputs of attention_forward_bf16.
inline void rope_heads_forward_bf16(__nv_bfloat16* q_heads, __nv_bfloat16* k_heads, __nv_bfloat16* v_heads,
                                    const float* q, const float* kv, const float* kv_a, const float* cos_table,
                                    const float* sin_table, int64_t N, int64_t T, int64_t H, int64_t dn, int64_t dr,
                                    int64_t dv, int64_t kr, cudaStream_t stream) {
    if (N * H == 0) return;
    launch_kernel(rope_heads_forward_kernel<__nv_bfloat16>, rope_grid(N, T, H), ROPE_ROW_THREADS, 0, stream, q_heads,
                  k_heads, v_heads, q, kv, kv_a, cos_table, sin_table, T, H, dn, dr, dv, kr);
}

// dq_heads, dk_heads (N, H, dqk) -> dq (N, H*dqk) overwritten, the k_nope columns of dkv (N, H*(dn+dv))
// overwritten (the v columns untouched), the last dr columns of dkv_a (N, kr+dr) overwritten (the first kr untouched).
inline void rope_heads_backward(float* dq, float* dkv, float* dkv_a, const float* dq_heads, const float* dk_heads,
                                const float* cos_table, const float* sin_table, int64_t N, int64_t T, int64_t H,
                                int64_t dn, int64_t dr, int64_t dv, int64_t kr, cudaStream_t stream) {
    if (N * H == 0) return;
    launch_kernel(rope_heads_backward_q_kernel, rope_grid(N, T, H), ROPE_ROW_THREADS, 0, stream, dq, dkv, dq_heads,
                  dk_heads, cos_table, sin_table, T, H, dn, dr, dv);
    launch_kernel(rope_heads_backward_k_kernel, rope_grid(N, T, 1), ROPE_ROW_THREADS, 0, stream, dkv_a, dk_heads,
                  cos_table, sin_table, T, H, dn, dr, kr);
}

}  // namespace gpu
