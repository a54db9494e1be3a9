// Builds the parameter table in a fixed order and maps it onto a buffer.
#include "params.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

const ParamTensor& ParamTable::at(const std::string& name) const {
    for (const ParamTensor& t : tensors)
        if (t.name == name) return t;
    fprintf(stderr, "internal error: parameter %s is not in the table\n", name.c_str());
    abort();
}

// Each tensor names the pointer map_weights sets to it: add(...).block for a field of its block, .model otherwise.
ParamTable build_param_table(const Config& c, int ep_size, int first_layer, int end_layer) {
    ParamTable table;
    const int L = c.num_hidden_layers;
    if (end_layer < 0) end_layer = L;
    int layer = -1;  // the block being added, -1 outside the blocks
    bool head = false;  // adding the final norm and the head
    ParamTensor not_held;  // what add() returns for a tensor of another stage
    auto add = [&](const std::string& name, std::vector<int64_t> shape, bool trainable = true,
                   bool expert_shard = false) -> ParamTensor& {
        const bool held = layer < 0 ? (head ? end_layer == L : first_layer == 0)
                                    : (layer >= first_layer && layer < end_layer) || (layer >= L && end_layer == L);
        if (!held) return not_held;
        ParamTensor t;
        t.name = name;
        t.shape = shape;
        t.numel = 1;
        for (int64_t s : shape) t.numel *= s;
        t.weight_decay = shape.size() >= 2;
        t.trainable = trainable;
        t.expert_shard = expert_shard;
        t.layer = layer;
        table.tensors.push_back(t);
        return table.tensors.back();
    };
    const int64_t d = c.hidden_size, H = c.num_attention_heads, dqk = c.qk_head_dim();
    add("model.embed_tokens.weight", {c.vocab_size, d}).model = &ModelWeights::embed;
    for (layer = 0; layer < c.num_blocks(); layer++) {
        std::string p = "model.layers." + std::to_string(layer) + ".";
        if (layer == c.num_hidden_layers) {  // the MTP block's input projection
            add(p + "enorm.weight", {d}).model = &ModelWeights::mtp_enorm;
            add(p + "hnorm.weight", {d}).model = &ModelWeights::mtp_hnorm;
            add(p + "eh_proj.weight", {d, 2 * d}).model = &ModelWeights::mtp_eh_proj;
        }
        add(p + "input_layernorm.weight", {d}).block = &BlockWeights::attn_norm;
        if (c.q_lora_rank > 0) {
            add(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, d}).block = &BlockWeights::q_a;
            add(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}).block = &BlockWeights::q_a_norm;
            add(p + "self_attn.q_b_proj.weight", {H * dqk, c.q_lora_rank}).block = &BlockWeights::q_b;
        } else {
            add(p + "self_attn.q_proj.weight", {H * dqk, d}).block = &BlockWeights::q;
        }
        add(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, d}).block =
            &BlockWeights::kv_a;
        add(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}).block = &BlockWeights::kv_a_norm;
        add(p + "self_attn.kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}).block =
            &BlockWeights::kv_b;
        add(p + "self_attn.o_proj.weight", {d, H * c.v_head_dim}).block = &BlockWeights::o;
        add(p + "post_attention_layernorm.weight", {d}).block = &BlockWeights::ffn_norm;
        if (!c.is_moe_layer(layer)) {
            add(p + "mlp.gate_proj.weight", {c.intermediate_size, d}).block = &BlockWeights::gate;
            add(p + "mlp.up_proj.weight", {c.intermediate_size, d}).block = &BlockWeights::up;
            add(p + "mlp.down_proj.weight", {d, c.intermediate_size}).block = &BlockWeights::down;
        } else {
            const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, E_local = E / ep_size;
            add(p + "mlp.gate.weight", {E, d}).block = &BlockWeights::router;
            add(p + "mlp.gate.e_score_correction_bias", {E}, false).block = &BlockWeights::router_bias;
            add(p + "mlp.experts.gate_proj.weight", {E_local, I, d}, true, true).block = &BlockWeights::expert_gate;
            add(p + "mlp.experts.up_proj.weight", {E_local, I, d}, true, true).block = &BlockWeights::expert_up;
            add(p + "mlp.experts.down_proj.weight", {E_local, d, I}, true, true).block = &BlockWeights::expert_down;
            if (c.n_shared_experts > 0) {
                const int64_t S = (int64_t)c.n_shared_experts * I;
                add(p + "mlp.shared_experts.gate_proj.weight", {S, d}).block = &BlockWeights::gate;
                add(p + "mlp.shared_experts.up_proj.weight", {S, d}).block = &BlockWeights::up;
                add(p + "mlp.shared_experts.down_proj.weight", {d, S}).block = &BlockWeights::down;
            }
        }
        if (layer == c.num_hidden_layers) add(p + "shared_head.norm.weight", {d}).model = &ModelWeights::mtp_norm;
    }
    layer = -1;
    head = true;
    add("model.norm.weight", {d}).model = &ModelWeights::final_norm;
    add("lm_head.weight", {c.vocab_size, d}).model = &ModelWeights::head;
    // The offsets, in four runs: the trainable tensors read in FP32, the router biases, then the GEMM weights, the
    // replicated ones and the experts'. Each trainable run is one bucket of the optimizer (model/optimizer.h).
    const auto run_of = [](const ParamTensor& t) {
        return !t.gemm_weight ? (t.trainable ? 0 : 1) : (t.expert_shard ? 3 : 2);
    };
    for (ParamTensor& t : table.tensors)
        t.gemm_weight = t.shape.size() >= 2 && t.model != &ModelWeights::embed && t.block != &BlockWeights::router;
    for (int run = 0; run < 4; run++) {
        for (ParamTensor& t : table.tensors) {
            if (run_of(t) != run) continue;
            t.offset = (table.total + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
            table.total = t.offset + t.numel;
        }
        if (run == 1) table.fp32_total = table.total;
    }
    return table;
}

std::string first_non_finite(const ParamTable& table, const float* values) {
    for (const ParamTensor& t : table.tensors)
        for (int64_t i = 0; i < t.numel; i++)
            if (!std::isfinite(values[t.offset + i]))
                return "tensor '" + t.name + "' (element " + std::to_string(i) + ")";
    return "";
}

// Pointers of tensors the config does not have stay nullptr.
ModelWeights map_weights(const Config& c, const ParamTable& table, float* buf) {
    ModelWeights w{};
    w.blocks.assign(c.num_blocks(), BlockWeights{});
    for (const ParamTensor& t : table.tensors)
        (t.block ? w.blocks[t.layer].*t.block : w.*t.model) = buf + t.offset;
    return w;
}
