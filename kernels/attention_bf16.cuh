// Causal multi-head attention core on the tensor cores: BF16 products, FP32 accumulation and softmax. The same
// math, layouts and launch interface as kernels/attention.cuh (read its top first); attention_forward and
// attention_backward there call these for Precision::BF16 when both head dims are at most ATTN_BF16_MAX_DIM.
//
// Rounding: q, k, v and dO are rounded to BF16 as they are loaded into shared memory (storage stays FP32); so are
// the probabilities P before P V, and dS before dS K and dS^T Q (the usual BF16 flash-attention recipe). The
// softmax statistics, the log-sum-exp, D and every accumulator are FP32. The forward normalises by the sum of the
// rounded P, so o is exactly the weighted mean of the rounded P it multiplied.
//
// Design. A block has 4 warps and one 64-row tile (queries for the forward and dq, keys for dk/dv); warp w owns
// rows 16w..16w+15. The tiles of the other side (64 keys, or 64 queries) stream through shared memory, converted
// to BF16 with the head dims zero-padded to multiples of 16. Products are warp-level 16 x 16 x 16 wmma tiles
// (<mma.h>): for each streamed tile a warp computes its 16 x 64 strip of scores into a per-warp FP32 buffer,
// its lanes apply the mask and the softmax there (lane l: row l / 2, columns l % 2 + 2t: the two lanes of a row
// interleave, so a warp's accesses hit 16 different banks, not 8), write P (or dS) as
// BF16, and the warp multiplies that strip into its output accumulators, which stay in registers across tiles
// (one 16 x 16 fragment per 16 output columns: the NF template parameter, so at most 16).
// The forward's online softmax must rescale its accumulators by a per-row factor, but a fragment's element-to-row
// mapping is unspecified: each warp loads a tile whose entry (r, c) is r into an accumulator fragment once; element
// i of any accumulator fragment then lies in row row_of.x[i].
//   forward:  block (b, h, query tile): S = Q K^T, online softmax, O += P V; at the end o = O / l, L = m + log l.
//   backward: D by attention.cuh's kernel; dq: block (b, h, query tile): S, dP = dO V^T, dS = P (dP - D) scale,
//             dq += dS K; dk/dv: block (b, h, key tile, z): transposed strips S^T = K Q^T (and dP^T = V dO^T for
//             dk), dv += P^T dO (z = 1) or dk += dS^T Q (z = 0). No atomics: deterministic.
// Masks as in attention.cuh: (i, j) counts iff j <= i < T; padding rows and columns are zeros in shared memory.
//
// Shared memory (dynamic; > 48 KiB, so launch_kernel raises the kernel's limit): the block's own tile(s), the
// streamed tile(s), and per warp a 16 x 64 FP32 strip (two for the backward's S and dP) and a 16 x 64 BF16 strip.
// Row strides are the padded width + 8 BF16 (+ 4 floats): multiples of 16 bytes as wmma requires, and a skew
// against bank conflicts. For DeepSeek-V3's dims (192, 128): forward ~97 KB (2 blocks per SM), dq/dkdv ~131 KB.
//
// Performance work left: this is wmma with synchronous loads and one 64-row tile per 4 warps; FA2/FA3-level speed
// needs mma.sync (or wgmma) with register-resident P, cp.async/TMA double buffering, 128-row tiles, and BF16
// storage of q, k, v so the loads move half the bytes.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/common.cuh"

