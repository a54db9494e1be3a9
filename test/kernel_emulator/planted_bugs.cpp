// Kernels with one planted bug each, for test/test_kernel_emulator.cpp: the hazard checker (checker.h) and the
// scheduler (emulator.cpp) must catch every one, with its place, in every thread order. Compiled like the real
// kernels (with the checker's instrumentation) and launched through the real kernels/launch.cuh.
#include "test/kernel_emulator/planted_bugs.h"

#include <functional>
#include <stdexcept>

#include "kernels/async_copy.cuh"
#include "kernels/common.cuh"

namespace {

// The line of the next statement, as the checker's reports print it.
std::string here(int line) { return "planted_bugs.cpp:" + std::to_string(line); }

// ---- block_reduce (kernels/common.cuh) with one of its two barriers left out, called twice -----------------------

int first_barrier_write = 0, first_barrier_read = 0, second_barrier_write = 0, second_barrier_read = 0;

static __device__ float* planted_partials() {
    __shared__ float partial[32];
    return partial;
}

template <bool FIRST_BARRIER, bool SECOND_BARRIER>
__device__ float planted_block_sum(float v) {
    float* partial = planted_partials();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = gpu::warp_sum(v);
    if (FIRST_BARRIER) __syncthreads();
    first_barrier_write = second_barrier_write = __LINE__ + 1;
    if (lane == 0) partial[warp] = v;
    if (SECOND_BARRIER) __syncthreads();
    first_barrier_read = second_barrier_read = __LINE__ + 1;
    return gpu::warp_sum(lane < warps ? partial[lane] : 0.0f);
}

template <bool FIRST_BARRIER, bool SECOND_BARRIER>
__global__ void two_block_sums_kernel(float* out) {
    const float a = planted_block_sum<FIRST_BARRIER, SECOND_BARRIER>((float)threadIdx.x);
    const float b = planted_block_sum<FIRST_BARRIER, SECOND_BARRIER>(1.0f);
    if (threadIdx.x == 0) out[blockIdx.x] = a + b;
}

// ---- warps ---------------------------------------------------------------------------------------------------------

int syncwarp_write = 0, syncwarp_read = 0;
__global__ void missing_syncwarp_kernel(float* out) {  // lanes pass values through shared memory
    __shared__ float lanes[32];
    const int lane = threadIdx.x % 32;
    syncwarp_write = __LINE__ + 1;
    lanes[lane] = (float)lane;
    syncwarp_read = __LINE__ + 1;
    out[lane] = lanes[(lane + 1) % 32];
}

int shuffle_write = 0, shuffle_read = 0;
__global__ void shuffle_as_fence_kernel(float* out) {  // a shuffle between them orders nothing
    __shared__ float lanes[32];
    const int lane = threadIdx.x % 32;
    shuffle_write = __LINE__ + 1;
    lanes[lane] = (float)lane;
    const float mine = __shfl_xor_sync(0xffffffffu, (float)lane, 1);
    shuffle_read = __LINE__ + 1;
    out[lane] = lanes[(lane + 1) % 32] + mine;
}

int partial_shuffle = 0;
__global__ void partial_shuffle_kernel(float* out) {  // half the warp returns before the shuffle
    const int lane = threadIdx.x % 32;
    if (lane >= 16) return;
    partial_shuffle = __LINE__ + 1;
    out[lane] = __shfl_xor_sync(0xffffffffu, (float)lane, 1);
}

int mixed_shuffle = 0, mixed_syncwarp = 0;
__global__ void mixed_collectives_kernel(float* out) {  // half the warp at a shuffle, half at __syncwarp
    const int lane = threadIdx.x % 32;
    if (lane < 16) {
        mixed_shuffle = __LINE__ + 1;
        out[lane] = __shfl_xor_sync(0xffffffffu, (float)lane, 1);
    } else {
        mixed_syncwarp = __LINE__ + 1;
        __syncwarp();
    }
}

// ---- device memory and cp.async -----------------------------------------------------------------------------------

int blocks_write = 0;
__global__ void two_blocks_one_address_kernel(float* out) {
    blocks_write = __LINE__ + 1;
    if (threadIdx.x == 0) out[0] = (float)blockIdx.x;
}

int copy_issue = 0, copy_read = 0;
__global__ void read_before_wait_kernel(float* out, const float* in) {
    __shared__ __align__(16) float tile[128];
    copy_issue = __LINE__ + 1;
    gpu::cp_async_16(&tile[4 * threadIdx.x], &in[4 * threadIdx.x]);
    gpu::cp_async_commit();
    copy_read = __LINE__ + 1;
    out[threadIdx.x] = tile[4 * threadIdx.x];
    gpu::cp_async_wait<0>();
}

// ---- shared memory over the limit -----------------------------------------------------------------------------------

constexpr int BIG_STATIC_FLOATS = 50 * 1024;  // 200 KiB
__global__ void big_static_kernel(float* out) {
    __shared__ float big[BIG_STATIC_FLOATS];
    float* dynamic = gpu::dynamic_shared<float>();
    big[threadIdx.x] = 1.0f;
    dynamic[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = big[(threadIdx.x + 1) % 32] + dynamic[(threadIdx.x + 1) % 32];
}

__global__ void dynamic_only_kernel(float* out) {
    float* dynamic = gpu::dynamic_shared<float>();
    dynamic[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = dynamic[(threadIdx.x + 1) % 32];
}

// The error the launch throws when the stream runs it ("" if none).
template <typename Launch>
std::string error_of(Launch&& launch) {
    try {
        launch();
        CUDA_CHECK(cudaDeviceSynchronize());
    } catch (const std::logic_error& e) {
        stand_in::discard_all();
        return e.what();
    }
    return "";
}

}  // namespace

std::vector<PlantedBug> planted_bugs() {
    float *out = nullptr, *in = nullptr;
    CUDA_CHECK(cudaMalloc(&out, 1024 * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&in, 1024 * sizeof(float)));
    CUDA_CHECK(cudaMemset(in, 0, 1024 * sizeof(float)));
    const dim3 one(1), warp(32), four_warps(128);
    std::vector<PlantedBug> bugs;
    // Runs the launch first: the places are known once the kernel has run.
    auto plant = [&](const char* name, const std::function<void()>& launch,
                     const std::function<std::vector<std::string>()>& places) {
        const std::string error = error_of(launch);
        bugs.push_back(PlantedBug{name, error, places()});
    };
    plant("block_reduce without its first __syncthreads",
          [&] { gpu::launch_kernel(two_block_sums_kernel<false, true>, one, four_warps, 0, nullptr, out); },
          [&] {
              return std::vector<std::string>{"shared-memory race", here(first_barrier_write),
                  here(first_barrier_read)};
          });
    plant("block_reduce without its second __syncthreads",
          [&] { gpu::launch_kernel(two_block_sums_kernel<true, false>, one, four_warps, 0, nullptr, out); },
          [&] {
              return std::vector<std::string>{"shared-memory race", here(second_barrier_write),
                  here(second_barrier_read)};
          });
    plant("lanes passing values without __syncwarp",
          [&] { gpu::launch_kernel(missing_syncwarp_kernel, one, warp, 0, nullptr, out); },
          [&] {
              return std::vector<std::string>{"no __syncwarp", "missing_syncwarp_kernel", "lanes[",
                  here(syncwarp_write), here(syncwarp_read)};
          });
    plant("a shuffle taken for a memory fence",
          [&] { gpu::launch_kernel(shuffle_as_fence_kernel, one, warp, 0, nullptr, out); },
          [&] { return std::vector<std::string>{"shared-memory race", here(shuffle_write), here(shuffle_read)}; });
    plant("a shuffle half the warp reaches",
          [&] { gpu::launch_kernel(partial_shuffle_kernel, one, warp, 0, nullptr, out); },
          [&] { return std::vector<std::string>{"which has exited", here(partial_shuffle)}; });
    plant("half a warp at a shuffle, half at __syncwarp",
          [&] { gpu::launch_kernel(mixed_collectives_kernel, one, warp, 0, nullptr, out); },
          [&] {
              return std::vector<std::string>{"different collectives", "a shuffle at", "__syncwarp at",
                  here(mixed_shuffle), here(mixed_syncwarp)};
          });
    plant("two blocks writing one address",
          [&] { gpu::launch_kernel(two_blocks_one_address_kernel, dim3(2), warp, 0, nullptr, out); },
          [&] {
              return std::vector<std::string>{"device-memory race", "two_blocks_one_address_kernel",
                  "byte 0 of a device allocation", here(blocks_write)};
          });
    plant("a cp.async destination read before its wait",
          [&] { gpu::launch_kernel(read_before_wait_kernel, one, warp, 0, nullptr, out, (const float*)in); },
          [&] { return std::vector<std::string>{"before the wait", "tile[", here(copy_issue), here(copy_read)}; });
    plant("static and dynamic shared memory over 227 KiB",
          [&] { gpu::launch_kernel(big_static_kernel, one, warp, 40 << 10, nullptr, out); },
          [&] {
              return std::vector<std::string>{"big_static_kernel", "204800 bytes of static and 40960 bytes of dynamic",
                  "sm_90"};
          });
    setenv("EMULATOR_TARGET", "sm_89", 1);
    plant("100 KiB of dynamic shared memory on sm_89 (99 KiB)",
          [&] {
              cudaLaunchConfig_t config = {};
              config.gridDim = one;
              config.blockDim = warp;
              config.dynamicSmemBytes = 100 << 10;
              if (cudaFuncSetAttribute(dynamic_only_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       100 << 10) != cudaErrorInvalidValue)
                  throw std::logic_error("cudaFuncSetAttribute took 100 KiB on sm_89");
              if (cudaLaunchKernelEx(&config, dynamic_only_kernel, out) != cudaErrorInvalidValue)
                  throw std::logic_error("a launch with 100 KiB of dynamic shared memory, never raised, was taken");
              emulator::run_grid(
                  one, warp, 100 << 10, [&] { dynamic_only_kernel(out); }, (const void*)dynamic_only_kernel);
          },
          [&] { return std::vector<std::string>{"102400 bytes of dynamic shared memory", "at most 101376"}; });
    unsetenv("EMULATOR_TARGET");
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(in));
    return bugs;
}

std::string run_without_bugs() {
    float* out = nullptr;
    CUDA_CHECK(cudaMalloc(&out, 1024 * sizeof(float)));
    const std::string error = error_of([&] {
        gpu::launch_kernel(two_block_sums_kernel<true, true>, dim3(2), dim3(128), 0, nullptr, out);
        // 60 KiB: the launcher raises the kernel's limit
        gpu::launch_kernel(dynamic_only_kernel, dim3(2), dim3(32), 60 << 10, nullptr, out + 64);
    });
    CUDA_CHECK(cudaFree(out));
    return error;
}
