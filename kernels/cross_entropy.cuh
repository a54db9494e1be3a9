// Fused softmax and cross-entropy over the vocabulary, FP32, a thread block per row (docs/design.md §1):
//   row m with target y >= 0:  loss_m = log sum_v exp(z_mv - zmax) - (z_my - zmax),   zmax = max_v z_mv
//                              dlogits_mv = loss_scale (softmax(z_m)_v - [v == y])
//   target < 0: the row is ignored, loss_m = 0 and dlogits_m = 0.  Targets are < V: the data loader checks.
// One pass finds zmax and the sum by the online softmax: each thread rescales its running sum when its max grows, and
// the thread block merges the pairs in a fixed order. A second pass writes the gradients. The logits do not stay in
// L2 between the passes (docs/performance.md), so two reads instead of three is what fusing saves. dlogits may be
// BF16, for the head's BF16 GEMMs, which would otherwise cast the largest tensor of the step.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int CROSS_ENTROPY_THREADS = 512;

// (zmax, sum) merged with (zmax2, sum2): the sums rescaled to the larger max
__device__ inline void softmax_merge(float& zmax, float& sum, float zmax2, float sum2) {
    const float top = fmaxf(zmax, zmax2);
    if (top == -INFINITY) return;  // both empty (threads past V)
    sum = sum * expf(zmax - top) + sum2 * expf(zmax2 - top);
    zmax = top;
}
__device__ inline void warp_softmax_stats(float& zmax, float& sum) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float zmax2 = __shfl_xor_sync(0xffffffffu, zmax, offset);
        const float sum2 = __shfl_xor_sync(0xffffffffu, sum, offset);
        softmax_merge(zmax, sum, zmax2, sum2);
    }
}
// The row's (max, sum of exp(z - max)) from every thread's pair; every thread must call it. Each thread takes its
// warp's thread 0 result, since the two sides of a butterfly may round differently: the compiler may fuse either
// product into an FMA. One call per thread block: the shared arrays are not protected for reuse.
static __device__ void block_softmax_stats(float& zmax, float& sum) {
    __shared__ float partial_max[32], partial_sum[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    warp_softmax_stats(zmax, sum);
    if (lane == 0) {
        partial_max[warp] = zmax;
        partial_sum[warp] = sum;
    }
    __syncthreads();
    zmax = lane < warps ? partial_max[lane] : -INFINITY;
    sum = lane < warps ? partial_sum[lane] : 0.0f;
    warp_softmax_stats(zmax, sum);
    zmax = __shfl_sync(0xffffffffu, zmax, 0);
    sum = __shfl_sync(0xffffffffu, sum, 0);
}

template <typename T>
static __global__ void cross_entropy_kernel(float* losses, T* dlogits, const float* logits, const int32_t* targets,
                                            int64_t V, float loss_scale) {
    const int64_t m = blockIdx.x;
    const float* z = logits + m * V;
    T* dz = dlogits ? dlogits + m * V : nullptr;
    const int64_t target = targets[m];
    if (target < 0) {  // uniform over the thread block: no thread skips the reduction alone
        if (threadIdx.x == 0) losses[m] = 0.0f;
        if (dz)
            for (int64_t v = threadIdx.x; v < V; v += blockDim.x) store_as(dz + v, 0.0f);
        return;
    }
    float zmax = -INFINITY, sum = 0.0f;  // this thread's running max, and sum of exp(z - zmax)
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float x = z[v];
        if (x > zmax) {
            sum = sum * expf(zmax - x) + 1.0f;
            zmax = x;
        } else if (x != -INFINITY) {  // a -inf logit adds 0; as a thread's first value it would add NaN
            sum += expf(x - zmax);
        }
    }
    block_softmax_stats(zmax, sum);
    if (threadIdx.x == 0) losses[m] = logf(sum) - (z[target] - zmax);
    if (dz) {
        const float inv = 1.0f / sum;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
            float p = loss_scale * expf(z[v] - zmax) * inv;
            if (v == target) p -= loss_scale;
            store_as(dz + v, p);
        }
    }
}

// logits (M, V), targets (M) -> losses (M); dlogits (M, V) overwritten, or nullptr for the loss only (evaluation)
inline void cross_entropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                           const int32_t* targets, int64_t M, int64_t V, float loss_scale,
                                           cudaStream_t stream) {
    if (M == 0) return;
    launch_kernel(cross_entropy_kernel<float>, (unsigned)M, CROSS_ENTROPY_THREADS, 0, stream, losses, dlogits, logits,
                  targets, V, loss_scale);
}

// the same, dlogits16 (M, V) = the gradients rounded to BF16
inline void cross_entropy_forward_backward_bf16(float* losses, __nv_bfloat16* dlogits16, const float* logits,
                                                const int32_t* targets, int64_t M, int64_t V, float loss_scale,
                                                cudaStream_t stream) {
    if (M == 0) return;
    launch_kernel(cross_entropy_kernel<__nv_bfloat16>, (unsigned)M, CROSS_ENTROPY_THREADS, 0, stream, losses,
                  dlogits16, logits, targets, V, loss_scale);
}

}  // namespace gpu
