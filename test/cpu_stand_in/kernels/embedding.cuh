// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/embedding.cuh: the CPU reference's functions, which
// the contract says the kernels equal (the backward bit for bit).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/token_rows.h"
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

// dembed (V, d) += dout (M, d) at the rows of the tokens that `rows` groups: the token of each row taken back from
// the grouping, then the CPU reference's sum
inline void embedding_backward(float* dembed, const float* dout, const TokenRows& rows, int64_t d,
                               cudaStream_t stream) {
    const int64_t M = rows.rows, U = rows.distinct;
    dev(dembed, d, "embedding_backward dembed");
    dev(dout, M * d, "embedding_backward dout");
    dev(rows.packed, 3 * M + 1, "embedding_backward rows");
    apart("embedding_backward", {span(dembed, d, "dembed")},
          {span(dout, M * d, "dout"), span(rows.packed, 3 * M + 1, "rows")});
    launch(stream, [=] {
        std::vector<int32_t> tokens(M);
        for (int64_t u = 0; u < U; u++)
            for (int32_t j = rows.starts()[u]; j < rows.starts()[u + 1]; j++)
                tokens[rows.order()[j]] = rows.tokens()[u];
        for (int64_t m = 0; m < M; m++) dev(dembed + (int64_t)tokens[m] * d, d, "embedding_backward dembed row");
        ::embedding_backward(dembed, dout, tokens.data(), M, d);
    });
}

}  // namespace gpu
