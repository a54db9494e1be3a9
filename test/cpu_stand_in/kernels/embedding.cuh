// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/embedding.cuh: the CPU reference's functions, which
// the contract says the kernels equal (the backward bit for bit).
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "model/ops.h"

namespace gpu {

// out (M, d) = embed (V, d) [tokens]
inline void embedding_forward(float* out, const int32_t* tokens, const float* embed, int64_t M, int64_t d,
                              cudaStream_t stream) {
    dev(out, M * d, "embedding_forward out");
    dev(tokens, M, "embedding_forward tokens");
    dev(embed, d, "embedding_forward embed");  // (V is not an argument: the first row at least)
    apart("embedding_forward", {span(out, M * d, "out")}, {span(tokens, M, "tokens"), span(embed, d, "embed")});
    launch(stream, [=] {
        for (int64_t m = 0; m < M; m++) dev(embed + (int64_t)tokens[m] * d, d, "embedding_forward embed row");
        ::embedding_forward(out, tokens, embed, M, d);
    });
}

// dembed (V, d) += dout (M, d) at rows tokens (M)
inline void embedding_backward(float* dembed, const float* dout, const int32_t* tokens, int64_t M, int64_t d,
                               cudaStream_t stream) {
    dev(dembed, d, "embedding_backward dembed");
    dev(dout, M * d, "embedding_backward dout");
    dev(tokens, M, "embedding_backward tokens");
    apart("embedding_backward", {span(dembed, d, "dembed")}, {span(dout, M * d, "dout"), span(tokens, M, "tokens")});
    launch(stream, [=] {
        for (int64_t m = 0; m < M; m++) dev(dembed + (int64_t)tokens[m] * d, d, "embedding_backward dembed row");
        ::embedding_backward(dembed, dout, tokens, M, d);
    });
}

}  // namespace gpu
