// The arithmetic of --plan (docs/design.md §1.4, §2, §8). Memory: FP32 master weights, FP32 gradients and a BF16
// working copy of what a GPU holds (replicated parameters whole, routed experts / EP; no pipeline stages), and the
// AdamW moments of its optimizer shard. FLOPs per token, as Megatron counts: 6 x active parameters (shared experts
// and MTP included) + the attention scores, causal halved. All-to-all: per MoE block and token, k rows of d BF16
// values are dispatched and returned in the forward, and again in the backward; 1/EP stays on the GPU,
// (per_node - 1)/EP crosses NVLink, the rest the network. The predicted step adds compute and communication, no
// overlap. --recompute keeps one activation set per kind of block and one head chunk of logits, and runs the forward
// again; the step counts that for every block (the trainers skip the last of each kind), MFU's FLOPs do not.
#include "trainer/plan.h"

#include <algorithm>
#include <cstdio>

#include "model/model.h"
#include "model/params.h"

// Parameters one token's forward passes through: the active ones, plus the MTP block less its unused routed experts,
// plus the output head a second time (the MTP prediction's logits come from the shared head).
static double active_params_with_mtp(const Config& c) {
    if (c.num_nextn_predict_layers == 0) return count_active_params(c);
    const double unused_mtp_experts = (double)(c.n_routed_experts - c.num_experts_per_tok) * 3 *
                                      c.moe_intermediate_size * c.hidden_size;
    return count_active_params(c) + count_mtp_params(c) - unused_mtp_experts + (double)c.vocab_size * c.hidden_size;
}

// The attention scores and their weighted sum, every block: a query at position t multiplies with t + 1 keys, T / 2
// on average (causal), H (dqk + dv) multiply-adds each; 2 FLOPs a multiply-add, x3 for the forward and backward.
static double attention_flops_per_token(const Config& c, int T) {
    return 3.0 * c.num_attention_heads * T * (c.qk_head_dim() + c.v_head_dim) * c.num_blocks();
}

double model_flops_per_token(const Config& c, int T) {
    return 6 * active_params_with_mtp(c) + attention_flops_per_token(c, T);
}

// The forward of the blocks and the heads, per token (what --recompute runs again): the model's FLOPs less those of
// the MTP projection and the final norms, over 3 (a forward and a backward are 3 forwards).
static double recomputed_flops_per_token(const Config& c, int T) {
    const double d = c.hidden_size, mtp = c.num_nextn_predict_layers > 0 ? 1 : 0;
    return (model_flops_per_token(c, T) - 6 * (d + mtp * (2 * d * d + 3 * d))) / 3;
}

