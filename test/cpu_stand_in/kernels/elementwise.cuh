// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/elementwise.cuh: the contract, as plain loops.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

// out = a + b (n values; out may alias a or b)
inline void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
    dev(out, n, "add out");
    dev(a, n, "add a");
    dev(b, n, "add b");
    launch(stream, [=] {
        for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    });
}

// dst[r][c] = src[r][c] for r < rows, c < cols, row strides dst_ld, src_ld
inline void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
    dev_strided(dst, rows, dst_ld, cols, "copy_columns dst");
    dev_strided(src, rows, src_ld, cols, "copy_columns src");
    apart("copy_columns", {span(dst, (rows - 1) * dst_ld + cols, "dst")}, {span(src, (rows - 1) * src_ld + cols, "src")});
    launch(stream, [=] {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[r * dst_ld + c] = src[r * src_ld + c];
    });
}

}  // namespace gpu
