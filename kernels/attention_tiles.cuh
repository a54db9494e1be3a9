// The tensor-core attention's tiles (kernels/attention_bf16.cuh), shared with the GPU model's device check: which
// head dims run on the tensor cores, and the shared memory a thread block takes.
// A thread block has 4 or 8 warps of 16 rows: its own tile has 16 x warps rows (the queries of the forward and dq,
// the keys of dk/dv); the tiles it streams have 64. Rows are BF16, padded to a multiple of 16 values plus 8, so that
// ldmatrix's eight row addresses fall in different banks: a tile is rows x (pad16(d) + 8) x 2 bytes.
//   forward: own Q (dqk), streamed K (dqk) and V (dv);  backward: own pair, streamed pair, 2 x 64 floats of statistics
// ATTN_BF16_WARPS is what the model runs; `make bench` times both. At DeepSeek's head dims 8 warps halve the bytes
// streamed per product and take 1.4x the shared memory in the forward, 1.5x in the backward.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int ATTN_BF16_ROWS = 64;      // rows of each streamed tile
constexpr int ATTN_BF16_WARPS = 4;      // warps of the model's thread blocks: own tiles of 64 rows
constexpr int ATTN_BF16_MAX_DIM = 256;  // head dims above this take the FP32 kernels (kernels/attention.cuh)

inline bool attention_on_tensor_cores(Precision precision, int dqk, int dv) {
    return precision == Precision::BF16 && dqk <= ATTN_BF16_MAX_DIM && dv <= ATTN_BF16_MAX_DIM;
}

__host__ __device__ inline int attn_bf16_pad(int d) { return (d + 15) / 16 * 16; }
// row stride in shared memory (BF16 elements)
__host__ __device__ inline int attn_bf16_ld(int d) { return attn_bf16_pad(d) + 8; }
__host__ __device__ inline int64_t attn_bf16_tile_bytes(int d, int rows) {
    return (int64_t)rows * attn_bf16_ld(d) * 2;
}
__host__ __device__ inline int64_t attn_bf16_forward_bytes(int dqk, int dv, int warps = ATTN_BF16_WARPS) {
    return attn_bf16_tile_bytes(dqk, 16 * warps) + attn_bf16_tile_bytes(dqk, ATTN_BF16_ROWS) +
           attn_bf16_tile_bytes(dv, ATTN_BF16_ROWS);
}
__host__ __device__ inline int64_t attn_bf16_backward_bytes(int dqk, int dv, int warps = ATTN_BF16_WARPS) {
    return attn_bf16_tile_bytes(dqk, 16 * warps) + attn_bf16_tile_bytes(dv, 16 * warps) +
           attn_bf16_tile_bytes(dqk, ATTN_BF16_ROWS) + attn_bf16_tile_bytes(dv, ATTN_BF16_ROWS) +
           2 * ATTN_BF16_ROWS * (int64_t)sizeof(float);
}

}  // namespace gpu
