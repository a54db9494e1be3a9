// Causal multi-head attention core on the tensor cores: BF16 products, FP32 accumulation and softmax, for
// Precision::BF16 when both head dims are at most ATTN_BF16_MAX_DIM. The math, layouts and masks are those of
// kernels/attention.cuh (read its top first). The caller stores q, k, v and dO in BF16, halving the bytes streamed.
// Rounding: q, k, v, dO, P before P V, and dS before dS K and dS^T Q are BF16. The softmax statistics, D (from the
// FP32 dO and o), every accumulator and the outputs are FP32. o divides by the sum of the rounded P it multiplied.
// FlashAttention-2's structure on mma.sync (kernels/mma_sync.cuh), tiles as kernels/attention_tiles.cuh: warp w owns
// rows 16w..16w+15 of the thread block's own tile, keeps its 16 x 64 scores of a streamed tile in registers, does the
// softmax there and rounds P or dS straight into the next product's A fragments. cp.async fetches each streamed tile
// while the products that do not read it run: three __syncthreads per streamed tile instead of two. No atomics: dq,
// dk and dv each recompute S (docs/performance.md: the products, registers and shared memory). Left for speed: dk
// and dv in one thread block; TMA; wgmma.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_bf16.h>

#include "kernels/async_copy.cuh"
#include "kernels/attention_tiles.cuh"
#include "kernels/common.cuh"
#include "kernels/mma_sync.cuh"

namespace gpu {

// two BF16 in one register, lo in the low half: the fragments' packing
__device__ inline uint32_t attn_bf16_pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (uint32_t)*reinterpret_cast<const uint16_t*>(&lo) | (uint32_t)*reinterpret_cast<const uint16_t*>(&hi) << 16;
}

// dst (tile_rows x attn_bf16_ld(width)) = the first min(rows, tile_rows) rows of src (row r at src + r * stride),
// columns < width; zeros in the padding. Called by every thread; the caller commits the copies, waits for them and
// syncs before reading. A warp per row, its threads over consecutive columns: 16-byte cp.async copies of 8 columns
// when src's rows are 16-byte aligned and width a multiple of 8 (DeepSeek's dims), else plain loads of one column.
__device__ inline void attn_bf16_load(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t stride, int rows,
                                      int width, int tile_rows = ATTN_BF16_ROWS) {
    const int padded = attn_bf16_pad(width), ld = attn_bf16_ld(width), warps = blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    if (width % 8 == 0 && stride % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
        for (int r = threadIdx.x / 32; r < tile_rows; r += warps)
            for (int e = 8 * lane; e < padded; e += 8 * 32) {  // e < width: all eight columns are (width % 8 == 0)
                if (r < rows && e < width) cp_async_16(dst + r * ld + e, src + r * stride + e);
                else *reinterpret_cast<uint4*>(dst + r * ld + e) = uint4{0, 0, 0, 0};
            }
        return;
    }
    const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
    for (int r = threadIdx.x / 32; r < tile_rows; r += warps)
        for (int e = lane; e < padded; e += 32) dst[r * ld + e] = r < rows && e < width ? src[r * stride + e] : zero;
}

__device__ inline float attn_bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// s[n] = the warp's 16 x 8 tile n (n < 8) of A B^T: A rows r0..r0+15 of a (ld lda), B rows 0..63 of b (ld ldb),
// both `len` (a multiple of 16) wide. b's rows run along k, so plain ldmatrix: K, V, Q or dO.
__device__ inline void attn_bf16_scores(float (&s)[8][4], const __nv_bfloat16* a, int lda, int r0,
                                        const __nv_bfloat16* b, int ldb, int len) {
#pragma unroll
    for (int n = 0; n < 8; n++)
        for (int e = 0; e < 4; e++) s[n][e] = 0.0f;
    const int lane = threadIdx.x % 32;
#pragma unroll 2  // nvcc picks 4, and then ptxas spills in attention_forward_bf16_kernel<8, 4>
    for (int k0 = 0; k0 < len; k0 += 16) {
        uint32_t fa[4];  // the A fragment of rows r0..r0+15, columns k0..k0+15 of a
        ldmatrix_x4(fa, a + (r0 + lane % 16) * lda + k0 + lane / 16 * 8);
#pragma unroll
        for (int n = 0; n < 8; n += 2) {
            uint32_t fb[4];  // the B fragments of tiles n and n + 1: rows 8n..8n+15, columns k0..k0+15 of b
            ldmatrix_x4(fb, b + (8 * n + lane % 8 + lane / 16 * 8) * ldb + k0 + lane / 8 % 2 * 8);
            const uint32_t b0[2] = {fb[0], fb[1]}, b1[2] = {fb[2], fb[3]};
            mma_bf16_16816(s[n], fa, b0);
            mma_bf16_16816(s[n + 1], fa, b1);
        }
    }
}

