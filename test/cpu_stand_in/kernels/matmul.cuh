// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/matmul.cuh: the same calls, on the same operand types
// (kernels/gemm_operands.cuh), the products by model/ops.h's matmul_forward / matmul_backward. Row-major, weights
// W (N, K) = [out, in]:
//   forward:  out (M, N) (=|+=) inp (M, K) @ W^T;   backward: dinp (M, K) (=|+=) dout @ W,  dW (N, K) += dout^T inp
//   grouped:  rows [offsets[g], offsets[g+1]) (host offsets) use W_g of W (G, N, K); the forward and dinp are
//             overwritten (=), dW_g +=.
// Precision::BF16 (W16 given): the activation operands are cast into the Matmul's two cast buffers (their
// capacity checked, as the real matmul_cast does), or an input's BF16 copy comes from the caller (checked to be
// the rounding of its FP32 rows when the product runs); the weights are read from W16, and the product runs in
// FP32 on the BF16 values. FP8 (the weight's E4M3 copies given): the weights are read from those copies (so a copy
// not refreshed after an update shows), the activations rounded by model/fp8.h's fp8_round_trip in the real
// header's tiles (from the FP32 rows where there are any, else from the BF16 copy), the products in FP32. The real
// one also allocates cuBLASLt workspaces (one per lane: the streams its grouped calls spread over) and FP8 buffers:
// so does this one, so the allocations add up to matmul_memory_bytes. The groups run in order.
#pragma once
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/gemm_operands.cuh"
#include "model/fp8.h"
#include "model/ops.h"

namespace gpu {



struct Matmul {  // one per stream
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    __nv_bfloat16 *cast_a = nullptr, *cast_b = nullptr;  // BF16 casts of the activation operands
    MatmulCasts cast_capacity;
    // the real one's three FP8 buffers (values, scales), allocated as it does so that the memory plan adds up; the
    // stand-in's FP8 products round on the host and never touch them
    std::array<std::array<void*, 2>, 3> fp8{};
    std::array<std::array<int64_t, 2>, 3> fp8_capacity{};
    bool fp8_enabled = false;
};


// out (n) = in (n) rounded to the nearest BF16, ties to even
inline void cast_to_bf16(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    dev(out, n, "cast_to_bf16 out");
    dev(in, n, "cast_to_bf16 in");
    apart("cast_to_bf16", {span(out, n, "out")}, {span(in, n, "in")});
    launch(stream, [=] {
        for (int64_t i = 0; i < n; i++) out[i] = __float2bfloat16_rn(in[i]);
    });
}


inline void matmul_destroy(Matmul& mm) {
    for (auto& buffers : mm.fp8)
        for (void* p : buffers) CUDA_CHECK(cudaFree(p));
    CUDA_CHECK(cudaFree(mm.workspace));
    CUDA_CHECK(cudaFree(mm.cast_a));
    CUDA_CHECK(cudaFree(mm.cast_b));
    mm = Matmul{};
}

inline void matmul_alloc(Matmul& mm, void** ptr, size_t bytes, const char* what) {
    *ptr = nullptr;
    if (bytes > 0 && cudaMalloc(ptr, bytes) != cudaSuccess) {
        *ptr = nullptr;
        matmul_destroy(mm);
        throw std::runtime_error(std::string("out of GPU memory for ") + what);
    }
}

inline void matmul_alloc_casts(Matmul& mm, MatmulCasts casts) {
    matmul_alloc(mm, (void**)&mm.cast_a, (size_t)casts.inputs * sizeof(__nv_bfloat16), "the BF16 GEMM input casts");
    matmul_alloc(mm, (void**)&mm.cast_b, (size_t)casts.output_grads * sizeof(__nv_bfloat16),
                 "the BF16 GEMM output-gradient casts");
    mm.cast_capacity = casts;
}

// The FP8 buffers grown to at least their sizes for `casts` (as the real matmul_fp8_buffer grows them)
inline void stand_in_fp8_reserve(Matmul& mm, MatmulCasts casts) {
    const auto sizes = matmul_fp8_sizes(casts);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            const int64_t bytes = sizes[i][j] * (j == 0 ? 1 : (int64_t)sizeof(float));
            if (bytes <= mm.fp8_capacity[i][j]) continue;
            CUDA_CHECK(cudaFree(mm.fp8[i][j]));
            mm.fp8[i][j] = nullptr;
            matmul_alloc(mm, &mm.fp8[i][j], (size_t)bytes, "the FP8 GEMM operands");
            mm.fp8_capacity[i][j] = bytes;
        }
}

