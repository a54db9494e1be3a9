// Sampling (model/sample.h) against its definition: top-k 1 is the argmax, nothing outside the top k is drawn, and
// the frequencies follow softmax(logits / temperature) over the kept tokens. 20,000 draws: a frequency p has a
// standard deviation of at most sqrt(0.25 / 20000) = 0.0035, so 0.02 is over 5 of them; a temperature multiplied
// instead of divided (or ignored) moves the frequencies below by 0.3 or more. And the trainer's sampling loop against
// a greedy continuation computed here.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/sample.h"
#include "test/test_helpers.h"

TEST_CASE("sample: top-k 1 is the argmax, top-k k never draws outside the top k, frequencies follow the softmax") {
    const std::vector<float> logits = {0.0f, 2.0f, -1.0f, 1.0f, 0.5f};  // ranked: 1, 3, 4, 0, 2
    Rng rng(11);
    for (int i = 0; i < 200; i++) CHECK(sample_token(logits.data(), 5, 1.0f, 1, rng) == 1);

    const float temperature = 0.5f;
    const int draws = 20000;
    std::vector<int> counts(5, 0);
    for (int i = 0; i < draws; i++) counts[sample_token(logits.data(), 5, temperature, 3, rng)]++;
    CHECK(counts[0] == 0);
    CHECK(counts[2] == 0);
    double norm = 0.0;
    for (int v : {1, 3, 4}) norm += std::exp(logits[v] / temperature);
    for (int v : {1, 3, 4}) {
        INFO("token " << v);
        CHECK(std::fabs((double)counts[v] / draws - std::exp(logits[v] / temperature) / norm) < 0.02);
    }

    std::vector<int> all(5, 0);  // top-k 0: every token can come
    for (int i = 0; i < draws; i++) all[sample_token(logits.data(), 5, 1.0f, 0, rng)]++;
    double all_norm = 0.0;
    for (float l : logits) all_norm += std::exp(l);
    for (int v = 0; v < 5; v++) CHECK(std::fabs((double)all[v] / draws - std::exp(logits[v]) / all_norm) < 0.02);
}

// train_cpu --sample with top-k 1 against the greedy continuation computed here from the checkpoint it wrote: each
// token the argmax of the logits at the last real token of the window (the prompt and the tokens so far, padded to
// T), through the CPU model's own forward. 20 tokens after the prompt's few, at T = 16, slide the window too. Exact:
// the same weights, the same forward, the same argmax.
TEST_CASE("sample: train_cpu's greedy sample continues the prompt from its last real token") {
    const std::string dir = test_path("sample_ckpt"), prompt = "The licen";
    const int T = 16, tokens = 20;
    system(("rm -rf " + dir).c_str());
    const CommandResult run =
        run_logged("./train_cpu --config test/data/ep-tiny.json --data 'data/default/train_*.bin' --seq 16 --batch 2 "
                   "--steps 3 --lr 1e-2 --checkpoint-dir " + dir + " --sample 20 --top-k 1 --prompt '" + prompt + "'",
                   "sample_run.txt", 120);
    REQUIRE_MESSAGE(run.status == 0, run.out);

    const std::string checkpoint = checkpoint_find_latest(dir);
    Model m;
    model_init(m, checkpoint_config(checkpoint));
    AdamWState opt = adamw_state(m.shard);
    TrainState state;
    checkpoint_load(checkpoint, m, opt, state);
    const Tokenizer tokenizer = Tokenizer::load("data/default/tokenizer.bin");
    const std::vector<uint32_t> encoded = tokenizer.encode(prompt);
    std::vector<int32_t> context(encoded.begin(), encoded.end());
    std::string text = prompt;
    std::vector<float> logits(m.config.vocab_size);
    for (int i = 0; i < tokens; i++) {
        std::vector<int32_t> window(context.end() - std::min<int64_t>((int64_t)context.size(), T), context.end());
        const int last = (int)window.size() - 1;
        window.resize(T, 0);
        model_forward(m, window.data(), nullptr, 1, T, false);
        model_logits_row(m, last, logits.data());
        const int next = (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
        context.push_back(next);
        text += tokenizer.token_bytes(next);
    }
    INFO(run.out);
    CHECK(run.out.find("sample (temperature 1.00, top-k 1):\n" + text + "\n") != std::string::npos);
    system(("rm -rf " + dir).c_str());
}
