// Token embedding (DESIGN §1), FP32.
//   forward:  out (M, d) = embed (V, d) [tokens (M)],  tokens in [0, V)
//   backward: dembed (V, d) += dout (M, d) scattered to the rows tokens[m]; a token that repeats adds up.
// The backward is deterministic without atomics: the host groups the rows by token (TokenRows, in
// kernels/token_rows.h, once per batch: the tokens come from there), and one block per distinct token adds that
// token's rows of dout into its row of dembed, threads over the columns, rows in ascending order. Each dembed
// element is summed in row order, exactly as the CPU reference (model/ops.cpp) does: the result is bit-identical to
// it. Reads are coalesced along the columns, and the parallelism is distinct tokens x columns.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/token_rows.h"

namespace gpu {

// one block per token row, threads over columns
static __global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* embed, int64_t d) {
    const int64_t m = blockIdx.x;
    const float* src = embed + (int64_t)tokens[m] * d;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[m * d + c] = src[c];
}

// one block per distinct token u, threads over columns: its row of dembed += its rows of dout, in row order
static __global__ void embedding_backward_kernel(float* dembed, const float* dout, const int32_t* order,
                                                 const int32_t* starts, const int32_t* tokens, int64_t d) {
    const int64_t u = blockIdx.x;
    float* row = dembed + (int64_t)tokens[u] * d;
    const int32_t first = starts[u], last = starts[u + 1];
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        float sum = row[c];
        for (int32_t j = first; j < last; j++) sum += dout[(int64_t)order[j] * d + c];
        row[c] = sum;
    }
}

// out (M, d) = embed[tokens]
inline void embedding_forward(float* out, const int32_t* tokens, const float* embed, int64_t M, int64_t d,
                              cudaStream_t stream) {
    if (M == 0) return;
    launch_kernel(embedding_forward_kernel, (unsigned)M, 256, 0, stream, out, tokens, embed, d);
}

// dembed (V, d) += dout (M, d) at the rows of the tokens that `rows` groups (M = rows.rows)
inline void embedding_backward(float* dembed, const float* dout, const TokenRows& rows, int64_t d,
                               cudaStream_t stream) {
    if (rows.distinct == 0) return;
    launch_kernel(embedding_backward_kernel, (unsigned)rows.distinct, 256, 0, stream, dembed, dout, rows.order(),
                  rows.starts(), rows.tokens(), d);
}

}  // namespace gpu