// casts: the largest input and output gradient any BF16 call will cast; {0, 0} for FP32-only use. fp8: the FP8
// buffers too.
inline void matmul_create(Matmul& mm, cudaStream_t stream, MatmulCasts casts, bool fp8 = false) {
    if (mm.workspace) matmul_destroy(mm);
    mm = Matmul{};
    mm.stream = stream;
    matmul_alloc(mm, &mm.workspace, MATMUL_LANES * MATMUL_WORKSPACE_BYTES, "the cuBLASLt workspaces");
    mm.workspace_bytes = MATMUL_WORKSPACE_BYTES;
    if (casts.inputs > 0 || casts.output_grads > 0) matmul_alloc_casts(mm, casts);
    mm.fp8_enabled = fp8;
    if (fp8) stand_in_fp8_reserve(mm, casts);
}

// Grows the cast buffers to at least casts (a Matmul created for FP32 only never casts and stays without them).
inline void matmul_reserve(Matmul& mm, MatmulCasts casts) {
    if (mm.fp8_enabled) stand_in_fp8_reserve(mm, casts);
    const MatmulCasts have = mm.cast_capacity;
    const bool fp32_only = have.inputs + have.output_grads == 0;
    if (fp32_only || (casts.inputs <= have.inputs && casts.output_grads <= have.output_grads)) return;
    CUDA_CHECK(cudaStreamSynchronize(mm.stream));
    CUDA_CHECK(cudaFree(mm.cast_a));
    CUDA_CHECK(cudaFree(mm.cast_b));
    mm.cast_a = mm.cast_b = nullptr;
    mm.cast_capacity = MatmulCasts{};
    matmul_alloc_casts(mm, {std::max(casts.inputs, have.inputs), std::max(casts.output_grads, have.output_grads)});
}

// The real matmul_cast: n elements into the input's or the output gradient's buffer; beyond its capacity is an
// internal error.
inline const __nv_bfloat16* matmul_cast(Matmul& mm, bool output_grad, const float* src, int64_t n, const char* site,
                                        const char* operand) {
    __nv_bfloat16* buffer = output_grad ? mm.cast_b : mm.cast_a;
    const int64_t capacity = output_grad ? mm.cast_capacity.output_grads : mm.cast_capacity.inputs;
    if (n > capacity || buffer == nullptr)
        stand_in::violation(std::string(site) + ": the BF16 cast of " + operand + " needs " + std::to_string(n) +
                            " elements, the Matmul holds " + std::to_string(capacity));
    cast_to_bf16(buffer, src, n, mm.stream);
    return buffer;
}

// inp's FP32 rows from row `first` on, or nullptr when there are none
inline const float* stand_in_rows(const GemmInput& inp, int64_t first, int64_t K) {
    return inp.fp32 ? inp.fp32 + first * K : nullptr;
}

// The caller's BF16 copy of an operand (n elements), which must be, when the product runs, the rounding of the
// FP32 rows if there are any (rows not null): a copy not refreshed after its rows changed, or made of other rows, is
// a contract violation.
inline const __nv_bfloat16* stand_in_checked_copy(Matmul& mm, const __nv_bfloat16* copy, const float* rows, int64_t n,
                                                  const char* site, const char* operand) {
    dev(copy, n, std::string(site) + " " + operand + " (BF16 copy)");
    if (!rows) return copy;  // written only in BF16
    launch(mm.stream, [=] {
        for (int64_t i = 0; i < n; i++) {
            const __nv_bfloat16 want = __float2bfloat16_rn(rows[i]);
            if (memcmp(&want, &copy[i], sizeof want) != 0)
                stand_in::violation(std::string(site) + ": the BF16 copy of " + operand +
                                    " is not the rounding of its FP32 rows (element " + std::to_string(i) + ")");
        }
    });
    return copy;
}

// The BF16 rows of x (width wide) from row `first` on (n elements): a cast into the buffer of inputs (or of output
// gradients), or the caller's copy.
inline const __nv_bfloat16* matmul_bf16_rows(Matmul& mm, const GemmInput& x, int64_t first, int64_t width, int64_t n,
                                             const char* site, bool output_grad = false) {
    const char* operand = output_grad ? "dout" : "inp";
    if (!x.bf16) return matmul_cast(mm, output_grad, x.fp32 + first * width, n, site, operand);
    return stand_in_checked_copy(mm, x.bf16 + first * width, stand_in_rows(x, first, width), n, site, operand);
}

// The FP32 rows of an operand (rows elements from row `first`), checked to lie in device memory; they may be absent
// only when a BF16 copy is given and the call is BF16.
inline void stand_in_input_fp32(const GemmInput& inp, bool bf16, int64_t first, int64_t K, int64_t rows,
                                const std::string& what) {
    if (inp.fp32 || !(bf16 && inp.bf16)) dev(stand_in_rows(inp, first, K), rows * K, what);
}