// p = the warp's 16 x 64 tile s as BF16 A fragments: slice kk (columns 16kk..16kk+15) from tiles 2kk and 2kk+1.
__device__ inline void attn_bf16_to_a(uint32_t (&p)[4][4], const float (&s)[8][4]) {
    auto pack = [](float lo, float hi) { return attn_bf16_pack(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)); };
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        p[kk][0] = pack(s[2 * kk][0], s[2 * kk][1]);
        p[kk][1] = pack(s[2 * kk][2], s[2 * kk][3]);
        p[kk][2] = pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        p[kk][3] = pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

// acc[n] (n < tiles <= NT) += p (the warp's 16 x 64, as A fragments) times columns 8n..8n+7 of rows 0..63 of x.
// x's rows run down k, so ldmatrix .trans: V in P V, K in dS K, dO in P^T dO, Q in dS^T Q.
template <int NT>
__device__ inline void attn_bf16_accumulate(float (&acc)[NT][4], const uint32_t (&p)[4][4], const __nv_bfloat16* x,
                                            int ld, int tiles) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int n = 0; n < NT; n += 2) {  // tiles is even (a padded width is a multiple of 16)
        if (n >= tiles) break;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t fb[4];  // the B fragments of tiles n and n + 1: rows 16kk..16kk+15, columns 8n..8n+15 of x
            ldmatrix_x4_trans(fb, x + (16 * kk + lane % 16) * ld + 8 * n + lane / 16 * 8);
            const uint32_t b0[2] = {fb[0], fb[1]}, b1[2] = {fb[2], fb[3]};
            mma_bf16_16816(acc[n], p[kk], b0);
            mma_bf16_16816(acc[n + 1], p[kk], b1);
        }
    }
}

template <int NT>
__device__ inline void attn_bf16_zero(float (&acc)[NT][4]) {
#pragma unroll
    for (int n = 0; n < NT; n++)
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
}

// The warp's rows of acc (16w + g and 16w + g + 8 of the tile at row0) to out (row r at out + r * row_stride),
// rows below T, columns below width, divided by div_lo and div_hi (the two rows').
template <int NT>
__device__ inline void attn_bf16_write(float* out, int64_t row_stride, const float (&acc)[NT][4], int tiles, int row0,
                                       int T, int width, float div_lo, float div_hi) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_lo = row0 + warp * 16 + lane / 4;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        if (n >= tiles) break;
        for (int e = 0; e < 4; e++) {
            const int row = row_lo + (e / 2) * 8, col = 8 * n + 2 * (lane % 4) + e % 2;
            if (row < T && col < width) out[row * row_stride + col] = acc[n][e] / (e < 2 ? div_lo : div_hi);
        }
    }
}

// Column c of score tile n in this thread's element e: 8n + 2t + e % 2 (row: g, or g + 8 for e >= 2).
__device__ inline int attn_bf16_col(int n, int e) { return 8 * n + 2 * (threadIdx.x % 4) + e % 2; }

// The last streamed tile of 64 that a thread block reaches whose own tile (16 x WARPS rows) starts at row0
template <int WARPS>
__device__ inline int attn_bf16_last_tile(int row0, int T) {
    const int last_row = (row0 + 16 * WARPS < T ? row0 + 16 * WARPS : T) - 1;
    return last_row / ATTN_BF16_ROWS;
}

