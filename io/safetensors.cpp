// safetensors reader and writer. The reader holds a file to the format's rules, as the official package does: a
// header of at most 100 MiB naming each tensor once, whose data_offsets cover the data section exactly (no hole, no
// overlap, nothing after the last tensor). Every refusal is one line naming the file.
#include "io/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <tuple>

using nlohmann::json;

const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "F32";
        case DType::F64: return "F64";
        case DType::I32: return "I32";
        case DType::I64: return "I64";
        case DType::BF16: return "BF16";
    }
    return "?";
}

size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32: case DType::I32: return 4;
        case DType::F64: case DType::I64: return 8;
        case DType::BF16: return 2;
    }
    return 0;
}

static bool parse_dtype(const std::string& s, DType* out) {
    for (DType t : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16})
        if (s == dtype_name(t)) { *out = t; return true; }
    return false;
}

int64_t TensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

static uint64_t tensor_bytes(const TensorView& t) {
    uint64_t bytes = dtype_size(t.dtype);
    for (int64_t s : t.shape) bytes *= (uint64_t)s;
    return bytes;
}

std::vector<uint64_t> safetensors_offsets(const std::vector<TensorView>& tensors) {
    std::vector<uint64_t> offsets(1, 0);
    for (const TensorView& t : tensors) offsets.push_back(offsets.back() + tensor_bytes(t));
    return offsets;
}

std::string safetensors_header(const std::vector<TensorView>& tensors,
                               const std::map<std::string, std::string>& metadata) {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    const std::vector<uint64_t> offsets = safetensors_offsets(tensors);
    for (size_t i = 0; i < tensors.size(); i++)
        header[tensors[i].name] = {{"dtype", dtype_name(tensors[i].dtype)},
                                   {"shape", tensors[i].shape},
                                   {"data_offsets", {offsets[i], offsets[i + 1]}}};
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
    const uint64_t len = text.size();
    return std::string((const char*)&len, 8) + text;
}

