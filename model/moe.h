// The MoE layer on the CPU (docs/design.md §1.2, §2), in the phases gpu/moe.cu follows too:
//   route     s = sigmoid(x W_router^T) (N, E); each token's k experts and gate weights (router.h); the expert plan
//   permute   rows_in[r] = x[token of row r]: the token rows in plan order (N*k, d)
//   dispatch  rows_in to the EP ranks that own their experts, in local expert order: expert_in (R, d)
//   experts   each local expert's SwiGLU on its contiguous rows: expert_out (R, d)
//   return    expert_out back to the tokens' ranks, in plan order: rows_out (N*k, d)
//   combine   out_t = shared(x_t) + sum_j w_tj rows_out[row of t*k+j]
// and the balance loss. At EP 1 expert_in is rows_in and expert_out is rows_out. The backward runs the phases in
// reverse with the same plans. The routed experts' rows are std::vectors, not in the arena: R depends on the routing.
#pragma once
#include <cstdint>
#include <vector>

#include "arena.h"
#include "comm/comm.h"
#include "config.h"
#include "expert_plan.h"
#include "ffn.h"
#include "params.h"

struct MoEActs {
    float* scores;        // (N, E)   s = sigmoid(router logits)
    float* gate_weights;  // (N, k)   w of each token's chosen experts
    float* rows_in;       // (N*k, d) the token rows in plan order
    float* rows_out;      // (N*k, d) the experts' outputs for them, in plan order
    SwigluActs shared;    // (N, n_shared * I) each
    std::vector<int32_t> chosen;  // (N, k) the chosen experts
    ExpertPlan plan;              // this rank's assignments sorted by expert
    DispatchPlan dispatch;        // what this rank sends, receives and computes
    std::vector<float> expert_in, expert_out;         // (R, d) EP > 1: the local experts' rows
    std::vector<float> expert_g, expert_u, expert_a;  // (R, I)
    double balance_loss = 0.0;    // alpha * sum_i f_i P_i, averaged over the B sequences
};

void moe_carve(Arena& arena, const Config& c, int B, int T, MoEActs& a);
// x (N, d) the normalised input -> out (N, d); a.plan.counts is this rank's expert load. comm's EP group holds the
// experts (one rank without EP). with_loss: compute a.balance_loss, else it is 0.
void moe_forward(const Config& c, Precision p, const BlockWeights& w, MoEActs& a, const float* x, float* out, int B,
                 int T, Comm& comm, bool with_loss);
// dout (N, d) -> dx (N, d) overwritten. balance_scale, the trainer's loss_scale, scales the balance loss's gradient.
void moe_backward(const Config& c, Precision p, const BlockWeights& w, BlockWeights& g, MoEActs& a, const float* x,
                  const float* dout, float* dx, int B, int T, float balance_scale, Comm& comm);
// dgate_weights (N, k) and the balance loss -> drouter_logits (N, E) overwritten; scores (N, E), chosen (N, k).
void router_backward(const Config& c, const float* scores, const int32_t* chosen, const float* dgate_weights,
                     float* drouter_logits, int B, int T, float balance_scale);