// grid (B*H, query tiles of 16 x WARPS rows counted from the last), 32 x WARPS threads; NT * 8 >= attn_bf16_pad(dv).
// S = Q K^T, online softmax, O += P V; o = O / l, L = m + log l. With 8 warps, the last key tile is all masked for
// the first four warps; in dk/dv the first query tile is, for the last four.
template <int NT, int WARPS>
static __global__ void __launch_bounds__(32 * WARPS)
    attention_forward_bf16_kernel(float* o, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                  const __nv_bfloat16* v, int64_t v_ld, int T, int H, int dqk, int dv, float scale) {
    constexpr int OWN_ROWS = 16 * WARPS;
    unsigned char* smem = dynamic_shared<unsigned char>();
    __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem);
    __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + attn_bf16_tile_bytes(dqk, OWN_ROWS));
    __nv_bfloat16* v_s = reinterpret_cast<__nv_bfloat16*>(smem + attn_bf16_tile_bytes(dqk, OWN_ROWS) +
                                                          attn_bf16_tile_bytes(dqk, ATTN_BF16_ROWS));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = blockIdx.x, seq = bh / H, h = bh % H;
    const int i0 = (gridDim.y - 1 - blockIdx.y) * OWN_ROWS, last_kt = attn_bf16_last_tile<WARPS>(i0, T);
    const int64_t qk_stride = (int64_t)H * dqk, v_stride = (int64_t)H * v_ld;
    const int ldq = attn_bf16_ld(dqk), ldv = attn_bf16_ld(dv), tiles = attn_bf16_pad(dv) / 8;
    auto load_k = [&](int j0) { attn_bf16_load(k_s, k + ((seq * T + j0) * H + h) * dqk, qk_stride, T - j0, dqk); };
    auto load_v = [&](int j0) { attn_bf16_load(v_s, v + ((seq * T + j0) * H + h) * v_ld, v_stride, T - j0, dv); };
    attn_bf16_load(q_s, q + ((seq * T + i0) * H + h) * dqk, qk_stride, T - i0, dqk, OWN_ROWS);
    load_k(0);
    cp_async_commit();
    load_v(0);
    cp_async_commit();
    float acc[NT][4];
    attn_bf16_zero(acc);
    const int i_lo = i0 + warp * 16 + lane / 4, i_hi = i_lo + 8;  // this thread's two query rows
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
    // Pipelined: V of this key tile lands while S = Q K^T and the softmax run, the next K while P V runs.
    for (int kt = 0; kt <= last_kt; kt++) {
        const int j0 = kt * ATTN_BF16_ROWS;
        cp_async_wait<1>();
        __syncthreads();  // Q and this K have landed (this V may still be in flight)
        float s[8][4];
        attn_bf16_scores(s, q_s, ldq, warp * 16, k_s, ldq, attn_bf16_pad(dqk));
        float max_lo = -INFINITY, max_hi = -INFINITY;
#pragma unroll
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++) {
                const int i = e < 2 ? i_lo : i_hi, j = j0 + attn_bf16_col(n, e);
                s[n][e] = j <= i && i < T ? s[n][e] * scale : -INFINITY;
                if (e < 2) max_lo = fmaxf(max_lo, s[n][e]);
                else max_hi = fmaxf(max_hi, s[n][e]);
            }
        for (int offset = 1; offset <= 2; offset *= 2) {  // over the 4 threads of each row
            max_lo = fmaxf(max_lo, __shfl_xor_sync(0xffffffffu, max_lo, offset));
            max_hi = fmaxf(max_hi, __shfl_xor_sync(0xffffffffu, max_hi, offset));
        }
        const float new_lo = fmaxf(m_lo, max_lo), new_hi = fmaxf(m_hi, max_hi);
        const float ref_lo = new_lo == -INFINITY ? 0.0f : new_lo;  // a row with nothing counted yet: exp(-inf) = 0
        const float ref_hi = new_hi == -INFINITY ? 0.0f : new_hi;
        float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++) {
                s[n][e] = attn_bf16_round(expf(s[n][e] - (e < 2 ? ref_lo : ref_hi)));  // P, as P V will see it
                if (e < 2) sum_lo += s[n][e];
                else sum_hi += s[n][e];
            }
        for (int offset = 1; offset <= 2; offset *= 2) {
            sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, offset);
            sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, offset);
        }
        const float corr_lo = expf(m_lo - ref_lo), corr_hi = expf(m_hi - ref_hi);
        l_lo = l_lo * corr_lo + sum_lo;
        l_hi = l_hi * corr_hi + sum_hi;
        m_lo = new_lo;
        m_hi = new_hi;
