// test_matmul: the cuBLASLt GEMMs of kernels/matmul.cuh against the CPU reference (model/ops.h matmul_forward /
// matmul_backward; the grouped versions against a loop of those over the groups), on fresh random inputs, with
// odd shapes, a realistic one, pointers that are only 4-byte aligned (as tensors inside the parameter buffer),
// groups of 0, 1 and many rows, and cast_to_bf16 bit for bit against a host round-to-nearest-even.
// Outputs that are overwritten are poisoned first (NaN); accumulated ones start from random values.
//
// Tolerances (error = max |gpu - cpu| / max |cpu|, as check() measures it; u32 = 2^-24 ~ 6e-8):
//   FP32      1e-5: the same sums of at most ~1000 products in another order (cuBLAS tiles and may split K);
//             the roundoff of such a sum grows like sqrt(K) u32 relative to its size (~1e-6 at most here).
//   BF16 against the CPU on the BF16-rounded inputs: 1e-4. A product of two BF16 values (8-bit significands)
//             is exact in FP32, so only the FP32 accumulation differs; the tensor cores' accumulation may
//             truncate instead of round, which is bounded by ~K u32 = 6e-5 for K = 1024 (test_gpu.cu's 1e-4
//             class). This check catches a wrong operand or an unrounded / doubly rounded one (errors ~1e-3).
//   BF16 against the CPU on the FP32 inputs: 1e-2. Rounding to BF16 is relative error |d| <= u = 2^-8 per
//             input, so a product a b becomes a b (1 + da + db + da db), and an output y = sum_k a_k b_k of K
//             terms is off by e = sum_k a_k b_k (da_k + db_k) (+ O(u^2), + FP32 roundoff).
//             Worst case: |e| <= (2u + u^2) sum_k |a_k b_k|, which is 2u |y| = 7.8e-3 |y| for a single product
//             (a group of one row in dW), but with K random-sign products sum |a b| ~ K E|a||b| while
//             |y| ~ sqrt(K), so this bound (~0.04 max|y| at K = 1024) is far too pessimistic.
//             Typical: the d's are independent, mean 0, variance <= u^2/3 (uniform rounding), so e is a random
//             sum with std sqrt(2/3) u sqrt(K) s (s = rms of a b) while y has std sqrt(K) s: the ratio of the
//             maxima over an output of thousands of elements (each ~3.5 std, within ~+-0.5) is
//             sqrt(2/3) u (3.5 + 0.5) / (3.5 - 0.5) ~ 0.82 * 3.9e-3 * 1.35 ~ 4.3e-3.
//             1e-2 leaves a factor ~2 over that and over the one-product worst case, and is still two orders
//             below what a layout or transposition mistake gives (an error ~1). BF16 is run only on shapes with
//             thousands of outputs (with a handful of outputs the maxima are not a few std).
//   TF32 against the CPU in FP32: 4e-3. The tensor cores round each FP32 operand to TF32 (10-bit mantissa): to
//             nearest, u = 2^-11, or by truncation, relative error in (-2^-10, 0]. To nearest, the BF16 argument
//             above with u = 2^-11 gives ~0.82 u 1.35 ~ 5.4e-4. Truncation shrinks every product by 2^-10 on average
//             (a bias that adds, ~1e-3 of max |y|) plus a random part of about the same size: ~1.5e-3. 4e-3 leaves
//             a factor ~2.5 over that and is far below a wrong operand or layout (~1).
//   FP8 against the CPU's FP8 linear layer (model/fp8.h linear_forward / linear_backward): 1e-3. Both multiply the
//             same E4M3 values and scales (the quantization is the CPU's, bit for bit: test_fp8), so what differs is
//             the summation: the CPU's FP32 sums of q * scale rounded to FP32 (2^-24 each), and on a GPU the tensor
//             cores' FP8 accumulation, whose precision DeepSeek-V3 measured at about 14 bits (2^-14 = 6e-5 of a
//             128-term chunk, which cuBLASLt then promotes to FP32 with its scales), so errors up to ~1e-4 of the
//             output's scale. 1e-3 leaves a factor ~10 and is far below a wrong tile, scale or layout (~1). The
//             emulator's model of cuBLASLt sums exactly (~1e-7 here).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/fp8.cuh"
#include "kernels/grouped_gemm.cuh"
#include "kernels/grouped_matmul.cuh"
#include "kernels/matmul.cuh"
#include "model/bf16.h"
#include "model/fp8.h"
#include "model/ops.h"
#include "test/gpu_check.cuh"

void test_matmul(Rng& rng);
void test_matmul_fp8(Rng& rng);

