// Fused softmax + cross-entropy over the vocabulary, FP32, one block per row (DESIGN §1):
//   row m with target y >= 0:  loss_m = log sum_v exp(z_mv - zmax) - (z_my - zmax)   (zmax: the row's max)
//                              dlogits_mv = loss_scale * (softmax(z_m)_v - [v == y])
//   target < 0: the row is ignored: loss_m = 0, dlogits_m = 0.
// Subtracting the row max keeps exp() in range. losses (M) are per row; the caller sums them (the CPU reference
// returns the sum in double). Three passes over the row (max, sum, write); rows of even 129K logits stay in L2.
// dlogits in FP32, or in BF16 (cross_entropy_forward_backward_bf16: the same values rounded, for the head's BF16
// GEMMs, which would otherwise cast them: at V = 102400 the gradients are the largest tensor of the step).
// Targets must be < V (the data loader checks tokens against the vocabulary).
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int CROSS_ENTROPY_THREADS = 512;

template <typename T>
static __global__ void cross_entropy_kernel(float* losses, T* dlogits, const float* logits, const int32_t* targets,
                                            int64_t V, float loss_scale) {
    const int64_t m = blockIdx.x;
    const float* z = logits + m * V;
    T* dz = dlogits ? dlogits + m * V : nullptr;
    const int64_t target = targets[m];
    if (target < 0) {  // the same branch for the whole block: no block reduction is skipped by only some threads
        if (threadIdx.x == 0) losses[m] = 0.0f;
        if (dz)
            for (int64_t v = threadIdx.x; v < V; v += blockDim.x) store_as(dz + v, 0.0f);
        return;
    }
    float zmax = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) zmax = fmaxf(zmax, z[v]);
    zmax = block_max(zmax);
    float sum = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(z[v] - zmax);
    sum = block_sum(sum);
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
