// Model configuration: the Hugging Face DeepseekV3Config keys (docs/design.md §1.6), presets, validation.
// A config is read from a preset name (tiny, small, deepseek-v2-lite, deepseek-v3) or a JSON file;
// a real DeepSeek config.json loads as is. Unknown keys are reported, invalid values are an error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

constexpr int MAX_VOCAB_SIZE = 1 << 24;       // for configs, --vocab, prepare_data --vocab and tokenizer files
constexpr size_t MAX_CONFIG_BYTES = 1 << 26;  // a config file, ours or a Hugging Face config.json

struct Config {
    // sizes
    int vocab_size = 512;
    int hidden_size = 64;               // d
    int intermediate_size = 128;        // dense SwiGLU width
    int moe_intermediate_size = 32;     // width of one routed expert
    int num_hidden_layers = 2;
    int num_attention_heads = 2;        // H
    int max_position_embeddings = 4096;
    // MLA
    int q_lora_rank = 0;                // 0: q = W_q h (no low-rank query)
    int kv_lora_rank = 32;
    int qk_nope_head_dim = 16;
    int qk_rope_head_dim = 8;
    int v_head_dim = 16;
    // MoE
    int n_routed_experts = 8;
    int n_shared_experts = 1;
    int num_experts_per_tok = 2;        // k
    int n_group = 1;
    int topk_group = 1;
    float routed_scaling_factor = 1.0f;
    bool norm_topk_prob = true;
    int first_k_dense_replace = 1;
    // MTP
    int num_nextn_predict_layers = 0;   // 0 or 1
    float mtp_loss_weight = 0.3f;
    // numerics and init
    float rms_norm_eps = 1e-6f;
    float rope_theta = 10000.0f;
    float initializer_range = 0.006f;
    // YaRN RoPE scaling (rope_scaling.type == "yarn"); factor 1 means none
    float yarn_factor = 1.0f;
    int yarn_original_max_position = 4096;
    float yarn_beta_fast = 32.0f;
    float yarn_beta_slow = 1.0f;
    float yarn_mscale = 1.0f;
    float yarn_mscale_all_dim = 0.0f;
    // balancing
    float aux_loss_alpha = 0.0001f;
    float bias_update_speed = 0.001f;

    // derived
    int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
    bool is_moe_layer(int layer) const { return layer >= first_k_dense_replace; }
    int num_blocks() const { return num_hidden_layers + num_nextn_predict_layers; }  // MTP block last
};

// Loads a preset or a JSON file; throws std::runtime_error with one line on any error.
Config parse_config_file(const std::string& preset_or_path);
// The same, but prints the error and exits 1: for tools and tests.
Config load_config(const std::string& preset_or_path);
// The parsers' notes on stderr (a replaced value, an ignored key, a default used): on by default. Ranks other than
// 0 turn them off, so each is said once.
void config_notes(bool on);
// Parses JSON text; throws std::runtime_error with one line on any error.
Config parse_config_json(const std::string& json_text, const std::string& source_name);
// Checks the values; throws std::runtime_error naming the offending key.
void validate_config(const Config& c);
// The config as a Hugging Face style JSON document (model_type deepseek_v3).
std::string config_to_json(const Config& c);
// Parameter counts: total without MTP, and active per token without MTP or the input embedding (docs/design.md §1.6).
int64_t count_total_params(const Config& c);
int64_t count_active_params(const Config& c);
int64_t count_mtp_params(const Config& c);
// Block `layer`'s parameters (the MTP block's is num_hidden_layers), or those one token passes through: k experts.
int64_t count_block_params(const Config& c, int layer, bool active_only);
