// The warp-level tensor-core product the BF16 attention kernels are made of: PTX's mma.sync m16n8k16 with BF16
// inputs and FP32 accumulators, D (16 x 8) += A (16 x 16) B (16 x 8), one instruction per warp; and ldmatrix, which
// loads its operand fragments from shared memory.
// Each lane holds fixed elements of each matrix (the PTX ISA's fragment layout for m16n8k16, .bf16, .f32). With
// g = lane / 4 and t = lane % 4, and two BF16 values per 32-bit register (the lower index in the low 16 bits):
//   A (row major)  a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//                  a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B (column major, k x n)   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   D, FP32        d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// So the accumulators of two adjacent 16 x 8 products (columns 0-7 and 8-15) hold exactly the elements the A
// fragment of their 16 x 16 tile needs, in the same lanes: a score tile becomes the next product's A operand
// without leaving the registers. Every lane of the warp must execute it (it is .sync.aligned).
//
// ldmatrix (.m8n8.x4.b16): four 8 x 8 BF16 matrices from shared memory in one instruction per warp. Lane l gives
// the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); afterwards, with g and t as above, r[i]
// holds in each lane row g, columns 2t and 2t+1 of matrix i; with .trans, column g, rows 2t and 2t+1 (the matrix
// transposed). The fragments above are such 8 x 8 pieces: an A fragment is the four 8 x 8 quarters of its 16 x 16
// tile (top left, bottom left, top right, bottom right), a B fragment two 8 x 8 halves, so one instruction loads an
// A fragment or two B fragments, where plain loads take 4 (or 8 16-bit loads for a B read down the columns).
// The kernel emulator replaces this file (test/kernel_emulator/kernels/mma_sync.cuh); test_gpu checks the layout
// above against the GPU.
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

// row: this lane's row address (see the top), in shared memory
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
