// The arithmetic of --plan (docs/design.md §1.4, §2, §8). The layers are cut into PP stages as the trainers cut them
// (trainer/pipeline.h); a GPU of stage s holds the stage's replicated parameters whole and its routed experts / EP,
// as ./train --dtype bf16 does: FP32 gradients, a BF16 working copy of the GEMM weights and FP32 of the rest
// (embedding, norms, routers), and its optimizer shard, the AdamW moments and FP32 master weights; the plan reports
// the heaviest stage. FLOPs per token, as Megatron counts: 6 x active parameters (shared experts and
// MTP included) + the attention scores, causal halved. All-to-all: per MoE block and token, k rows of d BF16 values
// are dispatched and returned in the forward, and again in the backward; 1/EP stays on the GPU, (per_node - 1)/EP
// crosses NVLink, the rest the network. The predicted step adds compute and communication, no overlap; 1F1B runs
// M + PP - 1 micro-steps of the slowest stage. --recompute keeps one activation set per kind of block and one head
// chunk of logits, and runs the forward again; the step counts that for every block (the trainers skip the last of
// each kind), MFU's FLOPs do not.
#include "trainer/plan.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/params.h"
#include "trainer/pipeline.h"

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

double block_flops_per_token(const Config& c, int layer, int T) {
    return 6.0 * count_block_params(c, layer, true) + attention_flops_per_token(c, T) / c.num_blocks();
}

double heads_flops_per_token(const Config& c, int T) {
    double blocks = 0;
    for (int l = 0; l < c.num_hidden_layers; l++) blocks += block_flops_per_token(c, l, T);
    return model_flops_per_token(c, T) - blocks;
}

// The forward of the blocks and the heads, per token (what --recompute runs again): the model's FLOPs less those of
// the MTP projection and the final norms, over 3 (a forward and a backward are 3 forwards).
static double recomputed_flops_per_token(const Config& c, int T) {
    const double d = c.hidden_size, mtp = c.num_nextn_predict_layers > 0 ? 1 : 0;
    return (model_flops_per_token(c, T) - 6 * (d + mtp * (2 * d * d + 3 * d))) / 3;
}

// One pipeline stage's share of a plan: what one of its GPUs holds and does.
struct StagePlan {
    int first = 0, end = 0;             // main blocks [first, end)
    double replicated = 0, experts = 0;  // parameters one GPU holds: the stage's replicated ones, its experts / EP
    double replicated_fp32 = 0;          // of the replicated ones, those read in FP32 (all experts are GEMM weights)
    double moment_values = 0;           // of m, and of v, in one GPU's AdamW shard
    double weight_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
    double all_to_all_bytes = 0, message_bytes = 0;  // sent per micro-step; one message to a neighbour
    double compute_s = 0, all_to_all_s = 0, p2p_s = 0, exchange_s = 0;  // per micro-step; the exchange per step
    double bytes() const { return weight_bytes + optimizer_bytes + activation_bytes; }
    double micro_step_s() const { return compute_s + all_to_all_s + p2p_s; }
};

// Activation values kept for the backward per token of one block, in FP32 as ./train keeps them; the attention saves
// its log-sum-exp, not the probabilities. BF16 copies and the routed experts' rows come on top.
static double block_activations_per_token(const Config& c, int layer) {
    const double d = c.hidden_size, H = c.num_attention_heads, dqk = c.qk_head_dim(), dv = c.v_head_dim;
    const double qr = c.q_lora_rank, kr = c.kv_lora_rank, I = c.moe_intermediate_size, k = c.num_experts_per_tok;
    const double attn = 2 * d + (qr > 0 ? 2 * qr : 0) + 2 * H * dqk + (kr + c.qk_rope_head_dim) + 2 * kr +
                        H * (c.qk_nope_head_dim + dv) + H * dqk + H * dv + 2 * H;
    if (!c.is_moe_layer(layer)) return attn + 2 * d + 3 * c.intermediate_size;
    return attn + 2 * d + c.n_routed_experts + 2 * k * d + k * 3 * I + 3 * c.n_shared_experts * I;
}

// The share of an EP group's all-to-all that crosses NVLink: (per_node - 1) / EP; 1 / EP stays on the GPU
static double nvlink_share(const PlanInputs& p) {
    return std::max(0.0, (double)(std::min(p.gpus_per_node, p.ep) - 1) / p.ep);
}