// FP8: the weight's copies checked to lie in device memory, and read back as floats: W (N, K) from q, or W^T (K, N)
// from q^T (transposed), each element its E4M3 value times its block's scale.
inline void stand_in_fp8_weight(const Fp8Weight& w, int64_t N, int64_t K, const std::string& site) {
    dev(w.q, N * K, site + " W (FP8)");
    dev(w.qt, N * K, site + " W^T (FP8)");
    dev(w.scales, fp8_blk128_scales(N, K), site + " W's scales");
    dev(w.scales_t, fp8_blk128_scales(K, N), site + " W^T's scales");
}
inline std::vector<float> stand_in_fp8_decoded(const __nv_fp8_storage_t* q, const float* scales, int64_t rows,
                                               int64_t cols, bool transposed) {
    std::vector<float> out(rows * cols);
    const int64_t ld_scales = round_up(ceil_div(cols, FP8_TILE), 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const float v = stand_in_e4m3_value(q[r * cols + c]) * scales[(r / FP8_TILE) * ld_scales + c / FP8_TILE];
            out[transposed ? c * rows + r : r * cols + c] = v;
        }
    return out;
}
// An FP8 call's activation operand (rows from row `first`, `cols` wide) as floats: its FP32 rows, else its BF16 copy,
// rounded as fp8_round_trip does in tiles of tile_rows x tile_cols
inline std::vector<float> stand_in_fp8_operand(const GemmInput& x, int64_t first, int64_t rows, int64_t cols,
                                               int64_t tile_rows, int64_t tile_cols) {
    std::vector<float> v = x.fp32 ? std::vector<float>(x.fp32 + first * cols, x.fp32 + (first + rows) * cols)
                                  : stand_in_widen(x.bf16 + first * cols, rows * cols);
    fp8_round_trip(v.data(), v.data(), rows, cols, tile_rows, tile_cols);
    return v;
}
// One group's (or a dense call's) FP8 products, on the host when the stream runs: out = inp8 W8^T, and/or dinp (=|+=)
// dout8 W8 and dW += dout8c^T inp8c (128 x 1 tiles down the rows)
inline void stand_in_fp8_forward(float* out, const GemmInput& inp, int64_t first, const Fp8Weight& w, int64_t M,
                                 int64_t K, int64_t N) {
    ::matmul_forward(out, stand_in_fp8_operand(inp, first, M, K, 1, FP8_TILE).data(),
                     stand_in_fp8_decoded(w.q, w.scales, N, K, false).data(), M, K, N);
}
inline void stand_in_fp8_backward(float* dinp, float* dW, const GemmInput& dout, const GemmInput& inp, int64_t first,
                                  const Fp8Weight& w, int64_t M, int64_t K, int64_t N, bool accumulate_dinp) {
    if (dinp)
        gemm_nn(dinp, stand_in_fp8_operand(dout, first, M, N, 1, FP8_TILE).data(),
                stand_in_fp8_decoded(w.qt, w.scales_t, K, N, true).data(), M, N, K, accumulate_dinp);
    ::matmul_backward(nullptr, dW, stand_in_fp8_operand(dout, first, M, N, FP8_TILE, 1).data(),
                      stand_in_fp8_operand(inp, first, M, K, FP8_TILE, 1).data(), nullptr, M, K, N, false);
}

// out (M, N) (=|+=) inp (M, K) @ W^T, W (N, K), in W's precision (GemmWeight).
inline void matmul_forward(Matmul& mm, float* out, GemmInput inp, const GemmWeight& Wt, int64_t M, int64_t K,
                           int64_t N, bool accumulate) {
    if (M == 0) return;
    const GemmType type = Wt.type();
    const float* W = Wt.fp32;
    const __nv_bfloat16* W16 = type == GemmType::BF16 ? Wt.bf16 : nullptr;
    const Fp8Weight W8 = Wt.fp8;
    dev(out, M * N, "matmul_forward out");
    stand_in_input_fp32(inp, type != GemmType::FP32, 0, K, M, "matmul_forward inp");
    dev(W, N * K, "matmul_forward W");
    apart("matmul_forward", {span(out, M * N, "out")}, {span(inp.fp32, M * K, "inp"), span(W, N * K, "W")});
    const __nv_bfloat16* inp16 = nullptr;
    if (W16) {
        dev(W16, N * K, "matmul_forward W16");
        inp16 = matmul_bf16_rows(mm, inp, 0, K, M * K, "matmul_forward");
    }
    if (type == GemmType::FP8) stand_in_fp8_weight(W8, N, K, "matmul_forward");
    launch(mm.stream, [=] {
        std::vector<float> product(M * N);
        if (type == GemmType::FP8)
            stand_in_fp8_forward(product.data(), inp, 0, W8, M, K, N);
        else if (W16)
            ::matmul_forward(product.data(), stand_in_widen(inp16, M * K).data(), stand_in_widen(W16, N * K).data(), M,
                             K, N);
        else
            ::matmul_forward(product.data(), inp.fp32, W, M, K, N);
        for (int64_t i = 0; i < M * N; i++) out[i] = accumulate ? out[i] + product[i] : product[i];
    });
}

