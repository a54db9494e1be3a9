// The CPU's one GEMM kernel (model/ops.cpp: packed panels of op(B), 6 x 16 register tiles, operands read transposed
// in place) against plain triple loops, on shapes that leave partial tiles in every direction. Bound: a float sum of
// K products, in any order and with or without fused multiply-adds, is within K eps sum_k |a_k b_k| of the exact
// value (eps = 2^-24), and the reference sums in double, so that bound holds against it too. And cross-entropy at
// the edges of the vocabulary.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/ops.h"
#include "model/rng.h"
#include "test/test_helpers.h"

static std::vector<float> random_values(int64_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = rng.normal();
    return v;
}

// got (M, N) against sum_k a(i, k) b(k, j) + base(i, j), elementwise within the bound above
template <typename A, typename B>
static void check_products(const char* what, const float* got, const float* base, int64_t M, int64_t K, int64_t N,
                           A a, B b) {
    int64_t bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double exact = base ? base[i * N + j] : 0.0, magnitude = base ? std::fabs(base[i * N + j]) : 0.0;
            for (int64_t k = 0; k < K; k++) {
                exact += (double)a(i, k) * b(k, j);
                magnitude += std::fabs((double)a(i, k) * b(k, j));
            }
            if (std::fabs(got[i * N + j] - exact) > (K + 1) * std::ldexp(magnitude, -24)) bad++;
        }
    INFO(what << " " << M << " x " << K << " x " << N);
    CHECK(bad == 0);
}

TEST_CASE("ops: the GEMM equals plain sums on partial tiles, both operand layouts, = and +=") {
    const int64_t shapes[][3] = {{1, 1, 1}, {5, 3, 15}, {6, 16, 16}, {7, 17, 17}, {13, 200, 33}, {64, 9, 70}};
    uint64_t seed = 1;
    for (const auto& s : shapes) {
        const int64_t M = s[0], K = s[1], N = s[2];
        const std::vector<float> x = random_values(M * K, seed++), W = random_values(N * K, seed++),
                                 dy = random_values(M * N, seed++), C0 = random_values(M * N, seed++),
                                 dx0 = random_values(M * K, seed++), dW0 = random_values(N * K, seed++);
        std::vector<float> C = C0;
        gemm_nn(C.data(), x.data(), W.data(), M, K, N, false);  // W read as (K, N) here
        check_products("gemm_nn =", C.data(), nullptr, M, K, N, [&](int64_t i, int64_t k) { return x[i * K + k]; },
                       [&](int64_t k, int64_t j) { return W[k * N + j]; });
        C = C0;
        gemm_nn(C.data(), x.data(), W.data(), M, K, N, true);
        check_products("gemm_nn +=", C.data(), C0.data(), M, K, N, [&](int64_t i, int64_t k) { return x[i * K + k]; },
                       [&](int64_t k, int64_t j) { return W[k * N + j]; });

        std::vector<float> y(M * N);
        matmul_forward(y.data(), x.data(), W.data(), M, K, N);  // y = x W^T
        check_products("matmul_forward", y.data(), nullptr, M, K, N,
                       [&](int64_t i, int64_t k) { return x[i * K + k]; },
                       [&](int64_t k, int64_t j) { return W[j * K + k]; });

        std::vector<float> dx = dx0, dW = dW0;
        matmul_backward(dx.data(), dW.data(), dy.data(), x.data(), W.data(), M, K, N, true);
        check_products("matmul_backward dinp +=", dx.data(), dx0.data(), M, N, K,
                       [&](int64_t i, int64_t n) { return dy[i * N + n]; },
                       [&](int64_t n, int64_t k) { return W[n * K + k]; });
        check_products("matmul_backward dW +=", dW.data(), dW0.data(), N, M, K,
                       [&](int64_t n, int64_t m) { return dy[m * N + n]; },
                       [&](int64_t m, int64_t k) { return x[m * K + k]; });
        dx = dx0;
        matmul_backward(dx.data(), dW.data(), dy.data(), x.data(), W.data(), M, K, N, false);
        check_products("matmul_backward dinp =", dx.data(), nullptr, M, N, K,
                       [&](int64_t i, int64_t n) { return dy[i * N + n]; },
                       [&](int64_t n, int64_t k) { return W[n * K + k]; });
    }
}

TEST_CASE("ops: the GEMM gives the same bits on 1, 2 and 3 threads") {
    const int64_t M = 37, K = 50, N = 45;
    const std::vector<float> x = random_values(M * K, 7), W = random_values(N * K, 8), dy = random_values(M * N, 9);
    std::vector<std::vector<float>> outputs;
    const int threads_before = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        std::vector<float> y(M * N), dx(M * K), dW(N * K, 0.5f);
        matmul_forward(y.data(), x.data(), W.data(), M, K, N);
        matmul_backward(dx.data(), dW.data(), dy.data(), x.data(), W.data(), M, K, N, false);
        y.insert(y.end(), dx.begin(), dx.end());
        y.insert(y.end(), dW.begin(), dW.end());
        outputs.push_back(y);
    }
    omp_set_num_threads(threads_before);
    CHECK(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(outputs[0].data(), outputs[2].data(), outputs[0].size() * sizeof(float)) == 0);
}

// Cross-entropy against its definition, in double: loss = sum over counted rows of logsumexp(x) - x[target], dlogits
// = scale (softmax(x) - onehot(target)), a row of target -1 not counted and its gradient 0. The targets include 0
// and V - 1, which random targets rarely draw and the default data never holds (token 0 is the byte 0x00). Float
// sums of V = 37 exponentials of N(0, 1) logits: the loss within 1e-6 relative, each gradient within 1e-6 x scale.
TEST_CASE("ops: cross-entropy of targets 0 and V - 1, and of an ignored row, against its definition") {
    const int64_t M = 4, V = 37;
    const std::vector<float> logits = random_values(M * V, 21);
    const std::vector<int32_t> targets = {0, (int32_t)V - 1, -1, 5};
    const float scale = 0.25f;
    std::vector<float> dlogits(M * V, NAN);
    const double loss = cross_entropy_forward_backward(dlogits.data(), logits.data(), targets.data(), M, V, scale);
    double want_loss = 0.0;
    for (int64_t m = 0; m < M; m++) {
        const float* x = logits.data() + m * V;
        double max = x[0], sum = 0.0;
        for (int64_t v = 1; v < V; v++) max = std::max(max, (double)x[v]);
        for (int64_t v = 0; v < V; v++) sum += std::exp(x[v] - max);
        if (targets[m] >= 0) want_loss += max + std::log(sum) - x[targets[m]];
        for (int64_t v = 0; v < V; v++) {
            const double want = targets[m] < 0 ? 0.0 : scale * (std::exp(x[v] - max) / sum - (v == targets[m]));
            INFO("row " << m << " token " << v);
            CHECK(std::fabs(dlogits[m * V + v] - want) <= 1e-6 * scale);
        }
    }
    CHECK_REL(loss, want_loss, 1e-6);
}
