// Tests of the data pipeline: BPE tokenizer (round trips, determinism, file format), llm.c token shards
// (round trips and rejection of bad files), the distributed resumable DataLoader, unigram entropy.
#include <doctest/doctest.h>

#include "data/dataloader.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/files.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>

namespace {

// A fresh directory from mkdtemp under /tmp, removed with everything in it at the end of the test.
struct TempDir {
    std::string path;
    TempDir() {
        char name[] = "/tmp/moe_test_data_XXXXXX";
        if (!mkdtemp(name)) throw std::runtime_error("mkdtemp failed");
        path = name;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string file(const std::string& name) const { return path + "/" + name; }
};

const char* ENGLISH =
    "The quick brown fox jumps over the lazy dog. The dog, being lazy, does not jump back; it sleeps in the sun "
    "until the evening comes and the fox has gone home. In 1999 there were 42 foxes and 7 dogs in the valley.\n\n"
    "Tokenizers split text into pieces: words, numbers, punctuation and whitespace. A byte-level tokenizer never "
    "fails on unusual input, because every byte is a token of its own before any merge is learned.\n";

std::string repeat(const std::string& s, int times) {
    std::string out;
    for (int i = 0; i < times; i++) out += s;
    return out;
}

std::string random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::string s(n, '\0');
    for (size_t i = 0; i < n; i++) s[i] = (char)(rng() & 0xFF);
    return s;
}

// Tokens 0, 1, 2, ... offset by `first`, so every position in every shard has a distinct value.
std::vector<uint32_t> counting_tokens(size_t n, uint32_t first) {
    std::vector<uint32_t> t(n);
    for (size_t i = 0; i < n; i++) t[i] = first + (uint32_t)i;
    return t;
}

}  // namespace

TEST_CASE("data: tokenizer round trip on English text") {
    Tokenizer tok = Tokenizer::train(repeat(ENGLISH, 3), 400);
    CHECK(tok.vocab_size() > 256);
    std::string text = ENGLISH;
    CHECK(tok.decode(tok.encode(text)) == text);
    std::string unseen = "Zebras  quietly\tgraze; 3.14159 isn't\r\n  an  answer!!\n\n\n";
    CHECK(tok.decode(tok.encode(unseen)) == unseen);
    CHECK(tok.encode("").empty());
    CHECK_THROWS_WITH_AS(tok.decode({(uint32_t)tok.vocab_size()}), doctest::Contains("outside the vocabulary"), std::runtime_error);
}

TEST_CASE("data: tokenizer round trip on random bytes") {
    std::string bytes = random_bytes(20000, 1);
    bytes += std::string("\0\0\xff\xfe \x80\x80\x80 \0", 10);
    Tokenizer on_english = Tokenizer::train(repeat(ENGLISH, 3), 400);
    Tokenizer on_bytes = Tokenizer::train(bytes + bytes, 600);
    CHECK(on_bytes.vocab_size() > 256);
    CHECK(on_english.decode(on_english.encode(bytes)) == bytes);
    CHECK(on_bytes.decode(on_bytes.encode(bytes)) == bytes);
    CHECK(on_bytes.decode(on_bytes.encode(ENGLISH)) == ENGLISH);
}

TEST_CASE("data: tokenizer training is deterministic and breaks ties by the smallest pair") {
    Tokenizer a = Tokenizer::train(repeat(ENGLISH, 4), 500);
    Tokenizer b = Tokenizer::train(repeat(ENGLISH, 4), 500);
    REQUIRE(a.vocab_size() == b.vocab_size());
    for (int t = 0; t < a.vocab_size(); t++) CHECK(a.token_bytes(t) == b.token_bytes(t));
    CHECK(a.encode(ENGLISH) == b.encode(ENGLISH));
    // chunks "ab", " cd", " ab", " cd": pairs (a,b), (' ',c), (c,d) each occur twice; (' ',c) is smallest
    CHECK(Tokenizer::train("ab cd ab cd", 257).token_bytes(256) == " c");
}

