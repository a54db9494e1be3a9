// The operands of the GEMMs (kernels/matmul.cuh), shared with its CPU stand-in (test/cpu_stand_in/kernels/matmul.cuh):
// an input with the copies its caller keeps (GemmInput), a weight with the copies its precision reads (GemmWeight),
// and which precision that is (GemmType).
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/fp8.cuh"

namespace gpu {

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

}  // namespace gpu
