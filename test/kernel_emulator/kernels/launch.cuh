// Kernel emulator (see ../emulator.h) for kernels/launch.cuh: a launch queues the emulated grid on its stream
// (it runs when the stream is synchronised, as every stand-in launch does); dynamic_shared<T>() is the running
// block's dynamic shared memory.
#pragma once
#include <cstddef>
#include <tuple>

#include "kernels/cuda_check.cuh"

namespace gpu {

template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                          Args... args) {
    const std::tuple<Params...> params(args...);  // converted to the kernel's parameter types now, as CUDA does
    stand_in::launch(stream,
                     [=] { emulator::run_grid(grid, block, shared_bytes, [&] { std::apply(kernel, params); }); });
}

template <typename T>
inline T* dynamic_shared() {
    return reinterpret_cast<T*>(emulator::dynamic_shared_memory());
}

}  // namespace gpu
