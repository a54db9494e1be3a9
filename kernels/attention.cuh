// Causal multi-head attention core, FP32 (docs/design.md §1.1, §6; the CPU's is the attention of model/mla.cpp).
// Per sequence and head, with q_i, k_j (dqk values) and v_j (dv values) of tokens i, j:
//   forward:  s_ij = scale q_i.k_j (j <= i);  L_i = log sum_j exp(s_ij) (saved);  P_ij = exp(s_ij - L_i);
//             o_i = sum_j P_ij v_j
//   backward: D_i = dO_i . o_i;  P recomputed from q, k, L;  dP_ij = dO_i . v_j;  dS_ij = P_ij (dP_ij - D_i) scale;
//             dq_i = sum_{j<=i} dS_ij k_j;  dk_j = sum_{i>=j} dS_ij q_i;  dv_j = sum_{i>=j} P_ij dO_i
// Layouts (N = B*T tokens): q, k, dq, dk (N, H, dqk); o, dO (N, H, dv); L and the scratch D (B, H, T). v and dv are
// strided, value e of (n, h) at [(n*H + h)*v_ld + e], to live inside MLA's kv (N, H*(dn+dv)) at offset dn = v_ld - dv.
// Flash style: 64 x 64 tiles, no T x T matrix in memory. No atomics: each sum runs in a fixed order, the CPU's.
// Masks: (i, j) counts iff j <= i < T; the padding rows and columns of a last partial tile are loaded as zeros.
// Precision::BF16 runs kernels/attention_bf16.cuh instead (same contract) for head dims up to ATTN_BF16_MAX_DIM. This
// readable version serves --dtype fp32 and wider heads. Left for speed: a resident Q tile, float4 and cp.async loads.
#pragma once
#include <cstdint>

#include "kernels/attention_bf16.cuh"
#include "kernels/common.cuh"

namespace gpu {

// 256 threads; thread (ty, tx) = (tid / 16, tid % 16) owns tile entries (ty + 16a, tx + 16b), a, b < 4, so a tile
// row lives in one half-warp. Shared memory is two 64 x ATTN_LD buffers, whatever dqk and dv: head dims stream
// through them in chunks of 64 columns. Outputs stay in registers, ATTN_SLAB columns a thread block; wider outputs
// are split into slabs over gridDim.z, each recomputing its scores.
constexpr int ATTN_TILE = 64;                  // queries and keys per tile, and columns per chunk
constexpr int ATTN_LD = ATTN_TILE + 1;         // shared buffer row stride; the pad avoids bank conflicts
constexpr int ATTN_THREADS = 256;              // 16 x 16 threads, 4 x 4 entries each
constexpr int ATTN_SLAB = 4 * ATTN_TILE;       // output columns per thread block (4 register chunks)

// buf (64 x ATTN_LD) = rows 0..63 (row r at src + r * stride), columns col0..col0+63 of src; zeros at rows >= `rows`
// and columns >= width. Coalesced: a warp reads 32 consecutive columns.
__device__ inline void attn_load_chunk(float* buf, const float* src, int64_t stride, int rows, int col0, int width) {
    for (int idx = threadIdx.x; idx < ATTN_TILE * ATTN_TILE; idx += ATTN_THREADS) {
        const int r = idx / ATTN_TILE, e = idx % ATTN_TILE;
        buf[r * ATTN_LD + e] = r < rows && col0 + e < width ? src[r * stride + col0 + e] : 0.0f;
    }
}

// acc[a][b] += sum_{e < len} A[ty + 16a][e] * Bm[tx + 16b][e]: rows of A at A + r * a_stride (a_rows valid),
// rows of Bm at Bm + c * b_stride (b_rows valid). Invalid rows give 0. Sums over e in order.
__device__ inline void attn_tile_dot(float (&acc)[4][4], const float* A, int64_t a_stride, int a_rows, const float* Bm,
                                     int64_t b_stride, int b_rows, int len, float* buf0, float* buf1) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    for (int e0 = 0; e0 < len; e0 += ATTN_TILE) {
        __syncthreads();  // every thread is done with both buffers: the last chunk's, or the caller's P and V
        attn_load_chunk(buf0, A, a_stride, a_rows, e0, len);
        attn_load_chunk(buf1, Bm, b_stride, b_rows, e0, len);
        __syncthreads();
        const int n = len - e0 < ATTN_TILE ? len - e0 : ATTN_TILE;
        for (int e = 0; e < n; e++) {
            float x[4], y[4];
#pragma unroll
            for (int a = 0; a < 4; a++) x[a] = buf0[(ty + 16 * a) * ATTN_LD + e];
#pragma unroll
            for (int b = 0; b < 4; b++) y[b] = buf1[(tx + 16 * b) * ATTN_LD + e];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) acc[a][b] += x[a] * y[b];
        }
    }
}