namespace {

constexpr double MATMUL_FP32_TOL = 1e-5, MATMUL_BF16_ROUNDED_TOL = 1e-4, MATMUL_BF16_TOL = 1e-2, MATMUL_FP8_TOL = 1e-3,
                 MATMUL_TF32_TOL = 4e-3;

std::vector<float> matmul_bf16_round(const std::vector<float>& v) {
    std::vector<float> r(v.size());
    for (size_t i = 0; i < v.size(); i++) r[i] = bf16_round(v[i]);
    return r;
}

std::vector<float> matmul_plus(const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> c(a.size());
    for (size_t i = 0; i < a.size(); i++) c[i] = a[i] + b[i];
    return c;
}

// The CPU reference over groups (one group [0, M) for the dense GEMMs): out = inp W_g^T, dinp = dout W_g (both
// overwritten), dW_g = dW0_g + dout^T inp; in FP32, or as the CPU's FP8 linear layer (model/fp8.h). Rows before the
// first group's belong to none.
struct MatmulRef {
    std::vector<float> out, dinp, dW;
};
MatmulRef matmul_cpu(const std::vector<float>& inp, const std::vector<float>& W, const std::vector<float>& dout,
                     const std::vector<float>& dW0, const std::vector<int64_t>& offsets, int64_t K, int64_t N,
                     Precision precision = Precision::FP32) {
    const int64_t rows = offsets.back();
    MatmulRef r{std::vector<float>(rows * N), std::vector<float>(rows * K), dW0};
    for (size_t g = 0; g + 1 < offsets.size(); g++) {
        const int64_t r0 = offsets[g], M = offsets[g + 1] - r0;
        if (M == 0) continue;
        linear_forward(precision, r.out.data() + r0 * N, inp.data() + r0 * K, W.data() + g * N * K, M, K, N);
        linear_backward(precision, r.dinp.data() + r0 * K, r.dW.data() + g * N * K, dout.data() + r0 * N,
                        inp.data() + r0 * K, W.data() + g * N * K, M, K, N, false);
    }
    return r;
}

// FP32: one check. BF16: against the CPU on the FP32 inputs and on the BF16-rounded inputs (see the top).
void matmul_check(const std::string& name, bool bf16, const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<float>& want_rounded) {
    if (!bf16) {
        check(name, got, want, MATMUL_FP32_TOL);
        return;
    }
    check(name + " vs fp32", got, want, MATMUL_BF16_TOL);
    check(name + " vs rounded", got, want_rounded, MATMUL_BF16_ROUNDED_TOL);
}

// The BF16 copy of W, made on the device by the cast under test (checked exactly in matmul_test_cast).
struct MatmulW16 {
    DeviceArray<__nv_bfloat16> w;
    MatmulW16(const float* W, size_t n, size_t offset) : w(n, offset) { gpu::cast_to_bf16(w.ptr, W, (int64_t)n, 0); }
};

// The E4M3 copies of W (G, N, K), made on the device by fp8_quantize_blocks from its BF16 copy, as the model's
// (checked bit for bit in test_fp8)
struct MatmulW8 {
    DeviceArray<__nv_fp8_storage_t> q, qt;
    DeviceArray<float> scales, scales_t;
    MatmulW8(const __nv_bfloat16* W, int64_t G, int64_t N, int64_t K)
        : q(G * N * K), qt(G * N * K), scales(G * gpu::fp8_blk128_scales(N, K)),
          scales_t(G * gpu::fp8_blk128_scales(K, N)) {
        gpu::fp8_quantize_blocks(q.ptr, qt.ptr, scales.ptr, scales_t.ptr, W, G, N, K, 0);
    }
    gpu::Fp8Weight view() const { return {q.ptr, qt.ptr, scales.ptr, scales_t.ptr}; }
};

// The dense and grouped FP8 calls: out =, dinp = and +=, dW +=, against matmul_cpu(..., Precision::FP8). Rows of very different
// magnitudes (2^-6 .. 2^5), so the per-row and per-token-tile scales matter.
void matmul_test_fp8(gpu::Matmul& mm, Rng& rng, const std::vector<int64_t>& counts, int64_t K, int64_t N,
                     bool grouped) {
    const int64_t G = (int64_t)counts.size();
    std::vector<int64_t> offsets{0};
    std::string rows;
    for (int64_t c : counts) {
        offsets.push_back(offsets.back() + c);
        rows += (rows.empty() ? "" : ",") + std::to_string(c);
    }
    const int64_t R = offsets.back();
    const std::string shape = fmt("(fp8 rows %s K=%ld N=%ld)", rows.c_str(), K, N);
    std::vector<float> inp = randn(R * K, rng), dout = randn(R * N, rng);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t k = 0; k < K; k++) inp[r * K + k] = std::ldexp(inp[r * K + k], (int)(r % 12) - 6);
        for (int64_t n = 0; n < N; n++) dout[r * N + n] = std::ldexp(dout[r * N + n], (int)(r % 7) - 3);
    }
    const std::vector<float> W = randn(G * N * K, rng, 0.05f), dW0 = randn(G * N * K, rng), dinp0 = randn(R * K, rng);
    const MatmulRef ref = matmul_cpu(inp, W, dout, dW0, offsets, K, N, Precision::FP8);
    DeviceArray<float> d_inp(inp), d_W(W), d_dout(dout), d_out(R * N), d_dinp(R * K), d_dW(dW0);
    MatmulW16 W16(d_W.ptr, W.size(), 0);
    MatmulW8 W8(W16.w.ptr, G, N, K);
    const gpu::GemmWeight weight(d_W.ptr, W16.w.ptr, W8.view());
    d_out.poison();
    d_dinp.poison();
    if (grouped) {
        gpu::grouped_matmul_forward(mm, d_out.ptr, d_inp.ptr, weight, offsets.data(), G, K, N);
        gpu::grouped_matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, weight, offsets.data(), G, K, N);
        check("grouped_matmul_forward out = " + shape, d_out.get(), ref.out, MATMUL_FP8_TOL);
        check("grouped_matmul_backward dinp = " + shape, d_dinp.get(), ref.dinp, MATMUL_FP8_TOL);
        check("grouped_matmul_backward dW += " + shape, d_dW.get(), ref.dW, MATMUL_FP8_TOL);
        return;
    }
    gpu::matmul_forward(mm, d_out.ptr, d_inp.ptr, weight, R, K, N, false);
    check("matmul_forward out = " + shape, d_out.get(), ref.out, MATMUL_FP8_TOL);
    gpu::matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, weight, R, K, N, false);
    check("matmul_backward dinp = " + shape, d_dinp.get(), ref.dinp, MATMUL_FP8_TOL);
    check("matmul_backward dW += " + shape, d_dW.get(), ref.dW, MATMUL_FP8_TOL);
    d_dinp.set(dinp0);
    gpu::matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, weight, R, K, N, true);
    check("matmul_backward dinp += " + shape, d_dinp.get(), matmul_plus(dinp0, ref.dinp), MATMUL_FP8_TOL);
}

