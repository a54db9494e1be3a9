// DeepSeekMoE layer (DESIGN §1.2, §2), CPU reference:
//   route -> plan (rows ordered by expert) -> dispatch (all-to-all-v to the experts' EP ranks) -> sort received
//   rows by local expert -> grouped expert SwiGLUs -> unsort -> combine (all-to-all-v back) -> weighted sum per
//   token, plus the shared experts. The backward runs the mirror image with the same plan.
// With one EP rank the exchanges are copies. Also the complementary sequence-wise balance loss.
// The routed-expert buffers are std::vectors, not part of the activation arena: under expert parallelism the
// number of rows a rank receives depends on the routing (dropless), so their size changes from step to step.
#pragma once
#include <cstdint>
#include <vector>

#include "arena.h"
#include "comm/comm.h"
#include "comm/expert_plan.h"
#include "config.h"
#include "ffn.h"
#include "params.h"

struct MoEActs {
    float* scores;        // (N, E)   sigmoid router scores
    float* gate_weights;  // (N, k)   w_j of each token's chosen experts
    float* rows_sent;     // (N*k, d) this rank's token rows in plan order (by expert)
    float* rows_back;     // (N*k, d) the experts' outputs for them, returned in the same order
    SwigluActs shared;    // (N, n_shared * I) each
    float* shared_out;    // (N, d)
    std::vector<int32_t> chosen;  // (N*k) expert of each assignment t*k + j
    ExpertPlan plan;              // this rank's assignments ordered by expert
    DispatchPlan dispatch;        // what this rank sends, receives and computes
    std::vector<float> expert_in, expert_out;        // (R, d) received rows in expert-contiguous order
    std::vector<float> expert_g, expert_u, expert_a; // (R, I)
    double balance_loss = 0.0;    // alpha * sum_i f_i P_i, averaged over the B sequences
};

void moe_carve(Arena<float>& arena, const Config& c, int B, int T, MoEActs& a);
// x (N, d) the normalised input -> out (N, d). a.plan.counts holds this rank's tokens routed to each expert.
// comm: the EP group that holds the experts (a one-rank Comm when there is no expert parallelism).
void moe_forward(const Config& c, LinearPrecision precision, const BlockWeights& w, MoEActs& a, const float* x,
                 float* out, int B, int T, Comm& comm);
// dout (N, d) -> dx (N, d) overwritten. balance_scale multiplies the balance loss's gradient: the weight of this
// rank's loss in what is differentiated (the trainer's 1/(grad_accum x world)).
void moe_backward(const Config& c, LinearPrecision precision, const BlockWeights& w, BlockWeights& g, MoEActs& a,
                  const float* x, const float* dout, float* dx, int B, int T, float balance_scale, Comm& comm);
// The router's backward on its own: d gate weights (N, k) and the balance loss -> d router logits (N, E)
// (overwritten), from the sigmoid scores (N, E) and the chosen experts (N, k).
void router_backward(const Config& c, const float* scores, const int32_t* chosen, const float* dgate_weights,
                     float* dlogits, int B, int T, float balance_scale);
