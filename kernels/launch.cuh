// launch_kernel(kernel, grid, block, shared_bytes, stream, args...) launches kernel<<<grid, block, shared_bytes,
// stream>>>(args...) and checks the launch, so no launcher can forget the check. Above 48 KiB of dynamic shared
// memory it first raises the kernel's limit (up to 227 KiB on Hopper). The kernel emulator runs this same file.
#pragma once
#include <cstddef>

#include "kernels/cuda_check.cuh"
#include "kernels/dynamic_shared.cuh"

namespace gpu {

template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                          Args... args) {
    if (shared_bytes > (size_t(48) << 10))
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes));
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace gpu
