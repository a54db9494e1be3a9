// The routed experts' BF16 GEMMs in one launch each, reading the experts' row offsets from device memory, so the
// host needs no group sizes (at EP 1 nothing waits for the expert counts). Rows [offsets[g], offsets[g+1]) of the
// expert rows are expert g's; W (G, N, K) holds a weight per expert; inputs BF16, sums and outputs FP32:
//   forward  out  (R, N) = inp (R, K) @ W_g^T
//   dinp     dinp (R, K) (=|+=) dout (R, N) @ W_g
//   dW       dW_g (N, K) (=|+=) dout_g^T @ inp_g     (an empty group: dW_g = 0, or unchanged with +=)
// Each is C (m x n) (=|+=) A (m x k) B (k x n) in 64 x 64 tiles of C, 4 warps of 16 rows on the tensor cores
// (mma.sync m16n8k16), k steps of 32 double-buffered with cp.async (dev/cuda/grouped_gemm.cu's version 4,
// generalised), A and B read with k contiguous or transposed (m or n contiguous) through ldmatrix .trans.
// Forward and dinp (one kernel): the groups split C's rows, and a block finds its (group, row tile) by walking the
// counts. dW (another): the groups split the summed rows, each group its own C.
// Every width a multiple of 8 and every pointer 16-byte aligned (cp.async moves 16-byte pieces): grouped_gemm_takes.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/async_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/mma_sync.cuh"

namespace gpu {

constexpr int GG_WARPS = 4, GG_BM = 16 * GG_WARPS, GG_BN = 64, GG_BK = 32;
constexpr int GG_LD_K = GG_BK + 8, GG_LD_MN = GG_BN + 8;  // smem row pitches: 80 and 144 bytes, conflict-free ldmatrix
constexpr int GG_TILE = GG_BM * GG_LD_MN;                  // BF16 values of one operand's tile, either layout
static_assert(GG_BM == GG_BN && GG_BN * GG_LD_K <= GG_TILE && GG_BK * GG_LD_MN <= GG_TILE, "tile sizes");

// dst (ROWS x COLS, pitch `pitch`) = src's ROWS x COLS values from its origin (row stride ld); rows from valid_rows
// on and columns from valid_cols on are zeros. In 16-byte pieces, copied with cp.async.
template <int ROWS, int COLS>
__device__ inline void gg_load_tile(__nv_bfloat16* dst, int pitch, const __nv_bfloat16* src, int64_t ld,
                                    int64_t valid_rows, int64_t valid_cols) {
    constexpr int PIECES = COLS / 8;
    for (int i = threadIdx.x; i < ROWS * PIECES; i += blockDim.x) {
        const int r = i / PIECES, c = i % PIECES * 8;
        __nv_bfloat16* d = dst + r * pitch + c;
        if (r < valid_rows && c < valid_cols) cp_async_16(d, src + r * ld + c);
        else *reinterpret_cast<uint4*>(d) = uint4{0, 0, 0, 0};
    }
}

// acc (the warp's 16 x 64 of C) += A's rows times B over one k step. As: (BM x BK, k contiguous) or with A_T
// (BK x BM); Bs: (BN x BK) or with B_T (BK x BN). ldmatrix_x4 takes a row address a lane: lane l gives row l % 8
// of 8 x 8 matrix q = l / 8. A's fragment is its quarters (rows 0-7 | 8-15) x (k 0-7 | 8-15) in the order
// q = 0, 1, 2, 3 = (0, 0), (8, 0), (0, 8), (8, 8); two B fragments (columns 8j, 8j + 8) are (k 0-7 | 8-15) of each.
// Stored transposed, the same matrices are read with .trans.
template <bool A_T, bool B_T>
__device__ inline void gg_mma_step(float (&acc)[8][4], const __nv_bfloat16* As, const __nv_bfloat16* Bs) {
    const int lane = threadIdx.x % 32, q = lane / 8, w0 = threadIdx.x / 32 * 16;
#pragma unroll
    for (int kk = 0; kk < GG_BK; kk += 16) {
        uint32_t a[4];
        const int am = w0 + q % 2 * 8, ak = kk + q / 2 * 8;  // this lane's matrix origin in A (m, k)
        if (A_T) ldmatrix_x4_trans(a, As + (ak + lane % 8) * GG_LD_MN + am);
        else ldmatrix_x4(a, As + (am + lane % 8) * GG_LD_K + ak);
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            uint32_t b[4];
            const int bn = 8 * j + q / 2 * 8, bk = kk + q % 2 * 8;  // this lane's matrix origin in B (n, k)
            if (B_T) ldmatrix_x4_trans(b, Bs + (bk + lane % 8) * GG_LD_MN + bn);
            else ldmatrix_x4(b, Bs + (bn + lane % 8) * GG_LD_K + bk);
            const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
            mma_bf16_16816(acc[j], a, b_lo);
            mma_bf16_16816(acc[j + 1], a, b_hi);
        }
    }
}

