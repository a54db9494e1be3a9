// safetensors files, read and written here: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the data.
// Used for checkpoints (weights, AdamW moments, metadata), for Hugging Face export/import, and for the tensors
// exchanged with the PyTorch twin. Writing streams tensor by tensor through write_file_atomic (files.h).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/files.h"
#include "model/bf16.h"

enum class DType { F32, F64, I32, I64, BF16 };

struct TensorView {  // a tensor to write: its bytes live elsewhere
    std::string name;
    DType dtype;  // in the file
    std::vector<int64_t> shape;
    const void* data;
    DType source = dtype;  // of the bytes at data: the same, or F32 for a BF16 tensor (converted by bf16_from_f32)
};

struct TensorInfo {  // a tensor found in a file
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets relative to the start of the data section
    int64_t numel() const;
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // as in the header: "F32", "BF16", ...
std::string shape_string(const std::vector<int64_t>& shape);  // as the messages write it: [a, b, ...]

// Where each of `tensors` starts in the data section when they are laid out back to back in their order (the first
// at 0), then where the last ends: tensors.size() + 1 byte offsets.
std::vector<uint64_t> safetensors_offsets(const std::vector<TensorView>& tensors);
// The file's first bytes: the 8-byte length and the JSON header of `tensors` at safetensors_offsets, padded to a
// multiple of 8 bytes. Their data is not read.
std::string safetensors_header(const std::vector<TensorView>& tensors,
                               const std::map<std::string, std::string>& metadata);
// Throws std::runtime_error on any I/O failure; the previous file at path survives until the rename. F32 data
// written as BF16 is converted through one scratch chunk (1 MiB), never a whole tensor.
void safetensors_write(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata);

// An open file with its parsed, validated header. Throws std::runtime_error naming the file on a bad header:
// bad length, malformed JSON, unknown dtype, shape/size mismatch, overlapping or out-of-range offsets.
class SafetensorsReader {
public:
    explicit SafetensorsReader(const std::string& path);
    ~SafetensorsReader();
    SafetensorsReader(const SafetensorsReader&) = delete;
    SafetensorsReader& operator=(const SafetensorsReader&) = delete;

    const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    bool has(const std::string& name) const { return tensors_.count(name) > 0; }
    const TensorInfo& info(const std::string& name) const;  // throws naming the missing tensor
    // Reads a tensor into out, checking dtype and shape; throws naming the tensor on a mismatch.
    void read(const std::string& name, DType dtype, const std::vector<int64_t>& shape, void* out) const;
    // Reads values [first, first + count) of a tensor of shape full_shape, in row-major order (one rank's experts,
    // or one range).
    void read_range(const std::string& name, DType dtype, const std::vector<int64_t>& full_shape, int64_t first,
                    int64_t count, void* out) const;
    std::string metadata_value(const std::string& key) const;  // throws when absent

private:
    std::string path_;
    FILE* file_ = nullptr;
    uint64_t data_start_ = 0;
    std::map<std::string, TensorInfo> tensors_;
    std::map<std::string, std::string> metadata_;
};
