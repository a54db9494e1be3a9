// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/common.cuh: the host helpers; the CUDA_CHECK of the
// real kernels/cuda_check.cuh (it only needs the runtime stand-in).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda_check.cuh"
#include "stand_in.h"

namespace gpu {

// The inputs of the GEMMs and of the attention products (kernels/matmul.cuh, kernels/attention.cuh); accumulation,
// activations and every output stay FP32.
// FP8: the linear layers inside the blocks in E4M3 with fine-grained scales (kernels/fp8.cuh), the rest as BF16.
enum class Precision { FP32, BF16, FP8 };

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// n BF16 values as floats: the stand-ins run their BF16 operands through the CPU reference's FP32 code (read when
// the queued work runs)
inline std::vector<float> stand_in_widen(const __nv_bfloat16* p, int64_t n) {
    std::vector<float> out(n);
    for (int64_t i = 0; i < n; i++) out[i] = __bfloat162float(p[i]);
    return out;
}

using stand_in::dev;
using stand_in::dev_strided;
using stand_in::apart;
using stand_in::launch;
using stand_in::span;

}  // namespace gpu
