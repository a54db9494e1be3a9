// libFuzzer's entry points (clang -fsanitize=fuzzer): the target named by FUZZ_TARGET gets every input.
#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_targets.h"
#include "model/config.h"

static const FuzzTarget* target = nullptr;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const char* name = getenv("FUZZ_TARGET");
    target = name ? find_fuzz_target(name) : nullptr;
    if (!target) {
        fprintf(stderr, "fuzz: set FUZZ_TARGET to config, safetensors, checkpoint, shard or tokenizer\n");
        exit(2);
    }
    config_notes(false);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    target->run(data, size);
    return 0;
}
