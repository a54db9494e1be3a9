// Fused softmax + cross-entropy over the vocabulary, FP32, one block per row (docs/design.md §1):
//   row m with target y >= 0:  loss_m = log sum_v exp(z_mv - zmax) - (z_my - zmax)   (zmax: the row's max)
//                              dlogits_mv = loss_scale * (softmax(z_m)_v - [v == y])
//   target < 0: the row is ignored: loss_m = 0, dlogits_m = 0.
// Subtracting the row max keeps exp() in range. losses (M) are per row; the caller sums them (the CPU reference
// returns the sum in double). The max and the sum come from one pass (the online softmax: each thread keeps a
// running max and the sum of exp(z - max) so far, rescaled when the max grows; the block merges the pairs in a
// fixed order), then one more pass writes the gradients: two reads of the logits and one write, not three reads.
// The row does not stay in L2 between passes (512 threads a row, four rows an SM: 528 rows of 129K logits in flight
// on 132 SMs are 270 MB against the H200's 50 MB), so the passes are what the kernel costs.
// dlogits in FP32, or in BF16 (cross_entropy_forward_backward_bf16: the same values rounded, for the head's BF16
// GEMMs, which would otherwise cast them: at V = 102400 the gradients are the largest tensor of the step).
// Targets must be < V (the data loader checks tokens against the vocabulary).
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
// The row's (max, sum of exp(z - max)) from every thread's pair; every thread gets lane 0's (the two lanes of a
// butterfly exchange may round differently: the compiler may fuse either product into an FMA), and every thread
// must call. One call per block: the shared arrays are not protected for reuse.
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
    if (target < 0) {  // the same branch for the whole block: no block reduction is skipped by only some threads
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
        } else if (x != -INFINITY) {  // (a -inf logit adds 0; as the first of a thread, it would add NaN)
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
