// THE KERNEL EMULATOR: the real kernels of kernels/ run on the CPU, compiled by g++ as plain C++, so that test_cpu
// checks them against the CPU reference on a machine without a GPU (the checks of test/test_gpu_kernels.cu, and
// the GPU model of gpu/ on them: see the Makefile's *_emulated targets). It is a test tool, not a CPU backend:
// it is slow, and it says nothing about speed.
//
// How it runs a launch: the blocks one after another; the threads of a block as fibers (emulator.cpp) on one OS
// thread, one at a time, each running until it reaches a barrier (__syncthreads, a warp shuffle or vote,
// __syncwarp) or exits. A barrier opens when every thread it waits for has arrived. So each thread runs from barrier
// to barrier as if alone: the GPU's independent thread scheduling in its strictest form. A kernel that lacks a
// __syncthreads or __syncwarp is reported by the hazard checker (checker.h) with the address and both lines; it
// would also read wrong values in some order of the threads: EMULATOR_ORDER=forward (ascending), reverse, or warps
// (one warp runs ahead of the others); the tests run forward and warps. The tensor-core product
// (mma.sync) and the fragment load ldmatrix are warp collectives (kernels/mma_sync.cuh); an asynchronous copy
// (cp.async, kernels/async_copy.cuh) leaves NaN bytes in its destination until the wait that covers it; cuBLASLt,
// under the real kernels/matmul.cuh, is a CPU model of its documented semantics (cublasLt.h); NCCL, under the real
// comm/nccl_comm.cu, is done with MPI (nccl.h).
// Stream order, device memory and its checks are stand_in.h's: a launch runs when its stream is synchronised,
// streams are ordered only by events, device memory is host memory filled with NaN bytes when allocated.
// What throws std::logic_error (through the synchronising call): a block of 0 or more than 1024 threads, a grid
// beyond CUDA's limits, a block over the target GPU's shared memory (shared_memory_optin), a __syncthreads that not
// every thread of the block reaches (some wait elsewhere, or exited), lanes of a warp at different collectives, a
// warp collective (an mma.sync included) that not all 32 lanes reach, a partial mask, an ldmatrix or cp.async
// address not 16-byte aligned or outside shared memory, a thread that exits with cp.async copies it never waited
// for; and what the hazard checker (checker.h) finds: races in shared memory and between blocks in device memory,
// a cp.async destination touched before its wait.
// Shared memory, static and dynamic, is filled with NaN bytes before every block: a read of shared memory the block
// has not written shows. Not modelled: timing; the device's math functions (the host's expf etc. stand in; the
// device's are within 2 ulp, which test_gpu's tolerances cover).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

// ---- the CUDA C++ keywords a kernel file uses, as plain C++ --------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One block runs at a time, so a function's static variable is that block's shared memory. They are all placed in
// one linker section, which the scheduler fills with NaN bytes before every block (shared memory starts undefined).
#define __shared__ static __attribute__((section("emulator_shared")))

struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) uint4 {  // CUDA's vector types the kernels use
    unsigned x, y, z, w;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The running thread's place; the scheduler sets them before it resumes a thread.
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emulator {

// Runs body on every thread of every block of the grid (see the top). Throws std::logic_error on the errors listed
// there; shared_bytes of dynamic shared memory per block.
// kernel, if given, names the kernel in error messages.
void run_grid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body,
              const void* kernel = nullptr);

// For the running thread: the block's dynamic shared memory (128-byte aligned).
unsigned char* dynamic_shared_memory();

// Collectives. Every participant deposits a value, waits until all have, then reads all of them: the returned
// array (32 lanes of the warp, or blockDim threads of the block) holds until the thread's next collective.
// The lanes of a warp must all call the same kind of warp collective, with a full mask.
enum class Collective { syncwarp, shuffle, vote, mma, ldmatrix };
// site: the kernel's return address at the call (source_line names it).
const uint64_t* warp_collective(Collective kind, unsigned mask, uint64_t value, const void* site);
// A load or store of the kernel at site that the hazard checker must see (the stand-ins' own reads of shared memory).
void checked_access(const void* p, size_t bytes, bool write, const void* site);
const uint64_t* block_collective(uint64_t value);

template <typename T>
__attribute__((no_sanitize("thread"))) inline uint64_t to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "collectives move values of up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    return bits;
}
template <typename T>
__attribute__((no_sanitize("thread"))) inline T from_bits(uint64_t bits) {
    T v;
    memcpy(&v, &bits, sizeof(T));
    return v;
}
// Whether [p, p + bytes) lies in the running block's shared memory (dynamic, or a static __shared__ variable).
bool in_shared_memory(const void* p, size_t bytes);
// cp.async for the running thread (kernels/async_copy.cuh): a 16-byte copy issued, the issued copies committed as
// a group, the wait until at most `in_flight` of its groups have not landed.
void async_copy(void* shared_dst, const void* global_src);
void async_commit();
void async_wait(int in_flight);
// Ends the running thread with an error the launch throws (a use the GPU would fault on, or the emulator lacks).
[[noreturn]] void fail_thread(const std::string& what);
// Device memory (cuda_runtime.h's cudaMalloc): 256-byte aligned, from one range the hazard checker watches.
void* device_allocate(size_t bytes);
void device_free(void* p, size_t bytes);
// The target GPU's shared memory per block, static and dynamic (EMULATOR_TARGET: sm_90 by default, 227 KiB).
size_t shared_memory_optin();
// The emulator's own helpers below run unchecked (the hazard checker watches the kernels' accesses, not these);
// a collective is a call of its own, so that its return address is the kernel's place.
#define EMULATOR_UNCHECKED __attribute__((no_sanitize("thread")))
#define EMULATOR_COLLECTIVE __attribute__((no_sanitize("thread"), noinline))
EMULATOR_UNCHECKED inline unsigned lane() {
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
}
void check_width(int width);

}  // namespace emulator

// ---- device functions ------------------------------------------------------------------------------------------

EMULATOR_COLLECTIVE inline void __syncthreads() { emulator::block_collective(0); }
EMULATOR_COLLECTIVE inline int __syncthreads_count(int predicate) {
    const uint64_t* all = emulator::block_collective(predicate != 0);
    int count = 0;
    for (unsigned t = 0; t < blockDim.x * blockDim.y * blockDim.z; t++) count += (int)all[t];
    return count;
}
EMULATOR_COLLECTIVE inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emulator::warp_collective(emulator::Collective::syncwarp, mask, 0, __builtin_return_address(0));
}

template <typename T>
EMULATOR_COLLECTIVE inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    emulator::check_width(width);
    const uint64_t* all = emulator::warp_collective(emulator::Collective::shuffle, mask, emulator::to_bits(v),
                                                    __builtin_return_address(0));
    return emulator::from_bits<T>(all[(emulator::lane() ^ lane_mask) % 32]);
}
template <typename T>
EMULATOR_COLLECTIVE inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    emulator::check_width(width);
    const uint64_t* all = emulator::warp_collective(emulator::Collective::shuffle, mask, emulator::to_bits(v),
                                                    __builtin_return_address(0));
    return emulator::from_bits<T>(all[src_lane % 32]);
}
EMULATOR_COLLECTIVE inline unsigned __ballot_sync(unsigned mask, int predicate) {
    const uint64_t* all =
        emulator::warp_collective(emulator::Collective::vote, mask, predicate != 0, __builtin_return_address(0));
    unsigned bits = 0;
    for (unsigned l = 0; l < 32; l++) bits |= (unsigned)all[l] << l;
    return bits;
}

// One thread runs at a time, so a plain read-modify-write is atomic. The hazard checker does not see it: blocks may
// add to one address.
template <typename T, typename U>
EMULATOR_UNCHECKED inline T atomicAdd(T* address, U value) {
    const T old = *address;
    *address = old + (T)value;
    return old;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }

template <typename A, typename B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    return b < a ? b : a;
}
template <typename A, typename B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    return a < b ? b : a;
}
