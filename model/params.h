// The parameter table (docs/design.md §4): every tensor with its Hugging Face name, shape and 64-bit offset into one
// float buffer (the tensors read in FP32 first, then the GEMM weights); the gradients use the same offsets in their
// own. Offsets are multiples of PARAM_ALIGN floats (256 bytes, gaps zero), for vector loads and cuBLASLt's fastest
// kernels. A block's routed experts are one stacked tensor (E, out, in), model.layers.N.mlp.experts.*_proj.weight;
// the published files hold its slice E as model.layers.N.mlp.experts.E.*_proj.weight. The MTP block is layer
// num_hidden_layers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

constexpr int64_t PARAM_ALIGN = 64;

// Pointers into a parameter (or gradient) buffer for one transformer block. Unused ones are nullptr.
struct BlockWeights {
    float* attn_norm;       // (d)
    float* q_a;             // (q_lora, d)            when q_lora_rank > 0
    float* q_a_norm;        // (q_lora)
    float* q_b;             // (H*dqk, q_lora)
    float* q;               // (H*dqk, d)             when q_lora_rank == 0
    float* kv_a;            // (kv_lora + d_rope, d)
    float* kv_a_norm;       // (kv_lora)
    float* kv_b;            // (H*(d_nope + d_v), kv_lora)
    float* o;               // (d, H*d_v)
    float* ffn_norm;        // (d)
    float* gate;            // dense: (inter, d); MoE shared experts: (n_shared*moe_inter, d)
    float* up;              // same shape as gate
    float* down;            // (d, width)
    float* router;          // (E, d)                 MoE only
    float* router_bias;     // (E) e_score_correction_bias
    float* expert_gate;     // (E_local, moe_inter, d)   E_local = E / ep_size experts of this rank
    float* expert_up;       // (E_local, moe_inter, d)
    float* expert_down;     // (E_local, d, moe_inter)
};

// The whole model's pointers into one buffer.
struct ModelWeights {
    float* embed;           // (V, d)
    std::vector<BlockWeights> blocks;  // num_hidden_layers main blocks, then the MTP block if any
    float* final_norm;      // (d)
    float* head;            // (V, d)
    float* mtp_enorm;       // (d)   MTP only
    float* mtp_hnorm;       // (d)
    float* mtp_eh_proj;     // (d, 2d)
    float* mtp_norm;        // (d)   the MTP block's own final norm (shared_head.norm)
};

struct ParamTensor {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0;  // in floats, into the parameter buffer
    int64_t numel = 0;
    bool weight_decay = false;  // matrices and embeddings decay; norm weights do not
    bool trainable = true;      // false for e_score_correction_bias (updated by the balancing rule, not AdamW)
    bool expert_shard = false;  // an expert tensor: this rank holds E/ep_size experts (dim 0)
    // A linear layer's weight or the head: read only by GEMMs, which in the GPU's BF16 and FP8 modes take its BF16
    // working copy. The rest (embedding, norms, routers and their biases) the GPU reads in FP32.
    bool gemm_weight = false;
    // The pointer map_weights sets to it: a field of its block's BlockWeights, or else of ModelWeights
    int layer = -1;
    float* BlockWeights::*block = nullptr;
    float* ModelWeights::*model = nullptr;
};

// The tensors are listed in the published order; in the buffer the ones read in FP32 come first, [0, fp32_total),
// then the GEMM weights, [fp32_total, total): the GPU's BF16 and FP8 modes keep only the first part in FP32. Within
// each part the trainable tensors come together (the router biases last of the first part, the experts' last of
// the second): the optimizer has at most three buckets.
struct ParamTable {
    std::vector<ParamTensor> tensors;
    int64_t fp32_total = 0;  // floats before the first GEMM weight
    int64_t total = 0;       // floats in the whole buffer, the alignment gaps included
    const ParamTensor& at(const std::string& name) const;  // aborts with the name when absent
};

// ep_size > 1: the routed-expert tensors hold only this rank's E/ep_size experts ([E/ep_size, out, in]).
// A pipeline stage holds main blocks [first_layer, end_layer) (end_layer -1: to the last), the embedding when it is
// the first, and the final norm, the head and the MTP block when it is the last.
ParamTable build_param_table(const Config& c, int ep_size = 1, int first_layer = 0, int end_layer = -1);

ModelWeights map_weights(const Config& c, const ParamTable& table, float* buffer);

// The first tensor of the table whose values (at its offset in `values`) hold a NaN or an inf, as "tensor 'NAME'
// (element I)", or "" when all are finite.
std::string first_non_finite(const ParamTable& table, const float* values);
