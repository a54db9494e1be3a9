// DeepSeek-V3's router, FP32 (docs/design.md §1.2, whose symbols this uses; the CPU's is model/moe.cpp).
//   forward:  s_t = sigmoid(z_t) (E scores); router_select (model/router.h, the function the CPU runs) picks
//             chosen (N, k) and the gate weights w (N, k)
//   backward: dL/dw (N, k) and the balance loss -> dL/dz (N, E), overwritten. With S = sum_j s[chosen_j]:
//             dL/ds_m += r (dw_m / S - sum_j dw_j s_j / S^2) (norm_topk_prob) or r dw_m, for chosen m
//             dL/ds_te += coef (f_e / S_t - sum_e' f_e' s_te' / S_t^2),  coef = balance_scale alpha / (B T)
//             dL/dz = dL/ds s (1 - s)
// Forward: a thread per token, with E floats of scratch each: latency-bound, but tiny next to the GEMMs. Backward:
// per-sequence expert counts (integer atomics in shared memory: exact), then a thread block per token. The balance
// loss's value: per-token totals, then a thread block per sequence.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "model/config.h"
#include "model/router.h"

namespace gpu {

constexpr int ROUTER_FORWARD_THREADS = 64, ROUTER_BACKWARD_THREADS = 128;
// The per-sequence counts are E ints of shared memory, within the 48 KiB a launch gets without opting in
constexpr int ROUTER_MAX_EXPERTS = 48 * 1024 / sizeof(int);

static __global__ void router_forward_kernel(float* scores, int32_t* chosen, float* gate_weights, float* scratch,
                                      const float* logits, const float* bias, Config c, int64_t N) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
    for (int64_t e = 0; e < E; e++) scores[t * E + e] = sigmoid(logits[t * E + e]);
    router_select(c, scores + t * E, bias, scratch + t * E, chosen + t * k, gate_weights + t * k);
}

// a thread block per sequence b: counts (B, E) = how many of the sequence's T tokens chose each expert
static __global__ void router_sequence_counts_kernel(int* counts, const int32_t* chosen, int64_t T, int E, int k) {
    int* hist = dynamic_shared<int>();  // (E)
    const int64_t b = blockIdx.x;
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < T * k; i += blockDim.x) {
        const int e = chosen[b * T * k + i];  // -1 for a token whose scores were not finite (the host stops on it)
        if ((unsigned)e < (unsigned)E) atomicAdd(&hist[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) counts[b * E + e] = hist[e];
}

// a thread block per token t, threads over experts
static __global__ void router_backward_kernel(float* drouter_logits, const float* dgate_weights, const float* scores,
                                       const int32_t* chosen, const int* seq_counts, Config c, int64_t T,
                                       double balance_coef) {
    const int64_t t = blockIdx.x, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const float r = c.routed_scaling_factor;
    const float* s = scores + t * E;
    const int32_t* idx = chosen + t * k;
    const float* dw = dgate_weights + t * k;
    float sum = 0.0f, weighted = 0.0f;  // S and sum_j dw_j s_j, in the CPU's order
    if (c.norm_topk_prob) {
        for (int64_t j = 0; j < k; j++) sum += s[idx[j]];
        for (int64_t j = 0; j < k; j++) weighted += dw[j] * s[idx[j]];
    }
    // balance loss: S_t and sum_e f_e s_te in double, as the CPU
    const bool balance = c.aux_loss_alpha > 0;  // uniform over the thread block: block_sum is safe
    const int* count = balance ? seq_counts + (t / T) * E : nullptr;
    const double f_unit = (double)E / (k * T);
    double total = 0.0, fs = 0.0;
    if (balance) {
        for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
            total += s[e];
            fs += f_unit * count[e] * s[e];
        }
        total = block_sum(total);
        fs = block_sum(fs);
    }
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        float ds = 0.0f;  // dL/ds_te
        for (int64_t j = 0; j < k; j++)
            if (idx[j] == e) ds += c.norm_topk_prob ? r * (dw[j] / sum - weighted / (sum * sum)) : r * dw[j];
        if (balance) ds += (float)(balance_coef * (f_unit * count[e] / total - fs / (total * total)));
        drouter_logits[t * E + e] = ds * (s[e] * (1.0f - s[e]));
    }
}

