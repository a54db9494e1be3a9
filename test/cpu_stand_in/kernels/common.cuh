// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/common.cuh: the host helpers; the CUDA_CHECK of the
// real kernels/cuda_check.cuh (it only needs the runtime stand-in).
#pragma once
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda_check.cuh"
#include "stand_in.h"

namespace gpu {

// The inputs of the GEMMs and of the attention products (kernels/matmul.cuh, kernels/attention.cuh); accumulation,
// activations and every output stay FP32.
enum class Precision { FP32, BF16 };

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

using stand_in::dev;
using stand_in::dev_strided;
using stand_in::apart;
using stand_in::launch;
using stand_in::span;

}  // namespace gpu
