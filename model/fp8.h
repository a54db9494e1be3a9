// DeepSeek-V3's FP8 recipe on the CPU (docs/design.md §1.5): the reference for the GPU's FP8 GEMMs, and a way to
// see what FP8 does to training on any machine. E4M3: largest 448, smallest normal 2^-6, subnormals in steps of
// 2^-9, no infinities. A tile (partial at the edges) shares scale = max(amax, FP8_MIN_AMAX) / 448, and
// q = E4M3(x / scale), x ~ q scale. A linear layer is three products of such values, with FP32 sums (W: the weight's
// BF16 working copy, from which the GPU makes its E4M3 copies):
//   forward   y  = Q[1x128](x)  Q[128x128](W)^T
//   backward  dx = Q[1x128](dy) Q[128x128](W)
//             dW += Q[128x1](dy)^T Q[128x1](x)
#pragma once
#include <cstdint>

constexpr float E4M3_MAX = 448.0f;
constexpr float FP8_MIN_AMAX = 1e-10f;  // a tile of zeros (or of values below this) still gets a finite scale
constexpr int64_t FP8_TILE = 128;

// The E4M3 value nearest to x (ties to even), saturating at +-448, NaN kept: as CUDA's __NV_SATFINITE conversion.
float e4m3_round(float x);

// x (rows, cols) row-major in tiles of tile_rows x tile_cols -> q (rows, cols), each an E4M3 value, and
// scales (ceil(rows / tile_rows), ceil(cols / tile_cols)) row-major. q may be x (in place).
void fp8_quantize(float* q, float* scales, const float* x, int64_t rows, int64_t cols, int64_t tile_rows,
                  int64_t tile_cols);
// The same, returning q * scale: the value an FP8 GEMM multiplies. out may be x.
void fp8_round_trip(float* out, const float* x, int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols);

// The GEMM inputs' precision (--dtype). The CPU runs FP32, or FP8 for the linear layers inside the blocks
// (docs/design.md §1.5); BF16 is the GPU's (gpu/model.h).
enum class Precision { FP32, BF16, FP8 };

// As model/ops.h's matmul_forward / matmul_backward; FP8 rounds the operands as above.
void linear_forward(Precision p, float* out, const float* inp, const float* W, int64_t M, int64_t K, int64_t N);
void linear_backward(Precision p, float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                     int64_t M, int64_t K, int64_t N, bool accumulate_dinp);
// Per group g, a routed expert: rows [offsets[g], offsets[g+1]) with matrix g of the stacked W (G, N, K).
void grouped_linear_forward(Precision p, float* out, const float* inp, const float* W, const int64_t* offsets,
                            int64_t G, int64_t K, int64_t N);
void grouped_linear_backward(Precision p, float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                             const int64_t* offsets, int64_t G, int64_t K, int64_t N, bool accumulate_dinp);
