// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/cross_entropy.cuh: the CPU reference's function,
// one row at a time for the per-row losses (FP32, as the kernel writes them).
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "model/ops.h"

namespace gpu {

// logits (M, V), targets (M) -> losses (M) (0 for target < 0); dlogits (M, V) = loss_scale (softmax - onehot)
// overwritten (0 for target < 0), or nullptr for the loss only
inline void cross_entropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                           const int32_t* targets, int64_t M, int64_t V, float loss_scale,
                                           cudaStream_t stream) {
    if (M == 0) return;
    dev(losses, M, "cross_entropy losses");
    if (dlogits) dev(dlogits, M * V, "cross_entropy dlogits");
    dev(logits, M * V, "cross_entropy logits");
    dev(targets, M, "cross_entropy targets");
    apart("cross_entropy", {span(losses, M, "losses"), span(dlogits, M * V, "dlogits")},
          {span(logits, M * V, "logits"), span(targets, M, "targets")});
    launch(stream, [=] {
        for (int64_t m = 0; m < M; m++) {
            if (targets[m] >= V) stand_in::violation("cross_entropy: target " + std::to_string(targets[m]) + " >= V");
            losses[m] = (float)::cross_entropy_forward_backward(dlogits ? dlogits + m * V : nullptr, logits + m * V,
                                                                targets + m, 1, V, loss_scale);
        }
    });
}

}  // namespace gpu
