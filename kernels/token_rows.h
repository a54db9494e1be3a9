// A token list's rows grouped by token, for the embedding's backward (kernels/embedding.cuh). Built on the host,
// where the batch's tokens come from, and read on the device. Plain C++.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace gpu {

// Packed in 3M + 1 int32 on the device, as token_rows_pack writes them:
//   order (M):              the rows sorted by token, equal tokens in row order
//   starts (distinct + 1):  where each distinct token's rows begin in order; the last entry is M
//   tokens (distinct):      the distinct tokens, ascending
struct TokenRows {
    int32_t* packed = nullptr;
    int64_t rows = 0, distinct = 0;
    const int32_t* order() const { return packed; }
    const int32_t* starts() const { return packed + rows; }
    const int32_t* tokens() const { return packed + 2 * rows + 1; }
};

// Host: packs tokens (M) into packed (3M + 1 values); returns the distinct count.
inline int64_t token_rows_pack(const int32_t* tokens, int64_t M, int32_t* packed) {
    int32_t *order = packed, *starts = packed + M, *distinct_tokens = packed + 2 * M + 1;
    std::vector<uint64_t> keys(M);  // token, then row: sorting the keys sorts by token, ties in row order
    for (int64_t m = 0; m < M; m++) keys[m] = (uint64_t)(uint32_t)tokens[m] << 32 | (uint64_t)m;
    std::sort(keys.begin(), keys.end());
    int64_t distinct = 0;
    for (int64_t j = 0; j < M; j++) {
        order[j] = (int32_t)(keys[j] & 0xffffffffu);
        const int32_t token = (int32_t)(keys[j] >> 32);
        if (j == 0 || token != distinct_tokens[distinct - 1]) {
            starts[distinct] = (int32_t)j;
            distinct_tokens[distinct++] = token;
        }
    }
    starts[distinct] = (int32_t)M;
    return distinct;
}

}  // namespace gpu
