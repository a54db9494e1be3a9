// The tensor-core attention's tiles (kernels/attention_bf16.cuh), shared by its kernels, by the GPU model's device
// check and by the CPU stand-in: which head dims run on the tensor cores, and the shared memory a block takes.
// A tile is 64 rows of BF16, each row padded to a multiple of 16 values plus 8 (so that ldmatrix's eight row
// addresses fall in different banks): 64 x (pad16(d) + 8) x 2 bytes, a multiple of 128.
//   forward block:  Q and K (dqk wide), V (dv wide)                                  2 tile(dqk) + tile(dv)
//   backward block: its own pair, the streamed pair, 2 x 64 floats of statistics     2 (tile(dqk) + tile(dv)) + 512
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int ATTN_BF16_ROWS = 64;      // rows of the block's tile, and of each streamed tile
constexpr int ATTN_BF16_MAX_DIM = 256;  // head dims above this take the FP32 kernels (kernels/attention.cuh)

// Whether Precision::BF16 runs on the tensor cores for these head dims
inline bool attention_on_tensor_cores(Precision precision, int dqk, int dv) {
    return precision == Precision::BF16 && dqk <= ATTN_BF16_MAX_DIM && dv <= ATTN_BF16_MAX_DIM;
}

__host__ __device__ inline int attn_bf16_pad(int d) { return (d + 15) / 16 * 16; }
// row stride in shared memory (BF16 elements)
__host__ __device__ inline int attn_bf16_ld(int d) { return attn_bf16_pad(d) + 8; }
__host__ __device__ inline int64_t attn_bf16_tile_bytes(int d) {
    return (int64_t)ATTN_BF16_ROWS * attn_bf16_ld(d) * 2;  // 2 bytes a BF16 value
}
__host__ __device__ inline int64_t attn_bf16_forward_bytes(int dqk, int dv) {
    return 2 * attn_bf16_tile_bytes(dqk) + attn_bf16_tile_bytes(dv);
}
__host__ __device__ inline int64_t attn_bf16_backward_bytes(int dqk, int dv) {
    return 2 * (attn_bf16_tile_bytes(dqk) + attn_bf16_tile_bytes(dv)) + 2 * ATTN_BF16_ROWS * (int64_t)sizeof(float);
}

}  // namespace gpu
