// Kernel emulator (see ../emulator.h) for kernels/dynamic_shared.cuh: the running block's dynamic shared memory.
#pragma once
#include "../emulator.h"

namespace gpu {

template <typename T>
inline T* dynamic_shared() {
    return reinterpret_cast<T*>(emulator::dynamic_shared_memory());
}

}  // namespace gpu
