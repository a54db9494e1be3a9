// Byte-level BPE: chunking, training with incremental pair counts and a max-heap, rank-order encoding, and
// the file format (little-endian uint32: magic, version, vocab_size, then vocab_size-256 merges (left, right)).
#include "tokenizer.h"

#include "shards.h"
#include "model/config.h"

#include <queue>
#include <stdexcept>

static const uint32_t TOKENIZER_MAGIC = 0x6B6F546D;  // "mTok"
static const uint32_t TOKENIZER_VERSION = 1;

static uint64_t pair_key(uint32_t left, uint32_t right) { return ((uint64_t)left << 32) | right; }

static bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
// Chunk classes: 0 whitespace, 1 letter (ASCII letters, bytes >= 128), 2 digit, 3 anything else.
static int char_class(unsigned char c) {
    if (is_space(c)) return 0;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 128) return 1;
    if (c >= '0' && c <= '9') return 2;
    return 3;
}

// The longest chunk, so the longest token: a run of one class is cut every MAX_CHUNK_BYTES (a text without
// spaces, Chinese or DNA, would otherwise be one chunk, and training scans every chunk a pair is in at each merge).
constexpr size_t MAX_CHUNK_BYTES = 256;

// Calls emit(start, length) for each chunk of text, in order; the chunks cover text exactly.
template <typename Emit>
static void for_each_chunk(const std::string& text, Emit emit) {
    size_t n = text.size(), i = 0;
    while (i < n) {
        size_t start = i;
        if (is_space(text[i])) {
            size_t end = i;
            while (end < n && is_space(text[end]) && end - i < MAX_CHUNK_BYTES) end++;
            if (end < n && text[end - 1] == ' ') end--;  // the last space prefixes the next chunk
            if (end > i) {
                emit(i, end - i);
                i = end;
                continue;
            }
            i++;  // a lone space before a non-space run: it starts that run's chunk
        }
        int cls = char_class(text[i]);
        while (i < n && char_class(text[i]) == cls && i - start < MAX_CHUNK_BYTES) i++;
        emit(start, i - start);
    }
}

// Replaces every non-overlapping (left, right), scanning left to right, with merged.
static void merge_pair(std::vector<uint32_t>& ids, uint32_t left, uint32_t right, uint32_t merged) {
    size_t out = 0;
    for (size_t i = 0; i < ids.size(); i++) {
        if (i + 1 < ids.size() && ids[i] == left && ids[i + 1] == right) {
            ids[out++] = merged;
            i++;
        } else {
            ids[out++] = ids[i];
        }
    }
    ids.resize(out);
}

// The longest token and the most bytes of all tokens load() takes: they bound what a corrupt file can make it
// allocate (a token merged with itself doubles; 40 such merges ask for a terabyte). train() stays within both.
constexpr size_t MAX_TOKEN_BYTES = 1 << 16, MAX_TOKENIZER_BYTES = 1 << 28;

Tokenizer::Tokenizer() {
    for (int b = 0; b < 256; b++) token_bytes_.push_back(std::string(1, (char)b));
}

uint32_t Tokenizer::add_merge(uint32_t left, uint32_t right) {
    uint32_t token = (uint32_t)token_bytes_.size();
    merges_.push_back({left, right});
    token_bytes_.push_back(token_bytes_[left] + token_bytes_[right]);
    merged_token_[pair_key(left, right)] = token;
    return token;
}

