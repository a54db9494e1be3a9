// RoPE and the per-head assembly of MLA's queries and keys (docs/design.md §1.1), FP32; the CPU reference is model/mla.cpp.
//   table:    cos[t][i] = m cos(t f_i),  sin[t][i] = m sin(t f_i)   (T, dr/2);  f_i = rope_inv_freq, m = rope_magnitude
//   forward:  q_heads[n,h] = [q_nope[n,h] ; R_t q_rope[n,h]],  k_heads[n,h] = [k_nope[n,h] (from kv) ; R_t k_rope[n]]
//             with ONE rope key per token (the last dr columns of kv_a) shared by all heads; t = n mod T, and R_t
//             rotates the interleaved pairs (x[2i], x[2i+1]) by the table row t (which carries m).
//   BF16 forward (for the tensor-core attention): the same q_heads and k_heads rounded to BF16, and v_heads[n,h] =
//             the v columns of kv (N, H, dv), rounded to BF16: the attention's three inputs, stored once in BF16.
//   backward: dq[n,h] = [dq_nope ; R_t^T dq_rope];  dkv's k_nope part = dk_nope (its v part is written by the
//             attention backward);  dkv_a's last dr columns = sum_h R_t^T dk_rope[n,h], in head order (its first
//             kv_lora columns are the RMSNorm backward's). Since d(R x)/dx = R, the transpose carries m as well.
//
// The table is computed ON THE DEVICE, with the same MOE_HD functions as the CPU (model/rope.h) and, like the CPU,
// in double before rounding to float. Why there: it is made where it is used, once per (config, T), with no host
// staging buffer or copy, and from one shared definition of the frequencies (no second host loop to keep equal).
// Why double: the angle t * f_i must be formed in double (as the CPU does): in float it is off by ~t * 6e-8 rad,
// 6e-3 rad at t = 1e5. CUDA's double cos/sin/pow/log are within 1-2 double ulp of glibc's, so an entry rounds to
// the CPU's float except in the rare case that the double lies within ~1e-16 of a float rounding boundary; then it
// is one float ulp (6e-8 relative) off. test_gpu allows that ulp.
//
// All kernels are elementwise (one thread per output value, grid-stride loops) and write every output value once:
// deterministic, no atomics. The rope key is rotated once per head in the forward (H times the minimal work, and
// still a few flops per loaded value).
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "model/config.h"
#include "model/rope.h"

namespace gpu {

constexpr int ROPE_THREADS = 256;

// Element r (0 <= r < dr) of R x, or of R^T x (inverse), for the pair layout (x[2i], x[2i+1]) and one table entry
// (co, si) = (m cos a, m sin a) of pair i = r / 2: the expressions of model/mla.cpp's rope_rotate.
__device__ inline float rope_rotate_element(const float* x, int64_t r, float co, float si, bool inverse) {
    const float x0 = x[r & ~int64_t(1)], x1 = x[r | 1], s = inverse ? -si : si;
    return (r & 1) ? x0 * s + x1 * co : x0 * co - x1 * s;
}

// cos_table, sin_table (T, dr/2)
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

// one thread per (n, h, e), e < dqk = dn + dr, and with v_heads also dqk <= e < dqk + dv (v_heads' values)
template <typename Out>
static __global__ void rope_heads_forward_kernel(Out* q_heads, Out* k_heads, Out* v_heads, const float* q,
                                                 const float* kv, const float* kv_a, const float* cos_table,
                                                 const float* sin_table, int64_t N, int64_t T, int64_t H, int64_t dn,
                                                 int64_t dr, int64_t dv, int64_t kr) {
    const int64_t dqk = dn + dr, width = dqk + (v_heads ? dv : 0), total = N * H * width;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = idx % width, nh = idx / width, n = nh / H, at = nh * dqk + e;
        if (e < dn) {
            store_as(q_heads + at, q[at]);  // q (N, H*dqk) and q_heads (N, H, dqk) have the same layout
            store_as(k_heads + at, kv[nh * (dn + dv) + e]);
        } else if (e < dqk) {
            const int64_t r = e - dn, table = (n % T) * (dr / 2) + r / 2;
            const float co = cos_table[table], si = sin_table[table];
            store_as(q_heads + at, rope_rotate_element(q + nh * dqk + dn, r, co, si, false));
            store_as(k_heads + at, rope_rotate_element(kv_a + n * (kr + dr) + kr, r, co, si, false));
        } else {
            store_as(v_heads + nh * dv + (e - dqk), kv[nh * (dn + dv) + dn + (e - dqk)]);
        }
    }
}