void safetensors_write(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    std::vector<uint64_t> sizes;  // in the file
    for (const TensorView& t : tensors) {
        if (t.source != t.dtype && !(t.source == DType::F32 && t.dtype == DType::BF16))
            throw std::runtime_error(path + ": tensor '" + t.name + "': cannot write " + dtype_name(t.source) +
                                     " data as " + dtype_name(t.dtype));
        sizes.push_back(tensor_bytes(t));
    }
    const std::string header = safetensors_header(tensors, metadata);
    write_file_atomic(path, [&](FILE* f) {
        if (fwrite(header.data(), 1, header.size(), f) != header.size()) return false;
        std::vector<uint16_t> chunk;  // the scratch of F32 -> BF16
        for (size_t i = 0; i < tensors.size(); i++) {
            const TensorView& t = tensors[i];
            if (t.source == t.dtype) {
                if (sizes[i] > 0 && fwrite(t.data, 1, sizes[i], f) != sizes[i]) return false;
                continue;
            }
            const float* src = (const float*)t.data;
            const uint64_t numel = sizes[i] / 2;
            chunk.resize(std::min<uint64_t>(numel, 1 << 19));
            for (uint64_t done = 0; done < numel; done += chunk.size()) {
                const uint64_t n = std::min<uint64_t>(numel - done, chunk.size());
                for (uint64_t k = 0; k < n; k++) chunk[k] = bf16_from_f32(src[done + k]);
                if (fwrite(chunk.data(), 2, n, f) != n) return false;
            }
        }
        return true;
    });
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
    file_ = fopen(path.c_str(), "rb");
    if (!file_) throw std::runtime_error(path + ": cannot open");
    auto fail = [&](const std::string& why) {
        fclose(file_);
        file_ = nullptr;
        throw std::runtime_error(path + ": " + why);
    };
    const off_t end = fseeko(file_, 0, SEEK_END) == 0 ? ftello(file_) : -1;
    if (end < 0 || fseeko(file_, 0, SEEK_SET) != 0) fail("cannot seek (not a regular file?)");
    const uint64_t file_size = (uint64_t)end;
    uint64_t header_len = 0;
    if (fread(&header_len, 8, 1, file_) != 1) fail("not a safetensors file (shorter than 8 bytes)");
    if (header_len > file_size - 8 || header_len > (100u << 20))
        fail("not a safetensors file (header length " + std::to_string(header_len) + " does not fit the file)");
    std::string text(header_len, '\0');
    if (fread(&text[0], 1, header_len, file_) != header_len) fail("truncated header");
    data_start_ = 8 + header_len;
    const uint64_t data_size = file_size - data_start_;
    json header;
    std::set<std::string> names;
    std::string twice;  // a name the header gives twice (the parser would keep the last one silently)
    try {
        header = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
            if (event == json::parse_event_t::key && depth == 1 && !names.insert(parsed.get<std::string>()).second &&
                twice.empty())
                twice = parsed.get<std::string>();
            return true;
        });
    } catch (const json::exception& e) {
        fail(std::string("malformed header JSON (") + e.what() + ")");
    }
    if (!header.is_object()) fail("header is not a JSON object");
    if (!twice.empty()) fail("the header names '" + twice + "' twice");
    std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& name = it.key();
        const json& v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object()) fail("__metadata__ is not an object");
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string()) fail("__metadata__ value of '" + m.key() + "' is not a string");
                metadata_[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        TensorInfo info;
        if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
            !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
            v["data_offsets"].size() != 2)
            fail("tensor '" + name + "' lacks dtype, shape or data_offsets");
        if (!parse_dtype(v["dtype"].get<std::string>(), &info.dtype))
            fail("tensor '" + name + "' has unsupported dtype " + v["dtype"].dump());
        uint64_t bytes = dtype_size(info.dtype);
        for (const json& s : v["shape"]) {
            if (!s.is_number_unsigned()) fail("tensor '" + name + "' has a bad shape " + v["shape"].dump());
            uint64_t dim = s.get<uint64_t>();
            if (dim > (uint64_t)INT64_MAX) fail("tensor '" + name + "' has a bad shape " + v["shape"].dump());
            if (dim != 0 && bytes > UINT64_MAX / dim) fail("tensor '" + name + "' is impossibly large");
            bytes *= dim;
            info.shape.push_back((int64_t)dim);
        }
        for (const json& o : v["data_offsets"])
            if (!o.is_number_unsigned()) fail("tensor '" + name + "' has bad data_offsets");
        info.begin = v["data_offsets"][0].get<uint64_t>();
        info.end = v["data_offsets"][1].get<uint64_t>();
        if (info.end < info.begin) fail("tensor '" + name + "' has data_offsets with begin > end");
        if (info.end > data_size)
            fail("tensor '" + name + "' has data_offsets outside the file");
        if (info.end - info.begin != bytes)
            fail("tensor '" + name + "' shape " + shape_string(info.shape) + " does not match its " +
                 std::to_string(info.end - info.begin) + " bytes");
        ranges.push_back({info.begin, info.end, name});
        tensors_[name] = info;
    }
    // As the format requires: the tensors' bytes cover the data section exactly, one after another.
    std::sort(ranges.begin(), ranges.end());
    uint64_t covered = 0;
    for (const auto& [begin, end, name] : ranges) {
        if (begin < covered) fail("tensors have overlapping data_offsets (tensor '" + name + "')");
        if (begin > covered)
            fail("bytes " + std::to_string(covered) + ".." + std::to_string(begin) +
                 " of the data belong to no tensor (a hole before tensor '" + name + "')");
        covered = end;
    }
    if (covered != data_size)
        fail(std::to_string(data_size - covered) + " bytes after the last tensor's data (the data section must end "
             "where the header says)");
}

SafetensorsReader::~SafetensorsReader() {
    if (file_) fclose(file_);
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw std::runtime_error(path_ + ": tensor '" + name + "' is missing");
    return it->second;
}

void SafetensorsReader::read(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                             void* out) const {
    read_range(name, dtype, shape, 0, info(name).numel(), out);  // a shape other than the file's is refused there
}

void SafetensorsReader::read_range(const std::string& name, DType dtype, const std::vector<int64_t>& full_shape,
                                   int64_t first, int64_t count, void* out) const {
    const TensorInfo& t = info(name);
    if (t.dtype != dtype)
        throw std::runtime_error(path_ + ": tensor '" + name + "' is " + dtype_name(t.dtype) + ", expected " +
                                 dtype_name(dtype));
    if (t.shape != full_shape)
        throw std::runtime_error(path_ + ": tensor '" + name + "' has shape " + shape_string(t.shape) +
                                 ", expected " + shape_string(full_shape));
    if (first < 0 || count < 0 || first + count > t.numel())
        throw std::runtime_error(path_ + ": tensor '" + name + "': values [" + std::to_string(first) + ", " +
                                 std::to_string(first + count) + ") are outside its " + std::to_string(t.numel()));
    const uint64_t bytes = dtype_size(dtype) * count;
    if (fseeko(file_, (off_t)(data_start_ + t.begin + dtype_size(dtype) * first), SEEK_SET) != 0 ||
        (bytes > 0 && fread(out, 1, bytes, file_) != bytes))
        throw std::runtime_error(path_ + ": reading tensor '" + name + "' failed");
}

std::string SafetensorsReader::metadata_value(const std::string& key) const {
    auto it = metadata_.find(key);
    if (it == metadata_.end()) throw std::runtime_error(path_ + ": metadata '" + key + "' is missing");
    return it->second;
}