Tokenizer Tokenizer::train(const std::string& text, int vocab_size) {
    if (vocab_size < 256) throw std::runtime_error("tokenizer vocab_size " + std::to_string(vocab_size) + " is below 256");
    std::unordered_map<std::string, int64_t> chunk_counts;
    for_each_chunk(text, [&](size_t start, size_t length) { chunk_counts[text.substr(start, length)]++; });

    // Each unique chunk as a token sequence with its count; pair counts weighted by chunk counts, and for each
    // pair the chunks it may occur in (entries can be stale or repeated: a chunk is checked before it is merged).
    std::vector<std::vector<uint32_t>> chunks;
    std::vector<int64_t> counts;
    std::unordered_map<uint64_t, int64_t> pair_counts;
    std::unordered_map<uint64_t, std::vector<int32_t>> pair_chunks;
    auto note_chunk = [&](uint64_t key, int32_t index) {
        std::vector<int32_t>& where = pair_chunks[key];
        if (where.empty() || where.back() != index) where.push_back(index);
    };
    for (const auto& kv : chunk_counts) {
        int32_t index = (int32_t)chunks.size();
        std::vector<uint32_t> ids(kv.first.size());
        for (size_t i = 0; i < ids.size(); i++) ids[i] = (unsigned char)kv.first[i];
        counts.push_back(kv.second);
        for (size_t i = 0; i + 1 < ids.size(); i++) {
            uint64_t key = pair_key(ids[i], ids[i + 1]);
            pair_counts[key] += kv.second;
            note_chunk(key, index);
        }
        chunks.push_back(std::move(ids));
    }

    // The most frequent pair comes from a max-heap of (count, pair) ordered by count, then smallest pair;
    // an entry is pushed whenever a count changes and entries whose count is stale are dropped when on top.
    auto lower_priority = [](const std::pair<int64_t, uint64_t>& a, const std::pair<int64_t, uint64_t>& b) {
        return a.first < b.first || (a.first == b.first && a.second > b.second);
    };
    std::priority_queue<std::pair<int64_t, uint64_t>, std::vector<std::pair<int64_t, uint64_t>>, decltype(lower_priority)>
        heap(lower_priority);
    for (const auto& kv : pair_counts) heap.push({kv.second, kv.first});
    std::unordered_map<uint64_t, int64_t> delta;  // the pair count changes of one merge
    Tokenizer tok;
    size_t total_bytes = 256;
    while (tok.vocab_size() < vocab_size) {
        while (!heap.empty()) {
            auto it = pair_counts.find(heap.top().second);
            if (it != pair_counts.end() && it->second == heap.top().first) break;
            heap.pop();
        }
        if (heap.empty() || heap.top().first < 2) break;
        uint64_t best_key = heap.top().second;
        uint32_t left = (uint32_t)(best_key >> 32), right = (uint32_t)best_key;
        const size_t token_bytes = tok.token_bytes_[left].size() + tok.token_bytes_[right].size();
        if (total_bytes + token_bytes > MAX_TOKENIZER_BYTES) break;
        total_bytes += token_bytes;
        uint32_t merged = tok.add_merge(left, right);
        std::vector<int32_t> where = std::move(pair_chunks[best_key]);
        pair_chunks.erase(best_key);
        for (int32_t index : where) {
            std::vector<uint32_t>& ids = chunks[index];
            bool contains = false;
            for (size_t i = 0; i + 1 < ids.size() && !contains; i++) contains = ids[i] == left && ids[i + 1] == right;
            if (!contains) continue;
            for (size_t i = 0; i + 1 < ids.size(); i++) delta[pair_key(ids[i], ids[i + 1])] -= counts[index];
            merge_pair(ids, left, right, merged);
            for (size_t i = 0; i + 1 < ids.size(); i++) {
                uint64_t key = pair_key(ids[i], ids[i + 1]);
                delta[key] += counts[index];
                if (ids[i] == merged || ids[i + 1] == merged) note_chunk(key, index);
            }
        }
        for (const auto& kv : delta) {
            if (kv.second == 0) continue;
            int64_t count = pair_counts[kv.first] += kv.second;
            if (count == 0) pair_counts.erase(kv.first);
            else heap.push({count, kv.first});
        }
        delta.clear();
    }
    return tok;
}

