// Builds the parameter table in a fixed order and maps it onto a buffer.
#include "params.h"

#include <cstdio>
#include <cstdlib>

const ParamTensor* ParamTable::find(const std::string& name) const {
    for (const ParamTensor& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

const ParamTensor& ParamTable::at(const std::string& name) const {
    const ParamTensor* t = find(name);
    if (!t) {
        fprintf(stderr, "internal error: parameter %s is not in the table\n", name.c_str());
        abort();
    }
    return *t;
}

ParamTable build_param_table(const Config& c, int ep_size) {
    ParamTable table;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, bool trainable = true, bool expert_shard = false) {
        ParamTensor t;
        t.name = name;
        t.shape = shape;
        t.numel = 1;
        for (int64_t s : shape) t.numel *= s;
        t.offset = (table.total + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
        t.weight_decay = shape.size() >= 2;
        t.trainable = trainable;
        t.expert_shard = expert_shard;
        table.total = t.offset + t.numel;
        table.tensors.push_back(t);
    };
    const int64_t d = c.hidden_size, H = c.num_attention_heads, dqk = c.qk_head_dim();
    add("model.embed_tokens.weight", {c.vocab_size, d});
    for (int l = 0; l < c.num_blocks(); l++) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        if (l == c.num_hidden_layers) {  // the MTP block's input projection
            add(p + "enorm.weight", {d});
            add(p + "hnorm.weight", {d});
            add(p + "eh_proj.weight", {d, 2 * d});
        }
        add(p + "input_layernorm.weight", {d});
        if (c.q_lora_rank > 0) {
            add(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, d});
            add(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank});
            add(p + "self_attn.q_b_proj.weight", {H * dqk, c.q_lora_rank});
        } else {
            add(p + "self_attn.q_proj.weight", {H * dqk, d});
        }
        add(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, d});
        add(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank});
        add(p + "self_attn.kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
        add(p + "self_attn.o_proj.weight", {d, H * c.v_head_dim});
        add(p + "post_attention_layernorm.weight", {d});
        if (!c.is_moe_layer(l)) {
            add(p + "mlp.gate_proj.weight", {c.intermediate_size, d});
            add(p + "mlp.up_proj.weight", {c.intermediate_size, d});
            add(p + "mlp.down_proj.weight", {d, c.intermediate_size});
        } else {
            const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, E_local = E / ep_size;
            add(p + "mlp.gate.weight", {E, d});
            add(p + "mlp.gate.e_score_correction_bias", {E}, false);
            add(p + "mlp.experts.gate_proj.weight", {E_local, I, d}, true, true);
            add(p + "mlp.experts.up_proj.weight", {E_local, I, d}, true, true);
            add(p + "mlp.experts.down_proj.weight", {E_local, d, I}, true, true);
            if (c.n_shared_experts > 0) {
                const int64_t S = (int64_t)c.n_shared_experts * I;
                add(p + "mlp.shared_experts.gate_proj.weight", {S, d});
                add(p + "mlp.shared_experts.up_proj.weight", {S, d});
                add(p + "mlp.shared_experts.down_proj.weight", {d, S});
            }
        }
        if (l == c.num_hidden_layers) add(p + "shared_head.norm.weight", {d});
    }
    add("model.norm.weight", {d});
    add("lm_head.weight", {c.vocab_size, d});
    return table;
}

ModelWeights map_weights(const Config& c, const ParamTable& table, float* buf) {
    auto ptr = [&](const std::string& name) -> float* {
        const ParamTensor* t = table.find(name);
        return t ? buf + t->offset : nullptr;
    };
    ModelWeights w;
    w.embed = ptr("model.embed_tokens.weight");
    w.final_norm = ptr("model.norm.weight");
    w.head = ptr("lm_head.weight");
    for (int l = 0; l < c.num_blocks(); l++) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        BlockWeights b;
        b.attn_norm = ptr(p + "input_layernorm.weight");
        b.q_a = ptr(p + "self_attn.q_a_proj.weight");
        b.q_a_norm = ptr(p + "self_attn.q_a_layernorm.weight");
        b.q_b = ptr(p + "self_attn.q_b_proj.weight");
        b.q = ptr(p + "self_attn.q_proj.weight");
        b.kv_a = ptr(p + "self_attn.kv_a_proj_with_mqa.weight");
        b.kv_a_norm = ptr(p + "self_attn.kv_a_layernorm.weight");
        b.kv_b = ptr(p + "self_attn.kv_b_proj.weight");
        b.o = ptr(p + "self_attn.o_proj.weight");
        b.ffn_norm = ptr(p + "post_attention_layernorm.weight");
        bool moe = c.is_moe_layer(l);
        b.gate = ptr(p + (moe ? "mlp.shared_experts.gate_proj.weight" : "mlp.gate_proj.weight"));
        b.up = ptr(p + (moe ? "mlp.shared_experts.up_proj.weight" : "mlp.up_proj.weight"));
        b.down = ptr(p + (moe ? "mlp.shared_experts.down_proj.weight" : "mlp.down_proj.weight"));
        b.router = ptr(p + "mlp.gate.weight");
        b.router_bias = ptr(p + "mlp.gate.e_score_correction_bias");
        b.expert_gate = ptr(p + "mlp.experts.gate_proj.weight");
        b.expert_up = ptr(p + "mlp.experts.up_proj.weight");
        b.expert_down = ptr(p + "mlp.experts.down_proj.weight");
        w.blocks.push_back(b);
    }
    const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";  // nullptr without MTP
    w.mtp_enorm = ptr(mtp + "enorm.weight");
    w.mtp_hnorm = ptr(mtp + "hnorm.weight");
    w.mtp_eh_proj = ptr(mtp + "eh_proj.weight");
    w.mtp_norm = ptr(mtp + "shared_head.norm.weight");
    return w;
}