void print_plan(const Config& c, const PlanInputs& p) {
    const double GiB = 1024.0 * 1024 * 1024;
    ParamTable table = build_param_table(c, 1);
    double expert_params = 0, replicated_params = 0, frozen_params = 0;  // frozen: the router biases, without moments
    for (const ParamTensor& t : table.tensors) {
        (t.expert_shard ? expert_params : replicated_params) += t.numel;
        if (!t.trainable) frozen_params += t.numel;
    }
    const int dp = p.gpus / p.ep;
    const double held = replicated_params + expert_params / p.ep;
    const double weight_bytes = held * (4 + 4 + 2);  // master, gradient, BF16 copy
    const double moment_values = replicated_params / p.gpus + expert_params / p.ep / dp;  // of m, and of v
    const double optimizer_bytes = 2 * p.moment_bytes * moment_values;
    const double checkpoint_bytes = 12 * (replicated_params + expert_params) - 8 * frozen_params;
    const double d = c.hidden_size, H = c.num_attention_heads, T = p.seq;
    const double dqk = c.qk_head_dim(), dv = c.v_head_dim, I = c.moe_intermediate_size, k = c.num_experts_per_tok;
    const int moe_layers = c.num_blocks() - std::min(c.first_k_dense_replace, c.num_hidden_layers);

    // Activations kept for the backward, per token and block, in FP32 as ./train keeps them; the attention saves its
    // log-sum-exp, not the probabilities. BF16 copies and the routed experts' rows come on top.
    const double qr = c.q_lora_rank, kr = c.kv_lora_rank;
    const double attn = 2 * d + (qr > 0 ? 2 * qr : 0) + 2 * H * dqk + (kr + c.qk_rope_head_dim) + 2 * kr +
                        H * (c.qk_nope_head_dim + dv) + H * dqk + H * dv + 2 * H;
    const double dense_ffn = 2 * d + 3 * c.intermediate_size;
    const double moe_ffn = 2 * d + c.n_routed_experts + 2 * k * d + k * 3 * I + 3 * c.n_shared_experts * I;
    const int dense_layers = c.num_blocks() - moe_layers;
    const double kept_per_token =  // with recompute: every block's input, and one set of each kind of block
        p.recompute ? c.num_blocks() * d + (dense_layers > 0) * (attn + dense_ffn) + (moe_layers > 0) * (attn + moe_ffn)
                    : dense_layers * (attn + dense_ffn) + moe_layers * (attn + moe_ffn);
    const double heads = c.num_nextn_predict_layers > 0 ? 2 : 1, tokens = (double)p.batch * T;
    // the logits of the main head and MTP's (all of them, or with --recompute one chunk each), and their gradient
    // (every row, BF16)
    const double logit_rows = p.recompute ? (double)head_chunk_rows(c, (int64_t)tokens, ActivationLayout{}) : tokens;
    const double logit_bytes = 4 * heads * logit_rows * c.vocab_size + 2 * tokens * c.vocab_size;
    const double act_bytes = 4 * kept_per_token * tokens + logit_bytes;
    const double active = active_params_with_mtp(c), attn_flops = attention_flops_per_token(c, p.seq);
    const double flops_per_token = model_flops_per_token(c, p.seq);

    // all-to-all bytes per GPU per micro-step (both directions counted once, as sent)
    const double row_bytes = 2 * d;
    const double passes = p.recompute ? 6 : 4;  // dispatch + return, forward (twice with recompute) + backward
    const double sent = passes * moe_layers * tokens * k * row_bytes;
    const double local_share = 1.0 / p.ep;
    const double node_share = std::max(0.0, (double)(std::min(p.gpus_per_node, p.ep) - 1) / p.ep);
    const double network_share = 1.0 - local_share - node_share;
    const double recomputed = p.recompute ? recomputed_flops_per_token(c, p.seq) : 0.0;
    const double compute_s = tokens * (flops_per_token + recomputed) / (p.matmul_tflops * 1e12);
    const double comm_s = sent * node_share / (p.nvlink_gbps * 1e9) + sent * network_share / (p.network_gbps * 1e9);
    // Once per step the gradients are reduce-scattered and the weights all-gathered, in FP32: a ring all-reduce's
    // 2 (n-1)/n of the buffer per GPU, over all GPUs for replicated tensors and the DP group for expert tensors.
    const double exchange_s = (2.0 * (p.gpus - 1) / p.gpus * 4 * replicated_params +
                               2.0 * (dp - 1) / dp * 4 * expert_params / p.ep) / (p.network_gbps * 1e9);
    const double step_s = p.grad_accum * (compute_s + comm_s) + exchange_s;
    const double tokens_per_gpu_s = p.grad_accum * tokens / step_s;
    printf("plan: %d GPUs (%d per node) as EP %d x DP %d; micro-batch %d x %d tokens, %d micro-steps per step\n",
           p.gpus, p.gpus_per_node, p.ep, dp, p.batch, p.seq, p.grad_accum);
    printf("parameters: %.3g total (%.3g replicated, %.3g in routed experts); one GPU holds %.3g\n",
           replicated_params + expert_params, replicated_params, expert_params, held);
    const double total_bytes = weight_bytes + optimizer_bytes + act_bytes;
    printf("memory per GPU: weights+grads+BF16 copy %.1f GiB, AdamW shard %.1f GiB, activations%s %.1f GiB, "
           "total %.1f of %.0f GiB%s\n",
           weight_bytes / GiB, optimizer_bytes / GiB, p.recompute ? " (--recompute)" : "", act_bytes / GiB,
           total_bytes / GiB, p.gpu_memory_gib,
           total_bytes > p.gpu_memory_gib * GiB
               ? "  -> does NOT fit: this needs pipeline stages or sharded weights, which moe.cu does not have"
               : "  -> fits");
    // The host keeps a rank's FP32 weights and AdamW shard; each rank writes its owned ranges into a checkpoint.
    printf("host memory per GPU: weights %.1f GiB, AdamW shard %.1f GiB; a checkpoint: %.3g TB, %.3g GB written by "
           "each rank\n",
           held * 4 / GiB, 8 * moment_values / GiB, checkpoint_bytes / 1e12, 12 * moment_values / 1e9);
    printf("FLOPs per token: %.4g (6 x %.4g active parameters incl. MTP, + %.4g attention)", flops_per_token, active,
           attn_flops);
    if (p.recompute) printf(", + %.4g recomputed (the blocks' and heads' forward, not model FLOPs)", recomputed);
    printf("\n");
    printf("all-to-all per GPU per micro-step: %.3g GB sent (%.0f%% local, %.0f%% NVLink, %.0f%% network)\n", sent / 1e9,
           100 * local_share, 100 * node_share, 100 * network_share);
    printf("assumed: matmul %.0f TFLOP/s per GPU, NVLink %.0f GB/s, network %.0f GB/s per GPU, no overlap\n",
           p.matmul_tflops, p.nvlink_gbps, p.network_gbps);
    printf("predicted per micro-step: compute %.3f s, all-to-all %.3f s; per step: gradient and weight exchange "
           "%.3f s, step %.3f s\n", compute_s, comm_s, exchange_s, step_s);
    printf("predicted throughput: %.0f tokens/s per GPU = %.0fK GPU-hours per trillion tokens\n", tokens_per_gpu_s,
           1e12 / tokens_per_gpu_s / 3600 / 1e3);
}
