// PTX cp.async (sm_80+): copies from global to shared memory that run while the thread block computes.
// cp_async_16: one 16-byte copy, both addresses 16-byte aligned. cp_async_commit: the thread's copies since its last
// commit become a group. cp_async_wait<N>: returns once at most N of the thread's groups are in flight; groups land
// in commit order. Other threads see the copies only after the wait and a __syncthreads.
// .cg caches in L2 only: a tile is read once per thread block, so L1 would only evict other data.
// The kernel emulator replaces this file (test/kernel_emulator/kernels/async_copy.cuh).
#pragma once
#include <cstdint>

namespace gpu {

__device__ inline void cp_async_16(void* shared_dst, const void* global_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :
                 : "r"((uint32_t)__cvta_generic_to_shared(shared_dst)), "l"(global_src)
                 : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ inline void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace gpu