// Writes the thread's 4 x 4 entries into buf0 (64 x ATTN_LD) after every thread is done reading it.
__device__ inline void attn_store_tile(float* buf0, const float (&val)[4][4]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) buf0[(ty + 16 * a) * ATTN_LD + tx + 16 * b] = val[a][b];
}

// acc[a][b] += sum_{k < rows} P[ty + 16a][k] * V[k][col0 + tx + 16b]: P (64 x 64) in buf0 from attn_store_tile,
// rows of V at V + k * v_stride (`rows` valid), columns below `width` valid. Sums over k in order.
__device__ inline void attn_tile_pv(float (&acc)[4][4], const float* buf0, const float* V, int64_t v_stride, int rows,
                                    int col0, int width, float* buf1) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    __syncthreads();  // P is complete; every thread is done with buf1
    attn_load_chunk(buf1, V, v_stride, rows, col0, width);
    __syncthreads();
    for (int k = 0; k < rows; k++) {
        float p[4], x[4];
#pragma unroll
        for (int a = 0; a < 4; a++) p[a] = buf0[(ty + 16 * a) * ATTN_LD + k];
#pragma unroll
        for (int b = 0; b < 4; b++) x[b] = buf1[k * ATTN_LD + tx + 16 * b];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) acc[a][b] += p[a] * x[b];
    }
}

// max and sum over the 16 threads of a half-warp (one tile row); each gets the result
__device__ inline float attn_row_max(float v) {
    for (int offset = 8; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
__device__ inline float attn_row_sum(float v) {
    for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// A thread's slab accumulator acc[c][a][b]: column chunk c, its rows ty + 16a, its columns tx + 16b.
__device__ inline void attn_zero(float (&acc)[4][4][4]) {
#pragma unroll
    for (int c = 0; c < 4; c++)
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) acc[c][a][b] = 0.0f;
}

// Writes acc / divisor[a] to the rows row0 + ty + 16a below T of out (row r at out + r * row_stride), columns
// col_base + 64c + tx + 16b below width.
__device__ inline void attn_write_rows(float* out, int64_t row_stride, const float (&acc)[4][4][4],
                                       const float (&divisor)[4], int row0, int T, int col_base, int width) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int r = row0 + ty + 16 * a;
        if (r >= T) continue;
        float* row = out + r * row_stride;
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int col = col_base + c * ATTN_TILE + tx + 16 * b;
                if (col < width) row[col] = acc[c][a][b] / divisor[a];
            }
    }
}

// Where a thread block of the forward or dq grid works: x = b*H + h, y = query tile counted from the last, so the
// longest tiles start first, z = column slab.
struct AttnQueryTile {
    int64_t bh, seq, h;
    int qt, i0, q_rows, col_base;
    int64_t qk_stride, v_stride;
    const float *q_tile, *k_seq, *v_seq;
};
__device__ inline AttnQueryTile attn_query_tile(const float* q, const float* k, const float* v, int64_t v_ld, int T,
                                                int H, int dqk) {
    AttnQueryTile t;
    t.bh = blockIdx.x;
    t.seq = t.bh / H;
    t.h = t.bh % H;
    t.qt = gridDim.y - 1 - blockIdx.y;
    t.i0 = t.qt * ATTN_TILE;
    t.q_rows = T - t.i0 < ATTN_TILE ? T - t.i0 : ATTN_TILE;
    t.col_base = blockIdx.z * ATTN_SLAB;
    t.qk_stride = (int64_t)H * dqk;
    t.v_stride = (int64_t)H * v_ld;
    t.q_tile = q + ((t.seq * T + t.i0) * H + t.h) * dqk;
    t.k_seq = k + (t.seq * T * H + t.h) * dqk;
    t.v_seq = v + (t.seq * T * H + t.h) * v_ld;
    return t;
}