static StagePlan plan_stage(const Config& c, const PlanInputs& p, int stage, int first, int end) {
    StagePlan s;
    s.first = first;
    s.end = end;
    const int pp = p.pp, dp = p.gpus / (p.ep * pp), M = p.grad_accum;
    const bool last = stage == pp - 1;
    for (const ParamTensor& t : build_param_table(c, 1, first, end).tensors) {
        (t.expert_shard ? s.experts : s.replicated) += t.numel;
        if (!t.gemm_weight) s.replicated_fp32 += t.numel;
    }
    s.experts /= p.ep;
    const double gemm_values = s.replicated + s.experts - s.replicated_fp32;
    s.weight_bytes = 4 * (s.replicated + s.experts) + 4 * s.replicated_fp32 + 2 * gemm_values;  // gradients, weights
    s.moment_values = s.replicated / (p.ep * dp) + s.experts / dp;
    s.optimizer_bytes = (2 * p.moment_bytes + 4) * s.moment_values;  // m, v and the master weights
    // per token and micro-batch in flight (trainer/pipeline.h): every block's set, or with recompute every block's
    // input, the micro-batches sharing one set of each kind of block; on the last stage (one micro-batch in flight)
    // the heads' logits (all, or one chunk each) and their gradient (every row, BF16)
    const double d = c.hidden_size, T = p.seq, tokens = (double)p.batch * T, mtp = c.num_nextn_predict_layers > 0;
    double kept = 0, kind_set[2] = {0, 0};
    for (int l = first; l < (last ? c.num_blocks() : end); l++) {
        const double set = block_activations_per_token(c, l);
        kept += p.recompute ? d : set;
        kind_set[c.is_moe_layer(l)] = set;
    }
    const double in_flight = std::min(pp - stage, M);
    s.activation_bytes = 4 * tokens * (kept * in_flight + (p.recompute ? kind_set[0] + kind_set[1] : 0));
    if (last) {
        const double rows = p.recompute ? (double)head_chunk_rows(c, (int64_t)tokens, ActivationLayout{}) : tokens;
        s.activation_bytes += 4 * (1 + mtp) * rows * c.vocab_size + 2 * tokens * c.vocab_size;
    }
    s.message_bytes = 4 * tokens * d * (1 + mtp);            // FP32 activations (and Emb(targets) for MTP)
    if (pp > 1) s.activation_bytes += 4 * s.message_bytes;  // the four message buffers
    // compute: the stage's blocks, the heads on the last, and with recompute their forward again
    double flops = 0;
    for (int l = first; l < end; l++) flops += block_flops_per_token(c, l, p.seq);
    if (last) flops += heads_flops_per_token(c, p.seq);
    const double recomputed = p.recompute ? (flops - (last ? 6 * (d + mtp * (2 * d * d + 3 * d)) : 0)) / 3 : 0;
    s.compute_s = tokens * (flops + recomputed) / (p.matmul_tflops * 1e12);
    // all-to-all: per MoE block and token, k rows of d BF16 values dispatched and returned, forward (twice with
    // recompute) and backward; 1/EP stays on the GPU, (per_node - 1)/EP crosses NVLink, the rest the network
    int moe_blocks = 0;
    for (int l = first; l < (last ? c.num_blocks() : end); l++) moe_blocks += c.is_moe_layer(l);
    s.all_to_all_bytes = (p.recompute ? 6 : 4) * moe_blocks * tokens * c.num_experts_per_tok * 2 * d;
    const double node_share = nvlink_share(p), network_share = 1.0 - 1.0 / p.ep - node_share;
    s.all_to_all_s = s.all_to_all_bytes * (node_share / (p.nvlink_gbps * 1e9) + network_share / (p.network_gbps * 1e9));
    // the message to each neighbour and its gradient back: over the network once a stage spans a node
    const int neighbours = (stage > 0) + !last;
    const bool same_node = p.ep * dp < p.gpus_per_node;
    s.p2p_s = neighbours * 2 * s.message_bytes / ((same_node ? p.nvlink_gbps : p.network_gbps) * 1e9);
    // once per step the gradients are reduce-scattered in FP32 and the weights all-gathered, the GEMM weights' BF16
    // working copy and the rest in FP32: (n-1)/n of each buffer per GPU in a ring, over the stage's GPUs for
    // replicated tensors and the DP group for experts
    const double stage_gpus = p.ep * dp;
    const double replicated_bytes = 4 * s.replicated + 4 * s.replicated_fp32 + 2 * (s.replicated - s.replicated_fp32);
    s.exchange_s = ((stage_gpus - 1) / stage_gpus * replicated_bytes + (dp - 1.0) / dp * (4 + 2) * s.experts) /
                   (p.network_gbps * 1e9);
    return s;
}

