// DeepSeek-V3's FP8 recipe on the CPU (docs/design.md §1.5): the reference the GPU's FP8 GEMMs are checked against, and a
// way to see what FP8 does to training on any machine.
//
// E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; largest finite 448 = 1.75 * 2^8, smallest normal 2^-6,
// subnormals in steps of 2^-9. No infinities (S.1111.111 is NaN).
// Fine-grained scaling: a matrix is cut into tiles (1 x 128 for activations and their gradients along the summed
// dimension, 128 x 128 for weights, 128 x 1 for the weight gradient's operands, whose summed dimension is the
// tokens); each tile gets scale = max(amax, FP8_MIN_AMAX) / 448 and its elements become q = E4M3(x / scale),
// x ~ q * scale. Partial tiles at the edges are tiles of what is there.
// A linear layer y = x W^T in FP8 (every one inside the transformer blocks) is then three products of such values
// with FP32 sums:
//   forward   y  = Q[1x128](x)  Q[128x128](W)^T
//   backward  dx = Q[1x128](dy) Q[128x128](W)
//             dW += Q[128x1](dy)^T Q[128x1](x)
#pragma once
#include <cstdint>

constexpr float E4M3_MAX = 448.0f;
constexpr float FP8_MIN_AMAX = 1e-10f;  // a tile of zeros (or of values below this) still gets a finite scale
constexpr int64_t FP8_TILE = 128;

// The E4M3 value nearest to x (ties to even), saturating at +-448; NaN stays NaN. As the GPU's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3).
float e4m3_round(float x);

// x (rows, cols) row-major in tiles of tile_rows x tile_cols -> q (rows, cols), each an E4M3 value, and
// scales (ceil(rows / tile_rows), ceil(cols / tile_cols)) row-major. q may be x (in place).
void fp8_quantize(float* q, float* scales, const float* x, int64_t rows, int64_t cols, int64_t tile_rows,
                  int64_t tile_cols);
// The same, returning q * scale: the value an FP8 GEMM multiplies. out may be x.
void fp8_round_trip(float* out, const float* x, int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols);

// The precision of the GEMM inputs, chosen at run time (--dtype). The CPU model computes FP32 and, for the linear
// layers inside the transformer blocks (the attention's projections, the dense FFNs', the shared and routed
// experts' matrices), FP8 as above; the router, the head, the embedding and the MTP projection stay FP32. BF16 is the
// GPU's (gpu/model.h).
enum class Precision { FP32, BF16, FP8 };

// As model/ops.h's matmul_forward / matmul_backward; FP8 rounds the operands as above.
void linear_forward(Precision p, float* out, const float* inp, const float* W, int64_t M, int64_t K, int64_t N);
void linear_backward(Precision p, float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                     int64_t M, int64_t K, int64_t N, bool accumulate_dinp);
// The same per group g: rows [offsets[g], offsets[g+1]) with weight g of the stacked W (G, N, K) (the routed experts).
void grouped_linear_forward(Precision p, float* out, const float* inp, const float* W, const int64_t* offsets,
                            int64_t G, int64_t K, int64_t N);
void grouped_linear_backward(Precision p, float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                             const int64_t* offsets, int64_t G, int64_t K, int64_t N, bool accumulate_dinp);