// grid (B*H, query tiles, dv slabs). Online softmax over key tiles 0..diagonal: per row a running max m and sum l,
// acc rescaled by exp(m_old - m_new) as m grows; o = acc / l, and slab 0 writes L = m + log l. A real row meets key
// 0 in the first tile, so its m is finite from then on; a padding row keeps m = -inf and is never written.
static __global__ void __launch_bounds__(ATTN_THREADS)
    attention_forward_kernel(float* o, float* lse, const float* q, const float* k, const float* v, int64_t v_ld,
                             int T, int H, int dqk, int dv, float scale) {
    __shared__ float buf0[ATTN_TILE * ATTN_LD], buf1[ATTN_TILE * ATTN_LD];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const auto [bh, seq, h, qt, i0, q_rows, col_base, qk_stride, v_stride, q_tile, k_seq, v_seq] =
        attn_query_tile(q, k, v, v_ld, T, H, dqk);
    float m[4], l[4], acc[4][4][4];
    attn_zero(acc);
#pragma unroll
    for (int a = 0; a < 4; a++) {
        m[a] = -INFINITY;
        l[a] = 0.0f;
    }
    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * ATTN_TILE, k_rows = T - j0 < ATTN_TILE ? T - j0 : ATTN_TILE;
        float s[4][4] = {};
        attn_tile_dot(s, q_tile, qk_stride, q_rows, k_seq + j0 * qk_stride, qk_stride, k_rows, dqk, buf0, buf1);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int i = i0 + ty + 16 * a;
            float tile_max = -INFINITY;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int j = j0 + tx + 16 * b;
                s[a][b] = j <= i && i < T ? s[a][b] * scale : -INFINITY;
                tile_max = fmaxf(tile_max, s[a][b]);
            }
            const float m_new = fmaxf(m[a], attn_row_max(tile_max));
            const float ref = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing counted yet: exp(-inf) = 0
            const float correction = expf(m[a] - ref);
            float sum = 0.0f;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                s[a][b] = expf(s[a][b] - ref);
                sum += s[a][b];
            }
            l[a] = l[a] * correction + attn_row_sum(sum);
            m[a] = m_new;
#pragma unroll
            for (int c = 0; c < 4; c++)
#pragma unroll
                for (int b = 0; b < 4; b++) acc[c][a][b] *= correction;
        }
        attn_store_tile(buf0, s);
#pragma unroll
        for (int c = 0; c < 4; c++)  // uniform over the thread block: attn_tile_pv syncs
            if (col_base + c * ATTN_TILE < dv)
                attn_tile_pv(acc[c], buf0, v_seq + j0 * v_stride, v_stride, k_rows, col_base + c * ATTN_TILE, dv,
                             buf1);
    }
    attn_write_rows(o + (seq * T * H + h) * dv, (int64_t)H * dv, acc, l, i0, T, col_base, dv);
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int i = i0 + ty + 16 * a;
        if (i < T && blockIdx.z == 0 && tx == 0) lse[bh * T + i] = m[a] + logf(l[a]);
    }
}

// one warp per (token n, head h): D[b][h][t] = sum_e dO[n,h,e] o[n,h,e]  (n = b*T + t)
static __global__ void attention_backward_d_kernel(float* D, const float* dout, const float* o, int64_t rows, int T,
                                                   int H, int dv) {
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;  // n*H + h; the same for a warp
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps only
    float sum = 0.0f;
    for (int e = lane; e < dv; e += 32) sum += dout[row * dv + e] * o[row * dv + e];
    sum = warp_sum(sum);
    const int64_t n = row / H, h = row % H, seq = n / T, t = n % T;
    if (lane == 0) D[(seq * H + h) * T + t] = sum;
}