// The plan of every stage of layout p, and the step: 1F1B takes M + PP - 1 micro-steps of the slowest stage.
struct LayoutPlan {
    std::vector<StagePlan> stages;
    int heaviest = 0, slowest = 0;  // by memory, by micro-step
    double exchange_s = 0;  // the slowest stage's gradient and weight exchange
    double step_s = 0, tokens_per_gpu_s = 0, bubble = 0;
};

static LayoutPlan plan_layout(const Config& c, const PlanInputs& p) {
    LayoutPlan plan;
    const std::vector<int> cut = pipeline_cut(c, p.pp, p.pp_split, p.seq);
    for (int s = 0; s < p.pp; s++) {
        plan.stages.push_back(plan_stage(c, p, s, cut[s], cut[s + 1]));
        if (plan.stages[s].bytes() > plan.stages[plan.heaviest].bytes()) plan.heaviest = s;
        if (plan.stages[s].micro_step_s() > plan.stages[plan.slowest].micro_step_s()) plan.slowest = s;
    }
    for (const StagePlan& s : plan.stages) plan.exchange_s = std::max(plan.exchange_s, s.exchange_s);
    const int M = p.grad_accum;
    plan.bubble = (double)(p.pp - 1) / (M + p.pp - 1);
    plan.step_s = (M + p.pp - 1) * plan.stages[plan.slowest].micro_step_s() + plan.exchange_s;
    const double replicas = (double)p.gpus / p.pp;  // the GPUs of a stage, each with its own tokens
    plan.tokens_per_gpu_s = M * (double)p.batch * p.seq * replicas / p.gpus / plan.step_s;
    return plan;
}

void print_plan(const Config& c, const PlanInputs& p) {
    const double GiB = 1024.0 * 1024 * 1024;
    double expert_params = 0, replicated_params = 0, frozen_params = 0;  // frozen: the router biases, without moments
    for (const ParamTensor& t : build_param_table(c, 1).tensors) {
        (t.expert_shard ? expert_params : replicated_params) += t.numel;
        if (!t.trainable) frozen_params += t.numel;
    }
    const int dp = p.gpus / (p.ep * p.pp);
    const LayoutPlan plan = plan_layout(c, p);
    const StagePlan& heavy = plan.stages[plan.heaviest];
    const StagePlan& slow = plan.stages[plan.slowest];
    printf("plan: %d GPUs (%d per node) as PP %d x EP %d x DP %d; micro-batch %d x %d tokens, %d micro-steps per "
           "step\n", p.gpus, p.gpus_per_node, p.pp, p.ep, dp, p.batch, p.seq, p.grad_accum);
    if (p.pp > 1) {
        printf("pipeline stages, their first layers:");
        for (const StagePlan& s : plan.stages) printf(" %d", s.first);
        printf("; the heaviest in memory: stage %d (layers %d-%d%s)\n", plan.heaviest, heavy.first, heavy.end - 1,
               plan.heaviest == p.pp - 1 ? ", the heads and MTP" : plan.heaviest == 0 ? ", the embedding" : "");
    }
    printf("parameters: %.3g total (%.3g replicated, %.3g in routed experts); one GPU holds %.3g\n",
           replicated_params + expert_params, replicated_params, expert_params, heavy.replicated + heavy.experts);
    const bool fits = heavy.bytes() <= p.gpu_memory_gib * GiB;
    printf("memory per GPU: weights+grads %.1f GiB, optimizer shard (moments, master weights) %.1f GiB, "
           "activations%s %.1f GiB, total %.1f of %.0f GiB%s\n",
           heavy.weight_bytes / GiB, heavy.optimizer_bytes / GiB, p.recompute ? " (--recompute)" : "",
           heavy.activation_bytes / GiB, heavy.bytes() / GiB, p.gpu_memory_gib,
           fits ? "  -> fits"
                : p.recompute ? "  -> does NOT fit: more pipeline stages or experts per GPU"
                              : "  -> does NOT fit: more pipeline stages or experts per GPU, or --recompute");
    // The host keeps a rank's FP32 weights and AdamW shard; each rank writes its owned ranges into a checkpoint.
    const double checkpoint_bytes = 12 * (replicated_params + expert_params) - 8 * frozen_params;
    printf("host memory per GPU: weights %.1f GiB, AdamW shard %.1f GiB; a checkpoint: %.3g TB, %.3g GB written by "
           "each rank\n",
           (heavy.replicated + heavy.experts) * 4 / GiB, 8 * heavy.moment_values / GiB, checkpoint_bytes / 1e12,
           12 * heavy.moment_values / 1e9);
    const double flops_per_token = model_flops_per_token(c, p.seq);
    printf("FLOPs per token: %.4g (6 x %.4g active parameters incl. MTP, + %.4g attention)", flops_per_token,
           active_params_with_mtp(c), attention_flops_per_token(c, p.seq));
    if (p.recompute)
        printf(", + %.4g recomputed (the blocks' and heads' forward, not model FLOPs)",
               recomputed_flops_per_token(c, p.seq));
    printf("\n");
    const double node_share = nvlink_share(p);
    const char* slowest = p.pp > 1 ? " (the slowest stage)" : "";
    printf("all-to-all per GPU per micro-step%s: %.3g GB sent (%.0f%% local, %.0f%% NVLink, %.0f%% network)\n",
           slowest, slow.all_to_all_bytes / 1e9, 100.0 / p.ep, 100 * node_share, 100 * (1 - 1.0 / p.ep - node_share));
    if (p.pp > 1)
        printf("pipeline: %.3g GB to and from each neighbouring stage per micro-step; 1F1B bubble %.0f%% ((PP - 1) / "
               "(micro-steps + PP - 1))\n", 2 * slow.message_bytes / 1e9, 100 * plan.bubble);
    printf("assumed: matmul %.0f TFLOP/s per GPU, NVLink %.0f GB/s, network %.0f GB/s per GPU, no overlap\n",
           p.matmul_tflops, p.nvlink_gbps, p.network_gbps);
    printf("predicted per micro-step%s: compute %.3f s, all-to-all %.3f s", slowest, slow.compute_s,
           slow.all_to_all_s);
    if (p.pp > 1) printf(", stage to stage %.3f s", slow.p2p_s);
    printf("; per step: gradient and weight exchange %.3f s, step %.3f s\n", plan.exchange_s, plan.step_s);
    printf("predicted throughput: %.0f tokens/s per GPU = %.0fK GPU-hours per trillion tokens\n",
           plan.tokens_per_gpu_s, 1e12 / plan.tokens_per_gpu_s / 3600 / 1e3);
}