#pragma unroll
        for (int n = 0; n < NT; n++)
            for (int e = 0; e < 4; e++) acc[n][e] *= e < 2 ? corr_lo : corr_hi;
        uint32_t p[4][4];
        attn_bf16_to_a(p, s);
        cp_async_wait<0>();
        __syncthreads();  // this V has landed, and every warp is done with this K
        if (kt < last_kt) {
            load_k(j0 + ATTN_BF16_ROWS);
            cp_async_commit();
        }
        attn_bf16_accumulate(acc, p, v_s, ldv, tiles);
        if (kt < last_kt) {
            __syncthreads();  // every warp is done with this V
            load_v(j0 + ATTN_BF16_ROWS);
            cp_async_commit();
        }
    }
    attn_bf16_write(o + (seq * T * H + h) * dv, (int64_t)H * dv, acc, tiles, i0, T, dv, l_lo, l_hi);
    if (lane % 4 == 0) {
        if (i_lo < T) lse[bh * T + i_lo] = m_lo + logf(l_lo);
        if (i_hi < T) lse[bh * T + i_hi] = m_hi + logf(l_hi);
    }
}

// The backward kernels' shared memory: the thread block's own two tiles of own_rows (dqk wide, then dv wide: Q and
// dO for dq, K and V for dk/dv), the two streamed ones of 64 rows (the other pair), and 2 x 64 floats.
struct AttnBf16BackwardSmem {
    __nv_bfloat16 *own_qk, *own_v, *streamed_qk, *streamed_v;
    float* stats;
};
__device__ inline AttnBf16BackwardSmem attn_bf16_backward_smem(int dqk, int dv, int own_rows) {
    unsigned char* smem = dynamic_shared<unsigned char>();
    const int64_t own_qk = attn_bf16_tile_bytes(dqk, own_rows), own_v = attn_bf16_tile_bytes(dv, own_rows);
    const int64_t qk = attn_bf16_tile_bytes(dqk, ATTN_BF16_ROWS), vv = attn_bf16_tile_bytes(dv, ATTN_BF16_ROWS);
    return AttnBf16BackwardSmem{reinterpret_cast<__nv_bfloat16*>(smem),
                                reinterpret_cast<__nv_bfloat16*>(smem + own_qk),
                                reinterpret_cast<__nv_bfloat16*>(smem + own_qk + own_v),
                                reinterpret_cast<__nv_bfloat16*>(smem + own_qk + own_v + qk),
                                reinterpret_cast<float*>(smem + own_qk + own_v + qk + vv)};
}

