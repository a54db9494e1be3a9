// DataLoader: llm.c's distributed, resumable shard reader (see dataloader.h for the exact semantics).
#include "dataloader.h"

#include "shards.h"

#include <stdexcept>

DataLoader::DataLoader(const std::string& pattern, int B, int T, int rank, int world) {
    if (B <= 0 || T <= 0) throw std::runtime_error("DataLoader: batch " + std::to_string(B) + " and sequence " +
                                                   std::to_string(T) + " must be positive");
    if (world <= 0 || rank < 0 || rank >= world)
        throw std::runtime_error("DataLoader: rank " + std::to_string(rank) + " is not in a world of " + std::to_string(world));
    batch_tokens_ = (int64_t)B * T;
    global_tokens_ = batch_tokens_ * world;
    rank_offset_ = batch_tokens_ * rank;
    files_ = glob_files(pattern);
    // One scan of every shard: sizes, max token, and the size check; keep the first shard loaded.
    for (size_t i = 0; i < files_.size(); i++) {
        std::vector<uint32_t> tokens = read_shard(files_[i]);
        int64_t n = (int64_t)tokens.size();
        if (n < global_tokens_ + 1)
            throw std::runtime_error(files_[i] + ": holds " + std::to_string(n) + " tokens, fewer than B*T*world+1 = " +
                                     std::to_string(global_tokens_ + 1));
        for (uint32_t t : tokens) max_token_ = t > max_token_ ? t : max_token_;
        shard_sizes_.push_back(n);
        total_tokens_ += n;
        if (i == 0) tokens_ = std::move(tokens);
    }
    shard_ = 0;
    position_ = 0;
}

void DataLoader::load_shard(int64_t shard) {
    if (shard == shard_) return;
    tokens_ = read_shard(files_[shard]);
    if ((int64_t)tokens_.size() != shard_sizes_[shard])
        throw std::runtime_error(files_[shard] + ": changed size while training (" + std::to_string(shard_sizes_[shard]) +
                                 " tokens, now " + std::to_string(tokens_.size()) + ")");
    shard_ = shard;
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
    const uint32_t* window = tokens_.data() + position_ + rank_offset_;
    for (int64_t i = 0; i < batch_tokens_; i++) {
        inputs[i] = (int32_t)window[i];
        targets[i] = (int32_t)window[i + 1];
    }
    position_ += global_tokens_;
    if (position_ + global_tokens_ + 1 > (int64_t)tokens_.size()) {
        load_shard((shard_ + 1) % (int64_t)files_.size());
        position_ = 0;
    }
}

void DataLoader::reset() {
    load_shard(0);
    position_ = 0;
}

DataLoaderState DataLoader::state() const {
    DataLoaderState s;
    s.shard = shard_;
    s.position = position_;
    return s;
}

void DataLoader::restore(const DataLoaderState& s) {
    if (s.shard < 0 || s.shard >= (int64_t)files_.size())
        throw std::runtime_error("DataLoader: saved shard " + std::to_string(s.shard) + " is out of range (" +
                                 std::to_string(files_.size()) + " shards)");
    if (s.position < 0 || s.position + global_tokens_ + 1 > shard_sizes_[s.shard])
        throw std::runtime_error("DataLoader: saved position " + std::to_string(s.position) + " is out of range for " +
                                 files_[s.shard] + " (" + std::to_string(shard_sizes_[s.shard]) + " tokens)");
    load_shard(s.shard);
    position_ = s.position;
}

uint32_t DataLoader::max_token() const { return max_token_; }
int64_t DataLoader::total_tokens() const { return total_tokens_; }
const std::vector<std::string>& DataLoader::files() const { return files_; }
