// Kernel emulator (see ../emulator.h) for kernels/matmul.cuh: cuBLASLt cannot be emulated, so the GEMMs are the
// CPU stand-in's (test/cpu_stand_in/kernels/matmul.cuh: the CPU reference's products, with the contract checks).
#pragma once
#include "../../cpu_stand_in/stand_in.h"
#include "kernels/common.cuh"

namespace gpu {
using stand_in::apart;
using stand_in::dev;
using stand_in::dev_strided;
using stand_in::launch;
using stand_in::span;
}  // namespace gpu

#include "../../cpu_stand_in/kernels/matmul.cuh"
