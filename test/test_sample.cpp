// Sampling (model/sample.h) against its definition: top-k 1 is the argmax, nothing outside the top k is drawn, and
// the frequencies follow softmax(logits / temperature) over the kept tokens. 20,000 draws: a frequency p has a
// standard deviation of at most sqrt(0.25 / 20000) = 0.0035, so 0.02 is over 5 of them; a temperature multiplied
// instead of divided (or ignored) moves the frequencies below by 0.3 or more.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "model/rng.h"
#include "model/sample.h"

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
