// The kernel emulator (see emulator.h): the E4M3 byte and the conversion the kernels use, __nv_cvt_float_to_fp8 with
// saturation to the largest finite value (__NV_SATFINITE), round to nearest even; and the other way, the value of a
// byte, for the emulator's cuBLASLt, which reads E4M3 operands. Written from the format, not from
// model/fp8.cpp, so that the CPU reference and this check each other (test_gpu_kernels' FP8 checks).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

typedef unsigned char __nv_fp8_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };

// E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7E = 448 the largest finite, 0x7F NaN.
inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t saturate,
                                                __nv_fp8_interpretation_t interpretation) {
    if (saturate != __NV_SATFINITE || interpretation != __NV_E4M3) {
        fprintf(stderr, "stand-in __nv_cvt_float_to_fp8: only E4M3 with __NV_SATFINITE is modelled\n");
        abort();
    }
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return (__nv_fp8_storage_t)(sign | 0x7f);  // NaN
    float a;
    memcpy(&a, &u, 4);
    if (a < 0.015625f) return (__nv_fp8_storage_t)(sign | (uint8_t)std::nearbyint(a * 512.0f));  // 2^-6: subnormals
    u += 0x7ffffu + ((u >> 20) & 1u);  // 23 mantissa bits to 3, ties to even
    const uint32_t exponent = (u >> 23) - 127 + 7, mantissa = (u >> 20) & 7u;
    if (exponent > 15 || (exponent == 15 && mantissa == 7)) return (__nv_fp8_storage_t)(sign | 0x7e);  // saturate
    return (__nv_fp8_storage_t)(sign | exponent << 3 | mantissa);
}

// The value of an E4M3 byte (exact in a float); S.1111.111 is NaN
inline float stand_in_e4m3_value(__nv_fp8_storage_t byte) {
    const int e = (byte >> 3) & 15, m = byte & 7;
    const float magnitude = (e == 15 && m == 7) ? NAN
                            : e == 0            ? std::ldexp((float)m, -9)
                                                : std::ldexp(8.0f + m, e - 10);
    return byte & 0x80 ? -magnitude : magnitude;
}