void matmul_test_dense(gpu::Matmul& mm, Rng& rng, int64_t M, int64_t K, int64_t N, size_t offset, bool bf16) {
    const std::string shape =
        fmt("(%s M=%ld K=%ld N=%ld%s)", bf16 ? "bf16" : "fp32", M, K, N, offset ? " unaligned" : "");
    const std::vector<float> inp = randn(M * K, rng), W = randn(N * K, rng), dout = randn(M * N, rng);
    const std::vector<float> out0 = randn(M * N, rng), dinp0 = randn(M * K, rng), dW0 = randn(N * K, rng);
    const std::vector<int64_t> offsets{0, M};
    const MatmulRef ref = matmul_cpu(inp, W, dout, dW0, offsets, K, N);
    const MatmulRef ref_r = bf16 ? matmul_cpu(matmul_bf16_round(inp), matmul_bf16_round(W), matmul_bf16_round(dout),
                                              dW0, offsets, K, N)
                                 : ref;
    DeviceArray<float> d_inp(inp, offset), d_W(W, offset), d_dout(dout, offset);
    DeviceArray<float> d_out(M * N, offset), d_dinp(M * K, offset), d_dW(dW0, offset);
    MatmulW16 W16(d_W.ptr, W.size(), offset);
    const __nv_bfloat16* w16 = bf16 ? W16.w.ptr : nullptr;

    d_out.poison();
    gpu::matmul_forward(mm, d_out.ptr, d_inp.ptr, {d_W.ptr, w16}, M, K, N, false);
    matmul_check("matmul_forward out = " + shape, bf16, d_out.get(), ref.out, ref_r.out);
    d_out.set(out0);
    gpu::matmul_forward(mm, d_out.ptr, d_inp.ptr, {d_W.ptr, w16}, M, K, N, true);
    matmul_check("matmul_forward out += " + shape, bf16, d_out.get(), matmul_plus(out0, ref.out),
                 matmul_plus(out0, ref_r.out));

    d_dinp.poison();
    gpu::matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, {d_W.ptr, w16}, M, K, N, false);
    matmul_check("matmul_backward dinp = " + shape, bf16, d_dinp.get(), ref.dinp, ref_r.dinp);
    matmul_check("matmul_backward dW += " + shape, bf16, d_dW.get(), ref.dW, ref_r.dW);

    d_dinp.set(dinp0);
    d_dW.set(dW0);
    gpu::matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, {d_W.ptr, w16}, M, K, N, true);
    matmul_check("matmul_backward dinp += " + shape, bf16, d_dinp.get(), matmul_plus(dinp0, ref.dinp),
                 matmul_plus(dinp0, ref_r.dinp));
    matmul_check("matmul_backward dW += (with dinp +=) " + shape, bf16, d_dW.get(), ref.dW, ref_r.dW);

    d_dW.set(dW0);
    gpu::matmul_backward(mm, nullptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, {d_W.ptr, w16}, M, K, N, false);
    matmul_check("matmul_backward dW += (dinp nullptr) " + shape, bf16, d_dW.get(), ref.dW, ref_r.dW);

    // dW = (a step's first contribution): the NaNs there never read; dW0 added on the host to compare
    d_dW.poison();
    gpu::matmul_backward(mm, nullptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, {d_W.ptr, w16}, M, K, N, false,
                         /*accumulate_dW*/ false);
    matmul_check("matmul_backward dW = " + shape, bf16, matmul_plus(dW0, d_dW.get()), ref.dW, ref_r.dW);
}

// TF32 (GemmWeight::tf32_inputs, the router's products) at the router's shape in a small model: out =, dinp +=,
// dW =, against the CPU in FP32 (see the top for the tolerance).
void matmul_test_tf32(gpu::Matmul& mm, Rng& rng) {
    const int64_t M = 512, K = 1024, N = 64;
    const std::string shape = fmt("(tf32 M=%ld K=%ld N=%ld)", M, K, N);
    const std::vector<float> inp = randn(M * K, rng), W = randn(N * K, rng), dout = randn(M * N, rng);
    const std::vector<float> dinp0 = randn(M * K, rng);
    const MatmulRef ref = matmul_cpu(inp, W, dout, std::vector<float>(N * K, 0.0f), {0, M}, K, N);
    DeviceArray<float> d_inp(inp), d_W(W), d_dout(dout), d_out(M * N), d_dinp(dinp0), d_dW(N * K);
    const gpu::GemmWeight weight = gpu::GemmWeight::tf32_inputs(d_W.ptr);
    gpu::matmul_forward(mm, d_out.ptr, d_inp.ptr, weight, M, K, N, false);
    check("matmul_forward out = " + shape, d_out.get(), ref.out, MATMUL_TF32_TOL);
    gpu::matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, weight, M, K, N, true,
                         /*accumulate_dW*/ false);
    check("matmul_backward dinp += " + shape, d_dinp.get(), matmul_plus(dinp0, ref.dinp), MATMUL_TF32_TOL);
    check("matmul_backward dW = " + shape, d_dW.get(), ref.dW, MATMUL_TF32_TOL);
}

