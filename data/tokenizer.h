// Byte-level BPE tokenizer. Token b < 256 is the byte b; token 256+i is merge i, the concatenation of two
// earlier tokens. Text is first split into chunks that merges never cross (like GPT-2): a whitespace run, or
// an optional single leading space followed by a run of letters (ASCII letters and bytes >= 128), a run of
// digits, or a run of other non-space bytes, each cut every 256 bytes (so no token is longer). Any byte string
// round-trips: decode(encode(x)) == x.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

class Tokenizer {
public:
    Tokenizer();  // the 256 byte tokens, no merges
    // Learns vocab_size-256 merges, each the most frequent adjacent pair (ties: smallest (left, right));
    // stops early when no pair occurs twice. Deterministic.
    static Tokenizer train(const std::string& text, int vocab_size);
    std::vector<uint32_t> encode(const std::string& text) const;
    std::string decode(const std::vector<uint32_t>& tokens) const;  // throws on a token >= vocab_size
    std::string token_bytes(uint32_t token) const;                  // throws on a token >= vocab_size
    int vocab_size() const { return (int)token_bytes_.size(); }
    void save(const std::string& path) const;        // atomic
    static Tokenizer load(const std::string& path);  // throws on a missing, foreign or truncated file

private:
    uint32_t add_merge(uint32_t left, uint32_t right);  // returns the new token
    std::vector<uint32_t> encode_chunk(const std::string& chunk) const;
    std::vector<std::pair<uint32_t, uint32_t>> merges_;
    std::vector<std::string> token_bytes_;
    std::unordered_map<uint64_t, uint32_t> merged_token_;  // (left << 32 | right) -> the token it merges into
};