TEST_CASE("data: merges reduce length on repetitive text, stop early, and never cross chunks") {
    std::string text = repeat("the cat sat on the mat. ", 200);
    Tokenizer tok = Tokenizer::train(text, 1000);
    CHECK(tok.vocab_size() < 1000);  // stops once every chunk is one token: nothing left to merge
    // one token per chunk: 7 per repetition ("the" or " the", " cat", " sat", " on", " the", " mat", "."), then " "
    CHECK(tok.encode(text).size() == 7 * 200 + 1);
    CHECK(Tokenizer::train(text, 260).encode(text).size() < text.size());
    CHECK(Tokenizer::train("abcdefg", 1000).vocab_size() == 256);  // no pair occurs twice
    CHECK(Tokenizer::train(repeat("a1", 100), 1000).vocab_size() == 256);  // letters and digits are separate chunks
    CHECK_THROWS_AS(Tokenizer::train("abc", 255), std::runtime_error);
}

TEST_CASE("data: tokenizer save/load round trip gives identical encodings") {
    TempDir dir;
    Tokenizer tok = Tokenizer::train(repeat(ENGLISH, 3), 450);
    tok.save(dir.file("tok.bin"));
    CHECK_FALSE(std::filesystem::exists(dir.file("tok.bin.tmp")));
    Tokenizer loaded = Tokenizer::load(dir.file("tok.bin"));
    CHECK(loaded.vocab_size() == tok.vocab_size());
    std::string probe = std::string(ENGLISH) + random_bytes(2000, 2);
    CHECK(loaded.encode(probe) == tok.encode(probe));
}

TEST_CASE("data: tokenizer load rejects missing, truncated and foreign files") {
    TempDir dir;
    Tokenizer::train(repeat(ENGLISH, 3), 300).save(dir.file("tok.bin"));
    std::string bytes = read_file(dir.file("tok.bin"));
    write_file_atomic(dir.file("short.bin"), bytes.substr(0, bytes.size() - 3));
    CHECK_THROWS_WITH_AS(Tokenizer::load(dir.file("short.bin")), doctest::Contains("truncated"), std::runtime_error);
    std::string corrupt = bytes;
    corrupt[12] = (char)0xFF;  // merge 0's left token becomes 0x10FF, a token not defined before it
    corrupt[13] = 0x10;
    write_file_atomic(dir.file("corrupt.bin"), corrupt);
    CHECK_THROWS_WITH_AS(Tokenizer::load(dir.file("corrupt.bin")), doctest::Contains("refers to a later token"), std::runtime_error);
    write_shard(dir.file("shard.bin"), {1, 2, 3}, 1);
    CHECK_THROWS_WITH_AS(Tokenizer::load(dir.file("shard.bin")), doctest::Contains("not a tokenizer file"), std::runtime_error);
    CHECK_THROWS_WITH_AS(Tokenizer::load(dir.file("missing.bin")), doctest::Contains("cannot open"), std::runtime_error);
    // a merge bomb: each merge joins the last token with itself, 40 doublings would ask for 2^41 bytes
    std::string bomb = bytes.substr(0, 8);
    auto append_u32 = [&](uint32_t v) { bomb.append((const char*)&v, 4); };
    append_u32(256 + 40);
    for (uint32_t i = 0; i < 40; i++) {
        append_u32(i == 0 ? 'a' : 255 + i);
        append_u32(i == 0 ? 'a' : 255 + i);
    }
    write_file_atomic(dir.file("bomb.bin"), bomb);
    CHECK_THROWS_WITH_AS(Tokenizer::load(dir.file("bomb.bin")), doctest::Contains("merge 16 makes a token of 131072 bytes"),
                         std::runtime_error);
    // tokens of 64 KiB each, allowed one by one: 4096 of them pass the 256 MiB that all tokens may take
    std::string wide = bytes.substr(0, 8);
    auto append_wide = [&](uint32_t v) { wide.append((const char*)&v, 4); };
    const uint32_t merges = 15 + 4100;
    append_wide(256 + merges);
    for (uint32_t i = 0; i < merges; i++) {
        const uint32_t half = i < 15 ? (i == 0 ? 'a' : 255 + i) : 255 + 15;  // a 2^i-byte token, then 32 KiB
        append_wide(half);
        append_wide(half);
    }
    write_file_atomic(dir.file("wide.bin"), wide);
    CHECK_THROWS_WITH_AS(Tokenizer::load(dir.file("wide.bin")), doctest::Contains("its tokens take over 268435456 bytes"),
                         std::runtime_error);
}

