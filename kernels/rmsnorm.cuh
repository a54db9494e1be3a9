// RMSNorm over the rows of (M, C), FP32 (docs/design.md §1):
//   forward:  r_m = 1 / sqrt(mean_c x_mc^2 + eps), saved as rstd (M);  y_mc = x_mc r_m w_c. out16, when not null,
//             gets y in BF16 in the same pass: the copy the BF16 GEMMs read (GemmInput), with no cast kernel
//   residual: the residual add fused with the norm after it: x = a + b is written out and normalised in one pass,
//             by the same float add as the CPU's, so x is exact
//   backward: dx_mc = [add_mc +] r_m dy_mc w_c - x_mc r_m^3 / C * sum_c' dy_mc' w_c' x_mc'  (add: the residual's
//             gradient, which the norm's is added to; it may be dx itself)
//             dw_c (=|+=) sum_m dy_mc x_mc r_m
// dw needs no atomics: a thread per (chunk of RMSNORM_DW_ROWS rows, column) sums its rows in order into scratch
// (chunks, C), then a thread per column sums the chunks in order. The chunking depends only on M, not on the GPU.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int RMSNORM_THREADS = 256;
constexpr int64_t RMSNORM_DW_ROWS = 128;

inline int64_t rmsnorm_backward_scratch_floats(int64_t M, int64_t C) { return ceil_div(M, RMSNORM_DW_ROWS) * C; }

// a thread block per row: x = a, or with b, x = a + b written to sum; out = RMSNorm(x) w. A thread reads back only
// the sums it wrote itself.
static __global__ void rmsnorm_forward_kernel(float* sum, float* out, __nv_bfloat16* out16, float* rstd, const float* a,
                                              const float* b, const float* w, int64_t C, float eps) {
    const int64_t m = blockIdx.x;
    const float* x = b ? sum + m * C : a + m * C;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        if (b) sum[m * C + c] = a[m * C + c] + b[m * C + c];
        ss += x[c] * x[c];
    }
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[m] = r;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float y = x[c] * r * w[c];
        out[m * C + c] = y;
        if (out16) out16[m * C + c] = __float2bfloat16_rn(y);
    }
}

// a thread block per row: dx
static __global__ void rmsnorm_backward_dx_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                           const float* rstd, int64_t C, const float* add) {
    const int64_t m = blockIdx.x;
    const float *x = inp + m * C, *dy = dout + m * C;
    const float r = rstd[m];
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += dy[c] * w[c] * x[c];
    dot = block_sum(dot);
    const float coef = r * r * r * dot / C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float g = r * dy[c] * w[c] - x[c] * coef;
        dinp[m * C + c] = add ? add[m * C + c] + g : g;
    }
}

// grid (row chunks, groups of RMSNORM_THREADS columns): partial (chunks, C) = sum over the chunk's rows of dy x r
static __global__ void rmsnorm_backward_dw_partial_kernel(float* partial, const float* dout, const float* inp,
                                                   const float* rstd, int64_t M, int64_t C) {
    const int64_t chunk = blockIdx.x, c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int64_t first = chunk * RMSNORM_DW_ROWS, last = min(M, first + RMSNORM_DW_ROWS);
    float acc = 0.0f;
    for (int64_t m = first; m < last; m++) acc += dout[m * C + c] * inp[m * C + c] * rstd[m];
    partial[chunk * C + c] = acc;
}

// one thread per column: dw (=|+=) the chunks' partial sums, in chunk order
static __global__ void rmsnorm_backward_dw_sum_kernel(float* dw, const float* partial, int64_t chunks, int64_t C,
                                                      bool accumulate) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; k++) acc += partial[k * C + c];
    dw[c] = accumulate ? dw[c] + acc : acc;
}

// inp, out (M, C), w (C) -> out, rstd (M), and out16 (M, C) = out rounded to BF16 unless out16 is null
inline void rmsnorm_forward(float* out, __nv_bfloat16* out16, float* rstd, const float* inp, const float* w, int64_t M,
                            int64_t C, float eps, cudaStream_t stream) {
    if (M == 0) return;
    launch_kernel(rmsnorm_forward_kernel, (unsigned)M, RMSNORM_THREADS, 0, stream, (float*)nullptr, out, out16, rstd,
                  inp, (const float*)nullptr, w, C, eps);
}

// sum (M, C) = a + b (sum may be a or b), out (M, C) = RMSNorm(sum) w, rstd (M), out16 as rmsnorm_forward's
inline void residual_rmsnorm_forward(float* sum, float* out, __nv_bfloat16* out16, float* rstd, const float* a,
                                     const float* b, const float* w, int64_t M, int64_t C, float eps,
                                     cudaStream_t stream) {
    if (M == 0) return;
    launch_kernel(rmsnorm_forward_kernel, (unsigned)M, RMSNORM_THREADS, 0, stream, sum, out, out16, rstd, a, b, w, C,
                  eps);
}

// dinp (M, C) = [dinp_add +] the norm's input gradient (dinp_add: nullptr, or (M, C), dinp itself included),
// dw (C) (=|+=) its gradient (with M = 0, = sets dw to zero). scratch: rmsnorm_backward_scratch_floats(M, C) floats.
inline void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                             const float* rstd, int64_t M, int64_t C, const float* dinp_add, float* scratch,
                             cudaStream_t stream, bool accumulate_dw = true) {
    if (M == 0) {
        if (!accumulate_dw) CUDA_CHECK(cudaMemsetAsync(dw, 0, C * sizeof(float), stream));
        return;
    }
    launch_kernel(rmsnorm_backward_dx_kernel, (unsigned)M, RMSNORM_THREADS, 0, stream, dinp, dout, inp, w, rstd, C,
                  dinp_add);
    const int64_t chunks = ceil_div(M, RMSNORM_DW_ROWS);
    const dim3 grid((unsigned)chunks, (unsigned)ceil_div(C, RMSNORM_THREADS));
    launch_kernel(rmsnorm_backward_dw_partial_kernel, grid, RMSNORM_THREADS, 0, stream, scratch, dout, inp, rstd, M, C);
    launch_kernel(rmsnorm_backward_dw_sum_kernel, (unsigned)ceil_div(C, RMSNORM_THREADS), RMSNORM_THREADS, 0, stream,
                  dw, scratch, chunks, C, accumulate_dw);
}

}  // namespace gpu
