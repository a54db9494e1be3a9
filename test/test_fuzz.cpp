// The fuzz targets (fuzz/fuzz_targets.h) as regression tests: every target takes moe.cu's own seed files, the
// inputs saved in fuzz/corpus/ and a fixed set of damaged versions of its seeds (cut short, bytes flipped), and
// refuses what is wrong with std::runtime_error, caught inside the target. Any other exception or a crash fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "fuzz/fuzz_targets.h"
#include "model/config.h"
#include "test_helpers.h"

TEST_CASE("fuzz: every reader takes its seeds, the saved inputs and 400 damaged seeds without a crash") {
    const std::string seeds = test_path("fuzz_seeds");
    config_notes(false);
    write_fuzz_seeds(seeds);
    Rng rng(3);
    for (const FuzzTarget& target : FUZZ_TARGETS) {
        std::vector<std::string> inputs;
        for (const std::string& dir : {seeds + "/" + target.name, std::string("fuzz/corpus/") + target.name})
            if (std::filesystem::is_directory(dir))
                for (const auto& entry : std::filesystem::directory_iterator(dir)) inputs.push_back(entry.path());
        REQUIRE(!inputs.empty());
        std::sort(inputs.begin(), inputs.end());
        int runs = 0;
        for (const std::string& path : inputs) {
            const std::string bytes = slurp(path);
            CAPTURE(path);
            target.run((const uint8_t*)bytes.data(), bytes.size());
            runs++;
        }
        for (int i = 0; i < 400; i++) {  // cut at a random length, or a few random bytes changed
            std::string bytes = slurp(inputs[i % inputs.size()]);
            if (i % 2 == 0) bytes.resize((size_t)(rng.uniform() * bytes.size()));
            else
                for (int k = 0; k < 1 + i % 4; k++) bytes[(size_t)(rng.uniform() * bytes.size())] ^= 1 << (i % 8);
            CAPTURE(i);
            target.run((const uint8_t*)bytes.data(), bytes.size());
            runs++;
        }
        MESSAGE(std::string(target.name) << ": " << runs << " inputs");
    }
    config_notes(true);
}
