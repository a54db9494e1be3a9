// Kernel emulator (see emulator.h): the E4M3 byte and its conversion, as in the CPU stand-ins.
#pragma once
#include "../cpu_stand_in/cuda_fp8.h"
