// The operands of the GEMMs (kernels/matmul.cuh), apart so that the GPU model's headers need not see cuBLASLt: an
// input with the copies its caller keeps (GemmInput) and a weight with the copies its precision reads (GemmWeight),
// which precision that is (GemmType); and what a Matmul allocates (MatmulCasts, matmul_memory_bytes).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/fp8.cuh"

namespace gpu {

constexpr size_t MATMUL_WORKSPACE_BYTES = size_t(32) << 20;  // per lane: what cuBLASLt recommends for Hopper
constexpr int MATMUL_LANES = 4;                                // streams a grouped GEMM spreads its groups over

// Sizes (elements) of a Matmul's buffers. The two BF16 cast buffers: cast_a holds a GEMM's input (rows x K), cast_b
// its output gradient (rows x N); 0 and 0: an FP32-only Matmul, without them. fp8_inputs: the largest input an FP8
// GEMM quantizes (rows x K, or K x the rows padded to 16 for the weight gradient, all groups of a grouped call);
// output_grads sizes the FP8 output gradients too, so it counts that padding as well.
struct MatmulCasts {
    int64_t inputs = 0, output_grads = 0, fp8_inputs = 0;
};

// The operands' type: FP32, BF16, or E4M3 with per-tile scales (kernels/fp8.cuh)
enum class GemmType { FP32, BF16, FP8 };

// A GEMM's input rows (M, K), or output gradient (M, N), as FP32, and in BF16 mode possibly their BF16 copy, laid
// out alike (row r at r * K), made by the caller: then the call reads it instead of casting the rows itself, and the
// FP32 rows may be absent (nullptr: an operand written only in BF16). Converts from a plain const float* (no copy:
// the call casts).
struct GemmInput {
    const float* fp32;
    const __nv_bfloat16* bf16;
    GemmInput(const float* rows, const __nv_bfloat16* rows_bf16 = nullptr) : fp32(rows), bf16(rows_bf16) {}
};

// A weight W (N, K) in E4M3, as kernels/fp8.cuh's fp8_quantize_blocks writes it: q (N, K) with its 128 x 128 scales,
// read by the forward, and q^T (K, N) with its own, read by the input gradient. Stacked weights (G, N, K): matrix g
// of each at g times its size (at(g)).
struct Fp8Weight {
    const __nv_fp8_storage_t *q = nullptr, *qt = nullptr;
    const float *scales = nullptr, *scales_t = nullptr;
    Fp8Weight at(int64_t g, int64_t N, int64_t K) const {
        return q ? Fp8Weight{q + g * N * K, qt + g * N * K, scales + g * fp8_blk128_scales(N, K),
                             scales_t + g * fp8_blk128_scales(K, N)}
                 : Fp8Weight{};
    }
};

// A linear layer's weight W (N, K) (or a stack (G, N, K)) with the copies the GEMMs read: the FP32 master, and in
// BF16 or FP8 mode the caller's BF16 copy (refreshed after each update), and in FP8 mode its E4M3 copies. The most
// compact copy present decides the GEMMs' precision: FP8, else BF16, else FP32. Converts from a plain const float*.
struct GemmWeight {
    const float* fp32;
    const __nv_bfloat16* bf16;
    Fp8Weight fp8;
    GemmWeight(const float* w, const __nv_bfloat16* w16 = nullptr, Fp8Weight w8 = {}) : fp32(w), bf16(w16), fp8(w8) {}
    GemmType type() const { return fp8.q ? GemmType::FP8 : bf16 ? GemmType::BF16 : GemmType::FP32; }
    GemmWeight at(int64_t g, int64_t N, int64_t K) const {
        return GemmWeight(fp32 + g * N * K, bf16 ? bf16 + g * N * K : nullptr, fp8.at(g, N, K));
    }
};

// The rows of an FP8 weight gradient's operands, whose summed dimension is the tokens: M padded with zeros to a
// multiple of 16 (FP8 leading dimensions are multiples of 16 bytes)
inline int64_t fp8_padded_rows(int64_t M) { return round_up(M, 16); }

// The FP8 buffers' {values, scales} for GEMMs whose inputs and output gradients have up to `casts` elements:
// FP8_INPUT, FP8_GRAD_ROWS, FP8_GRAD_T. A scale per 128 values along rows at least 16 wide (FP8 widths are multiples
// of 16), so at most values / 16 of them, plus the padding of a few groups; the buffers grow beyond when needed.
inline std::array<std::array<int64_t, 2>, 3> matmul_fp8_sizes(MatmulCasts casts) {
    auto sized = [](int64_t values) { return std::array<int64_t, 2>{values, values / 16 + 1024}; };
    return {sized(casts.fp8_inputs), sized(casts.output_grads), sized(casts.output_grads)};
}

// The workspaces, the cast buffers and with fp8 the FP8 buffers, as matmul_create allocates them for `casts`.
inline int64_t matmul_memory_bytes(MatmulCasts casts, bool fp8 = false) {
    const int64_t workspaces = (int64_t)MATMUL_LANES * (int64_t)MATMUL_WORKSPACE_BYTES;
    int64_t fp8_bytes = 0;
    if (fp8)
        for (const auto& size : matmul_fp8_sizes(casts)) fp8_bytes += size[0] + size[1] * (int64_t)sizeof(float);
    return workspaces + (casts.inputs + casts.output_grads) * (int64_t)sizeof(__nv_bfloat16) + fp8_bytes;
}

}  // namespace gpu
