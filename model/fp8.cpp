// E4M3 rounding, tile scaling, and the linear layers' three GEMMs on rounded operands (see fp8.h).
#include "fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "bf16.h"
#include "ops.h"

float e4m3_round(float x) {
    const float a = std::fabs(x);
    if (!(a < E4M3_MAX)) return std::isnan(x) ? x : std::copysign(E4M3_MAX, x);
    if (a < 0x1p-6f) return std::nearbyint(x * 512.0f) / 512.0f;  // the subnormals: multiples of 2^-9
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7FFFFu + ((u >> 20) & 1u);  // the 23 mantissa bits rounded to 3, ties to even (448 at most)
    u &= ~0xFFFFFu;
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

// Tile rows [r0, r1) x columns [c0, c1) of x (cols wide): writes q, or q * scale if dequantize; returns the scale.
static float quantize_tile(float* out, const float* x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                           bool dequantize) {
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) amax = std::max(amax, std::fabs(x[r * cols + c]));
    const float scale = std::max(amax, FP8_MIN_AMAX) / E4M3_MAX;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            const float q = e4m3_round(x[r * cols + c] / scale);
            out[r * cols + c] = dequantize ? q * scale : q;
        }
    return scale;
}

// Every tile of x through quantize_tile; scales (ceil(rows / tile_rows), ceil(cols / tile_cols)) or nullptr.
static void quantize_tiles(float* out, float* scales, const float* x, int64_t rows, int64_t cols, int64_t tile_rows,
                           int64_t tile_cols, bool dequantize) {
    const int64_t tiles_down = (rows + tile_rows - 1) / tile_rows, tiles_across = (cols + tile_cols - 1) / tile_cols;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t tr = 0; tr < tiles_down; tr++)
        for (int64_t tc = 0; tc < tiles_across; tc++) {
            const int64_t r0 = tr * tile_rows, c0 = tc * tile_cols;
            const float scale = quantize_tile(out, x, cols, r0, std::min(rows, r0 + tile_rows), c0,
                                              std::min(cols, c0 + tile_cols), dequantize);
            if (scales) scales[tr * tiles_across + tc] = scale;
        }
}

void fp8_quantize(float* q, float* scales, const float* x, int64_t rows, int64_t cols, int64_t tile_rows,
                  int64_t tile_cols) {
    quantize_tiles(q, scales, x, rows, cols, tile_rows, tile_cols, false);
}

void fp8_round_trip(float* out, const float* x, int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols) {
    quantize_tiles(out, nullptr, x, rows, cols, tile_rows, tile_cols, true);
}

// W's E4M3 copy is made from its BF16 working copy, as the GPU's (gpu/weights.cu): W8 = Q[128x128](bf16(W))
static void weight_round_trip(float* W8, const float* W, int64_t N, int64_t K) {
    for (int64_t i = 0; i < N * K; i++) W8[i] = bf16_round(W[i]);
    fp8_round_trip(W8, W8, N, K, FP8_TILE, FP8_TILE);
}

void linear_forward(Precision p, float* out, const float* inp, const float* W, int64_t M, int64_t K, int64_t N) {
    if (p != Precision::FP8) return matmul_forward(out, inp, W, M, K, N);
    std::vector<float> inp8(M * K), W8(N * K);
    fp8_round_trip(inp8.data(), inp, M, K, 1, FP8_TILE);
    weight_round_trip(W8.data(), W, N, K);
    matmul_forward(out, inp8.data(), W8.data(), M, K, N);
}

void linear_backward(Precision p, float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                     int64_t M, int64_t K, int64_t N, bool accumulate_dinp) {
    if (p != Precision::FP8) return matmul_backward(dinp, dW, dout, inp, W, M, K, N, accumulate_dinp);
    if (dinp) {  // summed over N: dout in 1 x 128 tiles along N, W in its 128 x 128 blocks
        std::vector<float> dout8(M * N), W8(N * K);
        fp8_round_trip(dout8.data(), dout, M, N, 1, FP8_TILE);
        weight_round_trip(W8.data(), W, N, K);
        gemm_nn(dinp, dout8.data(), W8.data(), M, N, K, accumulate_dinp);
    }
    // summed over the M tokens: both operands in 128 x 1 tiles down the rows
    std::vector<float> dout8(M * N), inp8(M * K);
    fp8_round_trip(dout8.data(), dout, M, N, FP8_TILE, 1);
    fp8_round_trip(inp8.data(), inp, M, K, FP8_TILE, 1);
    matmul_backward(nullptr, dW, dout8.data(), inp8.data(), W, M, K, N, false);
}

void grouped_linear_forward(Precision p, float* out, const float* inp, const float* W, const int64_t* offsets,
                            int64_t G, int64_t K, int64_t N) {
    for (int64_t g = 0; g < G; g++) {
        const int64_t first = offsets[g], rows = offsets[g + 1] - first;
        if (rows > 0) linear_forward(p, out + first * N, inp + first * K, W + g * N * K, rows, K, N);
    }
}

void grouped_linear_backward(Precision p, float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                             const int64_t* offsets, int64_t G, int64_t K, int64_t N, bool accumulate_dinp) {
    for (int64_t g = 0; g < G; g++) {
        const int64_t first = offsets[g], rows = offsets[g + 1] - first;
        if (rows > 0)
            linear_backward(p, dinp + first * K, dW + g * N * K, dout + first * N, inp + first * K, W + g * N * K,
                            rows, K, N, accumulate_dinp);
    }
}
