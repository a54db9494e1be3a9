// Batches (inputs, targets) for one rank, from llm.c token shards with llm.c's semantics. At position p of the
// shard, rank r takes the B*T+1 tokens from p + r*B*T (targets: inputs shifted by one), then p += B*T*world. When
// the next step would pass the shard's end (p + B*T*world + 1 > its tokens), the next shard starts at p = 0,
// wrapping. So N ranks of batch B/N see the rows of 1 rank of batch B. One shard is in memory, its tokens checked
// against the vocabulary when read, and data of at most check_at_start tokens in all has every shard checked at
// start, so a bad token in a later shard stops the run before it trains. The state (shard, position, file name and
// size) goes into checkpoints.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

struct DataLoaderState {
    int64_t shard = 0;     // index in the sorted list of files matching the pattern
    int64_t position = 0;  // global position in that shard
    std::string file;      // that shard's file name without its directory; restore() checks it unless empty
    int64_t tokens = 0;    // that shard's token count; checked with file
};

// Data up to this many tokens (1 GiB of shards at most) is checked whole at start.
constexpr int64_t DATA_CHECKED_AT_START = int64_t(1) << 28;

class DataLoader {
public:
    // Reads every shard's header and loads the first. Throws if no file matches, a header or file size is bad, a
    // shard holds fewer than B*T*world+1 tokens, or (vocab_size > 0) a loaded shard holds a token >= vocab_size, as
    // does any shard when the data holds at most check_at_start tokens.
    DataLoader(const std::string& pattern, int B, int T, int rank, int world, uint32_t vocab_size = 0,
               int64_t check_at_start = DATA_CHECKED_AT_START);
    // B*T each; targets[i] is the token after inputs[i]. May read the next shard, and throw its errors.
    void next_batch(int32_t* inputs, int32_t* targets);
    void reset();  // first shard, position 0
    DataLoaderState state() const;
    // Resumes at s. Throws if s's shard or position is outside the data, or s names a file or size that is not
    // the shard at that index now. A position with no room for a batch of this loader's B*T*world (a larger
    // batch than when saved) moves to the next shard as next_batch would.
    void restore(const DataLoaderState& s);
    int64_t total_tokens() const { return total_tokens_; }  // tokens in all shards
    int64_t batches_per_pass() const;  // next_batch calls from reset() that read every shard once, no wrap

private:
    void load_shard(int64_t shard);
    void next_shard_if_full();  // no room for another step of every rank here: the next shard (wrapping), at 0
    std::vector<std::string> files_;
    std::vector<int64_t> shard_sizes_;  // from the headers
    int64_t batch_tokens_;   // B*T, one rank's step
    int64_t global_tokens_;  // B*T*world, all ranks' step
    int64_t rank_offset_;    // rank*B*T
    uint32_t vocab_size_;    // 0: unchecked
    int64_t shard_ = 0;      // the current shard
    int64_t position_ = 0;
    int64_t loaded_ = -1;           // the shard in tokens_, -1 for none
    std::vector<uint32_t> tokens_;  // the loaded shard only
    int64_t total_tokens_ = 0;
};
