// The whole model on the CPU (docs/design.md §1): embedding, blocks (MLA, then a dense SwiGLU or MoE, pre-norm
// residuals), final norm, head and cross-entropy, plus MTP (§1.3) and the balance loss. It is the spec that the GPU
// model (gpu/model.h, step for step) and the PyTorch twin are checked against.
//   loss = CE_main + mtp_loss_weight * CE_mtp + sum over MoE blocks of the balance loss
// Each block's last residual add is fused with the RMSNorm that reads it, as on the GPU.
// A pipeline stage (docs/design.md §2.1) is a Model holding consecutive main blocks: the first stage the embedding,
// the last the final norm, the heads and MTP. Its forward and backward read and write the messages the stages pass.
#pragma once
#include <cstdint>
#include <vector>

#include "config.h"
#include "ffn.h"
#include "mla.h"
#include "moe.h"
#include "optimizer.h"
#include "params.h"

struct BlockActs {
    float* attn_normed;  // (N, d) RMSNorm(h) into the attention (written by whoever wrote h)
    float* attn_rstd;    // (N)
    MLAActs mla;
    float* attn_out;     // (N, d)
    float* h_mid;        // (N, d) h + attention
    float* ffn_normed;   // (N, d)
    float* ffn_rstd;     // (N)
    SwigluActs dense;    // dense layers only
    MoEActs moe;         // MoE layers only
    float* ffn_out;      // (N, d)
};

struct ModelActs {
    std::vector<float*> residual;  // num_hidden_layers + 1 of (N, d): the input of each main block, then the output
                                   // (a stage carves those of its blocks only; the last stage's output too)
    // The activation sets: one per block (main, then MTP), or with recompute one per kind of block (dense, MoE),
    // which the activation slots then share. block_set[l] is block l's set; set s holds the forward of block
    // set_layer[s] (-1: none) of slot set_slot[s].
    std::vector<BlockActs> blocks;
    std::vector<int> block_set, set_layer, set_slot;
    float* final_normed;           // (N, d)
    float* final_rstd;             // (N)
    float* logits;                 // (N, V), or with recompute (head_chunk_rows, V)
    // MTP
    float* next_embed;             // (N, d) Emb(y)
    float* enorm_out;              // (N, d)
    float* enorm_rstd;             // (N)
    float* hnorm_out;              // (N, d)
    float* hnorm_rstd;             // (N)
    float* mtp_concat;             // (N, 2d) [enorm_out | hnorm_out]
    float* mtp_in;                 // (N, d)  W_eh concat: the MTP block's input
    float* mtp_out;                // (N, d)
    float* mtp_normed;             // (N, d)
    float* mtp_rstd;               // (N)
    float* mtp_logits;             // (N, V), or with recompute (head_chunk_rows, V)
};

// How a model (this one, or gpu/model.h's) lays out what its backward reads (docs/design.md §6, §10).
//   recompute: --recompute, about a third more FLOPs in the blocks and heads for the same bits.
//   head_chunk_values: the most logits a head chunk holds; 2^26 (256 MiB) is 655 rows at V2-Lite's vocabulary.
//     Both modes chunk alike, so their head GEMMs have the same shapes, and cuBLASLt gives the same bits.
struct ActivationLayout {
    bool recompute = false;
    int64_t head_chunk_values = int64_t(1) << 26;
};

struct LossParts {
    double total = 0, main = 0, mtp = 0, balance = 0;
};

// What one micro-batch's forward leaves for its backward: the Model fields below of that name. 1F1B keeps several
// micro-batches in flight; the slot in use is in the Model, the others parked here. With recompute the slots share
// the activation sets (their blocks' inputs are all they keep), which stay in the Model.
struct ActivationSlot {
    int B = 0, T = 0;
    std::vector<float> act_storage, set_storage;
    ModelActs acts;
    std::vector<int32_t> inputs, targets, mtp_targets;
};

struct Model {
    Config config;
    Comm* comm = nullptr;              // the ranks this model is spread over (expert parallelism); never null
    ParamTable table;
    OptimizerShard shard;              // what this rank's optimizer updates (model/optimizer.h)
    std::vector<float> params, grads;  // one buffer each, laid out by the table
    ModelWeights w, g;                 // pointers into params and grads
    Precision precision = Precision::FP32;  // the linear layers inside the blocks: FP32 or FP8 (model/fp8.h)
    ActivationLayout layout;  // set before the first forward
    int first_layer = 0, end_layer = 0;  // this pipeline stage's main blocks: [first_layer, end_layer)
    // activations of the last forward, for a batch of B x T: slot `slot` (model_use_slot)
    int B = 0, T = 0;
    std::vector<float> act_storage, set_storage;  // the activation sets (acts.blocks) apart
    ModelActs acts;
    std::vector<int32_t> inputs, targets, mtp_targets;  // (N) each; mtp_targets[b, T-1] = -1
    int slot = 0;
    std::vector<ActivationSlot> parked;  // the other slots (parked[slot] is empty)
    // each block's expert load since the last bias update (empty for dense blocks; 0 for other stages' blocks)
    std::vector<std::vector<int64_t>> expert_counts;

