// AdamW on the FP32 master weights, and the gradient norm (docs/design.md §1.4, §8): model/optimizer.cpp's update.
// For step t from 1, g = grad * grad_multiplier (the clip factor), decay = 0 for tensors without weight decay:
//   m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
//   p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + decay p)
// One launch updates this rank's ranges (kernels/shard_ranges.h). In FP32 mode the weights are their own master
// copy, updated in place. In BF16 and FP8 modes the update reads and writes this rank's FP32 master shard (laid out
// as the moments) and writes the new value to the working copy: FP32 for the tensors before the table's fp32_total,
// the BF16 rounding for the GEMM weights after it (model/params.h). The moments are FP32 or BF16 (--moments bf16:
// m and v computed in FP32 from the stored values, used as they are, stored rounded).
// Norm: each range's sum of g^2 in double, in two fixed passes: a thread block per chunk of GRAD_NORM_CHUNK values
// writes a partial, then a thread block per range sums its partials. (double)g * g is exact, so only the order of
// the additions differs from the CPU.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/shard_ranges.h"
#include "model/optimizer.h"

namespace gpu {

constexpr int ADAMW_THREADS = 256, GRAD_NORM_THREADS = 512;

// The range that holds piece b: the largest r with starts[r] <= b. starts: R + 1 prefix sums, b < starts[R].
// An empty range starts where the next one does, so it is never chosen.
__device__ inline int64_t range_of_piece(const int64_t* starts, int64_t R, int64_t b) {
    int64_t low = 0, high = R - 1;
    while (low < high) {
        const int64_t mid = (low + high + 1) / 2;
        if (starts[mid] <= b)
            low = mid;
        else
            high = mid - 1;
    }
    return low;
}

__device__ inline float moment_value(float x) { return x; }
__device__ inline float moment_value(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void store_moment(float& out, float x) { out = x; }
__device__ inline void store_moment(__nv_bfloat16& out, float x) { out = __float2bfloat16_rn(x); }

// a thread block per piece of ADAMW_BLOCK_VALUES values of a range; Moment: float or __nv_bfloat16
template <typename Moment>
__global__ void adamw_kernel(float* params, __nv_bfloat16* params16, float* master, int64_t fp32_total,
                             const float* grads, Moment* m, Moment* v, const int64_t* table, int64_t R, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float bias1, float bias2,
                             float grad_multiplier) {
    const int64_t *first = table, *count = table + R, *moments = table + 2 * R, *decays = table + 3 * R;
    const int64_t* blocks = table + 4 * R;
    const int64_t r = range_of_piece(blocks, R, blockIdx.x);
    const int64_t begin = ((int64_t)blockIdx.x - blocks[r]) * ADAMW_BLOCK_VALUES;
    const int64_t end = begin + ADAMW_BLOCK_VALUES < count[r] ? begin + ADAMW_BLOCK_VALUES : count[r];
    const float decay = decays[r] ? weight_decay : 0.0f;
    float* p = master ? master + moments[r] : params + first[r];
    float* working = master && first[r] < fp32_total ? params + first[r] : nullptr;  // FP32 working copy
    __nv_bfloat16* working16 = master && first[r] >= fp32_total ? params16 + first[r] - fp32_total : nullptr;
    const float* gr = grads + first[r];
    Moment *mr = m + moments[r], *vr = v + moments[r];
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const float g = gr[i] * grad_multiplier;
        const float mi = beta1 * moment_value(mr[i]) + (1.0f - beta1) * g;
        const float vi = beta2 * moment_value(vr[i]) + (1.0f - beta2) * g * g;
        store_moment(mr[i], mi);
        store_moment(vr[i], vi);
        const float m_hat = mi / bias1, v_hat = vi / bias2;
        const float updated = p[i] - lr * (m_hat / (sqrtf(v_hat) + eps) + decay * p[i]);
        p[i] = updated;
        if (working) working[i] = updated;
        if (working16) working16[i] = __float2bfloat16_rn(updated);
    }
}

// a thread block per chunk of a range: partial[chunk] = the sum of its squares
static __global__ void grad_norm_partial_kernel(double* partial, const float* grads, const int64_t* table,
                                                int64_t R) {
    const int64_t *first = table, *count = table + R, *chunks = table + 5 * R + 1;
    const int64_t r = range_of_piece(chunks, R, blockIdx.x);
    const int64_t begin = ((int64_t)blockIdx.x - chunks[r]) * GRAD_NORM_CHUNK;
    const int64_t end = begin + GRAD_NORM_CHUNK < count[r] ? begin + GRAD_NORM_CHUNK : count[r];
    const float* g = grads + first[r];
    double sum = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) sum += (double)g[i] * g[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// a thread block per range r: out[r] = the sum of its partials
static __global__ void grad_norm_total_kernel(double* out, const double* partial, const int64_t* table, int64_t R) {
    const int64_t r = blockIdx.x, *chunks = table + 5 * R + 1;
    double sum = 0.0;
    for (int64_t i = chunks[r] + threadIdx.x; i < chunks[r + 1]; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) out[r] = sum;
}

// One AdamW update of the shard's ranges. params, grads and params16 (the working copy, or nullptr) are whole
// device buffers laid out by the parameter table; m and v (float or __nv_bfloat16) hold the shard's moments alone.
// step: 1 for the first update (AdamWState::step after its increment). The bias corrections are computed on the
// host, as the CPU does.
// master nullptr: FP32 mode, params whole. Else params16 is the working copy of values [fp32_total, ...) of the
// table and params of the values before.
template <typename Moment>
inline void adamw_update(const ShardRanges& shard, float* params, __nv_bfloat16* params16, float* master,
                         int64_t fp32_total, const float* grads, Moment* m, Moment* v, const OptimizerConfig& oc,
                         float lr, int64_t step, float grad_multiplier, cudaStream_t stream) {
    if (shard.blocks == 0) return;
    const float bias1 = 1.0f - powf(oc.beta1, (float)step), bias2 = 1.0f - powf(oc.beta2, (float)step);
    launch_kernel(adamw_kernel<Moment>, (unsigned)shard.blocks, ADAMW_THREADS, 0, stream, params, params16, master,
                  fp32_total, grads, m, v, shard.table, shard.ranges, lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay,
                  bias1, bias2, grad_multiplier);
}

// out[r] (device, a double per range) = the sum of g^2 over range r; partial: shard.chunks doubles of scratch.
// The caller sums its owned ranges over the ranks and computes the clip factor on the host (model/optimizer.h).
inline void range_norms_squared(double* out, const ShardRanges& shard, const float* grads, double* partial,
                                cudaStream_t stream) {
    if (shard.ranges == 0) return;
    if (shard.chunks > 0)
        launch_kernel(grad_norm_partial_kernel, (unsigned)shard.chunks, GRAD_NORM_THREADS, 0, stream, partial, grads,
                      shard.table, shard.ranges);
    launch_kernel(grad_norm_total_kernel, (unsigned)shard.ranges, GRAD_NORM_THREADS, 0, stream, out, partial,
                  shard.table, shard.ranges);
}

}  // namespace gpu