// Groups of counts rows from row `first` on (the rows before it belong to no group and must stay untouched).
void matmul_test_grouped(gpu::Matmul& mm, Rng& rng, const std::vector<int64_t>& counts, int64_t K, int64_t N,
                         bool bf16, int64_t first = 0) {
    const int64_t G = (int64_t)counts.size();
    std::vector<int64_t> offsets{first};
    std::string rows;
    for (int64_t c : counts) {
        offsets.push_back(offsets.back() + c);
        rows += (rows.empty() ? "" : ",") + std::to_string(c);
    }
    const int64_t R = offsets.back();
    const std::string shape = fmt("(%s rows %s K=%ld N=%ld", bf16 ? "bf16" : "fp32", rows.c_str(), K, N) +
                              (first > 0 ? fmt(" from row %ld)", first) : ")");
    const std::vector<float> inp = randn(R * K, rng), W = randn(G * N * K, rng), dout = randn(R * N, rng);
    const std::vector<float> dW0 = randn(G * N * K, rng);
    const MatmulRef ref = matmul_cpu(inp, W, dout, dW0, offsets, K, N);
    const MatmulRef ref_r = bf16 ? matmul_cpu(matmul_bf16_round(inp), matmul_bf16_round(W), matmul_bf16_round(dout),
                                              dW0, offsets, K, N)
                                 : ref;
    DeviceArray<float> d_inp(inp), d_W(W), d_dout(dout), d_out(R * N), d_dinp(R * K), d_dW(dW0);
    MatmulW16 W16(d_W.ptr, W.size(), 0);
    const __nv_bfloat16* w16 = bf16 ? W16.w.ptr : nullptr;

    auto poisoned_from_first = [&](int64_t width) {  // NaN in the groups' rows, zeros (as in ref) before them
        std::vector<float> v(R * width, NAN);
        std::fill(v.begin(), v.begin() + first * width, 0.0f);
        return v;
    };
    d_out.set(poisoned_from_first(N));
    gpu::grouped_matmul_forward(mm, d_out.ptr, d_inp.ptr, {d_W.ptr, w16}, offsets.data(), G, K, N);
    matmul_check("grouped_matmul_forward out = " + shape, bf16, d_out.get(), ref.out, ref_r.out);
    d_dinp.set(poisoned_from_first(K));
    gpu::grouped_matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, {d_W.ptr, w16}, offsets.data(), G, K,
                                 N);
    matmul_check("grouped_matmul_backward dinp = " + shape, bf16, d_dinp.get(), ref.dinp, ref_r.dinp);
    matmul_check("grouped_matmul_backward dW += " + shape, bf16, d_dW.get(), ref.dW, ref_r.dW);
    d_dW.poison();  // dW =: every group's written, an empty group's with zeros
    gpu::grouped_matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, {d_W.ptr, w16}, offsets.data(), G, K,
                                 N, /*accumulate_dinp*/ false, /*accumulate_dW*/ false);
    matmul_check("grouped_matmul_backward dW = " + shape, bf16, matmul_plus(dW0, d_dW.get()), ref.dW, ref_r.dW);
    const std::vector<float> dinp0 = randn(R * K, rng);  // dinp +=, the rows before the first group untouched
    d_dinp.set(dinp0);
    gpu::grouped_matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, {d_W.ptr, w16}, offsets.data(), G, K,
                                 N, /*accumulate_dinp*/ true);
    matmul_check("grouped_matmul_backward dinp += " + shape, bf16, d_dinp.get(), matmul_plus(dinp0, ref.dinp),
                 matmul_plus(dinp0, ref_r.dinp));
}