// grid (B*H, query tiles of 16 x WARPS rows counted from the last), 32 x WARPS threads; NT * 8 >= attn_bf16_pad(dqk).
// S, dP = dO V^T, dS = P (dP - D) scale, dq += dS K; D from attention_backward_d.
template <int NT, int WARPS>
static __global__ void __launch_bounds__(32 * WARPS)
    attention_backward_dq_bf16_kernel(float* dq, const __nv_bfloat16* dout, const __nv_bfloat16* q,
                                      const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t v_ld, const float* lse,
                                      const float* D, int T, int H, int dqk, int dv, float scale) {
    constexpr int OWN_ROWS = 16 * WARPS;
    const AttnBf16BackwardSmem sm = attn_bf16_backward_smem(dqk, dv, OWN_ROWS);
    __nv_bfloat16 *q_s = sm.own_qk, *do_s = sm.own_v, *k_s = sm.streamed_qk, *v_s = sm.streamed_v;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = blockIdx.x, seq = bh / H, h = bh % H;
    const int i0 = (gridDim.y - 1 - blockIdx.y) * OWN_ROWS, last_kt = attn_bf16_last_tile<WARPS>(i0, T);
    const int64_t qk_stride = (int64_t)H * dqk, v_stride = (int64_t)H * v_ld, o_stride = (int64_t)H * dv;
    const int ldq = attn_bf16_ld(dqk), ldv = attn_bf16_ld(dv), tiles = attn_bf16_pad(dqk) / 8;
    auto load_k = [&](int j0) { attn_bf16_load(k_s, k + ((seq * T + j0) * H + h) * dqk, qk_stride, T - j0, dqk); };
    auto load_v = [&](int j0) { attn_bf16_load(v_s, v + ((seq * T + j0) * H + h) * v_ld, v_stride, T - j0, dv); };
    attn_bf16_load(q_s, q + ((seq * T + i0) * H + h) * dqk, qk_stride, T - i0, dqk, OWN_ROWS);
    attn_bf16_load(do_s, dout + ((seq * T + i0) * H + h) * dv, o_stride, T - i0, dv, OWN_ROWS);
    load_v(0);
    cp_async_commit();
    load_k(0);
    cp_async_commit();
    float acc[NT][4];
    attn_bf16_zero(acc);
    const int i_lo = i0 + warp * 16 + lane / 4, i_hi = i_lo + 8;
    const float lse_lo = i_lo < T ? lse[bh * T + i_lo] : 0.0f, lse_hi = i_hi < T ? lse[bh * T + i_hi] : 0.0f;
    const float d_lo = i_lo < T ? D[bh * T + i_lo] : 0.0f, d_hi = i_hi < T ? D[bh * T + i_hi] : 0.0f;
    // Pipelined: K of this key tile lands while dP = dO V^T runs, the next V while S, dS and dq += dS K run.
    for (int kt = 0; kt <= last_kt; kt++) {
        const int j0 = kt * ATTN_BF16_ROWS;
        cp_async_wait<1>();
        __syncthreads();  // Q, dO and this V have landed (this K may still be in flight)
        float s[8][4], dp[8][4];
        attn_bf16_scores(dp, do_s, ldv, warp * 16, v_s, ldv, attn_bf16_pad(dv));
        cp_async_wait<0>();
        __syncthreads();  // this K has landed, and every warp is done with this V
        if (kt < last_kt) {
            load_v(j0 + ATTN_BF16_ROWS);
            cp_async_commit();
        }
        attn_bf16_scores(s, q_s, ldq, warp * 16, k_s, ldq, attn_bf16_pad(dqk));
#pragma unroll
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++) {
                const int i = e < 2 ? i_lo : i_hi, j = j0 + attn_bf16_col(n, e);
                const float p = j <= i && i < T ? expf(s[n][e] * scale - (e < 2 ? lse_lo : lse_hi)) : 0.0f;
                s[n][e] = p * (dp[n][e] - (e < 2 ? d_lo : d_hi)) * scale;  // dS
            }
        uint32_t ds[4][4];
        attn_bf16_to_a(ds, s);
        attn_bf16_accumulate(acc, ds, k_s, ldq, tiles);
        if (kt < last_kt) {
            __syncthreads();  // every warp is done with this K
            load_k(j0 + ATTN_BF16_ROWS);
            cp_async_commit();
        }
    }
    attn_bf16_write(dq + (seq * T * H + h) * dqk, qk_stride, acc, tiles, i0, T, dqk, 1.0f, 1.0f);
}

