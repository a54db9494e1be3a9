// BF16, the top half of an FP32: the rounding the GPU's __float2bfloat16_rn does, for the host (file formats and
// the optimizer's BF16 moments).
#pragma once
#include <cstdint>
#include <cstring>

// To BF16: round to nearest, ties to even; NaN stays NaN.
inline uint16_t bf16_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
inline float f32_from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
// x rounded to the nearest BF16 value, as an FP32
inline float bf16_round(float x) { return f32_from_bf16(bf16_from_f32(x)); }
