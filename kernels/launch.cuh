// Kernel launches and dynamic shared memory, the only two places that use CUDA's own syntax for them:
//   launch_kernel(kernel, grid, block, shared_bytes, stream, args...) is kernel<<<grid, block, shared_bytes,
//       stream>>>(args...) followed by the launch check (DESIGN §4), so no launcher can forget the check;
//   dynamic_shared<T>() is the block's dynamic shared memory (the launch's shared_bytes) as T*.
// The kernel emulator (test/kernel_emulator/) replaces this file to run the same kernels on the CPU.
#pragma once
#include <cstddef>

#include "kernels/cuda_check.cuh"

namespace gpu {

template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                          Args... args) {
    kernel<<<grid, block, shared_bytes, stream>>>(args...);
    CUDA_CHECK(cudaGetLastError());
}

template <typename T>
__device__ inline T* dynamic_shared() {
    extern __shared__ __align__(16) unsigned char dynamic_shared_bytes[];
    return reinterpret_cast<T*>(dynamic_shared_bytes);
}

}  // namespace gpu
