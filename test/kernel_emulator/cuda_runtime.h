// Kernel emulator (see emulator.h): the CPU stand-in of the CUDA runtime (host memory, queued streams) plus what
// kernel code sees of CUDA (keywords, thread indices, barriers, shuffles, atomics).
#pragma once
#include "../cpu_stand_in/cuda_runtime.h"
#include "emulator.h"
