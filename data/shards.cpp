// Token shard read/write (llm.c format, versions 1 and 2), file helpers, glob, unigram entropy.
#include "shards.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <glob.h>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

std::string read_file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::ostringstream buffer;
    buffer << in.rdbuf();
    if (in.bad()) throw std::runtime_error("error reading " + path);
    return buffer.str();
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
    std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot write " + tmp);
    bool ok = fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    ok = (fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw std::runtime_error("cannot write " + path);
    }
}

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

std::vector<uint32_t> read_shard(const std::string& path) {
    std::string bytes = read_file_bytes(path);
    size_t header_bytes = SHARD_HEADER_INTS * 4;
    if (bytes.size() < header_bytes)
        throw std::runtime_error(path + ": truncated header (" + std::to_string(bytes.size()) + " bytes, expected 1024)");
    int32_t magic = (int32_t)load_le32(&bytes[0]);
    int32_t version = (int32_t)load_le32(&bytes[4]);
    int32_t ntokens = (int32_t)load_le32(&bytes[8]);
    if (magic != SHARD_MAGIC)
        throw std::runtime_error(path + ": not a token shard (magic " + std::to_string(magic) + ", expected 20240520)");
    if (version != 1 && version != 2)
        throw std::runtime_error(path + ": unknown shard version " + std::to_string(version) + " (expected 1 or 2)");
    if (ntokens < 0) throw std::runtime_error(path + ": negative token count " + std::to_string(ntokens));
    size_t bytes_per_token = version == 1 ? 2 : 4;
    size_t expected = header_bytes + (size_t)ntokens * bytes_per_token;
    if (bytes.size() < expected)
        throw std::runtime_error(path + ": truncated (header says " + std::to_string(ntokens) + " tokens, file holds " +
                                 std::to_string((bytes.size() - header_bytes) / bytes_per_token) + ")");
    if (bytes.size() > expected)
        throw std::runtime_error(path + ": " + std::to_string(bytes.size() - expected) +
                                 " extra bytes after the " + std::to_string(ntokens) + " tokens");
    std::vector<uint32_t> tokens((size_t)ntokens);
    const unsigned char* p = (const unsigned char*)bytes.data() + header_bytes;
    for (size_t i = 0; i < tokens.size(); i++)
        tokens[i] = version == 1 ? (uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8) : load_le32((const char*)p + 4 * i);
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