// grid (B*H, key tiles of 16 x WARPS rows, 2), 32 x WARPS threads; NT * 8 >= attn_bf16_pad(max(dqk, dv)).
// S^T = K Q^T; z = 1: dv += P^T dO; z = 0: dk += dS^T Q, with dP^T = V dO^T.
template <int NT, int WARPS>
static __global__ void __launch_bounds__(32 * WARPS)
    attention_backward_dkdv_bf16_kernel(float* dk, float* dv_out, int64_t dv_ld, const __nv_bfloat16* dout,
                                        const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                        int64_t v_ld, const float* lse, const float* D, int T, int H, int dqk, int dv,
                                        float scale) {
    constexpr int OWN_ROWS = 16 * WARPS;
    const AttnBf16BackwardSmem sm = attn_bf16_backward_smem(dqk, dv, OWN_ROWS);
    __nv_bfloat16 *k_s = sm.own_qk, *v_s = sm.own_v, *q_s = sm.streamed_qk, *do_s = sm.streamed_v;
    float *col_lse = sm.stats, *col_d = sm.stats + ATTN_BF16_ROWS;  // of the streamed tile's 64 queries
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = blockIdx.x, seq = bh / H, h = bh % H;
    const int j0 = blockIdx.y * OWN_ROWS, q_tiles = (T + ATTN_BF16_ROWS - 1) / ATTN_BF16_ROWS;
    const bool is_dk = blockIdx.z == 0;  // uniform over the thread block
    const int64_t qk_stride = (int64_t)H * dqk, v_stride = (int64_t)H * v_ld, o_stride = (int64_t)H * dv;
    const int ldq = attn_bf16_ld(dqk), ldv = attn_bf16_ld(dv);
    const int tiles = attn_bf16_pad(is_dk ? dqk : dv) / 8;
    // The streamed tiles: the one only the first product reads (dO for dk, Q for dv), then the one the rest reads
    // (Q for dk, dO for dv) with the statistics (plain stores: visible after the next __syncthreads).
    auto load_q = [&](int i0) { attn_bf16_load(q_s, q + ((seq * T + i0) * H + h) * dqk, qk_stride, T - i0, dqk); };
    auto load_do = [&](int i0) { attn_bf16_load(do_s, dout + ((seq * T + i0) * H + h) * dv, o_stride, T - i0, dv); };
    auto load_first = [&](int i0) {
        if (is_dk) load_do(i0);
        else load_q(i0);
    };
    auto load_second = [&](int i0) {
        if (is_dk) load_q(i0);
        else load_do(i0);
        for (int c = threadIdx.x; c < ATTN_BF16_ROWS; c += 32 * WARPS) {
            col_lse[c] = i0 + c < T ? lse[bh * T + i0 + c] : 0.0f;
            col_d[c] = i0 + c < T ? D[bh * T + i0 + c] : 0.0f;
        }
    };
    attn_bf16_load(k_s, k + ((seq * T + j0) * H + h) * dqk, qk_stride, T - j0, dqk, OWN_ROWS);
    attn_bf16_load(v_s, v + ((seq * T + j0) * H + h) * v_ld, v_stride, T - j0, dv, OWN_ROWS);
    const int first_qt = j0 / ATTN_BF16_ROWS;  // the first query tile at or below the first own key
    load_first(j0);
    cp_async_commit();
    load_second(j0);
    cp_async_commit();
    float acc[NT][4];
    attn_bf16_zero(acc);
    const int j_lo = j0 + warp * 16 + lane / 4, j_hi = j_lo + 8;  // this thread's two keys
    // Pipelined: the second tile lands while the first product runs, the next first tile while the rest runs.
    for (int qt = first_qt; qt < q_tiles; qt++) {
        const int i0 = qt * ATTN_BF16_ROWS;
        cp_async_wait<1>();
        __syncthreads();  // K, V and the first tile have landed
        float st[8][4], dpt[8][4];
        if (is_dk) attn_bf16_scores(dpt, v_s, ldv, warp * 16, do_s, ldv, attn_bf16_pad(dv));  // dP^T
        else attn_bf16_scores(st, k_s, ldq, warp * 16, q_s, ldq, attn_bf16_pad(dqk));          // S^T
        cp_async_wait<0>();
        __syncthreads();  // the second tile has landed, and every warp is done with the first
        if (qt + 1 < q_tiles) {
            load_first(i0 + ATTN_BF16_ROWS);
            cp_async_commit();
        }
        if (is_dk) attn_bf16_scores(st, k_s, ldq, warp * 16, q_s, ldq, attn_bf16_pad(dqk));  // S^T
#pragma unroll
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++) {
                const int c = attn_bf16_col(n, e), i = i0 + c, j = e < 2 ? j_lo : j_hi;
                const float p = j <= i && i < T ? expf(st[n][e] * scale - col_lse[c]) : 0.0f;
                st[n][e] = is_dk ? p * (dpt[n][e] - col_d[c]) * scale : p;  // dS^T or P^T
            }
        uint32_t pa[4][4];
        attn_bf16_to_a(pa, st);
        if (is_dk)
            attn_bf16_accumulate(acc, pa, q_s, ldq, tiles);
        else
            attn_bf16_accumulate(acc, pa, do_s, ldv, tiles);
        if (qt + 1 < q_tiles) {
            __syncthreads();  // every warp is done with the second tile and the statistics
            load_second(i0 + ATTN_BF16_ROWS);
            cp_async_commit();
        }
    }
    if (is_dk)
        attn_bf16_write(dk + (seq * T * H + h) * dqk, qk_stride, acc, tiles, j0, T, dqk, 1.0f, 1.0f);
    else
        attn_bf16_write(dv_out + (seq * T * H + h) * dv_ld, (int64_t)H * dv_ld, acc, tiles, j0, T, dv, 1.0f, 1.0f);
}

