// The CPU reference ops. One GEMM kernel serves every linear layer: C (M, N) = op(A) (M, K) @ op(B) (K, N), either
// operand read transposed in place. Each thread packs a panel of op(B), K rows of 16 columns, contiguously, then
// sweeps row tiles over it: 6 x 16 values of C stay in registers while K streams (12 of AVX2's 16 registers).
// Packing keeps the panel's rows from sharing L1 sets when N is a multiple of 1024 (4 KiB strides map to one set).
// Each C value is summed over k in order, so results are the same bits for any number of threads.
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

static constexpr int64_t GEMM_ROWS = 6, GEMM_COLS = 16;

// Element (i, k) of op(A) is A[i * row_stride + k * k_stride]: (K, 1) for A (M, K), (1, M) for A^T stored (K, M)
struct Strided {
    const float* data;
    int64_t row_stride, k_stride;
};

// panel (K, 16) = columns [j0, j0 + cols) of op(B), zeros beyond cols; op(B) (K, N) is B (K, N), or B^T with B (N, K)
static void pack_panel(float* panel, const float* B, bool b_transposed, int64_t K, int64_t N, int64_t j0,
                       int64_t cols) {
    for (int64_t k = 0; k < K; k++)
        for (int64_t c = 0; c < GEMM_COLS; c++)
            panel[k * GEMM_COLS + c] = c >= cols ? 0.0f : b_transposed ? B[(j0 + c) * K + k] : B[k * N + j0 + c];
}

// acc (rows, 16) += op(A) rows [i0, i0 + rows) @ panel. FULL (rows == 6): the constant trip count lets the compiler
// keep acc in registers.
template <bool FULL>
static inline void tile_product(float (&acc)[GEMM_ROWS][GEMM_COLS], Strided A, const float* panel, int64_t K,
                                int64_t i0, int64_t rows) {
    for (int64_t k = 0; k < K; k++) {
        const float* b = panel + k * GEMM_COLS;
        for (int64_t r = 0; r < (FULL ? GEMM_ROWS : rows); r++) {
            const float a = A.data[(i0 + r) * A.row_stride + k * A.k_stride];
#pragma omp simd
            for (int64_t c = 0; c < GEMM_COLS; c++) acc[r][c] += a * b[c];
        }
    }
}

// C rows [i0, i0 + rows), columns [j0, j0 + cols) (=|+=) op(A) rows @ panel; rows <= 6, cols <= 16
static inline void gemm_tile(float* C, Strided A, const float* panel, int64_t K, int64_t N, int64_t i0, int64_t rows,
                             int64_t j0, int64_t cols, bool accumulate) {
    float acc[GEMM_ROWS][GEMM_COLS] = {};
    if (rows == GEMM_ROWS)
        tile_product<true>(acc, A, panel, K, i0, rows);
    else
        tile_product<false>(acc, A, panel, K, i0, rows);
    for (int64_t r = 0; r < rows; r++) {
        float* out = C + (i0 + r) * N + j0;
        for (int64_t c = 0; c < cols; c++) out[c] = accumulate ? out[c] + acc[r][c] : acc[r][c];
    }
}

static void gemm(float* C, Strided A, const float* B, bool b_transposed, int64_t M, int64_t K, int64_t N,
                 bool accumulate) {
    const int64_t row_tiles = (M + GEMM_ROWS - 1) / GEMM_ROWS, col_tiles = (N + GEMM_COLS - 1) / GEMM_COLS;
#pragma omp parallel
    {
        std::vector<float> panel(K * GEMM_COLS);
        int64_t packed = -1;  // the column tile in panel
#pragma omp for collapse(2) schedule(static)
        for (int64_t ct = 0; ct < col_tiles; ct++)
            for (int64_t rt = 0; rt < row_tiles; rt++) {
                const int64_t i0 = rt * GEMM_ROWS, j0 = ct * GEMM_COLS, cols = std::min(GEMM_COLS, N - j0);
                if (packed != ct) pack_panel(panel.data(), B, b_transposed, K, N, j0, cols);
                packed = ct;
                gemm_tile(C, A, panel.data(), K, N, i0, std::min(GEMM_ROWS, M - i0), j0, cols, accumulate);
            }
    }
}