TEST_CASE("data: a run without spaces is cut into chunks of 256 bytes, the longest token") {
    // two copies of a run of 2^17 letters (a text without spaces): one chunk each would let the merges go on to a
    // token of 2^17 bytes, every merge rescanning the whole run
    const std::string run(1 << 17, 'a');
    Tokenizer tok = Tokenizer::train(run + "\n" + run, 300);
    CHECK(tok.vocab_size() == 256 + 8);
    CHECK(tok.token_bytes(256 + 7) == std::string(256, 'a'));
    CHECK(tok.encode(run) == std::vector<uint32_t>(512, 256 + 7));
    TempDir dir;
    tok.save(dir.file("tok.bin"));
    CHECK(Tokenizer::load(dir.file("tok.bin")).vocab_size() == 256 + 8);
}

TEST_CASE("data: shard write/read round trip for versions 1 and 2") {
    TempDir dir;
    std::vector<uint32_t> small = {0, 1, 255, 256, 65535, 42};
    write_shard(dir.file("v1.bin"), small, 1);
    CHECK(read_shard(dir.file("v1.bin")) == small);
    CHECK(std::filesystem::file_size(dir.file("v1.bin")) == 1024 + 2 * small.size());
    std::vector<uint32_t> large = {0, 65536, 129279, 4000000000u, 7};
    write_shard(dir.file("v2.bin"), large, 2);
    CHECK(read_shard(dir.file("v2.bin")) == large);
    CHECK(std::filesystem::file_size(dir.file("v2.bin")) == 1024 + 4 * large.size());
    write_shard(dir.file("empty.bin"), {}, 1);
    CHECK(read_shard(dir.file("empty.bin")).empty());
    CHECK_FALSE(std::filesystem::exists(dir.file("v2.bin.tmp")));
}

TEST_CASE("data: read_shard rejects bad magic, bad version, truncated, trailing bytes and missing files") {
    TempDir dir;
    write_shard(dir.file("good.bin"), {1, 2, 3, 4}, 1);
    std::string good = read_file(dir.file("good.bin"));

    std::string bad_magic = good;
    bad_magic[0] = 7;
    write_file_atomic(dir.file("magic.bin"), bad_magic);
    CHECK_THROWS_WITH_AS(read_shard(dir.file("magic.bin")), doctest::Contains("not a token shard"), std::runtime_error);

    std::string bad_version = good;
    bad_version[4] = 3;
    write_file_atomic(dir.file("version.bin"), bad_version);
    CHECK_THROWS_WITH_AS(read_shard(dir.file("version.bin")), doctest::Contains("unknown shard version 3"), std::runtime_error);

    write_file_atomic(dir.file("truncated.bin"), good.substr(0, good.size() - 1));
    CHECK_THROWS_WITH_AS(read_shard(dir.file("truncated.bin")), doctest::Contains("truncated"), std::runtime_error);
    write_file_atomic(dir.file("header.bin"), good.substr(0, 100));
    CHECK_THROWS_WITH_AS(read_shard(dir.file("header.bin")), doctest::Contains("truncated"), std::runtime_error);

    write_file_atomic(dir.file("trailing.bin"), good + "xy");
    CHECK_THROWS_WITH_AS(read_shard(dir.file("trailing.bin")), doctest::Contains("extra bytes"), std::runtime_error);

    CHECK_THROWS_WITH_AS(read_shard(dir.file("missing.bin")), doctest::Contains("missing.bin"), std::runtime_error);
    CHECK_THROWS_WITH_AS(glob_files(dir.file("nothing_*.bin")), doctest::Contains("no files match"), std::runtime_error);
}

