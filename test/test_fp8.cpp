// The CPU's FP8 recipe (model/fp8.h): E4M3 rounding against the format's table, the tile scales against their
// definition, and the linear layer's three products against sums written out from the quantized values and scales
// (the weight's from its BF16 rounding).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/bf16.h"
#include "model/fp8.h"
#include "model/ops.h"
#include "model/rng.h"

// The value of E4M3 code c (0..126 positive finite): exponent e = c >> 3 (bias 7), mantissa m = c & 7.
static float e4m3_value(int c) {
    const int e = c >> 3, m = c & 7;
    return e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
}

TEST_CASE("fp8: e4m3_round is the nearest E4M3 value, ties to the even code, saturating at 448") {
    CHECK(e4m3_value(126) == 448.0f);
    CHECK(e4m3_value(1) == std::ldexp(1.0f, -9));
    for (int c = 0; c <= 126; c++)
        for (float sign : {1.0f, -1.0f}) {
            const float v = sign * e4m3_value(c);
            CHECK(e4m3_round(v) == v);
            if (c == 126) continue;
            const float next = sign * e4m3_value(c + 1), mid = (v + next) / 2;  // exact: a few bits more
            CHECK(e4m3_round(mid) == (c % 2 == 0 ? v : next));
            CHECK(e4m3_round(std::nextafter(mid, v)) == v);
            CHECK(e4m3_round(std::nextafter(mid, next)) == next);
        }
    CHECK(e4m3_round(460.0f) == 448.0f);
    CHECK(e4m3_round(-1e30f) == -448.0f);
    CHECK(e4m3_round(INFINITY) == 448.0f);
    CHECK(std::isnan(e4m3_round(NAN)));
    CHECK(std::signbit(e4m3_round(-0.0f)));
}

