// Sampling the next token from a row of logits: softmax(logits / temperature) over the top_k largest (all when
// top_k <= 0), ties ranked by the lower token id, drawn with the run's generator.
#pragma once
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "rng.h"

inline int sample_token(const float* logits, int V, float temperature, int top_k, Rng& rng) {
    std::vector<std::pair<float, int>> ranked(V);
    for (int v = 0; v < V; v++) ranked[v] = {logits[v] / temperature, v};
    const int keep = top_k > 0 ? std::min(top_k, V) : V;
    std::partial_sort(ranked.begin(), ranked.begin() + keep, ranked.end(), [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    double sum = 0.0;
    for (int j = 0; j < keep; j++) sum += std::exp((double)(ranked[j].first - ranked[0].first));
    const double u = rng.uniform() * sum;
    double acc = 0.0;
    for (int j = 0; j < keep; j++) {
        acc += std::exp((double)(ranked[j].first - ranked[0].first));
        if (acc > u) return ranked[j].second;
    }
    return ranked[keep - 1].second;  // u within roundoff of the sum
}
