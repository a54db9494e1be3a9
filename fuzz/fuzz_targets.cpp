// The fuzz targets of fuzz_targets.h. File readers get the input as a memory file (memfd, /proc/self/fd/N): no disk.
#include "fuzz/fuzz_targets.h"

#include <cstring>
#include <stdexcept>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include "comm/comm.h"
#include "data/dataloader.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/files.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"

namespace {

// The input as a file only this process sees; removed with the object.
struct MemoryFile {
    int fd = -1;
    std::string path;
    MemoryFile(const uint8_t* data, size_t size) {
        fd = memfd_create("fuzz_input", 0);
        if (fd < 0 || write(fd, data, size) != (ssize_t)size) throw std::logic_error("memfd_create or write failed");
        path = "/proc/self/fd/" + std::to_string(fd);
    }
    ~MemoryFile() { close(fd); }
};

void run_config(const uint8_t* data, size_t size) {
    const Config c = parse_config_json(std::string((const char*)data, size), "fuzz");
    build_param_table(c);
}

void run_safetensors(const uint8_t* data, size_t size) {
    MemoryFile file(data, size);
    SafetensorsReader r(file.path);
    for (const auto& [name, info] : r.tensors()) {
        std::vector<char> out(info.end - info.begin);  // within the file: the reader checked the offsets
        r.read(name, info.dtype, info.shape, out.data());
    }
}

// A checkpoint's reading order on resume: checksums, config, then the tensors into a model of that config (kept
// small: a fuzzed config may ask for any size the bounds allow).
void run_checkpoint(const uint8_t* data, size_t size) {
    MemoryFile file(data, size);
    checkpoint_verify(file.path);  // its verdict is not needed: the loaders must cope with damage too
    const Config c = checkpoint_config(file.path);
    if (build_param_table(c).total > (1 << 20)) return;
    Model m;
    model_init(m, c, &local_comm());
    AdamWState opt;
    TrainState st;
    checkpoint_load(file.path, m, opt, st);
}

void run_shard(const uint8_t* data, size_t size) {
    MemoryFile file(data, size);
    read_shard_header(file.path);
    DataLoader loader(file.path, 1, 4, 0, 1, 1000);
    std::vector<int32_t> inputs(4), targets(4);
    for (int i = 0; i < 3; i++) loader.next_batch(inputs.data(), targets.data());
}

void run_tokenizer(const uint8_t* data, size_t size) {
    MemoryFile file(data, size);
    const Tokenizer t = Tokenizer::load(file.path);
    t.decode(t.encode("moe.cu reads what it is given, 123 \xff\x01"));
}

template <void (*Run)(const uint8_t*, size_t)>
void catching(const uint8_t* data, size_t size) {
    try {
        Run(data, size);
    } catch (const std::runtime_error&) {
        // a refusal in one line: what these readers are for
    }
}

// The smallest model every part of the reader sees: MLA, shared and routed experts, groups, a dense layer, MTP
constexpr const char* MICRO_CONFIG = R"({"vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
    "moe_intermediate_size": 4, "num_hidden_layers": 2, "num_attention_heads": 1, "q_lora_rank": 4,
    "kv_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2, "n_routed_experts": 4,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 1})";

}  // namespace

const FuzzTarget FUZZ_TARGETS[5] = {
    {"config", catching<run_config>},         {"safetensors", catching<run_safetensors>},
    {"checkpoint", catching<run_checkpoint>}, {"shard", catching<run_shard>},
    {"tokenizer", catching<run_tokenizer>},
};

const FuzzTarget* find_fuzz_target(const std::string& name) {
    for (const FuzzTarget& t : FUZZ_TARGETS)
        if (name == t.name) return &t;
    return nullptr;
}

void write_fuzz_seeds(const std::string& dir) {
    for (const FuzzTarget& t : FUZZ_TARGETS) make_dirs(dir + "/" + t.name);
    const Config micro = parse_config_json(MICRO_CONFIG, "micro");
    write_file_atomic(dir + "/config/micro.json", MICRO_CONFIG);
    write_file_atomic(dir + "/config/small.json", config_to_json(load_config("small")));
    write_file_atomic(dir + "/config/hf_rope_parameters.json",
                      R"({"model_type": "deepseek_v3", "vocab_size": 16, "hidden_size": 8, "rope_parameters":
                      {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                      "original_max_position_embeddings": 64}, "rope_interleave": true})");
    Model m;
    model_init(m, micro, &local_comm());
    model_init_weights(m, 1);
    checkpoint_save(dir + "/checkpoint", m, adamw_state(m.shard), TrainState{});
    const float values[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 8.0f};
    const int64_t ints[2] = {7, -9};
    safetensors_write(dir + "/safetensors/mixed.safetensors",
                      {{"a", DType::F32, {2, 3}, values}, {"b", DType::BF16, {3}, values, DType::F32},
                       {"c", DType::I64, {2}, ints}},
                      {{"format", "pt"}});
    std::vector<uint32_t> tokens(64);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint32_t)(i * 37 % 1000);
    write_shard(dir + "/shard/v1.bin", tokens, 1);
    write_shard(dir + "/shard/v2.bin", tokens, 2);
    Tokenizer::train("the quick brown fox jumps over the lazy dog; the dog sleeps, 12 34 1234", 300)
        .save(dir + "/tokenizer/small.bin");
}