// kernels/grouped_gemm.cuh, the routed experts' BF16 products on the device's offsets, against the CPU as the
// BF16 cuBLASLt calls are (matmul_check): out =, dinp = and +=, dW = (an empty group's zeros) and +=. Widths that
// leave partial tiles and k steps; groups of 0, 1 and many rows, one over several row tiles.
void matmul_test_grouped_device(Rng& rng, const std::vector<int64_t>& counts, int64_t K, int64_t N) {
    const int G = (int)counts.size();
    std::vector<int64_t> offsets{0};
    for (int64_t c : counts) offsets.push_back(offsets.back() + c);
    const int64_t R = offsets.back();
    const std::string shape = fmt("(device offsets, %d groups, %ld rows, K=%ld N=%ld)", G, R, K, N);
    const std::vector<float> inp = randn(R * K, rng), W = randn(G * N * K, rng), dout = randn(R * N, rng);
    const std::vector<float> dW0 = randn(G * N * K, rng), dinp0 = randn(R * K, rng);
    const MatmulRef ref = matmul_cpu(inp, W, dout, dW0, offsets, K, N);
    const MatmulRef ref_r =
        matmul_cpu(matmul_bf16_round(inp), matmul_bf16_round(W), matmul_bf16_round(dout), dW0, offsets, K, N);
    DeviceArray<float> d_inp(inp), d_W(W), d_dout(dout), d_out(R * N), d_dinp(R * K), d_dW(G * N * K);
    MatmulW16 inp16(d_inp.ptr, inp.size(), 0), W16(d_W.ptr, W.size(), 0), dout16(d_dout.ptr, dout.size(), 0);
    DeviceArray<int64_t> d_offsets(offsets);

    gpu::grouped_gemm_forward(d_out.ptr, inp16.w.ptr, W16.w.ptr, d_offsets.ptr, G, R, K, N, 0);
    matmul_check("grouped_gemm_forward out = " + shape, true, d_out.get(), ref.out, ref_r.out);
    gpu::grouped_gemm_dinp(d_dinp.ptr, dout16.w.ptr, W16.w.ptr, d_offsets.ptr, G, R, K, N, false, 0);
    matmul_check("grouped_gemm_dinp dinp = " + shape, true, d_dinp.get(), ref.dinp, ref_r.dinp);
    d_dinp.set(dinp0);
    gpu::grouped_gemm_dinp(d_dinp.ptr, dout16.w.ptr, W16.w.ptr, d_offsets.ptr, G, R, K, N, true, 0);
    matmul_check("grouped_gemm_dinp dinp += " + shape, true, d_dinp.get(), matmul_plus(dinp0, ref.dinp),
                 matmul_plus(dinp0, ref_r.dinp));
    gpu::grouped_gemm_dW(d_dW.ptr, dout16.w.ptr, inp16.w.ptr, d_offsets.ptr, G, K, N, false, 0);  // over NaN
    matmul_check("grouped_gemm_dW dW = " + shape, true, matmul_plus(dW0, d_dW.get()), ref.dW, ref_r.dW);
    d_dW.set(dW0);
    gpu::grouped_gemm_dW(d_dW.ptr, dout16.w.ptr, inp16.w.ptr, d_offsets.ptr, G, K, N, true, 0);
    matmul_check("grouped_gemm_dW dW += " + shape, true, d_dW.get(), ref.dW, ref_r.dW);
}

// A product cuBLASLt has no FP8 algorithm for runs in BF16 (said on stderr): with K = 200 and N = 72 the forward's
// and the input gradient's FP8 leading dimensions (K, N) are not multiples of 16 bytes, which FP8 GEMMs require, so
// those two give the BF16 call's bits, while the weight gradient's (the tokens padded to 16) stays FP8 (against the
// CPU's FP8 layer; on a GPU this line also says whether cuBLASLt takes a summed dimension of 48, not a multiple of
// 128); a grouped call with any group refused runs wholly in BF16: the BF16 call's bits.
void matmul_test_fp8_fallback(gpu::Matmul& mm, Rng& rng) {
    const int64_t K = 200, N = 72, G = 2;
    const std::vector<int64_t> offsets{0, 37, 60};
    const int64_t R = offsets.back();
    const std::vector<float> inp = randn(R * K, rng), W = randn(G * N * K, rng, 0.05f), dout = randn(R * N, rng);
    const std::vector<float> dW0 = randn(G * N * K, rng);
    DeviceArray<float> d_inp(inp), d_W(W), d_dout(dout), d_out(R * N), d_dinp(R * K), d_dW(dW0);
    MatmulW16 W16(d_W.ptr, W.size(), 0);
    MatmulW8 W8(W16.w.ptr, G, N, K);
    const gpu::GemmWeight bf16(d_W.ptr, W16.w.ptr), fp8(d_W.ptr, W16.w.ptr, W8.view());
    auto dense = [&](const gpu::GemmWeight& w) {  // out and dinp of rows [0, 37) with W_0, and dW_0
        d_out.poison();
        d_dinp.poison();
        d_dW.set(dW0);
        const int64_t M = offsets[1];
        gpu::matmul_forward(mm, d_out.ptr, d_inp.ptr, w, M, K, N, false);
        gpu::matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, w, M, K, N, false);
        const std::vector<float> out = d_out.get(), dinp = d_dinp.get(), dW = d_dW.get();
        return std::vector<std::vector<float>>{
            {out.begin(), out.begin() + M * N}, {dinp.begin(), dinp.begin() + M * K}, {dW.begin(), dW.begin() + N * K}};
    };
    auto grouped = [&](const gpu::GemmWeight& w) {
        d_out.poison();
        d_dinp.poison();
        d_dW.set(dW0);
        gpu::grouped_matmul_forward(mm, d_out.ptr, d_inp.ptr, w, offsets.data(), G, K, N);
        gpu::grouped_matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, w, offsets.data(), G, K, N);
        return std::vector<std::vector<float>>{d_out.get(), d_dinp.get(), d_dW.get()};
    };
    const auto dense_bf16 = dense(bf16), dense_fp8 = dense(fp8), grouped_bf16 = grouped(bf16),
               grouped_fp8 = grouped(fp8);
    check("FP8 refused (K=200 N=72): matmul_forward = the BF16 call", dense_fp8[0], dense_bf16[0], 0);
    check("FP8 refused (K=200 N=72): matmul_backward dinp = the BF16 call", dense_fp8[1], dense_bf16[1], 0);
    const MatmulRef ref = matmul_cpu(inp, W, dout, dW0, {0, offsets[1]}, K, N, Precision::FP8);
    check("FP8 taken for the weight gradient (M=37 padded to 48): dW +=", dense_fp8[2],
          std::vector<float>(ref.dW.begin(), ref.dW.begin() + N * K), MATMUL_FP8_TOL);
    const char* names[3] = {"out", "dinp", "dW"};
    for (int i = 0; i < 3; i++)
        check(fmt("FP8 refused for a group: grouped %s = the BF16 call", names[i]), grouped_fp8[i], grouped_bf16[i], 0);
}