// one thread per (n, h, e), e < dqk: dq, and the k_nope part of dkv
static __global__ void rope_heads_backward_q_kernel(float* dq, float* dkv, const float* dq_heads, const float* dk_heads,
                                             const float* cos_table, const float* sin_table, int64_t N, int64_t T,
                                             int64_t H, int64_t dn, int64_t dr, int64_t dv) {
    const int64_t dqk = dn + dr, total = N * H * dqk;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = idx % dqk, nh = idx / dqk, n = nh / H;
        if (e < dn) {
            dq[idx] = dq_heads[idx];
            dkv[nh * (dn + dv) + e] = dk_heads[idx];
        } else {
            const int64_t r = e - dn, table = (n % T) * (dr / 2) + r / 2;
            dq[idx] = rope_rotate_element(dq_heads + nh * dqk + dn, r, cos_table[table], sin_table[table], true);
        }
    }
}

// one thread per (n, r), r < dr: the shared rope key's gradient, summed over the heads in order (as the CPU)
static __global__ void rope_heads_backward_k_kernel(float* dkv_a, const float* dk_heads, const float* cos_table,
                                             const float* sin_table, int64_t N, int64_t T, int64_t H, int64_t dn,
                                             int64_t dr, int64_t kr) {
    const int64_t dqk = dn + dr, total = N * dr;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx % dr, n = idx / dr, table = (n % T) * (dr / 2) + r / 2;
        const float co = cos_table[table], si = sin_table[table];
        float sum = 0.0f;
        for (int64_t h = 0; h < H; h++) sum += rope_rotate_element(dk_heads + (n * H + h) * dqk + dn, r, co, si, true);
        dkv_a[n * (kr + dr) + kr + r] = sum;
    }
}

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
    const int64_t n = N * H * (dn + dr);
    if (n == 0) return;
    launch_kernel(rope_heads_forward_kernel<float>, grid_stride_blocks(n, ROPE_THREADS), ROPE_THREADS, 0, stream,
                  q_heads, k_heads, (float*)nullptr, q, kv, kv_a, cos_table, sin_table, N, T, H, dn, dr, dv, kr);
}

// As rope_heads_forward, in BF16, plus the v columns of kv: -> q_heads, k_heads (N, H, dqk), v_heads (N, H, dv), the
// inputs of attention_forward_bf16 (each value rounded once from the FP32 one).
inline void rope_heads_forward_bf16(__nv_bfloat16* q_heads, __nv_bfloat16* k_heads, __nv_bfloat16* v_heads,
                                    const float* q, const float* kv, const float* kv_a, const float* cos_table,
                                    const float* sin_table, int64_t N, int64_t T, int64_t H, int64_t dn, int64_t dr,
                                    int64_t dv, int64_t kr, cudaStream_t stream) {
    const int64_t n = N * H * (dn + dr + dv);
    if (n == 0) return;
    launch_kernel(rope_heads_forward_kernel<__nv_bfloat16>, grid_stride_blocks(n, ROPE_THREADS), ROPE_THREADS, 0,
                  stream, q_heads, k_heads, v_heads, q, kv, kv_a, cos_table, sin_table, N, T, H, dn, dr, dv, kr);
}

// dq_heads, dk_heads (N, H, dqk) -> dq (N, H*dqk) overwritten, the k_nope columns of dkv (N, H*(dn+dv))
// overwritten (the v columns untouched), the last dr columns of dkv_a (N, kr+dr) overwritten (the first kr untouched).
inline void rope_heads_backward(float* dq, float* dkv, float* dkv_a, const float* dq_heads, const float* dk_heads,
                                const float* cos_table, const float* sin_table, int64_t N, int64_t T, int64_t H,
                                int64_t dn, int64_t dr, int64_t dv, int64_t kr, cudaStream_t stream) {
    const int64_t nq = N * H * (dn + dr), nk = N * dr;
    if (nq == 0) return;
    launch_kernel(rope_heads_backward_q_kernel, grid_stride_blocks(nq, ROPE_THREADS), ROPE_THREADS, 0, stream, dq, dkv,
                  dq_heads, dk_heads, cos_table, sin_table, N, T, H, dn, dr, dv);
    launch_kernel(rope_heads_backward_k_kernel, grid_stride_blocks(nk, ROPE_THREADS), ROPE_THREADS, 0, stream, dkv_a,
                  dk_heads, cos_table, sin_table, N, T, H, dn, dr, kr);
}

}  // namespace gpu
