// DeepSeekMoE layer (DESIGN §1.2), CPU reference: route -> plan -> gather rows in expert-contiguous order ->
// grouped expert SwiGLUs -> combine with the gate weights, plus the shared experts; and the mirror backward.
// Also the complementary sequence-wise balance loss and the expert-load counts for the aux-loss-free bias update.
#pragma once
#include <cstdint>
#include <vector>

#include "arena.h"
#include "comm/expert_plan.h"
#include "config.h"
#include "ffn.h"
#include "params.h"

struct MoEActs {
    float* scores;        // (N, E)   sigmoid router scores
    float* gate_weights;  // (N, k)   w_j of each token's chosen experts
    float* rows_in;       // (N*k, d) token rows in expert-contiguous order
    SwigluActs experts;   // (N*k, I) each
    float* rows_out;      // (N*k, d) expert outputs in the same order
    SwigluActs shared;    // (N, n_shared * I) each
    float* shared_out;    // (N, d)
    std::vector<int32_t> chosen;  // (N, k) expert index of each assignment
    ExpertPlan plan;
    double balance_loss = 0.0;    // alpha * sum_i f_i P_i, averaged over the B sequences
};

void moe_carve(Arena<float>& arena, const Config& c, int B, int T, MoEActs& a);
// x (N, d) the normalised input -> out (N, d). a.plan.counts holds the tokens routed to each expert.
void moe_forward(const Config& c, const BlockWeights& w, MoEActs& a, const float* x, float* out, int B, int T);
// dout (N, d) -> dx (N, d) overwritten. balance_scale multiplies the balance loss's gradient (the loss's weight
// in what is being differentiated, e.g. 1/grad_accum).
void moe_backward(const Config& c, const BlockWeights& w, BlockWeights& g, const MoEActs& a, const float* x,
                  const float* dout, float* dx, int B, int T, float balance_scale);
