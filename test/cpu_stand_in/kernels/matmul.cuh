// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/matmul.cuh: the same public types and calls, the
// products by model/ops.h's matmul_forward / matmul_backward. Row-major, weights W (N, K) = [out, in]:
//   forward:  out (M, N) (=|+=) inp (M, K) @ W^T;   backward: dinp (M, K) (=|+=) dout @ W,  dW (N, K) += dout^T inp
//   grouped:  rows [offsets[g], offsets[g+1]) (host offsets) use W_g of W (G, N, K); the forward and dinp are
//             overwritten (=), dW_g +=.
// Precision::BF16 (W16 given): the activation operands are cast into the Matmul's two cast buffers (their
// capacity checked, as the real matmul_cast does), or an input's BF16 copy comes from the caller (checked to be
// the rounding of its FP32 rows when the product runs); the weights are read from W16, and the product runs in
// FP32 on the BF16 values. The real one also allocates cuBLASLt workspaces (one per lane: the streams its grouped
// calls spread over): so does this one, so the allocations add up to matmul_memory_bytes. The groups run in order.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "model/ops.h"

namespace gpu {

constexpr size_t MATMUL_WORKSPACE_BYTES = size_t(32) << 20;
constexpr int MATMUL_LANES = 4;

// Sizes (elements) of a Matmul's two BF16 cast buffers: cast_a holds a GEMM's input (rows x K), cast_b its output
// gradient (rows x N). 0 and 0: an FP32-only Matmul, without buffers.
struct MatmulCasts {
    int64_t inputs = 0, output_grads = 0;
};

// A GEMM's input rows as FP32, and in BF16 mode possibly the caller's BF16 copy of them (see the real header).
struct GemmInput {
    const float* fp32;
    const __nv_bfloat16* bf16;
    GemmInput(const float* rows, const __nv_bfloat16* rows_bf16 = nullptr) : fp32(rows), bf16(rows_bf16) {}
};

struct Matmul {  // one per stream
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    __nv_bfloat16 *cast_a = nullptr, *cast_b = nullptr;  // BF16 casts of the activation operands
    MatmulCasts cast_capacity;
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

inline int64_t matmul_memory_bytes(MatmulCasts casts) {
    const int64_t workspaces = (int64_t)MATMUL_LANES * (int64_t)MATMUL_WORKSPACE_BYTES;
    return workspaces + (casts.inputs + casts.output_grads) * (int64_t)sizeof(__nv_bfloat16);
}

inline void matmul_destroy(Matmul& mm) {
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

// casts: the largest input and output gradient any BF16 call will cast; {0, 0} for FP32-only use.
inline void matmul_create(Matmul& mm, cudaStream_t stream, MatmulCasts casts) {
    if (mm.workspace) matmul_destroy(mm);
    mm = Matmul{};
    mm.stream = stream;
    matmul_alloc(mm, &mm.workspace, MATMUL_LANES * MATMUL_WORKSPACE_BYTES, "the cuBLASLt workspaces");
    mm.workspace_bytes = MATMUL_WORKSPACE_BYTES;
    if (casts.inputs > 0 || casts.output_grads > 0) matmul_alloc_casts(mm, casts);
}

// Grows the cast buffers to at least casts (a Matmul created for FP32 only never casts and stays without them).
inline void matmul_reserve(Matmul& mm, MatmulCasts casts) {
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

// The BF16 rows of inp from row `first` on (n elements): a cast into the input buffer, or the caller's copy.
inline const __nv_bfloat16* matmul_input_bf16(Matmul& mm, const GemmInput& inp, int64_t first, int64_t K, int64_t n,
                                              const char* site) {
    if (!inp.bf16) return matmul_cast(mm, false, inp.fp32 + first * K, n, site, "inp");
    return stand_in_checked_copy(mm, inp.bf16 + first * K, stand_in_rows(inp, first, K), n, site, "inp");
}

// The FP32 rows of an operand (rows elements from row `first`), checked to lie in device memory; they may be absent
// only when a BF16 copy is given and the call is BF16.
inline void stand_in_input_fp32(const GemmInput& inp, bool bf16, int64_t first, int64_t K, int64_t rows,
                                const std::string& what) {
    if (inp.fp32 || !(bf16 && inp.bf16)) dev(stand_in_rows(inp, first, K), rows * K, what);
}

// out (M, N) (=|+=) inp (M, K) @ W^T, W (N, K). W16 (BF16 copy of W) given: BF16 inputs; nullptr: FP32.
inline void matmul_forward(Matmul& mm, float* out, GemmInput inp, const float* W, const __nv_bfloat16* W16,
                           int64_t M, int64_t K, int64_t N, bool accumulate) {
    if (M == 0) return;
    dev(out, M * N, "matmul_forward out");
    stand_in_input_fp32(inp, W16, 0, K, M, "matmul_forward inp");
    dev(W, N * K, "matmul_forward W");
    apart("matmul_forward", {span(out, M * N, "out")}, {span(inp.fp32, M * K, "inp"), span(W, N * K, "W")});
    const __nv_bfloat16* inp16 = nullptr;
    if (W16) {
        dev(W16, N * K, "matmul_forward W16");
        inp16 = matmul_input_bf16(mm, inp, 0, K, M * K, "matmul_forward");
    }
    launch(mm.stream, [=] {
        std::vector<float> product(M * N);
        if (W16)
            ::matmul_forward(product.data(), stand_in_widen(inp16, M * K).data(), stand_in_widen(W16, N * K).data(), M,
                             K, N);
        else
            ::matmul_forward(product.data(), inp.fp32, W, M, K, N);
        for (int64_t i = 0; i < M * N; i++) out[i] = accumulate ? out[i] + product[i] : product[i];
    });
}

// dinp (M, K) (=|+=) dout (M, N) @ W (skipped when dinp is nullptr); dW (N, K) += dout^T @ inp.
inline void matmul_backward(Matmul& mm, float* dinp, float* dW, GemmInput dout, GemmInput inp, const float* W,
                            const __nv_bfloat16* W16, int64_t M, int64_t K, int64_t N, bool accumulate_dinp) {
    if (M == 0) return;
    if (dinp) dev(dinp, M * K, "matmul_backward dinp");
    dev(dW, N * K, "matmul_backward dW");
    stand_in_input_fp32(dout, W16, 0, N, M, "matmul_backward dout");
    stand_in_input_fp32(inp, W16, 0, K, M, "matmul_backward inp");
    dev(W, N * K, "matmul_backward W");
    apart("matmul_backward", {span(dinp, M * K, "dinp"), span(dW, N * K, "dW")},
          {span(dout.fp32, M * N, "dout"), span(inp.fp32, M * K, "inp"), span(W, N * K, "W")});
    const __nv_bfloat16 *dout16 = nullptr, *inp16 = nullptr;
    if (W16) {
        dev(W16, N * K, "matmul_backward W16");
        dout16 = dout.bf16 ? stand_in_checked_copy(mm, dout.bf16, dout.fp32, M * N, "matmul_backward", "dout")
                           : matmul_cast(mm, true, dout.fp32, M * N, "matmul_backward", "dout");
        inp16 = matmul_input_bf16(mm, inp, 0, K, M * K, "matmul_backward");
    }
    launch(mm.stream, [=] {
        if (W16)
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

// out rows [offsets[g], offsets[g+1]) (=) inp rows @ W_g^T, W (G, N, K); W16 likewise or nullptr. offsets: host.
inline void grouped_matmul_forward(Matmul& mm, float* out, GemmInput inp, const float* W,
                                   const __nv_bfloat16* W16, const int64_t* offsets, int64_t G, int64_t K,
                                   int64_t N) {
    if (G <= 0) return;
    const std::vector<int64_t> off = stand_in_offsets("grouped_matmul_forward", offsets, G);
    const int64_t first = off[0], rows = off[G] - first;
    if (rows == 0) return;
    dev(out + first * N, rows * N, "grouped_matmul_forward out");
    stand_in_input_fp32(inp, W16, first, K, rows, "grouped_matmul_forward inp");
    dev(W, G * N * K, "grouped_matmul_forward W");
    apart("grouped_matmul_forward", {span(out + first * N, rows * N, "out")},
          {span(stand_in_rows(inp, first, K), rows * K, "inp"), span(W, G * N * K, "W")});
    const __nv_bfloat16* inp16 = nullptr;
    if (W16) {
        dev(W16, G * N * K, "grouped_matmul_forward W16");
        inp16 = matmul_input_bf16(mm, inp, first, K, rows * K, "grouped_matmul_forward");
    }
    launch(mm.stream, [=] {
        for (int64_t g = 0; g < G; g++) {
            const int64_t r0 = off[g], M = off[g + 1] - r0;
            if (M == 0) continue;
            if (W16)
                ::matmul_forward(out + r0 * N, stand_in_widen(inp16 + (r0 - first) * K, M * K).data(),
                                 stand_in_widen(W16 + g * N * K, N * K).data(), M, K, N);
            else
                ::matmul_forward(out + r0 * N, inp.fp32 + r0 * K, W + g * N * K, M, K, N);
        }
    });
}

// Per group g: dinp rows (=) dout rows @ W_g;  dW_g (N, K) += dout rows^T @ inp rows. offsets: host.
inline void grouped_matmul_backward(Matmul& mm, float* dinp, float* dW, const float* dout, GemmInput inp,
                                    const float* W, const __nv_bfloat16* W16, const int64_t* offsets, int64_t G,
                                    int64_t K, int64_t N) {
    if (G <= 0) return;
    const std::vector<int64_t> off = stand_in_offsets("grouped_matmul_backward", offsets, G);
    const int64_t first = off[0], rows = off[G] - first;
    if (rows == 0) return;
    if (dinp) dev(dinp + first * K, rows * K, "grouped_matmul_backward dinp");
    dev(dW, G * N * K, "grouped_matmul_backward dW");
    dev(dout + first * N, rows * N, "grouped_matmul_backward dout");
    stand_in_input_fp32(inp, W16, first, K, rows, "grouped_matmul_backward inp");
    dev(W, G * N * K, "grouped_matmul_backward W");
    apart("grouped_matmul_backward", {span(dinp ? dinp + first * K : nullptr, rows * K, "dinp"), span(dW, G * N * K, "dW")},
          {span(dout + first * N, rows * N, "dout"), span(stand_in_rows(inp, first, K), rows * K, "inp"),
           span(W, G * N * K, "W")});
    const __nv_bfloat16 *dout16 = nullptr, *inp16 = nullptr;
    if (W16) {
        dev(W16, G * N * K, "grouped_matmul_backward W16");
        dout16 = matmul_cast(mm, true, dout + first * N, rows * N, "grouped_matmul_backward", "dout");
        inp16 = matmul_input_bf16(mm, inp, first, K, rows * K, "grouped_matmul_backward");
    }
    launch(mm.stream, [=] {
        for (int64_t g = 0; g < G; g++) {
            const int64_t r0 = off[g], M = off[g + 1] - r0;
            if (M == 0) continue;
            float* dinp_g = dinp ? dinp + r0 * K : nullptr;
            if (W16)
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
