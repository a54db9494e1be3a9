// FP8 (E4M3) quantization with DeepSeek-V3's fine-grained scales (docs/design.md §1.5), into the layouts that
// cuBLASLt's block-scaled GEMMs read (docs/design.md §7.3: `outer` rows of `inner` contiguous values). Per tile or
// block, scale = max(amax, FP8_MIN_AMAX) / 448 and q = E4M3(x / scale), with an IEEE division and round to nearest
// even with saturation: model/fp8.h's bits.
//   fp8_quantize_rows    x (rows, cols), FP32 or BF16, 1 x 128 tiles -> q (round_up(rows, 4), cols) with rows
//                        [rows, round_up(rows, 4)) zero, scales (outer = rows): the forward's and the input
//                        gradient's operands (cuBLASLt takes row counts that are multiples of 4)
//   fp8_quantize_cols    x (rows, cols), 128 x 1 tiles, transposed -> q^T (cols, ld) with rows [rows, ld) zero,
//                        scales (outer = cols, inner = ld): the weight gradient's operands, summed over the tokens
//   fp8_quantize_blocks  W (batch, rows, cols) BF16 (the model's working copy) or FP32, 128 x 128 blocks -> q
//                        (rows, cols) and q^T (cols, rows), each with its scales: W for the forward, W^T for the
//                        input gradient
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "model/fp8.h"

