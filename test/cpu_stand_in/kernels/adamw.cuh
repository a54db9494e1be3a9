// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/adamw.cuh: model/optimizer.cpp's update expressions
// range by range (the moments packed), and each range's squared norm by model/optimizer.cpp's grad_sum_squares.
#pragma once
#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "kernels/shard_ranges.h"
#include "model/optimizer.h"

namespace gpu {

// The shard's ranges (decay oc.weight_decay where weight_decay is set, else 0); m and v hold the shard's moments
inline void adamw_update(const ShardRanges& shard, float* params, __nv_bfloat16* params16, const float* grads,
                         float* m, float* v, const OptimizerConfig& oc, float lr, int64_t step, float grad_multiplier,
                         cudaStream_t stream) {
    const int64_t R = shard.ranges;
    const int64_t* t = shard.table;
    dev(t, 6 * R + 2, "adamw ranges");
    for (int64_t r = 0; r < R; r++) {
        const int64_t first = t[r], n = t[R + r], moments = t[2 * R + r];
        dev(params + first, n, "adamw params");
        if (params16) dev(params16 + first, n, "adamw params16");
        dev(grads + first, n, "adamw grads");
        dev(m + moments, n, "adamw m");
        dev(v + moments, n, "adamw v");
    }
    const float bias1 = 1.0f - powf(oc.beta1, (float)step), bias2 = 1.0f - powf(oc.beta2, (float)step);
    launch(stream, [=] {
        for (int64_t r = 0; r < R; r++) {
            const int64_t first = t[r], n = t[R + r], moments = t[2 * R + r];
            const float decay = t[3 * R + r] ? oc.weight_decay : 0.0f;
            float *p = params + first, *mr = m + moments, *vr = v + moments;
            const float* g_r = grads + first;
            for (int64_t i = 0; i < n; i++) {
                const float g = g_r[i] * grad_multiplier;
                mr[i] = oc.beta1 * mr[i] + (1.0f - oc.beta1) * g;
                vr[i] = oc.beta2 * vr[i] + (1.0f - oc.beta2) * g * g;
                const float m_hat = mr[i] / bias1, v_hat = vr[i] / bias2;
                p[i] -= lr * (m_hat / (sqrtf(v_hat) + oc.eps) + decay * p[i]);
                if (params16) params16[first + i] = __float2bfloat16_rn(p[i]);
            }
        }
    });
}

// out[r] = the sum of grads[i]^2 over range r: the CPU's grad_sum_squares, over the same chunks (partial, the
// kernels' scratch, is not needed here)
inline void range_norms_squared(double* out, const ShardRanges& shard, const float* grads, double* partial,
                                cudaStream_t stream) {
    const int64_t R = shard.ranges;
    const int64_t* t = shard.table;
    dev(t, 6 * R + 2, "range_norms_squared ranges");
    dev(out, R, "range_norms_squared out");
    if (shard.chunks > 0) dev(partial, shard.chunks, "range_norms_squared partial");
    for (int64_t r = 0; r < R; r++) dev(grads + t[r], t[R + r], "range_norms_squared grads");
    launch(stream, [=] {
        for (int64_t r = 0; r < R; r++) out[r] = grad_sum_squares(grads + t[r], t[R + r]);
    });
}

}  // namespace gpu