    bool first_stage() const { return first_layer == 0; }
    bool last_stage() const { return end_layer == config.num_hidden_layers; }
};

// Table and zeroed buffers. With comm (default: one process), the routed experts are split over its EP group.
// A pipeline stage holds main blocks [first_layer, end_layer) (end_layer -1: to the last).
void model_init(Model& m, const Config& c, Comm* comm = nullptr, int first_layer = 0, int end_layer = -1);
// For a backend with its own gradients (the GPU's): frees the host gradients and clears m.g. model_backward,
// model_zero_grads and model_reduce_grads are then not for this model.
void model_release_grads(Model& m);
void model_init_weights(Model& m, uint64_t seed);          // N(0, initializer_range) matrices, norms 1, biases 0
// Forward over B sequences of T tokens. targets == nullptr: logits only (no losses, no MTP).
// training: add this batch's expert loads to expert_counts (evaluation and sampling must not).
LossParts model_forward(Model& m, const int32_t* inputs, const int32_t* targets, int B, int T, bool training);
// Backward of the last forward (which had targets): grads += loss_scale * d loss / d params.
void model_backward(Model& m, float loss_scale);
// The message between pipeline stages, in floats: the hidden state (N, d), then with MTP Emb(targets) (N, d), which
// the first stage computes and the last reads (forward), or their gradients (backward).
int64_t stage_message_floats(const Config& c, int B, int T);
// A stage's forward: from `in` (the previous stage's message; the first stage reads the tokens instead) to `out`
// (the next stage's; nullptr on the last). The losses are the stage's own: the heads' on the last, the balance
// losses of its blocks. model_forward is this on a model of one stage.
LossParts model_stage_forward(Model& m, const int32_t* inputs, const int32_t* targets, int B, int T, bool training,
                              const float* in, float* out);
// A stage's backward of the forward in use: from `dout` (the next stage's gradient; nullptr on the last) to `din`
// (the previous stage's; nullptr on the first).
void model_stage_backward(Model& m, float loss_scale, const float* dout, float* din);
// Makes activation slot `slot` the one in use: the forward fills it, the backward reads it.
void model_use_slot(Model& m, int slot);
void model_zero_grads(Model& m);
// Allocates the activations of a B x T batch now (the first forward would otherwise): throws std::bad_alloc early.
void model_reserve(Model& m, int B, int T);
// Keeps freed memory in the process (mallopt), so the backward's temporaries are not faulted in again each step:
// call it once before training (docs/performance.md).
void keep_freed_memory();
// Block l's activation set: l itself, or with recompute the number of its kind (dense, MoE) in order of appearance;
// -1 for the blocks of other pipeline stages (those outside main blocks [first_layer, end_layer) and MTP's, which
// the last stage holds).
std::vector<int> block_sets(const Config& c, bool recompute, int first_layer = 0, int end_layer = -1);
// The rows of one chunk of the output heads for batches of N tokens (ActivationLayout::head_chunk_values).
int64_t head_chunk_rows(const Config& c, int64_t N, const ActivationLayout& layout);
// The main head's logits of row `row` of the last forward (V values): kept by it, or with recompute computed again.
void model_logits_row(Model& m, int64_t row, float* out);
// Sums the gradients over the ranks that share each tensor, where this rank's optimizer shard needs them
// (docs/design.md §8). With loss_scale 1/world in the backward, this is the global mean's gradient.
void model_reduce_grads(Model& m);
// The global gradient norm over the shards of every rank: each value of every tensor counted once.
double model_grad_norm(const Model& m);
// AdamW on this rank's shard (opt: adamw_state(m.shard)), then the weights gathered from every rank's shard.
void model_adamw(Model& m, AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier);
// Aux-loss-free balancing (docs/design.md §1.2) from the global counts: b_i += gamma sign(mean(count) - count_i) per
// MoE block, then m.expert_counts reset. router_bias_step is one block's update, which the GPU model uses too.
void router_bias_step(const Config& c, const std::vector<int64_t>& counts, float* bias);
void model_update_router_bias(Model& m, const std::vector<std::vector<int64_t>>& counts);
// The load imbalance the log reports, per MoE block: max count / mean count (1 is perfect; 0 if nothing was routed).
std::vector<double> load_imbalance(const Config& c, const std::vector<std::vector<int64_t>>& counts);
