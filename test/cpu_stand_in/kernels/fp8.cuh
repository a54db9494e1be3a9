// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/fp8.cuh: the weights' quantization (the one launcher
// gpu/gpu_model.cu calls; the activations' are inside the stand-in matmul), by model/fp8.h's fp8_quantize, into the
// real header's layouts (E4M3 bytes; scales of block (rb, b) at rb * round_up(ceil(inner / 128), 4) + b).
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_fp8.h>

#include "kernels/common.cuh"
#include "model/fp8.h"

namespace gpu {

inline int64_t round_up(int64_t a, int64_t multiple) { return ceil_div(a, multiple) * multiple; }
inline int64_t fp8_blk128_scales(int64_t outer, int64_t inner) {
    return ceil_div(outer, FP8_TILE) * round_up(ceil_div(inner, FP8_TILE), 4);
}

// For each of the batch matrices W (rows, cols): q (rows, cols) with scales and q^T (cols, rows) with scales_t
inline void fp8_quantize_blocks(__nv_fp8_storage_t* q, __nv_fp8_storage_t* qt, float* scales, float* scales_t,
                                const float* W, int64_t batch, int64_t rows, int64_t cols, cudaStream_t stream) {
    const int64_t n = batch * rows * cols, S = fp8_blk128_scales(rows, cols), St = fp8_blk128_scales(cols, rows);
    if (n == 0) return;
    dev(W, n, "fp8_quantize_blocks W");
    dev(q, n, "fp8_quantize_blocks q");
    dev(qt, n, "fp8_quantize_blocks qt");
    dev(scales, batch * S, "fp8_quantize_blocks scales");
    dev(scales_t, batch * St, "fp8_quantize_blocks scales_t");
    launch(stream, [=] {
        const int64_t down = ceil_div(rows, FP8_TILE), across = ceil_div(cols, FP8_TILE);
        std::vector<float> values(rows * cols), block_scales(down * across);
        for (int64_t z = 0; z < batch; z++) {
            fp8_quantize(values.data(), block_scales.data(), W + z * rows * cols, rows, cols, FP8_TILE, FP8_TILE);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) {
                    const __nv_fp8_storage_t byte =
                        __nv_cvt_float_to_fp8(values[r * cols + c], __NV_SATFINITE, __NV_E4M3);
                    q[z * rows * cols + r * cols + c] = byte;
                    qt[z * rows * cols + c * rows + r] = byte;
                }
            for (int64_t rb = 0; rb < down; rb++)
                for (int64_t b = 0; b < across; b++) {
                    scales[z * S + rb * round_up(across, 4) + b] = block_scales[rb * across + b];
                    scales_t[z * St + b * round_up(down, 4) + rb] = block_scales[rb * across + b];
                }
        }
    });
}

}  // namespace gpu
