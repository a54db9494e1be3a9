// write_seeds DIR: the fuzz targets' starting inputs, DIR/TARGET/NAME (fuzz_targets.h).
#include <cstdio>
#include <stdexcept>

#include "fuzz/fuzz_targets.h"
#include "model/config.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: write_seeds DIR\n");
        return 2;
    }
    config_notes(false);
    try {
        write_fuzz_seeds(argv[1]);
    } catch (const std::exception& e) {
        fprintf(stderr, "write_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
