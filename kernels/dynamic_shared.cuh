// dynamic_shared<T>() is the thread block's dynamic shared memory as T*, 128-byte aligned.
// The kernel emulator replaces this file (test/kernel_emulator/kernels/dynamic_shared.cuh).
#pragma once

namespace gpu {

template <typename T>
__device__ inline T* dynamic_shared() {
    extern __shared__ __align__(128) unsigned char dynamic_shared_bytes[];
    return reinterpret_cast<T*>(dynamic_shared_bytes);
}

}  // namespace gpu
