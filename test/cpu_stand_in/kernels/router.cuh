// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/router.cuh: router_select (model/router.h, the
// function the kernel runs too), model/moe.h's router_backward, and the balance loss's value as a plain loop.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/common.cuh"
#include "model/config.h"
#include "model/moe.h"
#include "model/ops.h"
#include "model/router.h"

namespace gpu {

constexpr int ROUTER_MAX_EXPERTS = 48 * 1024 / sizeof(int);  // the real kernels' bound, which gpu_model.cu checks

// logits (N, E) -> scores = sigmoid(logits) (N, E) (may be the same buffer as logits), chosen (N, k),
// gate_weights (N, k) by router_select. bias (E). scratch: N * E floats.
inline void router_forward(float* scores, int32_t* chosen, float* gate_weights, float* scratch, const float* logits,
                           const float* bias, const Config& c, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
    dev(scores, N * E, "router_forward scores");
    dev(chosen, N * k, "router_forward chosen");
    dev(gate_weights, N * k, "router_forward gate_weights");
    dev(scratch, N * E, "router_forward scratch");
    dev(logits, N * E, "router_forward logits");
    dev(bias, E, "router_forward bias");
    // scores may be logits (the contract allows it); nothing else may overlap
    apart("router_forward", {span(scores, N * E, "scores"), span(chosen, N * k, "chosen"),
                             span(gate_weights, N * k, "gate_weights"), span(scratch, N * E, "scratch")},
          {span(bias, E, "bias")});
    if (logits != scores)
        apart("router_forward", {span(chosen, N * k, "chosen"), span(gate_weights, N * k, "gate_weights"),
                                 span(scratch, N * E, "scratch"), span(scores, N * E, "scores")},
              {span(logits, N * E, "logits")});
    launch(stream, [=] {
        for (int64_t t = 0; t < N; t++) {
            for (int64_t e = 0; e < E; e++) scores[t * E + e] = sigmoidf_(logits[t * E + e]);
            router_select(c, scores + t * E, bias, scratch + t * E, chosen + t * k, gate_weights + t * k);
        }
    });
}

// dgate_weights (N, k), scores (N, E), chosen (N, k) of B sequences of T tokens -> dlogits (N, E) overwritten, with
// the balance loss's gradient weighted by balance_scale. scratch: B * E ints (used when aux_loss_alpha > 0).
inline void router_backward(float* dlogits, const float* dgate_weights, const float* scores, const int32_t* chosen,
                            const Config& c, int64_t B, int64_t T, float balance_scale, int* scratch,
                            cudaStream_t stream) {
    if (B * T == 0) return;
    const int64_t N = B * T, E = c.n_routed_experts, k = c.num_experts_per_tok;
    dev(dlogits, N * E, "router_backward dlogits");
    dev(dgate_weights, N * k, "router_backward dgate_weights");
    dev(scores, N * E, "router_backward scores");
    dev(chosen, N * k, "router_backward chosen");
    if (c.aux_loss_alpha > 0) dev(scratch, B * E, "router_backward scratch");
    apart("router_backward", {span(dlogits, N * E, "dlogits"), span(scratch, c.aux_loss_alpha > 0 ? B * E : 0, "scratch")},
          {span(dgate_weights, N * k, "dgate_weights"), span(scores, N * E, "scores"), span(chosen, N * k, "chosen")});
    launch(stream, [=] { ::router_backward(c, scores, chosen, dgate_weights, dlogits, (int)B, (int)T, balance_scale); });
}

// per_sequence[b] = sum_e f_e P_e of sequence b: f_e = E/(kT) count_e (the sequence's tokens that chose e),
// P_e = sum_t s_te / S_t / T in token order, S_t = sum_e s_te in expert order, all in double.
// scratch: totals B*T doubles, seq_counts B*E ints.
inline void balance_loss(double* per_sequence, double* totals, int* seq_counts, const float* scores,
                         const int32_t* chosen, const Config& c, int64_t B, int64_t T, cudaStream_t stream) {
    if (B * T == 0) return;
    const int64_t N = B * T, E = c.n_routed_experts, k = c.num_experts_per_tok;
    dev(per_sequence, B, "balance_loss per_sequence");
    dev(totals, N, "balance_loss totals");
    dev(seq_counts, B * E, "balance_loss seq_counts");
    dev(scores, N * E, "balance_loss scores");
    dev(chosen, N * k, "balance_loss chosen");
    apart("balance_loss",
          {span(per_sequence, B, "per_sequence"), span(totals, N, "totals"), span(seq_counts, B * E, "seq_counts")},
          {span(scores, N * E, "scores"), span(chosen, N * k, "chosen")});
    launch(stream, [=] {
        for (int64_t b = 0; b < B; b++) {
            for (int64_t e = 0; e < E; e++) seq_counts[b * E + e] = 0;
            for (int64_t i = 0; i < T * k; i++) seq_counts[b * E + chosen[b * T * k + i]]++;
        }
        for (int64_t t = 0; t < N; t++) {
            double total = 0.0;
            for (int64_t e = 0; e < E; e++) total += scores[t * E + e];
            totals[t] = total;
        }
        for (int64_t b = 0; b < B; b++) {
            double sum = 0.0;
            for (int64_t e = 0; e < E; e++) {
                double P = 0.0;
                for (int64_t t = b * T; t < (b + 1) * T; t++) P += scores[t * E + e] / totals[t] / T;
                sum += (double)E / (k * T) * seq_counts[b * E + e] * P;
            }
            per_sequence[b] = sum;
        }
    });
}

}  // namespace gpu
