// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/cross_entropy.cuh: the CPU reference's function,
// one row at a time for the per-row losses (FP32, as the kernel writes them).
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "model/ops.h"

namespace gpu {

// The rows' losses, and their gradients into dlogits unless it is null; on the stream's worker.
inline void stand_in_cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int64_t M, int64_t V, float loss_scale) {
    for (int64_t m = 0; m < M; m++) {
        if (targets[m] >= V) stand_in::violation("cross_entropy: target " + std::to_string(targets[m]) + " >= V");
        losses[m] = (float)::cross_entropy_forward_backward(dlogits ? dlogits + m * V : nullptr, logits + m * V,
                                                            targets + m, 1, V, loss_scale);
    }
}

// The launch's checks: device memory, and outputs apart from the inputs (dlogits FP32 or BF16, or null)
template <typename T>
inline void stand_in_cross_entropy_checks(const float* losses, const T* dlogits, const float* logits,
                                          const int32_t* targets, int64_t M, int64_t V) {
    dev(losses, M, "cross_entropy losses");
    if (dlogits) dev(dlogits, M * V, "cross_entropy dlogits");
    dev(logits, M * V, "cross_entropy logits");
    dev(targets, M, "cross_entropy targets");
    apart("cross_entropy", {span(losses, M, "losses"), span(dlogits, M * V, "dlogits")},
          {span(logits, M * V, "logits"), span(targets, M, "targets")});
}

// logits (M, V), targets (M) -> losses (M) (0 for target < 0); dlogits (M, V) = loss_scale (softmax - onehot)
// overwritten (0 for target < 0), or nullptr for the loss only
inline void cross_entropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                           const int32_t* targets, int64_t M, int64_t V, float loss_scale,
                                           cudaStream_t stream) {
    if (M == 0) return;
    stand_in_cross_entropy_checks(losses, dlogits, logits, targets, M, V);
    launch(stream, [=] { stand_in_cross_entropy(losses, dlogits, logits, targets, M, V, loss_scale); });
}

// the same, dlogits16 (M, V) = the gradients rounded to BF16
inline void cross_entropy_forward_backward_bf16(float* losses, __nv_bfloat16* dlogits16, const float* logits,
                                                const int32_t* targets, int64_t M, int64_t V, float loss_scale,
                                                cudaStream_t stream) {
    if (M == 0) return;
    stand_in_cross_entropy_checks(losses, dlogits16, logits, targets, M, V);
    launch(stream, [=] {
        std::vector<float> dlogits(M * V);
        stand_in_cross_entropy(losses, dlogits.data(), logits, targets, M, V, loss_scale);
        for (int64_t i = 0; i < M * V; i++) dlogits16[i] = __float2bfloat16_rn(dlogits[i]);
    });
}

}  // namespace gpu