TEST_CASE("data: version 1 shard rejects a token over 65535") {
    TempDir dir;
    CHECK_THROWS_WITH_AS(write_shard(dir.file("v1.bin"), {1, 65536}, 1), doctest::Contains("65536"), std::runtime_error);
    CHECK_FALSE(std::filesystem::exists(dir.file("v1.bin")));
}

TEST_CASE("data: loader targets are the inputs shifted by one") {
    TempDir dir;
    write_shard(dir.file("train_000000.bin"), counting_tokens(1000, 0), 1);
    const int B = 2, T = 16;
    DataLoader loader(dir.file("train_*.bin"), B, T, 0, 1);
    CHECK(loader.total_tokens() == 1000);
    CHECK(loader.batches_per_pass() == 31);
    std::vector<int32_t> inputs(B * T), targets(B * T);
    for (int step = 0; step < 40; step++) {  // 31 steps fit the shard (31*32+1 <= 1000), then it wraps
        loader.next_batch(inputs.data(), targets.data());
        int32_t first = (step % 31) * B * T;
        for (int i = 0; i < B * T; i++) {
            CHECK(inputs[i] == first + i);
            CHECK(targets[i] == first + i + 1);
        }
    }
}

TEST_CASE("data: loader rank split equals one rank with the whole batch, across shard boundaries") {
    TempDir dir;
    write_shard(dir.file("s_000000.bin"), counting_tokens(1000, 0), 1);
    write_shard(dir.file("s_000001.bin"), counting_tokens(700, 5000), 2);
    const int B = 4, T = 8, world = 2, rows_per_rank = B / world;
    DataLoader single(dir.file("s_*.bin"), B, T, 0, 1);
    DataLoader rank0(dir.file("s_*.bin"), rows_per_rank, T, 0, world);
    DataLoader rank1(dir.file("s_*.bin"), rows_per_rank, T, 1, world);
    CHECK(single.total_tokens() == 1700);
    std::vector<int32_t> x(B * T), y(B * T), x0(rows_per_rank * T), y0(rows_per_rank * T), x1(rows_per_rank * T), y1(rows_per_rank * T);
    int shards_seen = 0;
    for (int step = 0; step < 120; step++) {  // 31 + 21 steps per pass over both shards: more than two passes
        single.next_batch(x.data(), y.data());
        rank0.next_batch(x0.data(), y0.data());
        rank1.next_batch(x1.data(), y1.data());
        for (int i = 0; i < rows_per_rank * T; i++) {
            CHECK(x0[i] == x[i]);
            CHECK(y0[i] == y[i]);
            CHECK(x1[i] == x[rows_per_rank * T + i]);
            CHECK(y1[i] == y[rows_per_rank * T + i]);
        }
        shards_seen += x[0] == 5000;
        CHECK(rank0.state().shard == single.state().shard);
        CHECK(rank0.state().position == single.state().position);
    }
    CHECK(shards_seen == 2);
}

TEST_CASE("data: loader state/restore resumes identically") {
    TempDir dir;
    write_shard(dir.file("s_000000.bin"), counting_tokens(600, 0), 1);
    write_shard(dir.file("s_000001.bin"), counting_tokens(500, 1000), 1);
    const int B = 3, T = 10;
    DataLoader loader(dir.file("s_*.bin"), B, T, 1, 2);
    std::vector<int32_t> x(B * T), y(B * T);
    for (int step = 0; step < 7; step++) loader.next_batch(x.data(), y.data());
    DataLoaderState saved = loader.state();
    std::vector<std::vector<int32_t>> expected;
    for (int step = 0; step < 25; step++) {
        loader.next_batch(x.data(), y.data());
        expected.push_back(x);
        expected.push_back(y);
    }
    DataLoader resumed(dir.file("s_*.bin"), B, T, 1, 2);
    resumed.restore(saved);
    for (int step = 0; step < 25; step++) {
        resumed.next_batch(x.data(), y.data());
        CHECK(x == expected[2 * step]);
        CHECK(y == expected[2 * step + 1]);
    }
    resumed.reset();
    CHECK(resumed.state().shard == 0);
    CHECK(resumed.state().position == 0);
    DataLoaderState bad_shard{2, 0, "", 0}, bad_position{1, 500, "", 0}, negative{0, -1, "", 0};
    CHECK_THROWS_WITH_AS(resumed.restore(bad_shard), doctest::Contains("shard 2"), std::runtime_error);
    CHECK_THROWS_WITH_AS(resumed.restore(bad_position), doctest::Contains("position 500"), std::runtime_error);
    CHECK_THROWS_AS(resumed.restore(negative), std::runtime_error);
    // states without a file name (saved before the name was recorded) are not checked against the files
    resumed.restore({1, 60, "", 0});
    CHECK(resumed.state().position == 60);
}

