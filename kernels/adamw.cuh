// AdamW on FP32 master weights and the global gradient norm, FP32 / FP64 (DESIGN §1.4), exactly the update of
// model/optimizer.cpp. For step t (1-based), gradient g = grad * grad_multiplier (the clip factor):
//   m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
//   p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + decay p)
// decay is oc.weight_decay for tensors with weight_decay set and 0 otherwise; tensors that are not trainable
// (e_score_correction_bias) are skipped, and of the others only this rank's shard is updated (model/optimizer.h).
// With a BF16 working copy of the weights (--dtype bf16: what the GEMMs read) the update writes the new value's
// rounding there too, in the same pass (no second read of the parameters). One launch per range of the shard (a
// few thousand for DeepSeek-V3: a multi-tensor launch can come later).
// Global norm: sqrt(sum g^2), accumulated in double. Deterministic two passes: one block per fixed chunk of
// GRAD_NORM_CHUNK values writes its partial sum, then one block sums the partials. The chunking depends only on n.
// The squares (double)g * g are exact in double, so only the order of the additions differs from the CPU.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common.cuh"
#include "model/optimizer.h"
#include "model/params.h"

namespace gpu {

constexpr int ADAMW_THREADS = 256, GRAD_NORM_THREADS = 512;
constexpr int64_t GRAD_NORM_CHUNK = 1 << 16;

// doubles of scratch grad_norm_squared needs for n gradients
inline int64_t grad_norm_scratch_doubles(int64_t n) { return n > 0 ? ceil_div(n, GRAD_NORM_CHUNK) : 1; }

static __global__ void adamw_kernel(float* params, __nv_bfloat16* params16, const float* grads, float* m, float* v,
                                    int64_t n, float lr, float beta1, float beta2, float eps, float decay, float bias1,
                                    float bias2, float grad_multiplier) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = grads[i] * grad_multiplier;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float m_hat = mi / bias1, v_hat = vi / bias2;
        const float p = params[i] - lr * (m_hat / (sqrtf(v_hat) + eps) + decay * params[i]);
        params[i] = p;
        if (params16) params16[i] = __float2bfloat16_rn(p);
    }
}

// one block per chunk: partial[chunk] = sum of its squares
static __global__ void grad_norm_partial_kernel(double* partial, const float* grads, int64_t n) {
    const int64_t first = (int64_t)blockIdx.x * GRAD_NORM_CHUNK;
    const int64_t last = first + GRAD_NORM_CHUNK < n ? first + GRAD_NORM_CHUNK : n;
    double sum = 0.0;
    for (int64_t i = first + threadIdx.x; i < last; i += blockDim.x) sum += (double)grads[i] * grads[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// one block: out = sum of the partials
static __global__ void grad_norm_total_kernel(double* out, const double* partial, int64_t count) {
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) *out = sum;
}

// One AdamW update of n values of one tensor (and their BF16 copy params16, or nullptr). step: the update's number,
// 1 for the first (AdamWState::step after its increment); the bias corrections are computed here on the host
// exactly as the CPU does.
inline void adamw_update_tensor(float* params, __nv_bfloat16* params16, const float* grads, float* m, float* v,
                                int64_t n, const OptimizerConfig& oc, float lr, float decay, int64_t step,
                                float grad_multiplier, cudaStream_t stream) {
    if (n == 0) return;
    const float bias1 = 1.0f - powf(oc.beta1, (float)step), bias2 = 1.0f - powf(oc.beta2, (float)step);
    launch_kernel(adamw_kernel, grid_stride_blocks(n, ADAMW_THREADS), ADAMW_THREADS, 0, stream, params, params16,
                  grads, m, v, n, lr, oc.beta1, oc.beta2, oc.eps, decay, bias1, bias2, grad_multiplier);
}

// The shard's ranges, as model/optimizer.cpp's adamw_update (device pointers): params, grads (and params16, the
// BF16 copy, or nullptr) are whole buffers laid out by the table; m and v hold the shard's moments alone.
inline void adamw_update(const OptimizerShard& shard, float* params, __nv_bfloat16* params16, const float* grads,
                         float* m, float* v, const OptimizerConfig& oc, float lr, int64_t step, float grad_multiplier,
                         cudaStream_t stream) {
    for (const OptimizerRange& r : shard.ranges)
        adamw_update_tensor(params + r.first, params16 ? params16 + r.first : nullptr, grads + r.first,
                            m + r.moments, v + r.moments, r.count, oc, lr, r.weight_decay ? oc.weight_decay : 0.0f,
                            step, grad_multiplier, stream);
}

// *out (device double) = sum of grads[i]^2 over n values; scratch: grad_norm_scratch_doubles(n) doubles.
// The caller takes the square root (after summing over ranks, where gradients are sharded) and computes the
// clip factor on the host (model/optimizer.h's clip_factor): one 8-byte copy per step.
inline void grad_norm_squared(double* out, const float* grads, int64_t n, double* scratch, cudaStream_t stream) {
    const int64_t chunks = grad_norm_scratch_doubles(n);
    launch_kernel(grad_norm_partial_kernel, (unsigned)chunks, GRAD_NORM_THREADS, 0, stream, scratch, grads, n);
    launch_kernel(grad_norm_total_kernel, 1, GRAD_NORM_THREADS, 0, stream, out, scratch, chunks);
}

}  // namespace gpu