// one thread per token t: totals[t] = sum_e s_te in expert order, in double (the CPU's S_t)
static __global__ void token_score_totals_kernel(double* totals, const float* scores, int64_t N, int E) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    double total = 0.0;
    for (int e = 0; e < E; e++) total += scores[t * E + e];
    totals[t] = total;
}

// a thread block per sequence b, threads over experts: P_e = sum_t s_te / S_t / T in token order (double, as the
// CPU), f_e = E/(kT) count_e; per_sequence[b] = sum_e f_e P_e. The caller multiplies by alpha / B.
static __global__ void balance_loss_kernel(double* per_sequence, const float* scores, const double* totals,
                                           const int* seq_counts, int64_t T, int E, int k) {
    const int64_t b = blockIdx.x;
    double sum = 0.0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double P = 0.0;
        for (int64_t t = b * T; t < (b + 1) * T; t++) P += scores[t * E + e] / totals[t] / T;
        sum += (double)E / (k * T) * seq_counts[b * E + e] * P;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) per_sequence[b] = sum;
}

// logits (N, E) -> scores (N, E) (may be the same buffer as logits), chosen (N, k), gate_weights (N, k).
// bias (E): e_score_correction_bias. scratch: N * E floats.
inline void router_forward(float* scores, int32_t* chosen, float* gate_weights, float* scratch, const float* logits,
                           const float* bias, const Config& c, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    const unsigned blocks = (unsigned)ceil_div(N, ROUTER_FORWARD_THREADS);
    launch_kernel(router_forward_kernel, blocks, ROUTER_FORWARD_THREADS, 0, stream, scores, chosen, gate_weights,
                  scratch, logits, bias, c, N);
}

// dgate_weights (N, k), scores (N, E), chosen (N, k) of B sequences of T tokens -> drouter_logits (N, E) overwritten.
// balance_scale: the balance loss's weight in what is differentiated (as moe_backward). scratch: B * E ints.
inline void router_backward(float* drouter_logits, const float* dgate_weights, const float* scores,
                            const int32_t* chosen, const Config& c, int64_t B, int64_t T, float balance_scale,
                            int* scratch, cudaStream_t stream) {
    if (B * T == 0) return;
    const int E = c.n_routed_experts, k = c.num_experts_per_tok;
    if (c.aux_loss_alpha > 0) {
        launch_kernel(router_sequence_counts_kernel, (unsigned)B, ROUTER_BACKWARD_THREADS, E * sizeof(int), stream,
                      scratch, chosen, T, E, k);
    }
    const double balance_coef = balance_scale * c.aux_loss_alpha / ((double)B * T);  // the CPU's expression
    launch_kernel(router_backward_kernel, (unsigned)(B * T), ROUTER_BACKWARD_THREADS, 0, stream, drouter_logits,
                  dgate_weights, scores, chosen, scratch, c, T, balance_coef);
}

// The sequence-wise balance loss's sum_e f_e P_e of each of the B sequences -> per_sequence (B) doubles.
// scratch: B*T doubles (token totals) and B*E ints (counts).
inline void balance_loss(double* per_sequence, double* totals, int* seq_counts, const float* scores,
                         const int32_t* chosen, const Config& c, int64_t B, int64_t T, cudaStream_t stream) {
    if (B * T == 0) return;
    const int E = c.n_routed_experts, k = c.num_experts_per_tok;
    launch_kernel(router_sequence_counts_kernel, (unsigned)B, ROUTER_BACKWARD_THREADS, E * sizeof(int), stream,
                  seq_counts, chosen, T, E, k);
    const unsigned token_blocks = (unsigned)ceil_div(B * T, ROUTER_FORWARD_THREADS);
    launch_kernel(token_score_totals_kernel, token_blocks, ROUTER_FORWARD_THREADS, 0, stream, totals, scores, B * T, E);
    launch_kernel(balance_loss_kernel, (unsigned)B, ROUTER_BACKWARD_THREADS, 0, stream, per_sequence, scores, totals,
                  seq_counts, T, E, k);
}

}  // namespace gpu
