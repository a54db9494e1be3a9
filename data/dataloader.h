// Batches of (inputs, targets) for one rank of a data-parallel job, read from llm.c token shards, with
// llm.c's exact semantics: at global position p in the current shard, rank r takes the B*T+1 tokens from
// p + r*B*T (inputs = the first B*T, targets = the same window shifted by one), then p += B*T*world; when
// the next step would run past the shard, move to the next shard (wrapping to the first) at p = 0.
// So N ranks with batch B/N see exactly the rows of 1 rank with batch B. The state (shard, position) is
// saved in checkpoints and restored to resume the same token stream.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

struct DataLoaderState {
    int64_t shard = 0;
    int64_t position = 0;
};

class DataLoader {
public:
    // Throws if no file matches or a shard holds fewer than B*T*world+1 tokens.
    DataLoader(const std::string& pattern, int B, int T, int rank, int world);
    void next_batch(int32_t* inputs, int32_t* targets);  // each B*T: targets[i] = the token after inputs[i]
    void reset();                                        // first shard, position 0
    DataLoaderState state() const;
    void restore(const DataLoaderState& s);              // throws on a shard or position out of range
    uint32_t max_token() const;                          // largest token id in all shards
    int64_t total_tokens() const;                        // tokens in all shards
    const std::vector<std::string>& files() const;

private:
    void load_shard(int64_t shard);
    std::vector<std::string> files_;
    std::vector<int64_t> shard_sizes_;
    int64_t batch_tokens_;   // B*T, one rank's step
    int64_t global_tokens_;  // B*T*world, all ranks' step
    int64_t rank_offset_;    // rank*B*T
    int64_t shard_ = -1;
    int64_t position_ = 0;
    std::vector<uint32_t> tokens_;  // the current shard only
    uint32_t max_token_ = 0;
    int64_t total_tokens_ = 0;
};
