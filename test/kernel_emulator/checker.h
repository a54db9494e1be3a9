// The kernel emulator's hazard checker (checker.cpp), as the scheduler (emulator.cpp) drives it. The kernels are
// compiled with -fsanitize=thread, which makes g++ call __tsan_read4(p), __tsan_write8(p), ... before every load and
// store; checker.cpp defines those calls (no ThreadSanitizer runtime is linked) and, while a grid runs, records each
// access to shared memory and to device memory:
//   - shared memory, per byte: the last write and the last two readers, each with its thread, source line and the
//     block's barrier epoch (a count of __syncthreads) and its warp's count of __syncwarp. Two accesses of different
//     threads, one a write, are a race unless a __syncthreads lies between them, or a __syncwarp when both threads
//     are lanes of one warp. Shuffles, votes and mma.sync order nothing.
//   - device memory, per 4-byte word and launch: the block that wrote it and the block that read it. A word written
//     by two blocks, or read by one block and written by another, is a race (atomics excepted).
//   - cp.async: the destination bytes are in flight from the copy to the wait that covers it; any access is an error.
// The first race ends the launch with an error naming the kernel, the address (the __shared__ array and index, or
// the byte of the device allocation), both threads and both source lines.
#pragma once
#include <cstddef>
#include <cstdint>

namespace emulator::checker {

void begin_launch(const void* kernel, unsigned char* dynamic_shared, size_t dynamic_bytes, int threads);
void begin_block(uint64_t block);   // a new block: every earlier access is ordered before it
void run_thread(int thread);        // the scheduler resumes this thread (its linear index in the block)
void barrier();                     // a __syncthreads opened
void warp_synced(int warp);         // a __syncwarp of this warp opened
// Throws unless the launch's static __shared__ variables and its dynamic shared memory fit the target's limit.
void end_launch();
void abandon_launch();  // the launch threw
// The bytes of device memory the last launch read before writing them, and wrote, each byte once (counts.h).
void launch_bytes(int64_t* read, int64_t* written);

void async_issued(unsigned char* shared_dst, const void* global_src, const void* site);
void async_landed(unsigned char* shared_dst);

// "kernels/common.cuh:51" for a return address in kernel code; the function's name for a kernel's address.
const char* source_line(const void* return_address);
const char* function_name(const void* function);

}  // namespace emulator::checker
