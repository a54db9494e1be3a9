// Kernel emulator (see emulator.h): __nv_bfloat16 and its conversions, as in the CPU stand-ins.
#pragma once
#include "../cpu_stand_in/cuda_bf16.h"