void gemm_nn(float* C, const float* A, const float* B, int64_t M, int64_t K, int64_t N, bool accumulate) {
    gemm(C, {A, K, 1}, B, false, M, K, N, accumulate);
}

void matmul_forward(float* out, const float* inp, const float* W, int64_t M, int64_t K, int64_t N) {
    gemm(out, {inp, K, 1}, W, true, M, K, N, false);
}

void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int64_t M,
                     int64_t K, int64_t N, bool accumulate_dinp) {
    if (dinp) gemm(dinp, {dout, N, 1}, W, false, M, N, K, accumulate_dinp);
    gemm(dW, {dout, 1, N}, inp, false, N, M, K, true);  // dout^T: element (n, m) at dout[m * N + n]
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t M, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const float* x = inp + m * C;
        float ss = 0.0f;
        for (int64_t c = 0; c < C; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / C + eps);
        rstd[m] = r;
        for (int64_t c = 0; c < C; c++) out[m * C + c] = x[c] * r * w[c];
    }
}

void residual_rmsnorm_forward(float* h, float* out, float* rstd, const float* a, const float* b, const float* w,
                              int64_t M, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M * C; i++) h[i] = a[i] + b[i];
    rmsnorm_forward(out, rstd, h, w, M, C, eps);
}

// y = x r w with r = (mean(x^2)+eps)^-1/2:  dx = r (dy w) - x r^3 / C * sum(dy w x);  dw += sum_rows dy x r.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int64_t M, int64_t C, bool accumulate_dinp) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const float *x = inp + m * C, *dy = dout + m * C;
        float r = rstd[m], dot = 0.0f;
        for (int64_t c = 0; c < C; c++) dot += dy[c] * w[c] * x[c];
        float coef = r * r * r * dot / C;
        for (int64_t c = 0; c < C; c++) {
            float g = r * dy[c] * w[c] - x[c] * coef;
            dinp[m * C + c] = accumulate_dinp ? dinp[m * C + c] + g : g;
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; c++) {
        float acc = 0.0f;
        for (int64_t m = 0; m < M; m++) acc += dout[m * C + c] * inp[m * C + c] * rstd[m];
        dw[c] += acc;
    }
}

void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * dst_ld, src + r * src_ld, cols * sizeof(float));
}

void swiglu_forward(float* out, const float* g, const float* u, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = silu(g[i]) * u[i];
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float s = sigmoidf_(g[i]);
        dg[i] = dout[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        du[i] = dout[i] * g[i] * s;
    }
}

void embedding_forward(float* out, const int32_t* tokens, const float* embed, int64_t M, int64_t d) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) memcpy(out + m * d, embed + (int64_t)tokens[m] * d, d * sizeof(float));
}

void embedding_backward(float* dembed, const float* dout, const int32_t* tokens, int64_t M, int64_t d) {
    for (int64_t m = 0; m < M; m++) {
        float* row = dembed + (int64_t)tokens[m] * d;
        for (int64_t c = 0; c < d; c++) row[c] += dout[m * d + c];
    }
}

double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int64_t M,
                                      int64_t V, float loss_scale) {
    std::vector<double> row_loss(M, 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const float* z = logits + m * V;
        if (targets[m] < 0) {
            if (dlogits) memset(dlogits + m * V, 0, V * sizeof(float));
            continue;
        }
        float zmax = z[0];
        for (int64_t v = 1; v < V; v++) zmax = std::max(zmax, z[v]);
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++) sum += expf(z[v] - zmax);
        row_loss[m] = log(sum) - (z[targets[m]] - zmax);
        if (dlogits) {
            float inv = (float)(1.0 / sum);
            for (int64_t v = 0; v < V; v++) dlogits[m * V + v] = loss_scale * expf(z[v] - zmax) * inv;
            dlogits[m * V + targets[m]] -= loss_scale;
        }
    }
    double total = 0.0;
    for (int64_t m = 0; m < M; m++) total += row_loss[m];
    return total;
}