void print_layouts(const Config& c, const PlanInputs& p) {
    const double GiB = 1024.0 * 1024 * 1024;
    printf("layouts of %d GPUs of %.0f GiB (micro-batch %d x %d tokens, %d micro-steps%s): PP x EP x DP, memory of "
           "the heaviest stage, predicted tokens/s per GPU\n", p.gpus, p.gpu_memory_gib, p.batch, p.seq,
           p.grad_accum, p.recompute ? ", --recompute" : "");
    PlanInputs best;
    double best_rate = 0, least_bytes = 1e300;
    for (int pp = 1; pp <= std::min(p.gpus, c.num_hidden_layers); pp++)
        for (int ep = 1; ep <= c.n_routed_experts; ep++) {
            if (c.n_routed_experts % ep != 0 || p.gpus % (pp * ep) != 0) continue;
            PlanInputs q = p;
            q.pp = pp;
            q.ep = ep;
            q.pp_split.clear();  // each layout's balanced cut
            const LayoutPlan plan = plan_layout(c, q);
            const double bytes = plan.stages[plan.heaviest].bytes();
            const bool fits = bytes <= p.gpu_memory_gib * GiB;
            printf("  PP %2d x EP %3d x DP %3d: %7.1f GiB %s %7.0f tokens/s\n", pp, ep, p.gpus / (pp * ep),
                   bytes / GiB, fits ? "fits     " : "too large", plan.tokens_per_gpu_s);
            least_bytes = std::min(least_bytes, bytes);
            if (fits && plan.tokens_per_gpu_s > best_rate) {
                best_rate = plan.tokens_per_gpu_s;
                best = q;
            }
        }
    if (best_rate > 0)
        printf("best that fits: PP %d x EP %d x DP %d, %.0f tokens/s per GPU\n", best.pp, best.ep,
               p.gpus / (best.pp * best.ep), best_rate);
    else
        printf("none fits: the smallest needs %.1f GiB per GPU (more GPUs%s, or a smaller micro-batch)\n",
               least_bytes / GiB, p.recompute ? "" : ", --recompute");
}