// x (rows, cols): row r scaled by 2^(r % 24 - 12), so tiles see very different magnitudes; one all-zero row.
static std::vector<float> spread_matrix(int64_t rows, int64_t cols, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> x(rows * cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            x[r * cols + c] = r == 7 ? 0.0f : std::ldexp(rng.normal(), (int)(r % 24) - 12);
    return x;
}

// W (rows, cols) ~ N(0, 0.02^2): one magnitude, as a weight matrix
static std::vector<float> weight_matrix(int64_t rows, int64_t cols, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> w(rows * cols);
    for (float& v : w) v = 0.02f * rng.normal();
    return w;
}

TEST_CASE("fp8: fp8_quantize scales every tile by its amax / 448 and rounds within half an E4M3 step") {
    const int64_t rows = 300, cols = 200;  // partial tiles at both edges for every shape
    const std::vector<float> x = spread_matrix(rows, cols, 11);
    const int64_t shapes[3][2] = {{1, FP8_TILE}, {FP8_TILE, FP8_TILE}, {FP8_TILE, 1}};
    for (const auto& shape : shapes) {
        const int64_t th = shape[0], tw = shape[1], down = (rows + th - 1) / th, across = (cols + tw - 1) / tw;
        std::vector<float> q(rows * cols), scales(down * across), back(rows * cols);
        fp8_quantize(q.data(), scales.data(), x.data(), rows, cols, th, tw);
        fp8_round_trip(back.data(), x.data(), rows, cols, th, tw);
        int wrong_scale = 0, not_e4m3 = 0, no_448 = 0, too_far = 0, not_product = 0;
        for (int64_t tr = 0; tr < down; tr++)
            for (int64_t tc = 0; tc < across; tc++) {
                float amax = 0, qmax = 0;
                for (int64_t r = tr * th; r < std::min(rows, (tr + 1) * th); r++)
                    for (int64_t c = tc * tw; c < std::min(cols, (tc + 1) * tw); c++) {
                        amax = std::max(amax, std::fabs(x[r * cols + c]));
                        qmax = std::max(qmax, std::fabs(q[r * cols + c]));
                    }
                const float scale = scales[tr * across + tc];
                wrong_scale += scale != std::max(amax, FP8_MIN_AMAX) / E4M3_MAX;
                no_448 += amax > 0 && qmax != E4M3_MAX;  // the largest element lands on 448
                for (int64_t r = tr * th; r < std::min(rows, (tr + 1) * th); r++)
                    for (int64_t c = tc * tw; c < std::min(cols, (tc + 1) * tw); c++) {
                        const int64_t i = r * cols + c;
                        not_e4m3 += e4m3_round(q[i]) != q[i];
                        // half a step: 2^-4 relative for normals, 2^-10 (in units of the scale) for subnormals
                        too_far += std::fabs(q[i] * scale - x[i]) >
                                   std::ldexp(std::fabs(x[i]), -4) + std::ldexp(scale, -10) * 1.0001f;
                        not_product += back[i] != q[i] * scale;
                    }
            }
        CAPTURE(th);
        CAPTURE(tw);
        CHECK(wrong_scale == 0);
        CHECK(no_448 == 0);
        CHECK(not_e4m3 == 0);
        CHECK(too_far == 0);
        CHECK(not_product == 0);
    }
}

// W's values rounded to BF16: the working copy the weight's E4M3 copy is made from
static std::vector<float> bf16_rounded(std::vector<float> W) {
    for (float& w : W) w = bf16_round(w);
    return W;
}

// sum_i a_i b_i written out, and sum_i |a_i b_i| for the tolerance of a sum in another order
struct Dot {
    double sum = 0, abs_sum = 0;
    void add(double a, double b) {
        sum += a * b;
        abs_sum += std::fabs(a * b);
    }
};

TEST_CASE("fp8: the linear layer's three products use the recipe's tiles (1x128, 128x128, 128x1)") {
    const int64_t M = 260, K = 200, N = 150;  // two full token tiles and a partial one
    const std::vector<float> x = spread_matrix(M, K, 21), dy = spread_matrix(M, N, 22);
    const std::vector<float> W = weight_matrix(N, K, 23);
    auto quantized = [](const std::vector<float>& v, int64_t rows, int64_t cols, int64_t th, int64_t tw) {
        std::vector<float> q(rows * cols), s(((rows + th - 1) / th) * ((cols + tw - 1) / tw));
        fp8_quantize(q.data(), s.data(), v.data(), rows, cols, th, tw);
        const int64_t across = (cols + tw - 1) / tw;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) q[r * cols + c] *= s[(r / th) * across + c / tw];
        return q;
    };
    const std::vector<float> x_rows = quantized(x, M, K, 1, FP8_TILE), dy_rows = quantized(dy, M, N, 1, FP8_TILE),
                             W_blocks = quantized(bf16_rounded(W), N, K, FP8_TILE, FP8_TILE),
                             x_cols = quantized(x, M, K, FP8_TILE, 1), dy_cols = quantized(dy, M, N, FP8_TILE, 1);

    std::vector<float> y(M * N), dx(M * K), dW(N * K, 0.0f);
    linear_forward(Precision::FP8, y.data(), x.data(), W.data(), M, K, N);
    linear_backward(Precision::FP8, dx.data(), dW.data(), dy.data(), x.data(), W.data(), M, K, N, false);
    const double rel = 1e-5;  // FP32 sums of at most 260 terms in another order
    int y_off = 0, dx_off = 0, dW_off = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            Dot want;
            for (int64_t k = 0; k < K; k++) want.add(x_rows[i * K + k], W_blocks[j * K + k]);
            y_off += std::fabs(y[i * N + j] - want.sum) > rel * want.abs_sum + 1e-30;
        }
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) {
            Dot want;
            for (int64_t j = 0; j < N; j++) want.add(dy_rows[i * N + j], W_blocks[j * K + k]);
            dx_off += std::fabs(dx[i * K + k] - want.sum) > rel * want.abs_sum + 1e-30;
        }
    for (int64_t j = 0; j < N; j++)
        for (int64_t k = 0; k < K; k++) {
            Dot want;
            for (int64_t i = 0; i < M; i++) want.add(dy_cols[i * N + j], x_cols[i * K + k]);
            dW_off += std::fabs(dW[j * K + k] - want.sum) > rel * want.abs_sum + 1e-30;
        }
    CHECK(y_off == 0);
    CHECK(dx_off == 0);
    CHECK(dW_off == 0);

    // and the rounding is real: FP8 differs from FP32 in most outputs
    std::vector<float> y32(M * N);
    matmul_forward(y32.data(), x.data(), W.data(), M, K, N);
    int64_t differ = 0;
    for (int64_t i = 0; i < M * N; i++) differ += y[i] != y32[i];
    CHECK(differ > M * N * 9 / 10);
}

TEST_CASE("fp8: an outlier token changes no other token's output (per-token tiles, unlike one scale per tensor)") {
    const int64_t M = 64, K = 96, N = 40;
    std::vector<float> x = spread_matrix(M, K, 31);
    const std::vector<float> W = weight_matrix(N, K, 32);
    std::vector<float> y(M * N), y_outlier(M * N);
    linear_forward(Precision::FP8, y.data(), x.data(), W.data(), M, K, N);
    for (int64_t k = 0; k < K; k++) x[5 * K + k] *= 1000.0f;
    linear_forward(Precision::FP8, y_outlier.data(), x.data(), W.data(), M, K, N);
    int64_t changed_elsewhere = 0, changed_row = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            (i == 5 ? changed_row : changed_elsewhere) += y[i * N + j] != y_outlier[i * N + j];
    CHECK(changed_elsewhere == 0);
    CHECK(changed_row == N);
}