TEST_CASE("data: loader state names the shard's file and size") {
    TempDir dir;
    write_shard(dir.file("s_000000.bin"), counting_tokens(600, 0), 1);
    write_shard(dir.file("s_000001.bin"), counting_tokens(500, 1000), 2);
    DataLoader loader(dir.file("s_*.bin"), 2, 10, 0, 1);
    CHECK(loader.state().file == "s_000000.bin");
    CHECK(loader.state().tokens == 600);
    std::vector<int32_t> x(20), y(20);
    for (int step = 0; step < 29; step++) loader.next_batch(x.data(), y.data());  // (600-1)/20 = 29 fit shard 0
    DataLoaderState s = loader.state();
    CHECK(s.shard == 1);
    CHECK(s.position == 0);
    CHECK(s.file == "s_000001.bin");
    CHECK(s.tokens == 500);
}

TEST_CASE("data: over check_at_start tokens the loader reads headers only; a shard's tokens are checked when read") {
    TempDir dir;
    write_shard(dir.file("s_000000.bin"), counting_tokens(200, 0), 1);
    std::vector<uint32_t> bad = counting_tokens(200, 300);
    bad[150] = 5000;
    write_shard(dir.file("s_000001.bin"), bad, 1);
    const int B = 2, T = 10;
    // the whole of s_000001.bin would fail the check: construction must not have read it (400 tokens > 300)
    DataLoader loader(dir.file("s_*.bin"), B, T, 0, 1, 1000, 300);
    std::vector<int32_t> x(B * T), y(B * T);
    for (int step = 0; step < 9; step++) loader.next_batch(x.data(), y.data());  // (200-1)/20 = 9 batches of shard 0
    CHECK(loader.state().shard == 1);
    CHECK_THROWS_WITH_AS(loader.next_batch(x.data(), y.data()),
                         doctest::Contains("s_000001.bin holds token 5000 but the model's vocab_size is 1000"),
                         std::runtime_error);
    CHECK_THROWS_AS(loader.next_batch(x.data(), y.data()), std::runtime_error);  // still refused, nothing read past it
    CHECK(loader.state().shard == 1);
    CHECK(loader.state().position == 0);
    CHECK_THROWS_WITH_AS(loader.restore({1, 0, "", 0}), doctest::Contains("token 5000"), std::runtime_error);
    loader.reset();  // shard 0 is fine again
    loader.next_batch(x.data(), y.data());
    CHECK(x[0] == 0);
    // the first shard is loaded at construction; vocab_size 0 checks nothing; vocab_size 5001 admits 5000
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("s_000001.bin"), B, T, 0, 1, 1000), doctest::Contains("token 5000"),
                         std::runtime_error);
    CHECK_NOTHROW(DataLoader(dir.file("s_000001.bin"), B, T, 0, 1, 0));
    CHECK_NOTHROW(DataLoader(dir.file("s_000001.bin"), B, T, 0, 1, 5001));
    CHECK(read_shard_header(dir.file("s_000001.bin")).tokens == 200);
    CHECK(read_shard_header(dir.file("s_000001.bin")).version == 1);
    // within check_at_start (the default, 2^28 tokens) every shard is checked at construction
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("s_*.bin"), B, T, 0, 1, 1000),
                         doctest::Contains("s_000001.bin holds token 5000"), std::runtime_error);
    CHECK_NOTHROW(DataLoader(dir.file("s_*.bin"), B, T, 0, 1, 1000, 399));  // 400 tokens: one over
}

