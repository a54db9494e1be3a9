// Asynchronous copies from global to shared memory (PTX cp.async, sm_80 and newer), which let a block fetch its
// next tile while it computes on the current one. A thread issues 16-byte copies and goes on; cp_async_commit()
// closes the copies it issued since its last commit into a group; cp_async_wait<N>() returns once at most N of its
// groups are still in flight (groups land in the order they were committed). A thread's copies are visible to the
// rest of the block only after its wait and a __syncthreads. Both addresses 16-byte aligned.
// .cg: cached in L2 only; the tiles are read once per block, so L1 would only evict other data.
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