// dinp (M, K) (=|+=) dout (M, N) @ W (skipped when dinp is nullptr); dW (N, K) += dout^T @ inp.
inline void matmul_backward(Matmul& mm, float* dinp, float* dW, GemmInput dout, GemmInput inp, const GemmWeight& Wt,
                            int64_t M, int64_t K, int64_t N, bool accumulate_dinp) {
    if (M == 0) return;
    const GemmType type = Wt.type();
    const float* W = Wt.fp32;
    const __nv_bfloat16* W16 = type == GemmType::BF16 ? Wt.bf16 : nullptr;
    const Fp8Weight W8 = Wt.fp8;
    if (dinp) dev(dinp, M * K, "matmul_backward dinp");
    dev(dW, N * K, "matmul_backward dW");
    stand_in_input_fp32(dout, type != GemmType::FP32, 0, N, M, "matmul_backward dout");
    stand_in_input_fp32(inp, type != GemmType::FP32, 0, K, M, "matmul_backward inp");
    dev(W, N * K, "matmul_backward W");
    apart("matmul_backward", {span(dinp, M * K, "dinp"), span(dW, N * K, "dW")},
          {span(dout.fp32, M * N, "dout"), span(inp.fp32, M * K, "inp"), span(W, N * K, "W")});
    const __nv_bfloat16 *dout16 = nullptr, *inp16 = nullptr;
    if (W16) {
        dev(W16, N * K, "matmul_backward W16");
        dout16 = matmul_bf16_rows(mm, dout, 0, N, M * N, "matmul_backward", /*output_grad*/ true);
        inp16 = matmul_bf16_rows(mm, inp, 0, K, M * K, "matmul_backward");
    }
    if (type == GemmType::FP8) stand_in_fp8_weight(W8, N, K, "matmul_backward");
    launch(mm.stream, [=] {
        if (type == GemmType::FP8)
            stand_in_fp8_backward(dinp, dW, dout, inp, 0, W8, M, K, N, accumulate_dinp);
        else if (W16)
            ::matmul_backward(dinp, dW, stand_in_widen(dout16, M * N).data(), stand_in_widen(inp16, M * K).data(),
                              stand_in_widen(W16, N * K).data(), M, K, N, accumulate_dinp);
        else
            ::matmul_backward(dinp, dW, dout.fp32, inp.fp32, W, M, K, N, accumulate_dinp);
    });
}

// Checks the host offsets (G+1 entries, nonnegative, nondecreasing) and returns them.
inline std::vector<int64_t> stand_in_offsets(const char* site, const int64_t* offsets, int64_t G) {
    if (offsets[0] < 0) stand_in::violation(std::string(site) + ": offsets[0] < 0");
    for (int64_t g = 0; g < G; g++)
        if (offsets[g + 1] < offsets[g]) stand_in::violation(std::string(site) + ": offsets decrease");
    return std::vector<int64_t>(offsets, offsets + G + 1);
}

