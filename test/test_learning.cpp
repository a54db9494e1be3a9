// Training really learns: `small` trained on the default data (the Debian license texts) for 250 steps must reach a
// validation loss well below the unigram entropy of the validation tokens, the loss of the best model that
// ignores context. "Well below" is 1 nat: the model's perplexity at most e^-1 = 37% of the unigram one.
// (250 steps reach 4.28 against 5.76; 400 steps of `make run` reach 4.22; see the README.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "data/shards.h"
#include "test/test_helpers.h"

TEST_CASE("learning: small on the default data falls well below the unigram entropy") {
    const std::string log = test_path("learning.jsonl"), out = test_path("learning.out");
    remove(log.c_str());
    const std::string cmd =
        "./train_cpu --config small --data 'data/default/train_*.bin' --val 'data/default/val_*.bin' "
        "--steps 250 --batch 8 --seq 128 --lr 3e-3 --seed 1337 --log " + log + " > " + out + " 2>&1";
    if (system(cmd.c_str()) != 0) {
        std::ifstream output(out);  // the scratch directory goes at exit: show the output here
        std::stringstream ss;
        ss << output.rdbuf();
        FAIL("training failed:\n" << ss.str());
    }
    double val_loss = NAN, first_loss = NAN;
    std::ifstream f(log);
    for (std::string line; std::getline(f, line);) {
        size_t at = line.find("\"val_loss\": ");
        if (at != std::string::npos) val_loss = atof(line.c_str() + at + 12);
        at = line.find("\"loss_main\": ");
        if (std::isnan(first_loss) && at != std::string::npos) first_loss = atof(line.c_str() + at + 13);
    }
    std::vector<uint32_t> val_tokens;
    for (const std::string& path : glob_files("data/default/val_*.bin")) {
        std::vector<uint32_t> shard = read_shard(path);
        val_tokens.insert(val_tokens.end(), shard.begin(), shard.end());
    }
    const double unigram = unigram_entropy_nats(val_tokens);
    MESSAGE("first train loss " << first_loss << " nats, final validation loss " << val_loss
                                << " nats, unigram entropy of the validation data " << unigram << " nats");
    printf("learning: validation loss %.4f nats vs unigram entropy %.4f nats\n", val_loss, unigram);
    REQUIRE(!std::isnan(val_loss));
    CHECK(first_loss > unigram);  // a fresh model is no better than the unigram distribution
    CHECK(val_loss < unigram - 1.0);
}
