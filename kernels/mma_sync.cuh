// PTX mma.sync m16n8k16, BF16 in and FP32 accumulators: D (16 x 8) += A (16 x 16) B (16 x 8), one instruction per
// warp, executed by all its threads. Fragments, with g = lane / 4, t = lane % 4, two BF16 per 32-bit register (the
// lower index in the low half):
//   A (row major)            a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//                            a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B (column major, k x n)  b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   D (FP32)                 d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// Two adjacent 16 x 8 accumulators hold their 16 x 16 tile's A fragment: scores feed the next product in registers.
// ldmatrix .m8n8.x4: thread l gives the 16-byte aligned address of row l % 8 of 8 x 8 BF16 matrix l / 8; r[i] gets
// row g, columns 2t and 2t+1 of matrix i (.trans: column g, rows 2t and 2t+1). One instruction loads an A fragment
// (its quarters: top left, bottom left, top right, bottom right) or two B fragments (two halves each).
// The kernel emulator replaces this file (test/kernel_emulator/kernels/mma_sync.cuh); test_gpu checks the layout.
#pragma once
#include <cstdint>

namespace gpu {

__device__ inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// row: this thread's row address in shared memory (see the top)
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row))
                 : "memory");  // reads shared memory: not moved across the stores before it
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row))
                 : "memory");  // reads shared memory: not moved across the stores before it
}

}  // namespace gpu