namespace gpu {

constexpr int ATTN_BF16_ROWS = 64;      // rows of the block's tile, and of each streamed tile
constexpr int ATTN_BF16_THREADS = 128;  // 4 warps x 16 rows
constexpr int ATTN_BF16_MAX_DIM = 256;  // head dims above this take the FP32 kernels
constexpr int ATTN_BF16_STRIP_LD = ATTN_BF16_ROWS + 4;  // floats per row of a warp's score strip
constexpr int ATTN_BF16_P_LD = ATTN_BF16_ROWS + 8;      // BF16 per row of a warp's P / dS strip

namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;  // B^T stored by rows
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__host__ __device__ inline int attn_bf16_pad(int d) { return (d + 15) / 16 * 16; }
// row stride in shared memory (BF16 elements)
__host__ __device__ inline int attn_bf16_ld(int d) { return attn_bf16_pad(d) + 8; }

// Shared memory layout of one block. Offsets in bytes from the (128-byte aligned) base; every region starts on a
// 128-byte boundary. tiles: the number of 64-row BF16 tiles (widths w0..w3, 0 for none); strips: FP32 strips
// per warp.
struct AttnBf16Smem {
    int64_t tile[4], strip, p, row_of, stats, bytes;
};
__host__ __device__ inline int64_t attn_bf16_align(int64_t b) { return (b + 127) / 128 * 128; }
__host__ __device__ inline AttnBf16Smem attn_bf16_smem(int w0, int w1, int w2, int w3, int strips) {
    AttnBf16Smem s{};
    int64_t at = 0;
    const int widths[4] = {w0, w1, w2, w3};
    for (int t = 0; t < 4; t++) {
        s.tile[t] = at;
        if (widths[t] > 0) at = attn_bf16_align(at + (int64_t)ATTN_BF16_ROWS * attn_bf16_ld(widths[t]) * 2);
    }
    s.strip = at;
    at = attn_bf16_align(at + (int64_t)strips * 4 * 16 * ATTN_BF16_STRIP_LD * 4);
    s.p = at;
    at = attn_bf16_align(at + (int64_t)4 * 16 * ATTN_BF16_P_LD * 2);
    s.row_of = at;
    at = attn_bf16_align(at + 16 * 16 * 4);
    s.stats = at;  // per-row floats: 3 x 64 (forward m, l, correction; backward L and D of the streamed tile)
    s.bytes = attn_bf16_align(at + 3 * ATTN_BF16_ROWS * 4);
    return s;
}

template <typename T>
__device__ inline T* attn_bf16_region(unsigned char* base, int64_t offset) {
    return reinterpret_cast<T*>(base + offset);
}

// dst (64 x attn_bf16_ld(width)) = rows 0..rows-1 of src (row r at src + r * stride), columns < width, as BF16;
// zeros in the padding rows and columns. All threads of the block.
// A warp per row at a time, its lanes over consecutive columns (coalesced).
__device__ inline void attn_bf16_load(__nv_bfloat16* dst, const float* src, int64_t stride, int rows, int width) {
    const int padded = attn_bf16_pad(width), ld = attn_bf16_ld(width), warps = ATTN_BF16_THREADS / 32;
    for (int r = threadIdx.x / 32; r < ATTN_BF16_ROWS; r += warps)
        for (int e = threadIdx.x % 32; e < padded; e += 32)
            dst[r * ld + e] = __float2bfloat16_rn(r < rows && e < width ? src[r * stride + e] : 0.0f);
}

// strip (16 x 64, ld ATTN_BF16_STRIP_LD) = A_w B^T: A_w the warp's 16 rows of a (ld lda), B the 64 rows of b
// (ld ldb), both `len` (a multiple of 16) wide. One warp.
__device__ inline void attn_bf16_strip(float* strip, const __nv_bfloat16* a, int lda, const __nv_bfloat16* b, int ldb,
                                       int len) {
    for (int j = 0; j < ATTN_BF16_ROWS / 16; j++) {
        FragC s;
        wmma::fill_fragment(s, 0.0f);
        for (int e = 0; e < len; e += 16) {
            FragA fa;
            FragBT fb;
            wmma::load_matrix_sync(fa, a + e, lda);
            wmma::load_matrix_sync(fb, b + j * 16 * ldb + e, ldb);
            wmma::mma_sync(s, fa, fb, s);
        }
        wmma::store_matrix_sync(strip + j * 16, s, ATTN_BF16_STRIP_LD, wmma::mem_row_major);
    }
}

// acc[f] += P (16 x 64, the warp's BF16 strip) times columns 16f..16f+15 of the 64 rows of v (ld ldv). One warp.
template <int NF>
__device__ inline void attn_bf16_accumulate(FragC (&acc)[NF], const __nv_bfloat16* p, const __nv_bfloat16* v, int ldv,
                                            int frags) {
    FragA fp[ATTN_BF16_ROWS / 16];
#pragma unroll
    for (int k = 0; k < ATTN_BF16_ROWS / 16; k++) wmma::load_matrix_sync(fp[k], p + k * 16, ATTN_BF16_P_LD);
#pragma unroll
    for (int f = 0; f < NF; f++) {
        if (f >= frags) break;
#pragma unroll
        for (int k = 0; k < ATTN_BF16_ROWS / 16; k++) {
            FragB fv;
            wmma::load_matrix_sync(fv, v + k * 16 * ldv + f * 16, ldv);
            wmma::mma_sync(acc[f], fp[k], fv, acc[f]);
        }
    }
}

// Writes acc / divisor[row] (rows 16w + r of the tile, r < 16) to out rows row0 + 16w + r below T (row n at
// out + n * row_stride), columns below width, through the warp's FP32 strip. One warp; divisor may be null (1).
template <int NF>
__device__ inline void attn_bf16_write(float* out, int64_t row_stride, FragC (&acc)[NF], int frags, float* strip,
                                       const float* divisor, int row0, int T, int width) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int f = 0; f < NF; f++) {
        if (f >= frags) break;
        wmma::store_matrix_sync(strip, acc[f], ATTN_BF16_STRIP_LD, wmma::mem_row_major);
        __syncwarp();
        for (int idx = lane; idx < 16 * 16; idx += 32) {
            const int r = idx / 16, c = idx % 16, row = row0 + warp * 16 + r, col = f * 16 + c;
            if (row < T && col < width)
                out[row * row_stride + col] = strip[r * ATTN_BF16_STRIP_LD + c] / (divisor ? divisor[r] : 1.0f);
        }
        __syncwarp();
    }
}