// out rows [offsets[g], offsets[g+1]) (=) inp rows @ W_g^T, W (G, N, K) in its precision. offsets: host.
inline void grouped_matmul_forward(Matmul& mm, float* out, GemmInput inp, const GemmWeight& Wt, const int64_t* offsets,
                                   int64_t G, int64_t K, int64_t N) {
    if (G <= 0) return;
    const std::vector<int64_t> off = stand_in_offsets("grouped_matmul_forward", offsets, G);
    const int64_t first = off[0], rows = off[G] - first;
    if (rows == 0) return;
    const GemmType type = Wt.type();
    const float* W = Wt.fp32;
    const __nv_bfloat16* W16 = type == GemmType::BF16 ? Wt.bf16 : nullptr;
    dev(out + first * N, rows * N, "grouped_matmul_forward out");
    stand_in_input_fp32(inp, type != GemmType::FP32, first, K, rows, "grouped_matmul_forward inp");
    dev(W, G * N * K, "grouped_matmul_forward W");
    apart("grouped_matmul_forward", {span(out + first * N, rows * N, "out")},
          {span(stand_in_rows(inp, first, K), rows * K, "inp"), span(W, G * N * K, "W")});
    const __nv_bfloat16* inp16 = nullptr;
    if (W16) {
        dev(W16, G * N * K, "grouped_matmul_forward W16");
        inp16 = matmul_bf16_rows(mm, inp, first, K, rows * K, "grouped_matmul_forward");
    }
    if (type == GemmType::FP8)
        for (int64_t g = 0; g < G; g++) stand_in_fp8_weight(Wt.fp8.at(g, N, K), N, K, "grouped_matmul_forward");
    launch(mm.stream, [=] {
        for (int64_t g = 0; g < G; g++) {
            const int64_t r0 = off[g], M = off[g + 1] - r0;
            if (M == 0) continue;
            if (type == GemmType::FP8)
                stand_in_fp8_forward(out + r0 * N, inp, r0, Wt.fp8.at(g, N, K), M, K, N);
            else if (W16)
                ::matmul_forward(out + r0 * N, stand_in_widen(inp16 + (r0 - first) * K, M * K).data(),
                                 stand_in_widen(W16 + g * N * K, N * K).data(), M, K, N);
            else
                ::matmul_forward(out + r0 * N, inp.fp32 + r0 * K, W + g * N * K, M, K, N);
        }
    });
}

// Per group g: dinp rows (=) dout rows @ W_g;  dW_g (N, K) += dout rows^T @ inp rows. offsets: host.
inline void grouped_matmul_backward(Matmul& mm, float* dinp, float* dW, const float* dout, GemmInput inp,
                                    const GemmWeight& Wt, const int64_t* offsets, int64_t G, int64_t K, int64_t N) {
    if (G <= 0) return;
    const std::vector<int64_t> off = stand_in_offsets("grouped_matmul_backward", offsets, G);
    const int64_t first = off[0], rows = off[G] - first;
    if (rows == 0) return;
    const GemmType type = Wt.type();
    const float* W = Wt.fp32;
    const __nv_bfloat16* W16 = type == GemmType::BF16 ? Wt.bf16 : nullptr;
    if (dinp) dev(dinp + first * K, rows * K, "grouped_matmul_backward dinp");
    dev(dW, G * N * K, "grouped_matmul_backward dW");
    dev(dout + first * N, rows * N, "grouped_matmul_backward dout");
    stand_in_input_fp32(inp, type != GemmType::FP32, first, K, rows, "grouped_matmul_backward inp");
    dev(W, G * N * K, "grouped_matmul_backward W");
    apart("grouped_matmul_backward",
          {span(dinp ? dinp + first * K : nullptr, rows * K, "dinp"), span(dW, G * N * K, "dW")},
          {span(dout + first * N, rows * N, "dout"), span(stand_in_rows(inp, first, K), rows * K, "inp"),
           span(W, G * N * K, "W")});
    const __nv_bfloat16 *dout16 = nullptr, *inp16 = nullptr;
    if (W16) {
        dev(W16, G * N * K, "grouped_matmul_backward W16");
        dout16 = matmul_cast(mm, true, dout + first * N, rows * N, "grouped_matmul_backward", "dout");
        inp16 = matmul_bf16_rows(mm, inp, first, K, rows * K, "grouped_matmul_backward");
    }
    if (type == GemmType::FP8)
        for (int64_t g = 0; g < G; g++) stand_in_fp8_weight(Wt.fp8.at(g, N, K), N, K, "grouped_matmul_backward");
    launch(mm.stream, [=] {
        for (int64_t g = 0; g < G; g++) {
            const int64_t r0 = off[g], M = off[g + 1] - r0;
            if (M == 0) continue;
            float* dinp_g = dinp ? dinp + r0 * K : nullptr;
            if (type == GemmType::FP8)
                stand_in_fp8_backward(dinp_g, dW + g * N * K, dout, inp, r0, Wt.fp8.at(g, N, K), M, K, N, false);
            else if (W16)
                ::matmul_backward(dinp_g, dW + g * N * K, stand_in_widen(dout16 + (r0 - first) * N, M * N).data(),
                                  stand_in_widen(inp16 + (r0 - first) * K, M * K).data(),
                                  stand_in_widen(W16 + g * N * K, N * K).data(), M, K, N, false);
            else
                ::matmul_backward(dinp_g, dW + g * N * K, dout + r0 * N, inp.fp32 + r0 * K, W + g * N * K, M, K, N,
                                  false);
        }
    });
}

}  // namespace gpu
