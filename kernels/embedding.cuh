// Token embedding (DESIGN §1), FP32.
//   forward:  out (M, d) = embed (V, d) [tokens (M)],  tokens in [0, V)
//   backward: dembed (V, d) += dout (M, d) scattered to the rows tokens[m]; a token that repeats adds up.
// The backward is deterministic without sorting: each thread owns one column c and walks all M tokens in order,
// so no two threads touch the same value and every dembed element is summed in token order, exactly as the CPU
// reference (model/ops.cpp) does: the result is bit-identical to it. Its parallelism is only d threads;
// a faster version would sort the tokens and sum segments (later).
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

// one block per token row, threads over columns
static __global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* embed, int64_t d) {
    const int64_t m = blockIdx.x;
    const float* src = embed + (int64_t)tokens[m] * d;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[m * d + c] = src[c];
}

// one thread per column c, all tokens in order
static __global__ void embedding_backward_kernel(float* dembed, const float* dout, const int32_t* tokens, int64_t M,
                                          int64_t d) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    for (int64_t m = 0; m < M; m++) dembed[(int64_t)tokens[m] * d + c] += dout[m * d + c];
}

// out (M, d) = embed[tokens]
inline void embedding_forward(float* out, const int32_t* tokens, const float* embed, int64_t M, int64_t d,
                              cudaStream_t stream) {
    if (M == 0) return;
    launch_kernel(embedding_forward_kernel, (unsigned)M, 256, 0, stream, out, tokens, embed, d);
}

// dembed (V, d) += dout (M, d) at rows tokens (M)
inline void embedding_backward(float* dembed, const float* dout, const int32_t* tokens, int64_t M, int64_t d,
                               cudaStream_t stream) {
    const int threads = 64;  // small blocks: the d columns spread over more SMs
    launch_kernel(embedding_backward_kernel, (unsigned)ceil_div(d, threads), threads, 0, stream, dembed, dout, tokens,
                  M, d);
}

}  // namespace gpu
