// The safetensors reader and writer (io/safetensors.h): round trips of every dtype and of metadata, header
// parsing, 64-bit offsets and sizes (a sparse file of more than 8 GiB that costs a few KB of disk), and a clear
// one-line error for every malformed header.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "io/safetensors.h"
#include "test/test_helpers.h"

namespace {

std::string temp_dir() {
    char pattern[] = "/tmp/moe_st_XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    return pattern;
}

void remove_dir(const std::string& dir) { REQUIRE(system(("rm -rf '" + dir + "'").c_str()) == 0); }

// A file of: the 8-byte length (the header's own unless given), the header text, then data_bytes zero bytes.
void write_raw(const std::string& path, const std::string& header, uint64_t data_bytes, int64_t length = -1) {
    std::ofstream f(path, std::ios::binary);
    const uint64_t len = length < 0 ? header.size() : (uint64_t)length;
    f.write((const char*)&len, 8);
    f << header << std::string(data_bytes, '\0');
    REQUIRE(f.good());
}

// The message of opening PATH, "" when it opens.
std::string open_error(const std::string& path) {
    try {
        SafetensorsReader r(path);
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("safetensors: every dtype, scalar and empty tensors and metadata round trip") {
    std::string dir = temp_dir();
    const std::string path = dir + "/all.safetensors";
    std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-30f};
    std::vector<double> f64 = {3.141592653589793, -1e300};
    std::vector<int32_t> i32 = {1, -2, 2147483647};
    std::vector<int64_t> i64 = {-9223372036854775807LL, 42};
    std::vector<uint16_t> bf16 = {0x3F80, 0xBF81, 0x7F80, 0x0001};
    double scalar = 2.5;
    safetensors_write(path,
                      {{"f32", DType::F32, {2, 3}, f32.data()}, {"f64", DType::F64, {2}, f64.data()},
                       {"i32", DType::I32, {3, 1}, i32.data()}, {"i64", DType::I64, {1, 2}, i64.data()},
                       {"bf16", DType::BF16, {2, 2}, bf16.data()}, {"scalar", DType::F64, {}, &scalar},
                       {"empty", DType::F32, {0, 3}, nullptr}},
                      {{"format", "pt"}, {"note", "h\xc3\xa9llo \"quoted\"\n"}, {"empty", ""}});
    SafetensorsReader r(path);
    REQUIRE(r.tensors().size() == 7);
    std::vector<float> f32b(6);
    std::vector<double> f64b(2);
    std::vector<int32_t> i32b(3);
    std::vector<int64_t> i64b(2);
    std::vector<uint16_t> bf16b(4);
    double scalarb = 0;
    r.read("f32", DType::F32, {2, 3}, f32b.data());
    r.read("f64", DType::F64, {2}, f64b.data());
    r.read("i32", DType::I32, {3, 1}, i32b.data());
    r.read("i64", DType::I64, {1, 2}, i64b.data());
    r.read("bf16", DType::BF16, {2, 2}, bf16b.data());
    r.read("scalar", DType::F64, {}, &scalarb);
    r.read("empty", DType::F32, {0, 3}, nullptr);
    CHECK(memcmp(f32b.data(), f32.data(), 24) == 0);
    CHECK(f64b == f64);
    CHECK(i32b == i32);
    CHECK(i64b == i64);
    CHECK(bf16b == bf16);
    CHECK(scalarb == scalar);
    CHECK(r.info("scalar").shape.empty());
    CHECK(r.info("scalar").numel() == 1);
    CHECK(r.info("empty").numel() == 0);
    CHECK(r.info("bf16").dtype == DType::BF16);
    CHECK(r.info("bf16").end - r.info("bf16").begin == 8);
    // written in order, back to back, the data section 8-byte aligned
    CHECK(r.info("f32").begin == 0);
    CHECK(r.info("f64").begin == r.info("f32").end);
    CHECK(r.info("empty").begin == r.info("scalar").end);
    uint64_t len = 0;
    std::ifstream(path, std::ios::binary).read((char*)&len, 8);
    CHECK((8 + len) % 8 == 0);
    struct stat st;
    REQUIRE(stat(path.c_str(), &st) == 0);
    CHECK((uint64_t)st.st_size == 8 + len + r.info("empty").end);
    // metadata
    CHECK(r.metadata().size() == 3);
    CHECK(r.metadata_value("note") == "h\xc3\xa9llo \"quoted\"\n");
    CHECK(r.metadata_value("empty") == "");
    CHECK_THROWS_WITH_AS(r.metadata_value("absent"), doctest::Contains("metadata 'absent' is missing"), std::runtime_error);
    // reads check dtype and shape
    CHECK_THROWS_WITH_AS(r.read("f32", DType::BF16, {2, 3}, f32b.data()), doctest::Contains("is F32, expected BF16"),
                         std::runtime_error);
    CHECK_THROWS_WITH_AS(r.read("i32", DType::I32, {3}, i32b.data()), doctest::Contains("has shape [3, 1]"),
                         std::runtime_error);
    // no metadata at all
    safetensors_write(dir + "/plain.safetensors", {{"x", DType::I32, {1}, i32.data()}}, {});
    CHECK(SafetensorsReader(dir + "/plain.safetensors").metadata().empty());
    remove_dir(dir);
}

TEST_CASE("safetensors: F32 data written as BF16 is rounded to nearest even, chunk by chunk") {
    std::string dir = temp_dir();
    const std::string path = dir + "/conv.safetensors";
    // more values than one 2^19-value scratch chunk: scattered bit patterns, then ties and special values
    std::vector<float> src((1 << 19) + 70000);
    for (size_t i = 0; i < src.size(); i++) {
        const uint32_t u = 0x3f800000u + (uint32_t)i * 0x9e37u;
        memcpy(&src[i], &u, 4);
    }
    const float specials[] = {0.0f, -0.0f, 1.0f, 1.00390625f /* a tie: stays 1 */, 1.01171875f /* a tie: rounds up */,
                              3.4028235e38f, INFINITY, -INFINITY, NAN, 1e-40f};
    std::copy(std::begin(specials), std::end(specials), src.end() - 10);
    const float one = 1.5f;
    safetensors_write(path, {{"w", DType::BF16, {(int64_t)src.size()}, src.data(), DType::F32},
                             {"kept", DType::F32, {1}, &one, DType::F32}}, {});
    SafetensorsReader r(path);
    std::vector<uint16_t> got(src.size());
    r.read("w", DType::BF16, {(int64_t)src.size()}, got.data());
    size_t wrong = 0, compared = 0;
    for (size_t i = 0; i < src.size() - 10; i++) {  // against the definition: the finite values below BF16's overflow
        uint32_t u;
        memcpy(&u, &src[i], 4);
        if ((u & 0x7fffffffu) >= 0x7f7f8000u) continue;
        const float want = bf16_reference(src[i]);
        uint32_t want_bits;
        memcpy(&want_bits, &want, 4);
        wrong += got[i] != (uint16_t)(want_bits >> 16);
        compared++;
    }
    CHECK(wrong == 0);
    CHECK(compared > src.size() / 2);
    const size_t s = src.size() - 10;
    CHECK(got[s + 2] == 0x3f80);
    CHECK(got[s + 3] == 0x3f80);
    CHECK(got[s + 4] == 0x3f82);
    CHECK(got[s + 5] == 0x7f80);  // the largest float rounds to infinity
    CHECK(std::isnan(f32_from_bf16(got[s + 8])));
    CHECK(f32_from_bf16(0x3fc0) == 1.5f);
    float kept = 0;
    r.read("kept", DType::F32, {1}, &kept);
    CHECK(kept == 1.5f);
    // only F32 -> BF16 converts; nothing is written otherwise
    const double d = 1.0;
    CHECK_THROWS_WITH_AS(safetensors_write(dir + "/bad.safetensors", {{"d", DType::BF16, {1}, &d, DType::F64}}, {}),
                         doctest::Contains("tensor 'd': cannot write F64 data as BF16"), std::runtime_error);
    struct stat st;
    CHECK(stat((dir + "/bad.safetensors").c_str(), &st) != 0);
    CHECK(stat((dir + "/bad.safetensors.tmp").c_str(), &st) != 0);
    remove_dir(dir);
}

TEST_CASE("safetensors: a hand-written header parses: spacing, key order, padding") {
    std::string dir = temp_dir();
    const std::string path = dir + "/h.safetensors";
    const std::string header =
        "{ \"b\" : {\"data_offsets\": [8, 16], \"shape\": [2], \"dtype\": \"F32\"},\n"
        "  \"__metadata__\": {\"k\": \"v\"},\n  \"a\": {\"dtype\": \"I64\", \"shape\": [], \"data_offsets\": [0, 8]} }   ";
    write_raw(path, header, 16);
    // the data: a = 7 at 0, b = {0.5, -4} at 8
    int fd = open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    const int64_t a = 7;
    const float b[2] = {0.5f, -4.0f};
    REQUIRE(pwrite(fd, &a, 8, 8 + header.size()) == 8);
    REQUIRE(pwrite(fd, b, 8, 8 + header.size() + 8) == 8);
    REQUIRE(close(fd) == 0);
    SafetensorsReader r(path);
    CHECK(r.tensors().size() == 2);
    CHECK(r.metadata_value("k") == "v");
    CHECK(r.info("b").begin == 8);
    CHECK(r.info("b").end == 16);
    CHECK(r.info("b").shape == std::vector<int64_t>{2});
    int64_t a2 = 0;
    float b2[2] = {0, 0};
    r.read("a", DType::I64, {}, &a2);
    r.read("b", DType::F32, {2}, b2);
    CHECK(a2 == 7);
    CHECK(b2[0] == 0.5f);
    CHECK(b2[1] == -4.0f);
    remove_dir(dir);
}

TEST_CASE("safetensors: offsets and sizes beyond 4 GiB (a sparse file)") {
    std::string dir = temp_dir();
    const std::string path = dir + "/big.safetensors";
    // "huge": 2^32 + 2 BF16 values, 8 GiB + 4 bytes, then "probe" right after it
    const uint64_t huge_n = (1ull << 32) + 2, huge_bytes = 2 * huge_n;
    const std::string header = "{\"huge\": {\"dtype\": \"BF16\", \"shape\": [" + std::to_string(huge_n) +
                               "], \"data_offsets\": [0, " + std::to_string(huge_bytes) +
                               "]}, \"probe\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [" +
                               std::to_string(huge_bytes) + ", " + std::to_string(huge_bytes + 24) + "]}}";
    write_raw(path, header, 0);
    const float pattern[6] = {1.0f, -2.0f, 3.5f, 1e-7f, 6e20f, -0.0f};
    int fd = open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    const off_t data_start = 8 + header.size();
    REQUIRE(ftruncate(fd, data_start + huge_bytes + 24) == 0);  // holes: no blocks allocated
    REQUIRE(pwrite(fd, pattern, 24, data_start + huge_bytes) == 24);
    REQUIRE(close(fd) == 0);
    struct stat st;
    REQUIRE(stat(path.c_str(), &st) == 0);
    CHECK((uint64_t)st.st_size > (8ull << 30));
    CHECK(st.st_blocks * 512 < (1 << 20));  // really sparse

    SafetensorsReader r(path);
    const TensorInfo& h = r.info("huge");
    CHECK(h.shape == std::vector<int64_t>{(int64_t)huge_n});
    CHECK(h.numel() == (int64_t)huge_n);
    CHECK(h.begin == 0);
    CHECK(h.end == huge_bytes);
    CHECK(r.info("probe").begin == huge_bytes);
    float got[6] = {0, 0, 0, 0, 0, 0};
    r.read("probe", DType::F32, {2, 3}, got);  // 32-bit offsets would read zeros from the hole at offset 4
    CHECK(memcmp(got, pattern, 24) == 0);
    remove_dir(dir);
}

TEST_CASE("safetensors: every malformed header is rejected with a clear one-line message") {
    std::string dir = temp_dir();
    const std::string p = dir + "/bad.safetensors";
    const std::string f32_4 = "\"dtype\": \"F32\", \"shape\": [4]";
    struct Case {
        const char* what;
        std::string header;
        uint64_t data;
        int64_t length;  // -1: the header's own length
        const char* message;
    };
    const Case cases[] = {
        {"length beyond the file", "{}", 0, 1000, "header length 1000 does not fit the file"},
        {"length 0", "", 16, -1, "malformed header JSON"},
        {"not JSON", "{\"a\": {", 0, -1, "malformed header JSON"},
        {"an array", "[1, 2]", 0, -1, "header is not a JSON object"},
        {"a string", "\"x\"", 0, -1, "header is not a JSON object"},
        {"entry not an object", "{\"a\": 5}", 0, -1, "tensor 'a' lacks dtype, shape or data_offsets"},
        {"no dtype", "{\"a\": {\"shape\": [4], \"data_offsets\": [0, 16]}}", 16, -1, "tensor 'a' lacks dtype"},
        {"no shape", "{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 16]}}", 16, -1, "tensor 'a' lacks dtype, shape"},
        {"no data_offsets", "{\"a\": {" + f32_4 + "}}", 16, -1, "tensor 'a' lacks dtype, shape or data_offsets"},
        {"three data_offsets", "{\"a\": {" + f32_4 + ", \"data_offsets\": [0, 8, 16]}}", 16, -1, "lacks dtype"},
        {"dtype not a string", "{\"a\": {\"dtype\": 4, \"shape\": [4], \"data_offsets\": [0, 16]}}", 16, -1, "lacks dtype"},
        {"unknown dtype", "{\"a\": {\"dtype\": \"F8_E4M3\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4, -1,
         "tensor 'a' has unsupported dtype \"F8_E4M3\""},
        {"negative shape", "{\"a\": {\"dtype\": \"F32\", \"shape\": [-4], \"data_offsets\": [0, 16]}}", 16, -1,
         "tensor 'a' has a bad shape [-4]"},
        {"fractional shape", "{\"a\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 10]}}", 16, -1,
         "tensor 'a' has a bad shape [2.5]"},
        {"string shape", "{\"a\": {\"dtype\": \"F32\", \"shape\": [\"4\"], \"data_offsets\": [0, 16]}}", 16, -1,
         "has a bad shape"},
        {"shape beyond int64", "{\"a\": {\"dtype\": \"F32\", \"shape\": [0, 18446744073709551615], \"data_offsets\": [0, 0]}}",
         0, -1, "has a bad shape"},
        {"impossibly large", "{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 8], \"data_offsets\": [0, 0]}}",
         0, -1, "impossibly large"},
        {"size != end - begin", "{\"a\": {" + f32_4 + ", \"data_offsets\": [0, 12]}}", 16, -1,
         "tensor 'a' shape [4] does not match its 12 bytes"},
        {"begin > end", "{\"a\": {" + f32_4 + ", \"data_offsets\": [16, 0]}}", 16, -1, "begin > end"},
        {"negative offset", "{\"a\": {" + f32_4 + ", \"data_offsets\": [-16, 0]}}", 16, -1, "tensor 'a' has bad data_offsets"},
        {"end beyond the file", "{\"a\": {" + f32_4 + ", \"data_offsets\": [16, 32]}}", 16, -1,
         "tensor 'a' has data_offsets outside the file"},
        {"overlapping", "{\"a\": {" + f32_4 + ", \"data_offsets\": [0, 16]}, \"b\": {" + f32_4 +
         ", \"data_offsets\": [8, 24]}}", 24, -1, "overlapping data_offsets"},
        {"a hole between tensors", "{\"a\": {" + f32_4 + ", \"data_offsets\": [0, 16]}, \"b\": {" + f32_4 +
         ", \"data_offsets\": [20, 36]}}", 36, -1,
         "bytes 16..20 of the data belong to no tensor (a hole before tensor 'b')"},
        {"data not from byte 0", "{\"a\": {" + f32_4 + ", \"data_offsets\": [4, 20]}}", 20, -1,
         "bytes 0..4 of the data belong to no tensor"},
        {"bytes after the data", "{\"a\": {" + f32_4 + ", \"data_offsets\": [0, 16]}}", 7016, -1,
         "7000 bytes after the last tensor's data"},
        {"a name twice", "{\"a\": {" + f32_4 + ", \"data_offsets\": [0, 16]}, \"a\": {" + f32_4 +
         ", \"data_offsets\": [16, 32]}}", 32, -1, "the header names 'a' twice"},
        {"metadata value not a string", "{\"__metadata__\": {\"step\": 5}}", 0, -1,
         "__metadata__ value of 'step' is not a string"},
        {"metadata not an object", "{\"__metadata__\": [\"a\"]}", 0, -1, "__metadata__ is not an object"},
        {"truncated data", "{\"a\": {" + f32_4 + ", \"data_offsets\": [0, 16]}, \"b\": {" + f32_4 +
         ", \"data_offsets\": [16, 32]}}", 20, -1, "tensor 'b' has data_offsets outside the file"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.what);
        write_raw(p, c.header, c.data, c.length);
        const std::string msg = open_error(p);
        CAPTURE(msg);
        CHECK(msg.find(c.message) != std::string::npos);
        CHECK(msg.rfind(p + ": ", 0) == 0);  // names the file first
        CHECK(msg.find('\n') == std::string::npos);
    }
    // shorter than the length field, and a missing file
    std::ofstream(p, std::ios::binary) << "abc";
    CHECK(open_error(p).find("shorter than 8 bytes") != std::string::npos);
    CHECK(open_error(dir + "/none.safetensors") == dir + "/none.safetensors: cannot open");
    // the valid variant of the last case opens
    write_raw(p, cases[sizeof(cases) / sizeof(cases[0]) - 1].header, 32);
    CHECK(open_error(p) == "");
    remove_dir(dir);
}