// grid (B*H, query tiles counted from the last), ATTN_BF16_THREADS threads; NF >= attn_bf16_pad(dv) / 16
template <int NF>
static __global__ void __launch_bounds__(ATTN_BF16_THREADS)
    attention_forward_bf16_kernel(float* o, float* lse, const float* q, const float* k, const float* v, int64_t v_ld,
                                  int T, int H, int dqk, int dv, float scale) {
    unsigned char* smem = dynamic_shared<unsigned char>();
    const AttnBf16Smem lay = attn_bf16_smem(dqk, dqk, dv, 0, 1);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = blockIdx.x, seq = bh / H, h = bh % H;
    const int qt = gridDim.y - 1 - blockIdx.y, i0 = qt * ATTN_BF16_ROWS;
    const int q_rows = T - i0 < ATTN_BF16_ROWS ? T - i0 : ATTN_BF16_ROWS;
    const int64_t qk_stride = (int64_t)H * dqk, v_stride = (int64_t)H * v_ld;
    const int ldq = attn_bf16_ld(dqk), ldv = attn_bf16_ld(dv), dqk16 = attn_bf16_pad(dqk);
    const int frags = attn_bf16_pad(dv) / 16;
    __nv_bfloat16* q_s = attn_bf16_region<__nv_bfloat16>(smem, lay.tile[0]);
    __nv_bfloat16* k_s = attn_bf16_region<__nv_bfloat16>(smem, lay.tile[1]);
    __nv_bfloat16* v_s = attn_bf16_region<__nv_bfloat16>(smem, lay.tile[2]);
    float* strip = attn_bf16_region<float>(smem, lay.strip) + warp * 16 * ATTN_BF16_STRIP_LD;
    __nv_bfloat16* p_s = attn_bf16_region<__nv_bfloat16>(smem, lay.p) + warp * 16 * ATTN_BF16_P_LD;
    float* row_index = attn_bf16_region<float>(smem, lay.row_of);
    float* m_s = attn_bf16_region<float>(smem, lay.stats) + warp * 16;  // running max, sum, last correction
    float* l_s = m_s + ATTN_BF16_ROWS;
    float* corr_s = l_s + ATTN_BF16_ROWS;

    attn_bf16_load(q_s, q + ((seq * T + i0) * H + h) * dqk, qk_stride, q_rows, dqk);
    for (int idx = threadIdx.x; idx < 256; idx += ATTN_BF16_THREADS) row_index[idx] = (float)(idx / 16);
    if (lane < 16) {
        m_s[lane] = -INFINITY;
        l_s[lane] = 0.0f;
    }
    __syncthreads();
    FragC row_of, acc[NF];
    wmma::load_matrix_sync(row_of, row_index, 16, wmma::mem_row_major);
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(acc[f], 0.0f);

    const int r = lane / 2, c0 = lane % 2, i = i0 + warp * 16 + r;  // this lane's softmax row and columns
    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * ATTN_BF16_ROWS, k_rows = T - j0 < ATTN_BF16_ROWS ? T - j0 : ATTN_BF16_ROWS;
        __syncthreads();  // every warp is done with the previous K and V
        attn_bf16_load(k_s, k + ((seq * T + j0) * H + h) * dqk, qk_stride, k_rows, dqk);
        attn_bf16_load(v_s, v + ((seq * T + j0) * H + h) * v_ld, v_stride, k_rows, dv);
        __syncthreads();
        attn_bf16_strip(strip, q_s + warp * 16 * ldq, ldq, k_s, ldq, dqk16);
        __syncwarp();
        float tile_max = -INFINITY;
        for (int c = c0; c < ATTN_BF16_ROWS; c += 2) {
            const bool counted = j0 + c <= i && i < T;
            const float s = counted ? strip[r * ATTN_BF16_STRIP_LD + c] * scale : -INFINITY;
            strip[r * ATTN_BF16_STRIP_LD + c] = s;
            tile_max = fmaxf(tile_max, s);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        const float m_old = m_s[r], m_new = fmaxf(m_old, tile_max);
        const float ref = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing counted yet: exp(-inf) = 0
        float sum = 0.0f;
        for (int c = c0; c < ATTN_BF16_ROWS; c += 2) {
            const __nv_bfloat16 p = __float2bfloat16_rn(expf(strip[r * ATTN_BF16_STRIP_LD + c] - ref));
            p_s[r * ATTN_BF16_P_LD + c] = p;
            sum += __bfloat162float(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        const float correction = expf(m_old - ref);
        __syncwarp();  // both lanes of the row have read m_s[r]
        if (lane % 2 == 0) {
            l_s[r] = l_s[r] * correction + sum;
            m_s[r] = m_new;
            corr_s[r] = correction;
        }
        __syncwarp();
        float row_correction[FragC::num_elements];  // of each fragment element's row
        for (int e = 0; e < FragC::num_elements; e++) row_correction[e] = corr_s[(int)row_of.x[e]];
#pragma unroll
        for (int f = 0; f < NF; f++)
            for (int e = 0; e < FragC::num_elements; e++) acc[f].x[e] *= row_correction[e];
        attn_bf16_accumulate(acc, p_s, v_s, ldv, frags);
    }
    attn_bf16_write(o + (seq * T * H + h) * dv, (int64_t)H * dv, acc, frags, strip, l_s, i0, T, dv);
    if (lane < 16 && i0 + warp * 16 + lane < T) lse[bh * T + i0 + warp * 16 + lane] = m_s[lane] + logf(l_s[lane]);
}

// The backward kernels' shared memory: the block's own two tiles (dqk wide, then dv wide: Q and dO for dq, K and V
// for dk/dv), the two streamed ones (the other pair), this warp's BF16 P / dS strip and FP32 S and dP strips, and
// the per-row floats.
struct AttnBf16BackwardSmem {
    __nv_bfloat16 *own_qk, *own_v, *streamed_qk, *streamed_v, *p;
    float *s_strip, *dp_strip, *stats;
};
__device__ inline AttnBf16BackwardSmem attn_bf16_backward_smem(int dqk, int dv) {
    unsigned char* smem = dynamic_shared<unsigned char>();
    const AttnBf16Smem lay = attn_bf16_smem(dqk, dv, dqk, dv, 2);
    const int warp = threadIdx.x / 32;
    AttnBf16BackwardSmem b;
    b.own_qk = attn_bf16_region<__nv_bfloat16>(smem, lay.tile[0]);
    b.own_v = attn_bf16_region<__nv_bfloat16>(smem, lay.tile[1]);
    b.streamed_qk = attn_bf16_region<__nv_bfloat16>(smem, lay.tile[2]);
    b.streamed_v = attn_bf16_region<__nv_bfloat16>(smem, lay.tile[3]);
    b.p = attn_bf16_region<__nv_bfloat16>(smem, lay.p) + warp * 16 * ATTN_BF16_P_LD;
    b.s_strip = attn_bf16_region<float>(smem, lay.strip) + warp * 16 * ATTN_BF16_STRIP_LD;
    b.dp_strip = b.s_strip + 4 * 16 * ATTN_BF16_STRIP_LD;
    b.stats = attn_bf16_region<float>(smem, lay.stats);
    return b;
}

// grid (B*H, query tiles counted from the last); NF >= attn_bf16_pad(dqk) / 16
template <int NF>
static __global__ void __launch_bounds__(ATTN_BF16_THREADS)
    attention_backward_dq_bf16_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v,
                                      int64_t v_ld, const float* lse, const float* D, int T, int H, int dqk, int dv,
                                      float scale) {
    const auto [q_s, do_s, k_s, v_s, ds_s, s_strip, dp_strip, stats] = attn_bf16_backward_smem(dqk, dv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = blockIdx.x, seq = bh / H, h = bh % H;
    const int qt = gridDim.y - 1 - blockIdx.y, i0 = qt * ATTN_BF16_ROWS;
    const int q_rows = T - i0 < ATTN_BF16_ROWS ? T - i0 : ATTN_BF16_ROWS;
    const int64_t qk_stride = (int64_t)H * dqk, v_stride = (int64_t)H * v_ld, o_stride = (int64_t)H * dv;
    const int ldq = attn_bf16_ld(dqk), ldv = attn_bf16_ld(dv);

    attn_bf16_load(q_s, q + ((seq * T + i0) * H + h) * dqk, qk_stride, q_rows, dqk);
    attn_bf16_load(do_s, dout + ((seq * T + i0) * H + h) * dv, o_stride, q_rows, dv);
    FragC acc[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(acc[f], 0.0f);
    const int r = lane / 2, c0 = lane % 2, i = i0 + warp * 16 + r;
    const float row_lse = i < T ? lse[bh * T + i] : 0.0f, row_d = i < T ? D[bh * T + i] : 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * ATTN_BF16_ROWS, k_rows = T - j0 < ATTN_BF16_ROWS ? T - j0 : ATTN_BF16_ROWS;
        __syncthreads();
        attn_bf16_load(k_s, k + ((seq * T + j0) * H + h) * dqk, qk_stride, k_rows, dqk);
        attn_bf16_load(v_s, v + ((seq * T + j0) * H + h) * v_ld, v_stride, k_rows, dv);
        __syncthreads();
        attn_bf16_strip(s_strip, q_s + warp * 16 * ldq, ldq, k_s, ldq, attn_bf16_pad(dqk));
        attn_bf16_strip(dp_strip, do_s + warp * 16 * ldv, ldv, v_s, ldv, attn_bf16_pad(dv));
        __syncwarp();
        for (int c = c0; c < ATTN_BF16_ROWS; c += 2) {
            const bool counted = j0 + c <= i && i < T;
            const float p = counted ? expf(s_strip[r * ATTN_BF16_STRIP_LD + c] * scale - row_lse) : 0.0f;
            const float dp = dp_strip[r * ATTN_BF16_STRIP_LD + c];
            ds_s[r * ATTN_BF16_P_LD + c] = __float2bfloat16_rn(p * (dp - row_d) * scale);
        }
        __syncwarp();
        attn_bf16_accumulate(acc, ds_s, k_s, ldq, attn_bf16_pad(dqk) / 16);
    }
    attn_bf16_write(dq + (seq * T * H + h) * dqk, qk_stride, acc, attn_bf16_pad(dqk) / 16, s_strip, nullptr, i0, T,
                    dqk);
}

// grid (B*H, key tiles, 2): z = 0 writes dk, z = 1 writes dv; NF >= attn_bf16_pad(max(dqk, dv)) / 16
template <int NF>
static __global__ void __launch_bounds__(ATTN_BF16_THREADS)
    attention_backward_dkdv_bf16_kernel(float* dk, float* dv_out, const float* dout, const float* q, const float* k,
                                        const float* v, int64_t v_ld, const float* lse, const float* D, int T, int H,
                                        int dqk, int dv, float scale) {
    const auto [k_s, v_s, q_s, do_s, p_s, s_strip, dp_strip, col_lse] = attn_bf16_backward_smem(dqk, dv);
    float* col_d = col_lse + ATTN_BF16_ROWS;  // col_lse, col_d: of the streamed tile's 64 queries
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = blockIdx.x, seq = bh / H, h = bh % H;
    const int kt = blockIdx.y, j0 = kt * ATTN_BF16_ROWS, q_tiles = gridDim.y;
    const int k_rows = T - j0 < ATTN_BF16_ROWS ? T - j0 : ATTN_BF16_ROWS;
    const bool is_dk = blockIdx.z == 0;  // the same for the whole block
    const int64_t qk_stride = (int64_t)H * dqk, v_stride = (int64_t)H * v_ld, o_stride = (int64_t)H * dv;
    const int ldq = attn_bf16_ld(dqk), ldv = attn_bf16_ld(dv);

    attn_bf16_load(k_s, k + ((seq * T + j0) * H + h) * dqk, qk_stride, k_rows, dqk);
    attn_bf16_load(v_s, v + ((seq * T + j0) * H + h) * v_ld, v_stride, k_rows, dv);
    FragC acc[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(acc[f], 0.0f);
    const int r = lane / 2, c0 = lane % 2, j = j0 + warp * 16 + r;  // this lane's key and query columns

    for (int qt = kt; qt < q_tiles; qt++) {
        const int i0 = qt * ATTN_BF16_ROWS, q_rows = T - i0 < ATTN_BF16_ROWS ? T - i0 : ATTN_BF16_ROWS;
        __syncthreads();
        attn_bf16_load(q_s, q + ((seq * T + i0) * H + h) * dqk, qk_stride, q_rows, dqk);
        attn_bf16_load(do_s, dout + ((seq * T + i0) * H + h) * dv, o_stride, q_rows, dv);
        for (int c = threadIdx.x; c < ATTN_BF16_ROWS; c += ATTN_BF16_THREADS) {
            col_lse[c] = i0 + c < T ? lse[bh * T + i0 + c] : 0.0f;
            col_d[c] = i0 + c < T ? D[bh * T + i0 + c] : 0.0f;
        }
        __syncthreads();
        attn_bf16_strip(s_strip, k_s + warp * 16 * ldq, ldq, q_s, ldq, attn_bf16_pad(dqk));  // S^T
        if (is_dk) attn_bf16_strip(dp_strip, v_s + warp * 16 * ldv, ldv, do_s, ldv, attn_bf16_pad(dv));  // dP^T
        __syncwarp();
        for (int c = c0; c < ATTN_BF16_ROWS; c += 2) {
            const int i = i0 + c;
            const bool counted = j <= i && i < T;
            const float p = counted ? expf(s_strip[r * ATTN_BF16_STRIP_LD + c] * scale - col_lse[c]) : 0.0f;
            const float val = is_dk ? p * (dp_strip[r * ATTN_BF16_STRIP_LD + c] - col_d[c]) * scale : p;
            p_s[r * ATTN_BF16_P_LD + c] = __float2bfloat16_rn(val);  // dS^T or P^T
        }
        __syncwarp();
        if (is_dk)
            attn_bf16_accumulate(acc, p_s, q_s, ldq, attn_bf16_pad(dqk) / 16);
        else
            attn_bf16_accumulate(acc, p_s, do_s, ldv, attn_bf16_pad(dv) / 16);
    }
    if (is_dk)
        attn_bf16_write(dk + (seq * T * H + h) * dqk, qk_stride, acc, attn_bf16_pad(dqk) / 16, s_strip, nullptr, j0,
                        T, dqk);
    else
        attn_bf16_write(dv_out + (seq * T * H + h) * v_ld, v_stride, acc, attn_bf16_pad(dv) / 16, s_strip, nullptr,
                        j0, T, dv);
}

// The launches behind attention_forward / attention_backward for Precision::BF16, with dqk, dv <=
// ATTN_BF16_MAX_DIM. The fragment count is a template parameter (accumulators in registers): one instance per
// 64 columns of head dim.
inline void attention_forward_bf16(float* o, float* lse, const float* q, const float* k, const float* v, int64_t v_ld,
                                   int B, int T, int H, int dqk, int dv, float scale, cudaStream_t stream) {
    const dim3 grid((unsigned)((int64_t)B * H), (unsigned)ceil_div(T, ATTN_BF16_ROWS));
    const size_t bytes = (size_t)attn_bf16_smem(dqk, dqk, dv, 0, 1).bytes;
    const int frags = attn_bf16_pad(dv) / 16;
    auto kernel = frags <= 4 ? attention_forward_bf16_kernel<4>
                  : frags <= 8 ? attention_forward_bf16_kernel<8>
                  : frags <= 12 ? attention_forward_bf16_kernel<12>
                                : attention_forward_bf16_kernel<16>;
    launch_kernel(kernel, grid, ATTN_BF16_THREADS, bytes, stream, o, lse, q, k, v, v_ld, T, H, dqk, dv, scale);
}

inline void attention_backward_bf16(float* dq, float* dk, float* dv_out, const float* D, const float* dout,
                                    const float* q, const float* k, const float* v, int64_t v_ld, const float* lse,
                                    int B, int T, int H, int dqk, int dv, float scale, cudaStream_t stream) {
    const unsigned bh = (unsigned)((int64_t)B * H), tiles = (unsigned)ceil_div(T, ATTN_BF16_ROWS);
    const size_t bytes = (size_t)attn_bf16_smem(dqk, dv, dqk, dv, 2).bytes;
    const int dq_frags = attn_bf16_pad(dqk) / 16, kv_frags = attn_bf16_pad(dqk > dv ? dqk : dv) / 16;
    auto dq_kernel = dq_frags <= 4 ? attention_backward_dq_bf16_kernel<4>
                     : dq_frags <= 8 ? attention_backward_dq_bf16_kernel<8>
                     : dq_frags <= 12 ? attention_backward_dq_bf16_kernel<12>
                                      : attention_backward_dq_bf16_kernel<16>;
    auto kv_kernel = kv_frags <= 4 ? attention_backward_dkdv_bf16_kernel<4>
                     : kv_frags <= 8 ? attention_backward_dkdv_bf16_kernel<8>
                     : kv_frags <= 12 ? attention_backward_dkdv_bf16_kernel<12>
                                      : attention_backward_dkdv_bf16_kernel<16>;
    launch_kernel(dq_kernel, dim3(bh, tiles), ATTN_BF16_THREADS, bytes, stream, dq, dout, q, k, v, v_ld, lse, D, T, H,
                  dqk, dv, scale);
    launch_kernel(kv_kernel, dim3(bh, tiles, 2), ATTN_BF16_THREADS, bytes, stream, dk, dv_out, dout, q, k, v, v_ld, lse,
                  D, T, H, dqk, dv, scale);
}

}  // namespace gpu
