// Kernel emulator (see ../emulator.h) for kernels/mma_sync.cuh: mma.sync m16n8k16 (BF16 inputs, FP32 accumulators)
// as a warp collective. Every lane deposits its A and B fragments; each then rebuilds A and B from the 32 lanes'
// fragments by the PTX ISA's layout (the one kernels/mma_sync.cuh states) and adds to its own four accumulators
// their dot products, in k order (products of BF16 values are exact in float; the tensor cores' summation order
// and rounding inside the 16-term sum differ, far below BF16's precision, which the tests allow for).
// ldmatrix likewise: every lane deposits its row address, then reads its elements from the 32 rows; an address
// that is not 16-byte aligned or not in the block's shared memory throws, as it faults on the GPU.
// All 32 lanes must take part, as on the GPU.
#pragma once
#include <cstdint>

#include "../emulator.h"

namespace gpu {

EMULATOR_UNCHECKED inline float emulated_bf16_half(uint32_t pair, int half) {
    const uint32_t bits = (half ? pair >> 16 : pair & 0xFFFFu) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// Registers only: the hazard checker need not see its loads and stores.
EMULATOR_COLLECTIVE inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    const void* site = __builtin_return_address(0);
    uint32_t A_regs[32][4], B_regs[32][2];
    using emulator::Collective;
    const uint64_t* all = emulator::warp_collective(Collective::mma, ~0u, (uint64_t)a[0] | (uint64_t)a[1] << 32, site);
    for (int l = 0; l < 32; l++) A_regs[l][0] = (uint32_t)all[l], A_regs[l][1] = (uint32_t)(all[l] >> 32);
    all = emulator::warp_collective(Collective::mma, ~0u, (uint64_t)a[2] | (uint64_t)a[3] << 32, site);
    for (int l = 0; l < 32; l++) A_regs[l][2] = (uint32_t)all[l], A_regs[l][3] = (uint32_t)(all[l] >> 32);
    all = emulator::warp_collective(Collective::mma, ~0u, (uint64_t)b[0] | (uint64_t)b[1] << 32, site);
    for (int l = 0; l < 32; l++) B_regs[l][0] = (uint32_t)all[l], B_regs[l][1] = (uint32_t)(all[l] >> 32);

    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int half = 0; half < 2; half++) {
            A[g][2 * t + half] = emulated_bf16_half(A_regs[l][0], half);
            A[g + 8][2 * t + half] = emulated_bf16_half(A_regs[l][1], half);
            A[g][2 * t + 8 + half] = emulated_bf16_half(A_regs[l][2], half);
            A[g + 8][2 * t + 8 + half] = emulated_bf16_half(A_regs[l][3], half);
            B[2 * t + half][g] = emulated_bf16_half(B_regs[l][0], half);
            B[2 * t + 8 + half][g] = emulated_bf16_half(B_regs[l][1], half);
        }
    }
    const int g = (int)emulator::lane() / 4, t = (int)emulator::lane() % 4;
    for (int e = 0; e < 4; e++) {
        const int row = g + (e / 2) * 8, col = 2 * t + e % 2;
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
        d[e] += sum;
    }
}

// r[i] = this lane's pair of matrix i (rows given by lanes 8i..8i+7): (row g, columns 2t, 2t+1), or with
// transpose (rows 2t, 2t+1, column g). Its reads of shared memory go to the hazard checker as the kernel's at site.
EMULATOR_UNCHECKED inline void emulated_ldmatrix_x4(uint32_t (&r)[4], const void* row, bool transpose,
                                                     const void* site) {
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0 || !emulator::in_shared_memory(row, 16))
        emulator::fail_thread("ldmatrix: a row address not 16-byte aligned in shared memory");
    const uint64_t* all =
        emulator::warp_collective(emulator::Collective::ldmatrix, 0xffffffffu, emulator::to_bits(row), site);
    const int g = (int)emulator::lane() / 4, t = (int)emulator::lane() % 4;
    auto at = [&](int matrix, int r8, int c8) {
        const uint16_t* element = emulator::from_bits<const uint16_t*>(all[8 * matrix + r8]) + c8;
        emulator::checked_access(element, sizeof(uint16_t), false, site);
        return (uint32_t)*element;
    };
    for (int i = 0; i < 4; i++)
        r[i] = transpose ? at(i, 2 * t, g) | at(i, 2 * t + 1, g) << 16 : at(i, g, 2 * t) | at(i, g, 2 * t + 1) << 16;
}
EMULATOR_COLLECTIVE inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    emulated_ldmatrix_x4(r, row, false, __builtin_return_address(0));
}
EMULATOR_COLLECTIVE inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    emulated_ldmatrix_x4(r, row, true, __builtin_return_address(0));
}

}  // namespace gpu