// NT is a template parameter because the accumulators live in registers: one instance per 64 columns of head dim.
inline int attn_bf16_tile_class(int width) {  // 8, 16, 24 or 32 tiles of 8 columns
    const int tiles = attn_bf16_pad(width) / 8;
    return tiles <= 8 ? 8 : tiles <= 16 ? 16 : tiles <= 24 ? 24 : 32;
}

inline void attn_bf16_check_dims(const char* name, int dqk, int dv) {
    if (dqk > ATTN_BF16_MAX_DIM || dv > ATTN_BF16_MAX_DIM) {
        fprintf(stderr, "internal error: %s: head dims %d / %d above %d (attention_on_tensor_cores is false)\n", name,
                dqk, dv, ATTN_BF16_MAX_DIM);
        exit(1);
    }
}

// q, k (B*T, H, dqk), v (value e of (n, h) at [(n*H + h)*v_ld + e]), all BF16 -> o (B*T, H, dv), lse (B, H, T).
// WARPS: 4 or 8 (kernels/attention_tiles.cuh); the same bits either way (each row's sums run in the same order).
template <int WARPS = ATTN_BF16_WARPS>
inline void attention_forward_bf16(float* o, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, int64_t v_ld, int B, int T, int H, int dqk, int dv,
                                   float scale, cudaStream_t stream) {
    static_assert(WARPS == 4 || WARPS == 8, "blocks of 4 or 8 warps");
    if ((int64_t)B * T * H == 0) return;
    attn_bf16_check_dims("attention_forward_bf16", dqk, dv);
    const dim3 grid((unsigned)((int64_t)B * H), (unsigned)ceil_div(T, 16 * WARPS));
    const size_t bytes = (size_t)attn_bf16_forward_bytes(dqk, dv, WARPS);
    const int nt = attn_bf16_tile_class(dv);
    auto kernel = nt == 8    ? attention_forward_bf16_kernel<8, WARPS>
                  : nt == 16 ? attention_forward_bf16_kernel<16, WARPS>
                  : nt == 24 ? attention_forward_bf16_kernel<24, WARPS>
                             : attention_forward_bf16_kernel<32, WARPS>;
    launch_kernel(kernel, grid, 32 * WARPS, bytes, stream, o, lse, q, k, v, v_ld, T, H, dqk, dv, scale);
}

}  // namespace gpu