TEST_CASE("data: batches_per_pass reads every shard once with no token twice, for several ranks") {
    TempDir dir;
    write_shard(dir.file("a_000000.bin"), counting_tokens(1000, 0), 1);
    write_shard(dir.file("b_000000.bin"), counting_tokens(1000, 0), 1);
    write_shard(dir.file("b_000001.bin"), counting_tokens(700, 10000), 2);
    write_shard(dir.file("b_000002.bin"), counting_tokens(97, 20000), 1);  // exactly 2 steps of 48, plus 1
    const int B = 2, T = 8, world = 3;  // 48 tokens a step
    for (const char* pattern : {"a_*.bin", "b_*.bin"}) {
        std::vector<DataLoader> ranks;
        for (int r = 0; r < world; r++) ranks.emplace_back(dir.file(pattern), B, T, r, world);
        const int64_t batches = ranks[0].batches_per_pass();
        CHECK(batches == (pattern[0] == 'a' ? 999 / 48 : 999 / 48 + 699 / 48 + 96 / 48));
        std::vector<int32_t> x(B * T), y(B * T);
        std::vector<int> seen(21000, 0);  // each token as an input, over all ranks
        for (int64_t i = 0; i < batches; i++) {
            for (DataLoader& loader : ranks) {
                loader.next_batch(x.data(), y.data());
                for (int32_t t : x) seen[t]++;
            }
        }
        int64_t inputs = 0;
        for (int n : seen) {
            CHECK(n <= 1);
            inputs += n;
        }
        CHECK(inputs == batches * B * T * world);
        CHECK(ranks[0].state().shard == 0);  // the pass ends exactly at the wrap
        CHECK(ranks[0].state().position == 0);
    }
}

TEST_CASE("data: restore with a larger global batch near a shard's end moves to the next shard") {
    TempDir dir;
    write_shard(dir.file("s_000000.bin"), counting_tokens(1000, 0), 1);
    write_shard(dir.file("s_000001.bin"), counting_tokens(500, 5000), 1);
    DataLoader small(dir.file("s_*.bin"), 2, 10, 0, 1);  // 20 tokens a step: positions 0, 20, ..., 960 in shard 0
    std::vector<int32_t> x(40), y(40);
    for (int step = 0; step < 47; step++) small.next_batch(x.data(), y.data());
    DataLoaderState near_end = small.state();
    CHECK(near_end.position == 940);
    small.next_batch(x.data(), y.data());
    DataLoaderState at_end = small.state();
    CHECK(at_end.position == 960);

    // resumed with B = 2 per rank on 2 ranks: 40 tokens a step, so 960 + 41 > 1000 has no room
    DataLoader rank1(dir.file("s_*.bin"), 2, 10, 1, 2);
    rank1.restore(near_end);  // 940 + 41 <= 1000: stays
    CHECK(rank1.state().shard == 0);
    CHECK(rank1.state().position == 940);
    rank1.next_batch(x.data(), y.data());
    CHECK(x[0] == 960);
    CHECK(rank1.state().shard == 1);
    rank1.restore(at_end);
    CHECK(rank1.state().shard == 1);
    CHECK(rank1.state().position == 0);
    CHECK(rank1.state().file == "s_000001.bin");
    rank1.next_batch(x.data(), y.data());
    CHECK(x[0] == 5020);

    // near the end of the last shard it wraps to the first
    DataLoaderState last{1, 470, "s_000001.bin", 500};
    DataLoader big(dir.file("s_*.bin"), 4, 10, 0, 1);
    big.restore(last);
    CHECK(big.state().shard == 0);
    CHECK(big.state().position == 0);
    DataLoaderState past{1, 500, "s_000001.bin", 500};
    CHECK_THROWS_WITH_AS(big.restore(past), doctest::Contains("position 500"), std::runtime_error);
}