// The warp's accumulators into C (rows [m0, m_end), columns [n0, n_cols), row stride ldc): lane (g, t) = (lane / 4,
// lane % 4) holds rows g and g + 8 of each 16 x 8 tile, columns 2t and 2t + 1.
__device__ inline void gg_store(float* C, int64_t ldc, const float (&acc)[8][4], int64_t m0, int64_t m_end,
                                int64_t n0, int64_t n_cols, bool accumulate) {
    const int lane = threadIdx.x % 32;
    const int64_t row = m0 + threadIdx.x / 32 * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) {
            const int64_t r = row + e / 2 * 8, c = n0 + 8 * j + 2 * (lane % 4) + e % 2;
            if (r < m_end && c < n_cols) C[r * ldc + c] = accumulate ? C[r * ldc + c] + acc[j][e] : acc[j][e];
        }
}

// acc += the block's k steps: load(stage, s) queues step s's two tiles into a stage (2 x GG_TILE values of dynamic
// shared memory) with cp.async, step s + 1's landing while step s multiplies. Every iteration commits a group (the
// last an empty one), so "all but the newest group landed" is this step's.
template <bool A_T, bool B_T, typename Load>
__device__ inline void gg_steps(float (&acc)[8][4], int64_t steps, Load&& load) {
    __nv_bfloat16* smem = dynamic_shared<__nv_bfloat16>();
    if (steps == 0) return;
    load(smem, 0);
    cp_async_commit();
    for (int64_t s = 0; s < steps; s++) {
        if (s + 1 < steps) load(smem + (s + 1) % 2 * 2 * GG_TILE, s + 1);  // the stage step s - 1 read, now free
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // every thread's copies of step s have landed
        const __nv_bfloat16* stage = smem + s % 2 * 2 * GG_TILE;
        gg_mma_step<A_T, B_T>(acc, stage, stage + GG_TILE);
        __syncthreads();  // every warp is done with this stage before step s + 2's copies overwrite it
    }
}

// Block `slot`'s tile when every group's rows are cut into tiles of GG_BM, the groups in order: its group g and
// rows [m0, m_end); false past the last tile.
__device__ inline bool gg_row_tile(const int64_t* offsets, int G, int64_t slot, int& g, int64_t& m0, int64_t& m_end) {
    for (g = 0; g < G; g++) {
        const int64_t rows = offsets[g + 1] - offsets[g], tiles = (rows + GG_BM - 1) / GG_BM;
        if (slot < tiles) {
            m0 = offsets[g] + slot * GG_BM;
            m_end = min(m0 + GG_BM, offsets[g + 1]);
            return true;
        }
        slot -= tiles;
    }
    return false;
}

// Forward (B_T false) and dinp (B_T true): C rows [m0, m_end) of group g, columns from blockIdx.x * GG_BN, summed
// over k_sum. A: the rows (R, k_sum); B: W_g (n_cols, k_sum) for the forward, (k_sum, n_cols) for dinp. Grid:
// (column tiles, row tiles + G); dynamic shared memory 2 stages x 2 tiles.
template <bool B_T>
__global__ void grouped_gemm_rows_kernel(float* C, const __nv_bfloat16* A, const __nv_bfloat16* W,
                                         const int64_t* offsets, int G, int64_t n_cols, int64_t k_sum,
                                         bool accumulate) {
    int g;
    int64_t m0, m_end;
    if (!gg_row_tile(offsets, G, blockIdx.y, g, m0, m_end)) return;
    const int64_t n0 = (int64_t)blockIdx.x * GG_BN;
    const __nv_bfloat16* Wg = W + (int64_t)g * n_cols * k_sum;
    float acc[8][4] = {};
    gg_steps<false, B_T>(acc, (k_sum + GG_BK - 1) / GG_BK, [&](__nv_bfloat16* stage, int64_t s) {
        const int64_t k0 = s * GG_BK;
        gg_load_tile<GG_BM, GG_BK>(stage, GG_LD_K, A + m0 * k_sum + k0, k_sum, m_end - m0, k_sum - k0);
        if (B_T) gg_load_tile<GG_BK, GG_BN>(stage + GG_TILE, GG_LD_MN, Wg + k0 * n_cols + n0, n_cols, k_sum - k0,
                                            n_cols - n0);
        else gg_load_tile<GG_BN, GG_BK>(stage + GG_TILE, GG_LD_K, Wg + n0 * k_sum + k0, k_sum, n_cols - n0, k_sum - k0);
    });
    gg_store(C, n_cols, acc, m0, m_end, n0, n_cols, accumulate);
}

