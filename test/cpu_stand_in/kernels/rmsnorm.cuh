// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/rmsnorm.cuh: the CPU reference's functions. The
// scratch is not used, but its size is checked against the contract.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "model/ops.h"

namespace gpu {

constexpr int64_t RMSNORM_DW_ROWS = 128;

// floats of scratch rmsnorm_backward needs for M rows of C
inline int64_t rmsnorm_backward_scratch_floats(int64_t M, int64_t C) { return ceil_div(M, RMSNORM_DW_ROWS) * C; }

// out16 = out rounded to BF16, when out16 is not null
inline void stand_in_round_copy(__nv_bfloat16* out16, const float* out, int64_t n) {
    if (out16)
        for (int64_t i = 0; i < n; i++) out16[i] = __float2bfloat16_rn(out[i]);
}

// inp, out (M, C), w (C) -> out, rstd (M), and out16 (M, C) = out rounded to BF16 unless out16 is null
inline void rmsnorm_forward(float* out, __nv_bfloat16* out16, float* rstd, const float* inp, const float* w, int64_t M,
                            int64_t C, float eps, cudaStream_t stream) {
    if (M == 0) return;
    dev(out, M * C, "rmsnorm_forward out");
    if (out16) dev(out16, M * C, "rmsnorm_forward out16");
    dev(rstd, M, "rmsnorm_forward rstd");
    dev(inp, M * C, "rmsnorm_forward inp");
    dev(w, C, "rmsnorm_forward w");
    apart("rmsnorm_forward", {span(out, M * C, "out"), span(out16, M * C, "out16"), span(rstd, M, "rstd")},
          {span(inp, M * C, "inp"), span(w, C, "w")});
    launch(stream, [=] {
        ::rmsnorm_forward(out, rstd, inp, w, M, C, eps);
        stand_in_round_copy(out16, out, M * C);
    });
}

// sum (M, C) = a + b (sum may be a or b), out (M, C) = RMSNorm(sum) w, rstd (M), out16 as rmsnorm_forward's
inline void residual_rmsnorm_forward(float* sum, float* out, __nv_bfloat16* out16, float* rstd, const float* a,
                                     const float* b, const float* w, int64_t M, int64_t C, float eps,
                                     cudaStream_t stream) {
    if (M == 0) return;
    dev(sum, M * C, "residual_rmsnorm_forward sum");
    dev(out, M * C, "residual_rmsnorm_forward out");
    if (out16) dev(out16, M * C, "residual_rmsnorm_forward out16");
    dev(rstd, M, "residual_rmsnorm_forward rstd");
    dev(a, M * C, "residual_rmsnorm_forward a");
    dev(b, M * C, "residual_rmsnorm_forward b");
    dev(w, C, "residual_rmsnorm_forward w");
    apart("residual_rmsnorm_forward", {span(out, M * C, "out"), span(out16, M * C, "out16"), span(rstd, M, "rstd")},
          {span(a, M * C, "a"), span(b, M * C, "b"), span(w, C, "w"), span(sum, M * C, "sum")});
    launch(stream, [=] {
        for (int64_t i = 0; i < M * C; i++) sum[i] = a[i] + b[i];
        ::rmsnorm_forward(out, rstd, sum, w, M, C, eps);
        stand_in_round_copy(out16, out, M * C);
    });
}

// dinp (M, C) (=|+=), dw (C) +=. scratch: rmsnorm_backward_scratch_floats(M, C) floats.
inline void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                             const float* rstd, int64_t M, int64_t C, bool accumulate_dinp, float* scratch,
                             cudaStream_t stream) {
    if (M == 0) return;
    dev(dinp, M * C, "rmsnorm_backward dinp");
    dev(dw, C, "rmsnorm_backward dw");
    dev(dout, M * C, "rmsnorm_backward dout");
    dev(inp, M * C, "rmsnorm_backward inp");
    dev(w, C, "rmsnorm_backward w");
    dev(rstd, M, "rmsnorm_backward rstd");
    dev(scratch, rmsnorm_backward_scratch_floats(M, C), "rmsnorm_backward scratch");
    apart("rmsnorm_backward",
          {span(dinp, M * C, "dinp"), span(dw, C, "dw"), span(scratch, rmsnorm_backward_scratch_floats(M, C), "scratch")},
          {span(dout, M * C, "dout"), span(inp, M * C, "inp"), span(w, C, "w"), span(rstd, M, "rstd")});
    launch(stream, [=] { ::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, M, C, accumulate_dinp); });
}

}  // namespace gpu