// grid (B*H, query tiles, dqk slabs): over key tiles 0..diagonal, S and dP by attn_tile_dot, dS in registers,
// dq += dS K by attn_tile_pv. The CPU's pass 1.
static __global__ void __launch_bounds__(ATTN_THREADS)
    attention_backward_dq_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v,
                                 int64_t v_ld, const float* lse, const float* D, int T, int H, int dqk, int dv,
                                 float scale) {
    __shared__ float buf0[ATTN_TILE * ATTN_LD], buf1[ATTN_TILE * ATTN_LD];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const auto [bh, seq, h, qt, i0, q_rows, col_base, qk_stride, v_stride, q_tile, k_seq, v_seq] =
        attn_query_tile(q, k, v, v_ld, T, H, dqk);
    const int64_t o_stride = (int64_t)H * dv;
    const float* do_tile = dout + ((seq * T + i0) * H + h) * dv;
    float row_lse[4], row_d[4], acc[4][4][4];
    attn_zero(acc);
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int i = i0 + ty + 16 * a;
        row_lse[a] = i < T ? lse[bh * T + i] : 0.0f;
        row_d[a] = i < T ? D[bh * T + i] : 0.0f;
    }
    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * ATTN_TILE, k_rows = T - j0 < ATTN_TILE ? T - j0 : ATTN_TILE;
        float s[4][4] = {}, dp[4][4] = {};
        attn_tile_dot(s, q_tile, qk_stride, q_rows, k_seq + j0 * qk_stride, qk_stride, k_rows, dqk, buf0, buf1);
        attn_tile_dot(dp, do_tile, o_stride, q_rows, v_seq + j0 * v_stride, v_stride, k_rows, dv, buf0, buf1);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int i = i0 + ty + 16 * a;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int j = j0 + tx + 16 * b;
                const float p = j <= i && i < T ? expf(s[a][b] * scale - row_lse[a]) : 0.0f;
                s[a][b] = p * (dp[a][b] - row_d[a]) * scale;  // dS
            }
        }
        attn_store_tile(buf0, s);
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (col_base + c * ATTN_TILE < dqk)
                attn_tile_pv(acc[c], buf0, k_seq + j0 * qk_stride, qk_stride, k_rows, col_base + c * ATTN_TILE, dqk,
                             buf1);
    }
    const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    attn_write_rows(dq + (seq * T * H + h) * dqk, qk_stride, acc, one, i0, T, col_base, dqk);
}

