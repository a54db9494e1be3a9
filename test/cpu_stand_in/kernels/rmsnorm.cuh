// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/rmsnorm.cuh: the CPU reference's functions. The
// scratch is not used, but its size is checked against the contract.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "model/ops.h"

namespace gpu {

constexpr int64_t RMSNORM_DW_ROWS = 128;

// floats of scratch rmsnorm_backward needs for M rows of C
inline int64_t rmsnorm_backward_scratch_floats(int64_t M, int64_t C) { return ceil_div(M, RMSNORM_DW_ROWS) * C; }

// inp, out (M, C), w (C) -> out, rstd (M)
inline void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t M, int64_t C,
                            float eps, cudaStream_t stream) {
    if (M == 0) return;
    dev(out, M * C, "rmsnorm_forward out");
    dev(rstd, M, "rmsnorm_forward rstd");
    dev(inp, M * C, "rmsnorm_forward inp");
    dev(w, C, "rmsnorm_forward w");
    apart("rmsnorm_forward", {span(out, M * C, "out"), span(rstd, M, "rstd")}, {span(inp, M * C, "inp"), span(w, C, "w")});
    launch(stream, [=] { ::rmsnorm_forward(out, rstd, inp, w, M, C, eps); });
}

// sum (M, C) = a + b (sum may be a or b), out (M, C) = RMSNorm(sum) w, rstd (M)
inline void residual_rmsnorm_forward(float* sum, float* out, float* rstd, const float* a, const float* b,
                                     const float* w, int64_t M, int64_t C, float eps, cudaStream_t stream) {
    if (M == 0) return;
    dev(sum, M * C, "residual_rmsnorm_forward sum");
    dev(out, M * C, "residual_rmsnorm_forward out");
    dev(rstd, M, "residual_rmsnorm_forward rstd");
    dev(a, M * C, "residual_rmsnorm_forward a");
    dev(b, M * C, "residual_rmsnorm_forward b");
    dev(w, C, "residual_rmsnorm_forward w");
    apart("residual_rmsnorm_forward", {span(out, M * C, "out"), span(rstd, M, "rstd")},
          {span(a, M * C, "a"), span(b, M * C, "b"), span(w, C, "w"), span(sum, M * C, "sum")});
    launch(stream, [=] {
        for (int64_t i = 0; i < M * C; i++) sum[i] = a[i] + b[i];
        ::rmsnorm_forward(out, rstd, sum, w, M, C, eps);
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
