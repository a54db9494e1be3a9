// Fuzz targets: the readers of every file moe.cu takes from a user, each fed one input from memory. A target catches
// the readers' one-line errors (std::runtime_error): anything else, a crash, a hang or a sanitizer report is a bug.
// Run by libFuzzer (make fuzz, fuzz/README.md) and, on their seeds and the saved inputs in fuzz/corpus/, by make test.
// Callers turn the config's notes off (config_notes(false)): a fuzzed config would print some on every input.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

struct FuzzTarget {
    const char* name;
    void (*run)(const uint8_t* data, size_t size);
};

// config: a JSON config (moe.cu's or Hugging Face's); safetensors: any safetensors file; checkpoint: a training
// checkpoint, verified then loaded; shard: a token shard, through the data loader; tokenizer: a tokenizer file.
extern const FuzzTarget FUZZ_TARGETS[5];
const FuzzTarget* find_fuzz_target(const std::string& name);  // nullptr when there is none of that name

// Valid inputs for every target, written as DIR/TARGET/NAME by moe.cu's own writers: libFuzzer's starting points.
void write_fuzz_seeds(const std::string& dir);
