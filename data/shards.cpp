// Token shard read/write (llm.c format, versions 1 and 2), glob, unigram entropy.
#include "shards.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <glob.h>
#include <stdexcept>
#include <unordered_map>

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version) {
    if (version != 1 && version != 2) throw std::runtime_error(path + ": unknown shard version " + std::to_string(version));
    if (tokens.size() > (size_t)INT32_MAX)
        throw std::runtime_error(path + ": " + std::to_string(tokens.size()) + " tokens do not fit one shard");
    size_t bytes_per_token = version == 1 ? 2 : 4;
    std::string bytes;
    bytes.reserve(SHARD_HEADER_INTS * 4 + tokens.size() * bytes_per_token);
    append_le32(bytes, (uint32_t)SHARD_MAGIC);
    append_le32(bytes, (uint32_t)version);
    append_le32(bytes, (uint32_t)tokens.size());
    bytes.resize(SHARD_HEADER_INTS * 4, '\0');
    for (size_t i = 0; i < tokens.size(); i++) {
        uint32_t t = tokens[i];
        if (version == 1) {
            if (t > 65535)
                throw std::runtime_error(path + ": token " + std::to_string(t) + " does not fit version 1 (uint16) shard");
            bytes.push_back((char)(t & 0xFF));
            bytes.push_back((char)(t >> 8));
        } else {
            append_le32(bytes, t);
        }
    }
    write_file_atomic(path, bytes);
}

// The header of an open shard, checked against the file's size; leaves `in` just after the header.
static ShardHeader read_header(std::ifstream& in, const std::string& path) {
    if (!in) throw std::runtime_error("cannot open " + path);
    in.seekg(0, std::ios::end);
    const int64_t file_bytes = (int64_t)in.tellg();
    in.seekg(0, std::ios::beg);
    if (file_bytes < 0 || !in) throw std::runtime_error("error reading " + path);
    const int64_t header_bytes = SHARD_HEADER_INTS * 4;
    if (file_bytes < header_bytes)
        throw std::runtime_error(path + ": truncated header (" + std::to_string(file_bytes) + " bytes, expected 1024)");
    char header[SHARD_HEADER_INTS * 4];
    if (!in.read(header, header_bytes)) throw std::runtime_error("error reading " + path);
    int32_t magic = (int32_t)load_le32(&header[0]);
    int32_t version = (int32_t)load_le32(&header[4]);
    int32_t ntokens = (int32_t)load_le32(&header[8]);
    if (magic != SHARD_MAGIC)
        throw std::runtime_error(path + ": not a token shard (magic " + std::to_string(magic) + ", expected 20240520)");
    if (version != 1 && version != 2)
        throw std::runtime_error(path + ": unknown shard version " + std::to_string(version) + " (expected 1 or 2)");
    if (ntokens < 0) throw std::runtime_error(path + ": negative token count " + std::to_string(ntokens));
    const int64_t bytes_per_token = version == 1 ? 2 : 4;
    const int64_t expected = header_bytes + (int64_t)ntokens * bytes_per_token;
    if (file_bytes < expected)
        throw std::runtime_error(path + ": truncated (header says " + std::to_string(ntokens) + " tokens, file holds " +
                                 std::to_string((file_bytes - header_bytes) / bytes_per_token) + ")");
    if (file_bytes > expected)
        throw std::runtime_error(path + ": " + std::to_string(file_bytes - expected) + " extra bytes after the " +
                                 std::to_string(ntokens) + " tokens");
    return {version, ntokens};
}

ShardHeader read_shard_header(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return read_header(in, path);
}

std::vector<uint32_t> read_shard(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    const ShardHeader h = read_header(in, path);
    // the payload goes straight into the result's memory, then is widened/byte-ordered in place
    std::vector<uint32_t> tokens((size_t)h.tokens);
    unsigned char* raw = (unsigned char*)tokens.data();
    const int64_t bytes_per_token = h.version == 1 ? 2 : 4;
    const std::streamsize payload = (std::streamsize)(h.tokens * bytes_per_token);
    if (!in.read((char*)raw, payload) || in.gcount() != payload)
        throw std::runtime_error(path + ": truncated while reading (header says " + std::to_string(h.tokens) + " tokens)");
    if (h.version == 1) {  // back to front: token i's 4 bytes overlap only the 2-byte values of tokens >= i
        for (int64_t i = h.tokens - 1; i >= 0; i--) tokens[i] = (uint32_t)raw[2 * i] | ((uint32_t)raw[2 * i + 1] << 8);
    } else {
        for (size_t i = 0; i < tokens.size(); i++) tokens[i] = load_le32((const char*)raw + 4 * i);
    }
    return tokens;
}

std::vector<std::string> glob_files(const std::string& pattern) {
    glob_t g;
    int rc = glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> files;
    if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) files.push_back(g.gl_pathv[i]);
    globfree(&g);
    if (files.empty()) throw std::runtime_error("no files match " + pattern);
    std::sort(files.begin(), files.end());
    return files;
}

double unigram_entropy_nats(const std::vector<uint32_t>& tokens) {
    std::unordered_map<uint32_t, int64_t> counts;
    for (uint32_t t : tokens) counts[t]++;
    double entropy = 0.0, n = (double)tokens.size();
    for (const auto& kv : counts) {
        double p = (double)kv.second / n;
        entropy -= p * std::log(p);
    }
    return entropy;
}