// dW: block (j, i, g) makes dW_g's rows [64 i, 64 i + 64) and columns [64 j, 64 j + 64), summing over group g's
// rows: A = dout (R, N) read transposed, B = inp (R, K).
static __global__ void grouped_gemm_dW_kernel(float* dW, const __nv_bfloat16* dout, const __nv_bfloat16* inp,
                                       const int64_t* offsets, int64_t N, int64_t K, bool accumulate) {
    const int64_t g = blockIdx.z, r0 = offsets[g], rows = offsets[g + 1] - r0;
    const int64_t i0 = (int64_t)blockIdx.y * GG_BM, j0 = (int64_t)blockIdx.x * GG_BN;
    float acc[8][4] = {};
    gg_steps<true, true>(acc, (rows + GG_BK - 1) / GG_BK, [&](__nv_bfloat16* stage, int64_t s) {
        const int64_t r = r0 + s * GG_BK;
        gg_load_tile<GG_BK, GG_BM>(stage, GG_LD_MN, dout + r * N + i0, N, rows - s * GG_BK, N - i0);
        gg_load_tile<GG_BK, GG_BN>(stage + GG_TILE, GG_LD_MN, inp + r * K + j0, K, rows - s * GG_BK, K - j0);
    });
    if (rows > 0 || !accumulate) gg_store(dW + g * N * K, K, acc, i0, N, j0, K, accumulate);
}

// Whether the grouped kernels take widths K and N: multiples of 8. Their pointers must be 16-byte aligned too, as
// every buffer of the arenas is (256 bytes).
inline bool grouped_gemm_takes(int64_t K, int64_t N) { return K % 8 == 0 && N % 8 == 0; }

constexpr size_t GG_SHARED_BYTES = 2 * 2 * GG_TILE * sizeof(__nv_bfloat16);

// out (R, N) = inp (R, K) @ W_g^T for the R rows of the G groups (offsets on the device, offsets[0] = 0)
inline void grouped_gemm_forward(float* out, const __nv_bfloat16* inp, const __nv_bfloat16* W, const int64_t* offsets,
                                 int G, int64_t R, int64_t K, int64_t N, cudaStream_t stream) {
    if (R == 0 || G == 0 || N == 0) return;
    const dim3 grid((unsigned)ceil_div(N, GG_BN), (unsigned)(ceil_div(R, GG_BM) + G));
    launch_kernel(grouped_gemm_rows_kernel<false>, grid, 32 * GG_WARPS, GG_SHARED_BYTES, stream, out, inp, W, offsets,
                  G, N, K, false);
}

// dinp (R, K) (=|+=) dout (R, N) @ W_g
inline void grouped_gemm_dinp(float* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* W, const int64_t* offsets,
                              int G, int64_t R, int64_t K, int64_t N, bool accumulate, cudaStream_t stream) {
    if (R == 0 || G == 0 || K == 0) return;
    const dim3 grid((unsigned)ceil_div(K, GG_BN), (unsigned)(ceil_div(R, GG_BM) + G));
    launch_kernel(grouped_gemm_rows_kernel<true>, grid, 32 * GG_WARPS, GG_SHARED_BYTES, stream, dinp, dout, W,
                  offsets, G, K, N, accumulate);
}

// dW_g (N, K) (=|+=) dout_g^T @ inp_g for every group g (an empty group's dW_g set to zero, or left with +=)
inline void grouped_gemm_dW(float* dW, const __nv_bfloat16* dout, const __nv_bfloat16* inp, const int64_t* offsets,
                            int G, int64_t K, int64_t N, bool accumulate, cudaStream_t stream) {
    if (G == 0 || N == 0 || K == 0) return;
    const dim3 grid((unsigned)ceil_div(K, GG_BN), (unsigned)ceil_div(N, GG_BM), (unsigned)G);
    launch_kernel(grouped_gemm_dW_kernel, grid, 32 * GG_WARPS, GG_SHARED_BYTES, stream, dW, dout, inp, offsets, N, K,
                  accumulate);
}

}  // namespace gpu
