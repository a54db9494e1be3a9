// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/adamw.cuh: model/optimizer.cpp's update expressions
// on one range at a time, and the squared norm in double over the same fixed chunks as grad_sum_squares.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "model/optimizer.h"
#include "model/params.h"

namespace gpu {

constexpr int64_t GRAD_NORM_CHUNK = 1 << 16;

// doubles of scratch grad_norm_squared needs for n gradients
inline int64_t grad_norm_scratch_doubles(int64_t n) { return n > 0 ? ceil_div(n, GRAD_NORM_CHUNK) : 1; }

// One AdamW update of n values (and their BF16 copy params16, or nullptr; step: 1 for the first update); bias
// corrections on the host as the CPU.
inline void adamw_update_tensor(float* params, __nv_bfloat16* params16, const float* grads, float* m, float* v,
                                int64_t n, const OptimizerConfig& oc, float lr, float decay, int64_t step,
                                float grad_multiplier, cudaStream_t stream) {
    if (n == 0) return;
    dev(params, n, "adamw params");
    if (params16) dev(params16, n, "adamw params16");
    dev(grads, n, "adamw grads");
    dev(m, n, "adamw m");
    dev(v, n, "adamw v");
    apart("adamw", {span(params, n, "params"), span(m, n, "m"), span(v, n, "v")}, {span(grads, n, "grads")});
    const float bias1 = 1.0f - powf(oc.beta1, (float)step), bias2 = 1.0f - powf(oc.beta2, (float)step);
    launch(stream, [=] {
        for (int64_t i = 0; i < n; i++) {
            const float g = grads[i] * grad_multiplier;
            m[i] = oc.beta1 * m[i] + (1.0f - oc.beta1) * g;
            v[i] = oc.beta2 * v[i] + (1.0f - oc.beta2) * g * g;
            const float m_hat = m[i] / bias1, v_hat = v[i] / bias2;
            params[i] -= lr * (m_hat / (sqrtf(v_hat) + oc.eps) + decay * params[i]);
            if (params16) params16[i] = __float2bfloat16_rn(params[i]);
        }
    });
}

// The shard's ranges (decay oc.weight_decay where weight_decay is set, else 0); m and v hold the shard's moments
inline void adamw_update(const OptimizerShard& shard, float* params, __nv_bfloat16* params16, const float* grads,
                         float* m, float* v, const OptimizerConfig& oc, float lr, int64_t step, float grad_multiplier,
                         cudaStream_t stream) {
    for (const OptimizerRange& r : shard.ranges)
        adamw_update_tensor(params + r.first, params16 ? params16 + r.first : nullptr, grads + r.first,
                            m + r.moments, v + r.moments, r.count, oc, lr, r.weight_decay ? oc.weight_decay : 0.0f,
                            step, grad_multiplier, stream);
}

// *out = sum of grads[i]^2 over n values, in double, chunk partials summed in chunk order.
// scratch: grad_norm_scratch_doubles(n) doubles (the partials).
inline void grad_norm_squared(double* out, const float* grads, int64_t n, double* scratch, cudaStream_t stream) {
    dev(out, 1, "grad_norm_squared out");
    dev(grads, n, "grad_norm_squared grads");
    dev(scratch, grad_norm_scratch_doubles(n), "grad_norm_squared scratch");
    apart("grad_norm_squared", {span(out, 1, "out"), span(scratch, grad_norm_scratch_doubles(n), "scratch")},
          {span(grads, n, "grads")});
    launch(stream, [=] {
        const int64_t chunks = grad_norm_scratch_doubles(n);
        for (int64_t c = 0; c < chunks; c++) {
            double sum = 0.0;
            for (int64_t i = c * GRAD_NORM_CHUNK; i < std::min(n, (c + 1) * GRAD_NORM_CHUNK); i++)
                sum += (double)grads[i] * grads[i];
            scratch[c] = sum;
        }
        double total = 0.0;
        for (int64_t c = 0; c < chunks; c++) total += scratch[c];
        *out = total;
    });
}

}  // namespace gpu
