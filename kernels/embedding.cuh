// Token embedding (docs/design.md §1), FP32.
//   forward:  out (M, d) = embed (V, d) [tokens (M)],  tokens in [0, V)
//   backward: dembed (V, d) += dout (M, d) scattered to the rows tokens[m]; a token that repeats adds up.
// The backward needs no atomics: the host groups the rows by token (kernels/token_rows.h), and a thread per
// (distinct token, column) adds that token's rows in row order, as model/ops.cpp does: the CPU's bits.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/token_rows.h"

namespace gpu {

// a thread block per token row, threads over columns
static __global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* embed, int64_t d) {
    const int64_t m = blockIdx.x;
    const float* src = embed + (int64_t)tokens[m] * d;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[m * d + c] = src[c];
}

constexpr int EMBEDDING_BACKWARD_THREADS = 256;

// grid (distinct token u, EMBEDDING_BACKWARD_THREADS columns), a thread per column. Splitting the columns spreads
// a frequent token's rows over several thread blocks.
static __global__ void embedding_backward_kernel(float* dembed, const float* dout, const int32_t* order,
                                                 const int32_t* starts, const int32_t* tokens, int64_t d) {
    const int64_t u = blockIdx.x, c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= d) return;
    float* value = dembed + (int64_t)tokens[u] * d + c;
    float sum = *value;
    for (int32_t j = starts[u]; j < starts[u + 1]; j++) sum += dout[(int64_t)order[j] * d + c];
    *value = sum;
}

inline void embedding_forward(float* out, const int32_t* tokens, const float* embed, int64_t M, int64_t d,
                              cudaStream_t stream) {
    if (M == 0) return;
    launch_kernel(embedding_forward_kernel, (unsigned)M, 256, 0, stream, out, tokens, embed, d);
}

// dembed (V, d) += dout (M, d), M = rows.rows, at the rows of the tokens that `rows` groups
inline void embedding_backward(float* dembed, const float* dout, const TokenRows& rows, int64_t d,
                               cudaStream_t stream) {
    if (rows.distinct == 0 || d == 0) return;
    const dim3 grid((unsigned)rows.distinct, (unsigned)ceil_div(d, EMBEDDING_BACKWARD_THREADS));
    launch_kernel(embedding_backward_kernel, grid, EMBEDDING_BACKWARD_THREADS, 0, stream, dembed, dout, rows.order(),
                  rows.starts(), rows.tokens(), d);
}

}  // namespace gpu