// A grouped call spread over the Matmul's streams gives the same bits as the same call on one stream: the groups
// are the same cuBLASLt calls, each writing its own rows and its own dW_g. The results are read the way the model
// reads them: copied on the caller's stream, which alone is synchronised. So a missing fork (a stream reading a cast
// before it is written) or join (the caller's stream not waiting for a lane) shows up as a difference or as the
// NaN the outputs are poisoned with (always on the emulator, whose streams run only when synchronised).
void matmul_test_streams(gpu::Matmul& mm, Rng& rng, gpu::GemmType type) {
    const int64_t G = 24, K = 128, N = 96;
    std::vector<int64_t> offsets{0};
    for (int64_t g = 0; g < G; g++) offsets.push_back(offsets.back() + (g % 5 == 3 ? 0 : 16 + 11 * g));
    const int64_t R = offsets.back();
    gpu::matmul_reserve(mm, {R * K, R * N});
    const std::vector<float> inp = randn(R * K, rng), W = randn(G * N * K, rng), dout = randn(R * N, rng);
    const std::vector<float> dW0 = randn(G * N * K, rng);
    DeviceArray<float> d_inp(inp), d_W(W), d_dout(dout), d_out(R * N), d_dinp(R * K), d_dW(dW0);
    DeviceArray<float> seen_out(R * N), seen_dinp(R * K), seen_dW(G * N * K);
    MatmulW16 W16(d_W.ptr, W.size(), 0);
    MatmulW8 W8(W16.w.ptr, G, N, K);
    const gpu::GemmWeight weight(d_W.ptr, type == gpu::GemmType::FP32 ? nullptr : W16.w.ptr,
                                 type == gpu::GemmType::FP8 ? W8.view() : gpu::Fp8Weight{});
    auto copy_on_stream = [&](DeviceArray<float>& dst, const DeviceArray<float>& src) {
        CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, src.n * sizeof(float), cudaMemcpyDeviceToDevice, mm.stream));
    };
    std::vector<float> out[2], dinp[2], dW[2];
    for (int run = 0; run < 2; run++) {
        mm.group_streams = run == 0 ? 1 : gpu::MATMUL_STREAMS;
        d_out.poison();
        d_dinp.poison();
        d_dW.set(dW0);
        gpu::grouped_matmul_forward(mm, d_out.ptr, d_inp.ptr, weight, offsets.data(), G, K, N);
        gpu::grouped_matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, d_inp.ptr, weight, offsets.data(), G, K, N);
        copy_on_stream(seen_out, d_out);
        copy_on_stream(seen_dinp, d_dinp);
        copy_on_stream(seen_dW, d_dW);
        CUDA_CHECK(cudaStreamSynchronize(mm.stream));
        out[run] = seen_out.get();
        dinp[run] = seen_dinp.get();
        dW[run] = seen_dW.get();
    }
    mm.group_streams = gpu::MATMUL_STREAMS;
    const char* type_name = type == gpu::GemmType::FP8 ? "fp8" : type == gpu::GemmType::BF16 ? "bf16" : "fp32";
    const std::string shape = fmt("(%s, %ld groups, %ld rows)", type_name, G, R);
    check(fmt("grouped out, %d streams = 1 stream ", gpu::MATMUL_STREAMS) + shape, out[1], out[0], 0);
    check(fmt("grouped dinp, %d streams = 1 stream ", gpu::MATMUL_STREAMS) + shape, dinp[1], dinp[0], 0);
    check(fmt("grouped dW, %d streams = 1 stream ", gpu::MATMUL_STREAMS) + shape, dW[1], dW[0], 0);
}