// grid (B*H, key tiles, dk slabs + dv slabs): slab z < dk_slabs writes dk columns, the others dv columns. Over query
// tiles diagonal..last: S^T = K Q^T; dv += P^T dO, or dk += dS^T Q with dP^T = V dO^T. The CPU's pass 2. The dk and
// dv slabs are separate thread blocks: more parallelism, fewer registers.
static __global__ void __launch_bounds__(ATTN_THREADS)
    attention_backward_dkdv_kernel(float* dk, float* dv_out, const float* dout, const float* q, const float* k,
                                   const float* v, int64_t v_ld, const float* lse, const float* D, int T, int H,
                                   int dqk, int dv, float scale, int dk_slabs) {
    __shared__ float buf0[ATTN_TILE * ATTN_LD], buf1[ATTN_TILE * ATTN_LD];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t bh = blockIdx.x, seq = bh / H, h = bh % H;
    const int kt = blockIdx.y, j0 = kt * ATTN_TILE, q_tiles = gridDim.y;
    const int k_rows = T - j0 < ATTN_TILE ? T - j0 : ATTN_TILE;
    const bool is_dk = (int)blockIdx.z < dk_slabs;  // uniform over the thread block
    const int col_base = (int)(is_dk ? blockIdx.z : blockIdx.z - dk_slabs) * ATTN_SLAB, width = is_dk ? dqk : dv;
    const int64_t qk_stride = (int64_t)H * dqk, v_stride = (int64_t)H * v_ld, o_stride = (int64_t)H * dv;
    const float* k_tile = k + ((seq * T + j0) * H + h) * dqk;
    const float* v_tile = v + ((seq * T + j0) * H + h) * v_ld;
    const float* q_seq = q + (seq * T * H + h) * dqk;
    const float* do_seq = dout + (seq * T * H + h) * dv;
    float acc[4][4][4];
    attn_zero(acc);
    for (int qt = kt; qt < q_tiles; qt++) {
        const int i0 = qt * ATTN_TILE, q_rows = T - i0 < ATTN_TILE ? T - i0 : ATTN_TILE;
        float col_lse[4], col_d[4];  // of the queries i0 + tx + 16b
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int i = i0 + tx + 16 * b;
            col_lse[b] = i < T ? lse[bh * T + i] : 0.0f;
            col_d[b] = i < T ? D[bh * T + i] : 0.0f;
        }
        // transposed tiles: entry (a, b) is key j = j0 + ty + 16a, query i = i0 + tx + 16b
        float s[4][4] = {}, dp[4][4] = {};
        attn_tile_dot(s, k_tile, qk_stride, k_rows, q_seq + i0 * qk_stride, qk_stride, q_rows, dqk, buf0, buf1);
        if (is_dk)
            attn_tile_dot(dp, v_tile, v_stride, k_rows, do_seq + i0 * o_stride, o_stride, q_rows, dv, buf0, buf1);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int j = j0 + ty + 16 * a;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int i = i0 + tx + 16 * b;
                const float p = j <= i && i < T ? expf(s[a][b] * scale - col_lse[b]) : 0.0f;
                s[a][b] = is_dk ? p * (dp[a][b] - col_d[b]) * scale : p;  // dS^T or P^T
            }
        }
        attn_store_tile(buf0, s);
        const float* rhs = is_dk ? q_seq + i0 * qk_stride : do_seq + i0 * o_stride;  // Q or dO rows of the tile
        const int64_t rhs_stride = is_dk ? qk_stride : o_stride;
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (col_base + c * ATTN_TILE < width)
                attn_tile_pv(acc[c], buf0, rhs, rhs_stride, q_rows, col_base + c * ATTN_TILE, width, buf1);
    }
    const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    if (is_dk)
        attn_write_rows(dk + (seq * T * H + h) * dqk, qk_stride, acc, one, j0, T, col_base, width);
    else
        attn_write_rows(dv_out + (seq * T * H + h) * v_ld, v_stride, acc, one, j0, T, col_base, width);
}

// q, k (B*T, H, dqk); v strided by v_ld (see the top) -> o (B*T, H, dv), lse (B, H, T). scale: the softmax scale
// (attention_softmax_scale of model/rope.h). FP32 throughout (attention_forward_bf16 for BF16).
inline void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, int64_t v_ld,
                              int B, int T, int H, int dqk, int dv, float scale, cudaStream_t stream) {
    if ((int64_t)B * T * H == 0) return;
    const dim3 grid((unsigned)((int64_t)B * H), (unsigned)ceil_div(T, ATTN_TILE), (unsigned)ceil_div(dv, ATTN_SLAB));
    launch_kernel(attention_forward_kernel, grid, ATTN_THREADS, 0, stream, o, lse, q, k, v, v_ld, T, H, dqk, dv, scale);
}

// D: a float per (b, h, t)
inline int64_t attention_backward_scratch_floats(int B, int T, int H) { return (int64_t)B * H * T; }

// D (B, H, T) into scratch: one warp per (token, head)
inline void attention_backward_d(float* scratch, const float* dout, const float* o, int B, int T, int H, int dv,
                                 cudaStream_t stream) {
    const int64_t rows = (int64_t)B * T * H;
    constexpr int d_threads = 256;
    launch_kernel(attention_backward_d_kernel, (unsigned)ceil_div(rows * 32, d_threads), d_threads, 0, stream, scratch,
                  dout, o, rows, T, H, dv);
}

