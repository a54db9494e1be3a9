// DataLoader: llm.c's distributed, resumable shard reader (see dataloader.h for the exact semantics).
#include "dataloader.h"

#include "shards.h"

#include <stdexcept>

// Throws when a shard holds a token outside the vocabulary (vocab_size 0: no check).
static void check_tokens(const std::string& file, const std::vector<uint32_t>& tokens, uint32_t vocab_size) {
    if (vocab_size == 0) return;
    uint32_t max = 0;
    for (uint32_t t : tokens) max = t > max ? t : max;
    if (max >= vocab_size)
        throw std::runtime_error(file + " holds token " + std::to_string(max) + " but the model's vocab_size is " +
                                 std::to_string(vocab_size) +
                                 " (wrong --config for this data? --vocab N overrides it)");
}

static std::string base_name(const std::string& path) {
    size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

DataLoader::DataLoader(const std::string& pattern, int B, int T, int rank, int world, uint32_t vocab_size,
                       int64_t check_at_start)
    : vocab_size_(vocab_size) {
    if (B <= 0 || T <= 0) throw std::runtime_error("DataLoader: batch " + std::to_string(B) + " and sequence " +
                                                   std::to_string(T) + " must be positive");
    if (world <= 0 || rank < 0 || rank >= world)
        throw std::runtime_error("DataLoader: rank " + std::to_string(rank) + " is not in a world of " + std::to_string(world));
    batch_tokens_ = (int64_t)B * T;
    global_tokens_ = batch_tokens_ * world;
    rank_offset_ = batch_tokens_ * rank;
    files_ = glob_files(pattern);
    // headers only: sizes and the size check, without reading the tokens
    for (const std::string& file : files_) {
        int64_t n = read_shard_header(file).tokens;
        if (n < global_tokens_ + 1)
            throw std::runtime_error(file + ": holds " + std::to_string(n) + " tokens, fewer than B*T*world+1 = " +
                                     std::to_string(global_tokens_ + 1));
        shard_sizes_.push_back(n);
        total_tokens_ += n;
    }
    load_shard(0);
    if (total_tokens_ <= check_at_start)
        for (size_t i = 1; i < files_.size(); i++) check_tokens(files_[i], read_shard(files_[i]), vocab_size_);
}

void DataLoader::load_shard(int64_t shard) {
    if (shard == loaded_) return;
    std::vector<uint32_t>().swap(tokens_);  // free the old shard first: never two in memory
    loaded_ = -1;
    const std::string& file = files_[shard];
    std::vector<uint32_t> tokens = read_shard(file);
    if ((int64_t)tokens.size() != shard_sizes_[shard])
        throw std::runtime_error(file + ": changed size while training (" + std::to_string(shard_sizes_[shard]) +
                                 " tokens, now " + std::to_string(tokens.size()) + ")");
    check_tokens(file, tokens, vocab_size_);
    tokens_ = std::move(tokens);
    loaded_ = shard;
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
    load_shard(shard_);
    const uint32_t* window = tokens_.data() + position_ + rank_offset_;
    for (int64_t i = 0; i < batch_tokens_; i++) {
        inputs[i] = (int32_t)window[i];
        targets[i] = (int32_t)window[i + 1];
    }
    position_ += global_tokens_;
    next_shard_if_full();  // the next shard is read by the next call
}

void DataLoader::next_shard_if_full() {
    if (position_ + global_tokens_ + 1 > shard_sizes_[shard_]) {
        shard_ = (shard_ + 1) % (int64_t)files_.size();
        position_ = 0;
    }
}

void DataLoader::reset() {
    shard_ = 0;
    position_ = 0;
    load_shard(0);
}

DataLoaderState DataLoader::state() const {
    return {shard_, position_, base_name(files_[shard_]), shard_sizes_[shard_]};
}

void DataLoader::restore(const DataLoaderState& s) {
    const int64_t n = (int64_t)files_.size();
    const std::string saved = "shard " + std::to_string(s.shard) + " was " + s.file + " (" + std::to_string(s.tokens) + " tokens)";
    if (s.shard < 0 || s.shard >= n) {
        if (!s.file.empty())
            throw std::runtime_error("the data changed since the checkpoint: " + saved + ", now there are " +
                                     std::to_string(n) + " shards");
        throw std::runtime_error("DataLoader: saved shard " + std::to_string(s.shard) + " is out of range (" +
                                 std::to_string(n) + " shards)");
    }
    const std::string now = base_name(files_[s.shard]);
    if (!s.file.empty() && (s.file != now || s.tokens != shard_sizes_[s.shard]))
        throw std::runtime_error("the data changed since the checkpoint: " + saved + ", now " + now + " (" +
                                 std::to_string(shard_sizes_[s.shard]) + " tokens)");
    if (s.position < 0 || s.position >= shard_sizes_[s.shard])
        throw std::runtime_error("DataLoader: saved position " + std::to_string(s.position) + " is out of range for " +
                                 files_[s.shard] + " (" + std::to_string(shard_sizes_[s.shard]) + " tokens)");
    shard_ = s.shard;
    position_ = s.position;
    next_shard_if_full();  // no room for this layout's batch
    load_shard(shard_);
}

int64_t DataLoader::batches_per_pass() const {
    int64_t batches = 0;
    for (int64_t n : shard_sizes_) batches += (n - 1) / global_tokens_;
    return batches;
}
