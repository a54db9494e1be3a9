// Batches of (inputs, targets) for one rank of a data-parallel job, read from llm.c token shards, with
// llm.c's exact semantics: at global position p in the current shard, rank r takes the B*T+1 tokens from
// p + r*B*T (inputs = the first B*T, targets = the same window shifted by one), then p += B*T*world; when
// the next step would run past the shard (p + B*T*world + 1 > its tokens), move to the next shard (wrapping
// to the first) at p = 0. So N ranks with batch B/N see exactly the rows of 1 rank with batch B.
// Construction reads every shard's 1 KiB header (checking each file's size against it) and loads the first
// shard; the loader holds one shard in memory, read when it becomes current, and checks its tokens against
// the vocabulary then. The state (shard, position, and the shard's file name and size to detect changed data)
// is saved in checkpoints and restored to resume the same token stream.
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

class DataLoader {
public:
    // Throws if no file matches, a shard's header or file size is bad, or a shard holds fewer than
    // B*T*world+1 tokens. vocab_size > 0: loading a shard that holds a token >= vocab_size throws.
    // Loads the first shard.
    DataLoader(const std::string& pattern, int B, int T, int rank, int world, uint32_t vocab_size = 0);
    // Each B*T: targets[i] = the token after inputs[i]. Reads the next shard when it comes up, so may throw
    // its read or vocabulary errors.
    void next_batch(int32_t* inputs, int32_t* targets);
    void reset();  // first shard, position 0
    DataLoaderState state() const;
    // Resumes at s. Throws if s's shard or position is outside the data, or s names a file or size that is not
    // the shard at that index now. A position with no room for a batch of this loader's B*T*world (a larger
    // batch than when saved) moves to the next shard as next_batch would.
    void restore(const DataLoaderState& s);
    int64_t total_tokens() const;      // tokens in all shards
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