// Repeatedly merges the lowest-rank adjacent pair (lowest merged token id) until no pair has a merge.
std::vector<uint32_t> Tokenizer::encode_chunk(const std::string& chunk) const {
    std::vector<uint32_t> ids(chunk.size());
    for (size_t i = 0; i < chunk.size(); i++) ids[i] = (unsigned char)chunk[i];
    while (ids.size() >= 2) {
        uint32_t best = UINT32_MAX, left = 0, right = 0;
        for (size_t i = 0; i + 1 < ids.size(); i++) {
            auto it = merged_token_.find(pair_key(ids[i], ids[i + 1]));
            if (it != merged_token_.end() && it->second < best) {
                best = it->second;
                left = ids[i];
                right = ids[i + 1];
            }
        }
        if (best == UINT32_MAX) break;
        merge_pair(ids, left, right, best);
    }
    return ids;
}

std::vector<uint32_t> Tokenizer::encode(const std::string& text) const {
    std::unordered_map<std::string, std::vector<uint32_t>> cache;
    std::vector<uint32_t> tokens;
    for_each_chunk(text, [&](size_t start, size_t length) {
        std::string chunk = text.substr(start, length);
        auto it = cache.find(chunk);
        if (it == cache.end()) it = cache.emplace(chunk, encode_chunk(chunk)).first;
        tokens.insert(tokens.end(), it->second.begin(), it->second.end());
    });
    return tokens;
}

std::string Tokenizer::token_bytes(uint32_t token) const {
    if (token >= token_bytes_.size())
        throw std::runtime_error("token " + std::to_string(token) + " is outside the vocabulary of " +
                                 std::to_string(token_bytes_.size()));
    return token_bytes_[token];
}

std::string Tokenizer::decode(const std::vector<uint32_t>& tokens) const {
    std::string text;
    for (uint32_t t : tokens) text += token_bytes(t);
    return text;
}

void Tokenizer::save(const std::string& path) const {
    std::string bytes;
    append_le32(bytes, TOKENIZER_MAGIC);
    append_le32(bytes, TOKENIZER_VERSION);
    append_le32(bytes, (uint32_t)vocab_size());
    for (const auto& m : merges_) {
        append_le32(bytes, m.first);
        append_le32(bytes, m.second);
    }
    write_file_atomic(path, bytes);
}

Tokenizer Tokenizer::load(const std::string& path) {
    std::string bytes = read_file(path, 12 + 8 * (size_t)MAX_VOCAB_SIZE);
    if (bytes.size() < 12 || load_le32(&bytes[0]) != TOKENIZER_MAGIC)
        throw std::runtime_error(path + ": not a tokenizer file (bad magic)");
    uint32_t version = load_le32(&bytes[4]), vocab = load_le32(&bytes[8]);
    if (version != TOKENIZER_VERSION)
        throw std::runtime_error(path + ": unknown tokenizer version " + std::to_string(version));
    if (vocab < 256 || bytes.size() != 12 + 8 * (size_t)(vocab - 256))
        throw std::runtime_error(path + ": truncated or corrupt (vocab " + std::to_string(vocab) + " does not match " +
                                 std::to_string(bytes.size()) + " bytes)");
    Tokenizer tok;
    size_t total_bytes = 256;
    for (uint32_t i = 0; i < vocab - 256; i++) {
        uint32_t left = load_le32(&bytes[12 + 8 * i]), right = load_le32(&bytes[16 + 8 * i]);
        if (left >= 256 + i || right >= 256 + i)
            throw std::runtime_error(path + ": merge " + std::to_string(i) + " refers to a later token");
        const size_t token_bytes = tok.token_bytes_[left].size() + tok.token_bytes_[right].size();
        if (token_bytes > MAX_TOKEN_BYTES)
            throw std::runtime_error(path + ": corrupt (merge " + std::to_string(i) + " makes a token of " +
                                     std::to_string(token_bytes) + " bytes)");
        total_bytes += token_bytes;
        if (total_bytes > MAX_TOKENIZER_BYTES)
            throw std::runtime_error(path + ": corrupt (its tokens take over " + std::to_string(MAX_TOKENIZER_BYTES) +
                                     " bytes by merge " + std::to_string(i) + ")");
        tok.add_merge(left, right);
    }
    return tok;
}
