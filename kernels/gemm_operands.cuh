// The GEMMs' operands (docs/design.md §7.4) and what a Matmul allocates, apart from kernels/matmul.cuh so that the
// GPU model's headers need not see cuBLASLt.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/fp8.cuh"

namespace gpu {

constexpr size_t MATMUL_WORKSPACE_BYTES = size_t(32) << 20;  // per stream: what cuBLASLt recommends for Hopper
constexpr int MATMUL_STREAMS = 4;                                // streams a grouped GEMM spreads its groups over

// Sizes in values. inputs, output_grads: the BF16 casts of a GEMM's input (rows x K) and output gradient (rows x N),
// both 0 for an FP32-only Matmul; output_grads sizes the FP8 output gradients too. fp8_inputs: the largest input an
// FP8 GEMM quantizes. The FP8 sizes count the weight gradient's rows padded to 16, over all groups of a call.
// fp8_tails: the FP8 products' last rows, 4 rows of the output a group (kernels/matmul.cuh fp8_row_products).
struct MatmulCasts {
    int64_t inputs = 0, output_grads = 0, fp8_inputs = 0, fp8_tails = 0;
};

enum class GemmType { FP32, TF32, BF16, FP8 };

// A GEMM's input (M, K) or output gradient (M, N): its FP32 rows and, in BF16 mode, the BF16 copy its caller may
// keep, laid out alike. The call reads that copy instead of casting. fp32 is nullptr for an operand written only in
// BF16. A plain const float* converts to a GemmInput without a copy; the call then casts.
struct GemmInput {
    const float* fp32;
    const __nv_bfloat16* bf16;
    GemmInput(const float* rows, const __nv_bfloat16* rows_bf16 = nullptr) : fp32(rows), bf16(rows_bf16) {}
};

// A weight W (N, K) in E4M3 as fp8_quantize_blocks writes it: q (N, K) for the forward and q^T (K, N) for the input
// gradient, each with its 128 x 128 block scales. A stack (G, N, K): matrix g of each at g times its size (at(g)).
struct Fp8Weight {
    const __nv_fp8_storage_t *q = nullptr, *qt = nullptr;
    const float *scales = nullptr, *scales_t = nullptr;
    Fp8Weight at(int64_t g, int64_t N, int64_t K) const {
        return q ? Fp8Weight{q + g * N * K, qt + g * N * K, scales + g * fp8_blk128_scales(N, K),
                             scales_t + g * fp8_blk128_scales(K, N)}
                 : Fp8Weight{};
    }
};

// A linear layer's weight W (N, K), or a stack (G, N, K): FP32 (FP32 mode, and the router), or the BF16 working copy
// (BF16 and FP8 modes) with the E4M3 copies (FP8 mode). The most compact copy present decides the precision: FP8,
// else BF16, else FP32, or TF32 for an FP32 weight made by tf32_inputs: FP32 operands that the tensor cores round to
// TF32 (10-bit mantissa).
struct GemmWeight {
    const float* fp32;
    const __nv_bfloat16* bf16;
    Fp8Weight fp8;
    bool tf32 = false;
    GemmWeight(const float* w, const __nv_bfloat16* w16 = nullptr, Fp8Weight w8 = {}) : fp32(w), bf16(w16), fp8(w8) {}
    static GemmWeight tf32_inputs(const float* w) {
        GemmWeight g(w);
        g.tf32 = true;
        return g;
    }
    GemmType type() const {
        return fp8.q ? GemmType::FP8 : bf16 ? GemmType::BF16 : tf32 ? GemmType::TF32 : GemmType::FP32;
    }
    GemmWeight at(int64_t g, int64_t N, int64_t K) const {
        GemmWeight w(fp32 ? fp32 + g * N * K : nullptr, bf16 ? bf16 + g * N * K : nullptr, fp8.at(g, N, K));
        w.tf32 = tf32;
        return w;
    }
};

// An FP8 weight gradient sums over the M tokens, zero-padded to 16: FP8 leading dimensions are 16-byte multiples
inline int64_t fp8_padded_rows(int64_t M) { return round_up(M, 16); }

// The FP8 buffers' {values, scales} (FP8_INPUT, FP8_GRAD_ROWS, FP8_GRAD_T) for the sizes in casts. A scale per 128
// values along rows at least 16 wide: at most values / 16, plus room for a few groups' padding. They grow if needed.
inline std::array<std::array<int64_t, 2>, 3> matmul_fp8_sizes(MatmulCasts casts) {
    auto sized = [](int64_t values) { return std::array<int64_t, 2>{values, values / 16 + 1024}; };
    return {sized(casts.fp8_inputs), sized(casts.output_grads), sized(casts.output_grads)};
}

// The workspaces, the cast buffers and with fp8 the FP8 buffers, as matmul_create allocates them for `casts`.
inline int64_t matmul_memory_bytes(MatmulCasts casts, bool fp8 = false) {
    const int64_t workspaces = (int64_t)MATMUL_STREAMS * (int64_t)MATMUL_WORKSPACE_BYTES;
    int64_t fp8_bytes = 0;
    if (fp8) {
        for (const auto& size : matmul_fp8_sizes(casts)) fp8_bytes += size[0] + size[1] * (int64_t)sizeof(float);
        fp8_bytes += casts.fp8_tails * (int64_t)sizeof(float);
    }
    return workspaces + (casts.inputs + casts.output_grads) * (int64_t)sizeof(__nv_bfloat16) + fp8_bytes;
}

}  // namespace gpu