namespace gpu {

constexpr int FP8_THREADS = 256;
constexpr int FP8_COL_TILE = 32;  // columns per thread block of fp8_quantize_cols

__host__ __device__ inline int64_t round_up(int64_t a, int64_t multiple) { return ceil_div(a, multiple) * multiple; }
__host__ __device__ inline int64_t fp8_vec128_scales(int64_t outer, int64_t inner) {
    return ceil_div(inner, FP8_TILE) * round_up(outer, 4);
}
__host__ __device__ inline int64_t fp8_blk128_scales(int64_t outer, int64_t inner) {
    return ceil_div(outer, FP8_TILE) * round_up(ceil_div(inner, FP8_TILE), 4);
}

__device__ inline float fp8_scale_of(float amax) { return fmaxf(amax, FP8_MIN_AMAX) / E4M3_MAX; }
__device__ inline __nv_fp8_storage_t to_e4m3(float x, float scale) {
    return __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
}
__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// 1 x 128 tiles: a warp per tile, 4 values a thread; the padding rows are tiles of zeros
template <typename T>
static __global__ void fp8_quantize_rows_kernel(__nv_fp8_storage_t* q, float* scales, const T* x, int64_t rows,
                                                int64_t cols) {
    const int lane = threadIdx.x % 32;
    const int64_t tiles_across = ceil_div(cols, FP8_TILE);
    const int64_t tile = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int64_t r = tile / tiles_across, b = tile % tiles_across;
    if (r >= round_up(rows, 4)) return;  // the whole warp
    const int64_t c0 = b * FP8_TILE + lane * 4;
    float v[4], amax = 0.0f;
    for (int i = 0; i < 4; i++) {
        v[i] = r < rows && c0 + i < cols ? to_float(x[r * cols + c0 + i]) : 0.0f;
        amax = fmaxf(amax, fabsf(v[i]));
    }
    const float scale = fp8_scale_of(warp_max(amax));
    for (int i = 0; i < 4; i++)
        if (c0 + i < cols) q[r * cols + c0 + i] = to_e4m3(v[i], scale);
    if (lane == 0) scales[b * round_up(rows, 4) + r] = scale;
}

// q (round_up(rows, 4), cols) and scales (fp8_vec128_scales(rows, cols)) from x (rows, cols)
template <typename T>
inline void fp8_quantize_rows(__nv_fp8_storage_t* q, float* scales, const T* x, int64_t rows, int64_t cols,
                              cudaStream_t stream) {
    const int64_t tiles = round_up(rows, 4) * ceil_div(cols, FP8_TILE), warps = FP8_THREADS / 32;
    if (tiles == 0) return;
    launch_kernel(fp8_quantize_rows_kernel<T>, (unsigned)ceil_div(tiles, warps), FP8_THREADS, 0, stream, q, scales, x,
                  rows, cols);
}

// fp8_quantize_cols_kernel's shared memory, declared outside the template (docs/design.md §4)
struct Fp8ColsShared {
    float tile[FP8_TILE][FP8_COL_TILE + 1];  // + 1: no bank conflicts down a column
    float partial[8][FP8_COL_TILE];
};
static __device__ inline Fp8ColsShared& fp8_cols_shared() {
    __shared__ Fp8ColsShared shared;
    return shared;
}

// 128 x 1 tiles, transposed: a thread block takes 128 rows x 32 columns through shared memory. Thread (tx, ty) of
// 32 x 8 loads column tx of rows ty, ty + 8, ...; warp ty writes the transposed rows of columns 4ty .. 4ty + 3.
template <typename T>
static __global__ void fp8_quantize_cols_kernel(__nv_fp8_storage_t* qt, float* scales, const T* x, int64_t rows,
                                                int64_t cols, int64_t ld) {
    float(&tile)[FP8_TILE][FP8_COL_TILE + 1] = fp8_cols_shared().tile;
    float(&partial)[8][FP8_COL_TILE] = fp8_cols_shared().partial;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t r0 = (int64_t)blockIdx.y * FP8_TILE, c0 = (int64_t)blockIdx.x * FP8_COL_TILE;
    float amax = 0.0f;
    for (int i = ty; i < FP8_TILE; i += 8) {
        const int64_t r = r0 + i, c = c0 + tx;
        tile[i][tx] = r < rows && c < cols ? to_float(x[r * cols + c]) : 0.0f;
        amax = fmaxf(amax, fabsf(tile[i][tx]));
    }
    partial[ty][tx] = amax;
    __syncthreads();
    for (int j = ty * 4; j < ty * 4 + 4; j++) {
        const int64_t c = c0 + j;
        if (c >= cols) break;
        float column_amax = 0.0f;
        for (int w = 0; w < 8; w++) column_amax = fmaxf(column_amax, partial[w][j]);
        const float scale = fp8_scale_of(column_amax);
        for (int i = tx * 4; i < tx * 4 + 4; i++)
            if (r0 + i < ld) qt[c * ld + r0 + i] = to_e4m3(tile[i][j], scale);
        if (tx == 0) scales[blockIdx.y * round_up(cols, 4) + c] = scale;
    }
}

// qt (cols, ld) and scales (fp8_vec128_scales(cols, ld)) from x (rows, cols); rows <= ld <= round_up(rows, 128)
template <typename T>
inline void fp8_quantize_cols(__nv_fp8_storage_t* qt, float* scales, const T* x, int64_t rows, int64_t cols, int64_t ld,
                              cudaStream_t stream) {
    if (ld < rows || ld > round_up(rows, FP8_TILE)) {
        fprintf(stderr, "internal error: fp8_quantize_cols: ld %ld for %ld rows\n", (long)ld, (long)rows);
        exit(1);
    }
    if (rows == 0 || cols == 0) return;
    const dim3 grid((unsigned)ceil_div(cols, FP8_COL_TILE), (unsigned)ceil_div(rows, FP8_TILE));
    launch_kernel(fp8_quantize_cols_kernel<T>, grid, FP8_THREADS, 0, stream, qt, scales, x, rows, cols, ld);
}

// 128 x 128 blocks: a thread block per block of W writes both copies
template <typename T>
static __global__ void fp8_quantize_blocks_kernel(__nv_fp8_storage_t* q, __nv_fp8_storage_t* qt, float* scales,
                                                  float* scales_t, const T* W, int64_t rows, int64_t cols) {
    const int64_t matrix = blockIdx.z, b = blockIdx.x, rb = blockIdx.y;
    W += matrix * rows * cols;
    q += matrix * rows * cols;
    qt += matrix * rows * cols;
    scales += matrix * fp8_blk128_scales(rows, cols);
    scales_t += matrix * fp8_blk128_scales(cols, rows);
    const int64_t r0 = rb * FP8_TILE, c0 = b * FP8_TILE;
    const int64_t height = rows - r0 < FP8_TILE ? rows - r0 : FP8_TILE,
                  width = cols - c0 < FP8_TILE ? cols - c0 : FP8_TILE;
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < height * width; i += blockDim.x)
        amax = fmaxf(amax, fabsf(to_float(W[(r0 + i / width) * cols + c0 + i % width])));
    const float scale = fp8_scale_of(block_max(amax));
    for (int64_t i = threadIdx.x; i < height * width; i += blockDim.x) {  // along W's rows
        const int64_t r = r0 + i / width, c = c0 + i % width;
        q[r * cols + c] = to_e4m3(to_float(W[r * cols + c]), scale);
    }
    for (int64_t i = threadIdx.x; i < height * width; i += blockDim.x) {  // along W^T's rows
        const int64_t c = c0 + i / height, r = r0 + i % height;
        qt[c * rows + r] = to_e4m3(to_float(W[r * cols + c]), scale);
    }
    if (threadIdx.x == 0) {
        scales[rb * round_up(ceil_div(cols, FP8_TILE), 4) + b] = scale;
        scales_t[b * round_up(ceil_div(rows, FP8_TILE), 4) + rb] = scale;
    }
}

// For each of the batch matrices W (rows, cols): q (rows, cols) with scales (fp8_blk128_scales(rows, cols)) and
// q^T (cols, rows) with scales_t (fp8_blk128_scales(cols, rows)); matrix z of each at z times its size.
template <typename T>
inline void fp8_quantize_blocks(__nv_fp8_storage_t* q, __nv_fp8_storage_t* qt, float* scales, float* scales_t,
                                const T* W, int64_t batch, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (batch == 0 || rows == 0 || cols == 0) return;
    const dim3 grid((unsigned)ceil_div(cols, FP8_TILE), (unsigned)ceil_div(rows, FP8_TILE), (unsigned)batch);
    launch_kernel(fp8_quantize_blocks_kernel<T>, grid, FP8_THREADS, 0, stream, q, qt, scales, scales_t, W, rows, cols);
}

}  // namespace gpu
