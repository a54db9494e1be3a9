// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/swiglu.cuh: the CPU reference's functions.
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "model/ops.h"

namespace gpu {

// out = silu(g) * u (n values)
inline void swiglu_forward(float* out, const float* g, const float* u, int64_t n, cudaStream_t stream) {
    dev(out, n, "swiglu_forward out");
    dev(g, n, "swiglu_forward g");
    dev(u, n, "swiglu_forward u");
    apart("swiglu_forward", {span(out, n, "out")}, {span(g, n, "g"), span(u, n, "u")});
    launch(stream, [=] { ::swiglu_forward(out, g, u, n); });
}

// the same values rounded to BF16
inline void swiglu_forward_bf16(__nv_bfloat16* out, const float* g, const float* u, int64_t n, cudaStream_t stream) {
    dev(out, n, "swiglu_forward_bf16 out");
    dev(g, n, "swiglu_forward_bf16 g");
    dev(u, n, "swiglu_forward_bf16 u");
    apart("swiglu_forward_bf16", {span(out, n, "out")}, {span(g, n, "g"), span(u, n, "u")});
    launch(stream, [=] {
        std::vector<float> a(n);
        ::swiglu_forward(a.data(), g, u, n);
        for (int64_t i = 0; i < n; i++) out[i] = __float2bfloat16_rn(a[i]);
    });
}

// dg = dout u s (1 + g (1 - s)), du = dout g s (overwritten)
inline void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n,
                            cudaStream_t stream) {
    dev(dg, n, "swiglu_backward dg");
    dev(du, n, "swiglu_backward du");
    dev(dout, n, "swiglu_backward dout");
    dev(g, n, "swiglu_backward g");
    dev(u, n, "swiglu_backward u");
    apart("swiglu_backward", {span(dg, n, "dg"), span(du, n, "du")},
          {span(dout, n, "dout"), span(g, n, "g"), span(u, n, "u")});
    launch(stream, [=] { ::swiglu_backward(dg, du, dout, g, u, n); });
}

}  // namespace gpu
