// The optimizer shard's ranges packed into one device table, so AdamW and the gradient norm take one launch each
// (docs/design.md §8). A launch cuts every range into fixed pieces, a thread block per piece; a thread block finds
// its range by binary search over the prefix sums of the pieces. Built once on the host; plain C++.
#pragma once
#include <cstdint>
#include <vector>

#include "model/optimizer.h"

namespace gpu {

constexpr int64_t ADAMW_BLOCK_VALUES = 4096;  // values per thread block of the update; the norm's: GRAD_NORM_CHUNK

// Packed in 6 R + 2 int64 (R ranges): first (R), count (R), moments (R), decay (R: 1 where weight decay applies),
// then the prefix sums of the update's pieces (R + 1) and of the norm's chunks (R + 1).
struct ShardRanges {
    const int64_t* table = nullptr;  // device
    int64_t ranges = 0, blocks = 0, chunks = 0;
};

inline std::vector<int64_t> shard_ranges_pack(const OptimizerShard& shard) {
    const int64_t R = (int64_t)shard.ranges.size();
    std::vector<int64_t> packed(6 * R + 2, 0);
    int64_t *blocks = packed.data() + 4 * R, *chunks = blocks + R + 1;
    for (int64_t r = 0; r < R; r++) {
        const OptimizerRange& range = shard.ranges[r];
        packed[r] = range.first;
        packed[R + r] = range.count;
        packed[2 * R + r] = range.moments;
        packed[3 * R + r] = range.weight_decay ? 1 : 0;
        blocks[r + 1] = blocks[r] + (range.count + ADAMW_BLOCK_VALUES - 1) / ADAMW_BLOCK_VALUES;
        chunks[r + 1] = chunks[r] + (range.count + GRAD_NORM_CHUNK - 1) / GRAD_NORM_CHUNK;
    }
    return packed;
}

// The ShardRanges of a packed table (host) whose copy is at `device`
inline ShardRanges shard_ranges_of(const std::vector<int64_t>& packed, const int64_t* device) {
    const int64_t R = ((int64_t)packed.size() - 2) / 6;
    return {device, R, packed[5 * R], packed[6 * R + 1]};
}

}  // namespace gpu