// dout (B*T, H, dv) and the forward's inputs, o and lse -> dq, dk (B*T, H, dqk) and dv_out (strided by v_ld like v),
// all overwritten (dv_out's other columns, e.g. k_nope's inside dkv, untouched). FP32 throughout.
inline void attention_backward(float* dq, float* dk, float* dv_out, float* scratch, const float* dout, const float* q,
                               const float* k, const float* v, int64_t v_ld, const float* o, const float* lse, int B,
                               int T, int H, int dqk, int dv, float scale, cudaStream_t stream) {
    if ((int64_t)B * T * H == 0) return;
    attention_backward_d(scratch, dout, o, B, T, H, dv, stream);
    const unsigned bh = (unsigned)((int64_t)B * H), tiles = (unsigned)ceil_div(T, ATTN_TILE);
    const int dk_slabs = (int)ceil_div(dqk, ATTN_SLAB), dv_slabs = (int)ceil_div(dv, ATTN_SLAB);
    launch_kernel(attention_backward_dq_kernel, dim3(bh, tiles, dk_slabs), ATTN_THREADS, 0, stream, dq, dout, q, k, v,
                  v_ld, lse, scratch, T, H, dqk, dv, scale);
    launch_kernel(attention_backward_dkdv_kernel, dim3(bh, tiles, dk_slabs + dv_slabs), ATTN_THREADS, 0, stream, dk,
                  dv_out, dout, q, k, v, v_ld, lse, scratch, T, H, dqk, dv, scale, dk_slabs);
}

// The BF16 backward (kernels/attention_bf16.cuh): q, k, v (strided by v_ld) and dout16 (B*T, H, dv) in BF16; dout
// (the same values in FP32) and o for D; -> dq, dk (B*T, H, dqk) and dv_out (strided by dv_ld), FP32, overwritten.
template <int WARPS = ATTN_BF16_WARPS>
inline void attention_backward_bf16(float* dq, float* dk, float* dv_out, int64_t dv_ld, float* scratch,
                                    const float* dout, const __nv_bfloat16* dout16, const __nv_bfloat16* q,
                                    const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t v_ld, const float* o,
                                    const float* lse, int B, int T, int H, int dqk, int dv, float scale,
                                    cudaStream_t stream) {
    if ((int64_t)B * T * H == 0) return;
    static_assert(WARPS == 4 || WARPS == 8, "blocks of 4 or 8 warps");
    attn_bf16_check_dims("attention_backward_bf16", dqk, dv);
    attention_backward_d(scratch, dout, o, B, T, H, dv, stream);
    const unsigned bh = (unsigned)((int64_t)B * H), tiles = (unsigned)ceil_div(T, 16 * WARPS);
    const size_t bytes = (size_t)attn_bf16_backward_bytes(dqk, dv, WARPS);
    const int dq_nt = attn_bf16_tile_class(dqk), kv_nt = attn_bf16_tile_class(dqk > dv ? dqk : dv);
    auto dq_kernel = dq_nt == 8    ? attention_backward_dq_bf16_kernel<8, WARPS>
                     : dq_nt == 16 ? attention_backward_dq_bf16_kernel<16, WARPS>
                     : dq_nt == 24 ? attention_backward_dq_bf16_kernel<24, WARPS>
                                   : attention_backward_dq_bf16_kernel<32, WARPS>;
    auto kv_kernel = kv_nt == 8    ? attention_backward_dkdv_bf16_kernel<8, WARPS>
                     : kv_nt == 16 ? attention_backward_dkdv_bf16_kernel<16, WARPS>
                     : kv_nt == 24 ? attention_backward_dkdv_bf16_kernel<24, WARPS>
                                   : attention_backward_dkdv_bf16_kernel<32, WARPS>;
    launch_kernel(dq_kernel, dim3(bh, tiles), 32 * WARPS, bytes, stream, dq, dout16, q, k, v, v_ld, lse, scratch, T,
                  H, dqk, dv, scale);
    launch_kernel(kv_kernel, dim3(bh, tiles, 2), 32 * WARPS, bytes, stream, dk, dv_out, dv_ld, dout16, q, k, v, v_ld,
                  lse, scratch, T, H, dqk, dv, scale);
}

}  // namespace gpu
