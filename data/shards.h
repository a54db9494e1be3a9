// Token shards in llm.c's format: a header of 256 little-endian int32 ([0] magic 20240520, [1] version,
// [2] token count) followed by the tokens, uint16 in version 1 (llm.c) or uint32 in version 2 (our extension
// for vocabularies over 65536). Also glob, the unigram entropy of a token stream and little-endian helpers; the
// whole-file read and atomic write are io/files.h's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/files.h"

constexpr int32_t SHARD_MAGIC = 20240520;
constexpr int SHARD_HEADER_INTS = 256;

struct ShardHeader {
    int version = 0;     // 1: uint16 tokens, 2: uint32 tokens
    int64_t tokens = 0;  // the header's token count
};

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version);  // atomic
// Reads only the 1 KiB header and checks the file size against it; throws the same errors as read_shard.
ShardHeader read_shard_header(const std::string& path);
std::vector<uint32_t> read_shard(const std::string& path);  // straight into the result: one copy in memory
std::vector<std::string> glob_files(const std::string& pattern);  // sorted; throws "no files match PATTERN"
double unigram_entropy_nats(const std::vector<uint32_t>& tokens);  // -sum p log p over token frequencies

inline void append_le32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; i++) out.push_back((char)((v >> (8 * i)) & 0xFF));
}
inline uint32_t load_le32(const char* p) {
    const unsigned char* b = (const unsigned char*)p;
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}
