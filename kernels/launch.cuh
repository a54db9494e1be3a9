// CUDA's own launch syntax appears only here. launch_kernel(kernel, grid, block, shared_bytes, stream, args...) runs
// kernel<<<grid, block, shared_bytes, stream>>>(args...) and checks the launch, so no launcher can forget the check.
// Above 48 KiB of dynamic shared memory it first raises the kernel's limit (up to 227 KiB on Hopper).
// dynamic_shared<T>() is the thread block's dynamic shared memory as T*, 128-byte aligned.
// The kernel emulator (test/kernel_emulator/) replaces this file to run the same kernels on the CPU.
#pragma once
#include <cstddef>

#include "kernels/cuda_check.cuh"

namespace gpu {

template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                          Args... args) {
    if (shared_bytes > (size_t(48) << 10))
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes));
    kernel<<<grid, block, shared_bytes, stream>>>(args...);
    CUDA_CHECK(cudaGetLastError());
}

template <typename T>
__device__ inline T* dynamic_shared() {
    extern __shared__ __align__(128) unsigned char dynamic_shared_bytes[];
    return reinterpret_cast<T*>(dynamic_shared_bytes);
}

}  // namespace gpu
