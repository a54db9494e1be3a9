// Kernel emulator (see ../emulator.h) for kernels/async_copy.cuh, in its strictest reading: a copy reads its source
// when issued, but its destination holds NaN bytes until the wait that covers it, when the data lands. So a thread
// that reads a tile before its own wait, or before the __syncthreads after the other threads' waits, reads NaN; one
// that overwrites a tile while another thread still reads it (a missing __syncthreads before the copy) hands that
// thread NaN. An address that is not 16-byte aligned, a destination outside shared memory, or a copy still in
// flight when its thread exits, throws.
#pragma once
#include "../emulator.h"

namespace gpu {

inline void cp_async_16(void* shared_dst, const void* global_src) { emulator::async_copy(shared_dst, global_src); }
inline void cp_async_commit() { emulator::async_commit(); }
template <int N>
inline void cp_async_wait() {
    emulator::async_wait(N);
}

}  // namespace gpu