TEST_CASE("data: restore rejects a state whose shard is now a different file or size") {
    TempDir dir;
    write_shard(dir.file("train_000000.bin"), counting_tokens(600, 0), 1);
    write_shard(dir.file("train_000001.bin"), counting_tokens(500, 1000), 1);
    write_shard(dir.file("train_000002.bin"), counting_tokens(400, 2000), 1);
    DataLoader loader(dir.file("train_*.bin"), 2, 10, 0, 1);
    std::vector<int32_t> x(20), y(20);
    for (int step = 0; step < 31; step++) loader.next_batch(x.data(), y.data());  // 29 in shard 0, 2 in shard 1
    DataLoaderState saved = loader.state();
    CHECK(saved.shard == 1);
    CHECK(saved.position == 40);
    CHECK_NOTHROW(DataLoader(dir.file("train_*.bin"), 2, 10, 0, 1).restore(saved));

    std::filesystem::remove(dir.file("train_000000.bin"));
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("train_*.bin"), 2, 10, 0, 1).restore(saved),
                         doctest::Contains("the data changed since the checkpoint: shard 1 was train_000001.bin (500 "
                                           "tokens), now train_000002.bin (400 tokens)"),
                         std::runtime_error);
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("train_*.bin"), 2, 10, 0, 1).restore({2, 0, "train_000002.bin", 400}),
                         doctest::Contains("now there are 2 shards"), std::runtime_error);
    write_shard(dir.file("train_000000.bin"), counting_tokens(600, 0), 1);
    write_shard(dir.file("train_000001.bin"), counting_tokens(520, 1000), 1);
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("train_*.bin"), 2, 10, 0, 1).restore(saved),
                         doctest::Contains("shard 1 was train_000001.bin (500 tokens), now train_000001.bin (520 tokens)"),
                         std::runtime_error);
}

TEST_CASE("data: loader constructor rejects missing and too-small shards") {
    TempDir dir;
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("none_*.bin"), 2, 8, 0, 1), doctest::Contains("no files match"), std::runtime_error);
    write_shard(dir.file("s_000000.bin"), counting_tokens(100, 0), 1);
    write_shard(dir.file("s_000001.bin"), counting_tokens(32, 0), 1);  // needs 2*8*2+1 = 33
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("s_*.bin"), 2, 8, 0, 2), doctest::Contains("s_000001.bin"), std::runtime_error);
    CHECK_NOTHROW(DataLoader(dir.file("s_*.bin"), 2, 8, 0, 1));  // 2*8+1 = 17 fits both
    CHECK_THROWS_AS(DataLoader(dir.file("s_*.bin"), 2, 8, 2, 2), std::runtime_error);  // rank outside the world
    // a truncated or foreign shard is still rejected at construction, from its header and file size
    std::string good = read_file(dir.file("s_000000.bin"));
    write_file_atomic(dir.file("t_000000.bin"), good.substr(0, good.size() - 2));
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("t_*.bin"), 2, 8, 0, 1), doctest::Contains("t_000000.bin: truncated"), std::runtime_error);
    write_file_atomic(dir.file("u_000000.bin"), good + "xy");
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("u_*.bin"), 2, 8, 0, 1), doctest::Contains("2 extra bytes"), std::runtime_error);
    write_file_atomic(dir.file("v_000000.bin"), std::string(2000, 'x'));
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("v_*.bin"), 2, 8, 0, 1), doctest::Contains("not a token shard"), std::runtime_error);
    write_file_atomic(dir.file("w_000000.bin"), good.substr(0, 100));
    CHECK_THROWS_WITH_AS(DataLoader(dir.file("w_*.bin"), 2, 8, 0, 1), doctest::Contains("truncated header (100 bytes"), std::runtime_error);
}

TEST_CASE("data: unigram entropy is -sum p ln p over the token frequencies") {
    CHECK(unigram_entropy_nats({7, 1, 3, 9, 9, 3, 1, 7}) == doctest::Approx(std::log(4.0)).epsilon(1e-12));
    CHECK(unigram_entropy_nats({5, 5, 5}) == doctest::Approx(0.0));
    // not uniform: p = 3/4, 1/4 (log of the number of distinct tokens would give ln 2 = 0.693)
    CHECK(unigram_entropy_nats({2, 2, 8, 2}) == doctest::Approx(-(0.75 * std::log(0.75) + 0.25 * std::log(0.25))).epsilon(1e-12));
}