// An input's BF16 copy kept by the caller (GemmInput) is what the BF16 calls read instead of casting the FP32 rows:
// given the copy of other rows (inp2), every output equals the plain call's on inp2, bit for bit; given the copy of
// inp itself, the plain call's on inp. The grouped calls start at row 5: the copy is indexed like the rows.
void matmul_test_kept_input(gpu::Matmul& mm, Rng& rng) {
    const int64_t K = 96, N = 40, G = 3;
    const std::vector<int64_t> offsets{5, 20, 20, 47};
    const int64_t R = offsets.back(), first = offsets[0];
    const std::vector<float> inp = randn(R * K, rng), inp2 = randn(R * K, rng), W = randn(G * N * K, rng);
    const std::vector<float> dout = randn(R * N, rng), dW0 = randn(G * N * K, rng);
    DeviceArray<float> d_inp(inp), d_inp2(inp2), d_W(W), d_dout(dout), d_out(R * N), d_dinp(R * K), d_dW(dW0);
    DeviceArray<__nv_bfloat16> inp16(R * K, 0), inp2_16(R * K, 0);
    gpu::cast_to_bf16(inp16.ptr, d_inp.ptr, R * K, mm.stream);
    gpu::cast_to_bf16(inp2_16.ptr, d_inp2.ptr, R * K, mm.stream);
    MatmulW16 W16(d_W.ptr, W.size(), 0);
    // out, dinp, dW of the dense calls (rows [0, R), W_0) and of the grouped calls (rows [first, R))
    auto outputs = [&](gpu::GemmInput in) {
        std::vector<std::vector<float>> got;
        auto keep = [&](DeviceArray<float>& d, int64_t from) {
            const std::vector<float> all = d.get();
            got.emplace_back(all.begin() + from, all.end());
        };
        d_out.poison();
        d_dinp.poison();
        d_dW.set(dW0);
        gpu::matmul_forward(mm, d_out.ptr, in, {d_W.ptr, W16.w.ptr}, R, K, N, false);
        gpu::matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, in, {d_W.ptr, W16.w.ptr}, R, K, N, false);
        keep(d_out, 0);
        keep(d_dinp, 0);
        keep(d_dW, 0);
        d_out.poison();
        d_dinp.poison();
        d_dW.set(dW0);
        gpu::grouped_matmul_forward(mm, d_out.ptr, in, {d_W.ptr, W16.w.ptr}, offsets.data(), G, K, N);
        gpu::grouped_matmul_backward(mm, d_dinp.ptr, d_dW.ptr, d_dout.ptr, in, {d_W.ptr, W16.w.ptr}, offsets.data(), G,
                                     K, N);
        keep(d_out, first * N);
        keep(d_dinp, first * K);
        keep(d_dW, 0);
        return got;
    };
    const char* names[6] = {"out", "dinp", "dW", "grouped out", "grouped dinp", "grouped dW"};
    const auto plain = outputs(d_inp.ptr), plain2 = outputs(d_inp2.ptr);
    const auto kept = outputs({d_inp.ptr, inp16.ptr}), kept_other = outputs({d_inp.ptr, inp2_16.ptr});
    for (int i = 0; i < 6; i++) {
        check(fmt("kept BF16 input: %s = the call that casts", names[i]), kept[i], plain[i], 0);
        check(fmt("kept BF16 input of other rows: %s = the call on those rows", names[i]), kept_other[i], plain2[i],
              0);
    }
    // The same for matmul_backward's output gradient, also without FP32 rows (the head's dlogits in BF16 mode).
    const std::vector<float> dout2 = randn(R * N, rng);
    DeviceArray<float> d_dout2(dout2);
    DeviceArray<__nv_bfloat16> dout16(R * N, 0), dout2_16(R * N, 0);
    gpu::cast_to_bf16(dout16.ptr, d_dout.ptr, R * N, mm.stream);
    gpu::cast_to_bf16(dout2_16.ptr, d_dout2.ptr, R * N, mm.stream);
    auto backward = [&](gpu::GemmInput grad) {
        d_dinp.poison();
        d_dW.set(dW0);
        gpu::matmul_backward(mm, d_dinp.ptr, d_dW.ptr, grad, d_inp.ptr, {d_W.ptr, W16.w.ptr}, R, K, N, false);
        return std::vector<std::vector<float>>{d_dinp.get(), d_dW.get()};
    };
    const auto cast_here = backward(d_dout.ptr), cast_here2 = backward(d_dout2.ptr);
    const auto only16 = backward({nullptr, dout16.ptr}), kept_other_dout = backward({d_dout.ptr, dout2_16.ptr});
    for (int i = 0; i < 2; i++) {
        check(fmt("BF16 dout alone: %s = the call that casts", names[i + 1]), only16[i], cast_here[i], 0);
        check(fmt("BF16 dout of other rows: %s = the call on those rows", names[i + 1]), kept_other_dout[i],
              cast_here2[i], 0);
    }
}

// Every kind of float: Gaussians over the whole exponent range (subnormals and overflow to Inf included), raw
// random bit patterns, exact ties (to even both ways), zeros, infinities, NaN.
void matmul_test_cast(Rng& rng) {
    std::vector<uint32_t> special_bits{0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                       0xFFC12345u, 0x00000001u, 0x80008000u, 0x00018000u, 0x007FFFFFu,
                                       0x3F808000u, 0x3F818000u, 0xBF808000u, 0xBF818000u, 0x3F807FFFu,
                                       0x3F808001u, 0x7F7FFFFFu, 0x7F7F7FFFu, 0x7F7F8000u, 0xFF7F8000u};
    const int64_t n = 1000003;
    std::vector<float> in(n);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        if (i < (int64_t)special_bits.size()) {
            u = special_bits[i];
        } else if (i % 2 == 0) {
            const float x = std::ldexp(rng.normal(), (int)(rng.next_u64() % 280) - 150);
            memcpy(&u, &x, sizeof u);
        } else {
            do u = (uint32_t)rng.next_u64();
            while ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0);  // no NaN beyond the specials
        }
        memcpy(&in[i], &u, sizeof u);
    }
    DeviceArray<float> d_in(in);
    DeviceArray<__nv_bfloat16> d_out(n);
    d_out.poison();
    gpu::cast_to_bf16(d_out.ptr, d_in.ptr, n, 0);
    const std::vector<__nv_bfloat16> got16 = d_out.get();
    std::vector<uint16_t> got(n), want(n);
    for (int64_t i = 0; i < n; i++) {
        memcpy(&got[i], &got16[i], sizeof got[i]);
        const bool got_nan = (got[i] & 0x7F80u) == 0x7F80u && (got[i] & 0x007Fu) != 0;
        want[i] = std::isnan(in[i]) ? (got_nan ? got[i] : (uint16_t)0x7FC0u) : bf16_from_f32(in[i]);
    }
    check(fmt("cast_to_bf16 bits (n=%ld)", n), got, want, 0);
}

}  // namespace

void test_matmul(Rng& rng) {
    matmul_test_cast(rng);
    struct Case { int64_t M, K, N; size_t offset; };
    const Case odd{37, 129, 67, 0}, odd_unaligned{37, 129, 67, 1}, realistic{512, 1024, 768, 0};

    gpu::Matmul mm;
    gpu::matmul_create(mm, 0, gpu::MatmulCasts{});  // FP32 only: no cast buffers, and matmul_reserve leaves it so
    gpu::matmul_reserve(mm, {1 << 20, 1 << 20});
    check("matmul_reserve on an FP32-only Matmul: cast capacity",
          std::vector<int64_t>{mm.cast_capacity.inputs, mm.cast_capacity.output_grads}, std::vector<int64_t>{0, 0},
          0);
    // K = 0 (out = 0) and N = 0 (dinp = 0): no products, the outputs still written
    for (Case tc : {odd, odd_unaligned, realistic, Case{1, 7, 3, 1}, Case{5, 1, 2, 0}, Case{5, 0, 3, 0},
                    Case{4, 6, 0, 0}})
        matmul_test_dense(mm, rng, tc.M, tc.K, tc.N, tc.offset, false);
    {
        DeviceArray<float> d_dW(3 * 5);  // no rows: dW = sets zeros
        d_dW.poison();
        const float* none = nullptr;
        gpu::matmul_backward(mm, nullptr, d_dW.ptr, none, none, none, 0, 5, 3, false, /*accumulate_dW*/ false);
        check("matmul_backward dW = with M=0", d_dW.get(), std::vector<float>(15, 0.0f), 0);
    }
    matmul_test_grouped(mm, rng, {0, 1, 37, 0, 200, 5, 1, 64}, 129, 67, false);
    matmul_test_grouped(mm, rng, {130, 0, 3, 1}, 256, 96, false);
    matmul_test_grouped(mm, rng, {0, 0, 0}, 64, 32, false);
    matmul_test_grouped(mm, rng, {3, 0, 40}, 129, 67, false, 5);
    matmul_test_streams(mm, rng, gpu::GemmType::FP32);
    matmul_test_tf32(mm, rng);
    gpu::matmul_destroy(mm);

    // the largest casts below until the reserve: the first grouped case's inp and dout (308 rows)
    gpu::matmul_create(mm, 0, gpu::MatmulCasts{308 * 129, 308 * 67});
    for (Case tc : {odd, odd_unaligned}) matmul_test_dense(mm, rng, tc.M, tc.K, tc.N, tc.offset, true);
    matmul_test_grouped(mm, rng, {0, 1, 37, 0, 200, 5, 1, 64}, 129, 67, true);
    matmul_test_grouped(mm, rng, {130, 0, 3, 1}, 256, 96, true);
    matmul_test_grouped(mm, rng, {0, 0, 0}, 64, 32, true);
    matmul_test_grouped(mm, rng, {3, 0, 40}, 129, 67, true, 5);
    gpu::matmul_reserve(mm, {realistic.M * realistic.K, realistic.M * realistic.N});  // grows both cast buffers
    matmul_test_dense(mm, rng, realistic.M, realistic.K, realistic.N, realistic.offset, true);
    matmul_test_streams(mm, rng, gpu::GemmType::BF16);
    matmul_test_kept_input(mm, rng);
    gpu::matmul_destroy(mm);
    matmul_test_grouped_device(rng, {0, 1, 37, 0, 200, 5, 1, 64}, 136, 72);
    matmul_test_grouped_device(rng, {130, 0, 3}, 64, 200);
}

// FP8 (run last by test_gpu, on Hopper only). Full 128-blocks first, then the summed dimensions that are multiples of
// 16 but not of 128 (K = 208, N = 144: a partial last block), rows of every count (groups of 0, 1 and 37 rows:
// partial token tiles, the last M % 4 rows through a padded block of 4, transposes padded to 16), then the shapes FP8
// GEMMs cannot take.
void test_matmul_fp8(Rng& rng) {
    gpu::Matmul mm;
    gpu::matmul_create(mm, 0, gpu::MatmulCasts{300 * 256, 300 * 144, 300 * 256}, true);
    matmul_test_fp8(mm, rng, {256}, 256, 128, false);
    matmul_test_fp8(mm, rng, {300}, 256, 96, false);
    matmul_test_fp8(mm, rng, {37}, 208, 144, false);
    matmul_test_fp8(mm, rng, {0, 1, 37, 0, 150, 5}, 208, 144, true);
    matmul_test_streams(mm, rng, gpu::GemmType::FP8);
    check("FP8 shapes refused (rows of any count: none)", std::vector<double>{(double)mm.fp8_refused}, {0.0}, 0);
    matmul_test_fp8_fallback(mm, rng);
    // counted once per shape: the forward's and the input gradient's (the grouped calls' first groups are the same)
    check("FP8 shapes refused (K=200 N=72: 2)", std::vector<double>{(double)mm.fp8_refused}, {2.0}, 0);
    // every product run in BF16: the dense out and dinp, the grouped out (2 groups), dinp and dW (2 groups each)
    check("FP8 products run in BF16 (K=200 N=72: 8)", std::vector<double>{(double)mm.fp8_in_bf16}, {8.0}, 0);
    gpu::matmul_destroy(mm);
}
