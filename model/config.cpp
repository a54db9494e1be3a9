// Config loading: presets, JSON with Hugging Face DeepseekV3Config key names, validation, parameter counts.
#include "config.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unistd.h>

#include "io/files.h"

using nlohmann::json;

// Presets. tiny: the gradient checks and unit tests. small: the CPU demo (3.1M parameters, 0.8M more in MTP).
// deepseek-v2-lite and deepseek-v3: the published shapes (routing is always DeepSeek-V3's sigmoid router).
static const char* preset_json(const std::string& name) {
    if (name == "tiny")
        return R"({"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
          "num_hidden_layers": 2, "num_attention_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 8,
          "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
          "routed_scaling_factor": 2.5, "norm_topk_prob": true, "first_k_dense_replace": 1,
          "num_nextn_predict_layers": 1, "initializer_range": 0.02, "aux_loss_alpha": 0.01,
          "max_position_embeddings": 256})";
    if (name == "small")
        return R"({"vocab_size": 1024, "hidden_size": 192, "intermediate_size": 512, "moe_intermediate_size": 128,
          "num_hidden_layers": 4, "num_attention_heads": 4, "q_lora_rank": 96, "kv_lora_rank": 64,
          "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
          "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
          "routed_scaling_factor": 1.0, "norm_topk_prob": true, "first_k_dense_replace": 1,
          "num_nextn_predict_layers": 1, "initializer_range": 0.02, "aux_loss_alpha": 0.0001,
          "max_position_embeddings": 1024})";
    if (name == "deepseek-v2-lite")
        return R"({"vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
          "num_hidden_layers": 27, "num_attention_heads": 16, "q_lora_rank": null, "kv_lora_rank": 512,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
          "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 1, "topk_group": 1,
          "routed_scaling_factor": 1.0, "norm_topk_prob": false, "first_k_dense_replace": 1,
          "num_nextn_predict_layers": 0, "initializer_range": 0.02, "aux_loss_alpha": 0.001,
          "max_position_embeddings": 163840, "rope_theta": 10000,
          "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}})";
    if (name == "deepseek-v3")
        return R"({"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
          "num_hidden_layers": 61, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
          "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
          "routed_scaling_factor": 2.5, "norm_topk_prob": true, "first_k_dense_replace": 3,
          "num_nextn_predict_layers": 1, "initializer_range": 0.006, "aux_loss_alpha": 0.0001,
          "max_position_embeddings": 163840, "rope_theta": 10000,
          "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})";
    return nullptr;
}

// The keys a config file sets, in the order they are read and written. norm_topk_prob, the one boolean, has neither i
// nor f. `shape` marks the architectural keys: a file that leaves one out gets a note.
struct ConfigKey {
    const char* name;
    int Config::*i;    // an integer key, or
    float Config::*f;  // a float key
    bool shape;
};
static const ConfigKey config_keys[] = {
    {"vocab_size", &Config::vocab_size, nullptr, true},
    {"hidden_size", &Config::hidden_size, nullptr, true},
    {"intermediate_size", &Config::intermediate_size, nullptr, true},
    {"moe_intermediate_size", &Config::moe_intermediate_size, nullptr, true},
    {"num_hidden_layers", &Config::num_hidden_layers, nullptr, true},
    {"num_attention_heads", &Config::num_attention_heads, nullptr, true},
    {"max_position_embeddings", &Config::max_position_embeddings, nullptr, false},
    {"q_lora_rank", &Config::q_lora_rank, nullptr, true},  // null (0) in configs without a low-rank query
    {"kv_lora_rank", &Config::kv_lora_rank, nullptr, true},
    {"qk_nope_head_dim", &Config::qk_nope_head_dim, nullptr, true},
    {"qk_rope_head_dim", &Config::qk_rope_head_dim, nullptr, true},
    {"v_head_dim", &Config::v_head_dim, nullptr, true},
    {"n_routed_experts", &Config::n_routed_experts, nullptr, true},
    {"n_shared_experts", &Config::n_shared_experts, nullptr, true},
    {"num_experts_per_tok", &Config::num_experts_per_tok, nullptr, true},
    {"n_group", &Config::n_group, nullptr, true},
    {"topk_group", &Config::topk_group, nullptr, true},
    {"routed_scaling_factor", nullptr, &Config::routed_scaling_factor, true},
    {"norm_topk_prob", nullptr, nullptr, true},
    {"first_k_dense_replace", &Config::first_k_dense_replace, nullptr, true},
    {"num_nextn_predict_layers", &Config::num_nextn_predict_layers, nullptr, false},
    {"mtp_loss_weight", nullptr, &Config::mtp_loss_weight, false},
    {"rms_norm_eps", nullptr, &Config::rms_norm_eps, false},
    {"rope_theta", nullptr, &Config::rope_theta, false},
    {"initializer_range", nullptr, &Config::initializer_range, false},
    {"aux_loss_alpha", nullptr, &Config::aux_loss_alpha, false},
    {"bias_update_speed", nullptr, &Config::bias_update_speed, false}};

// Keys read apart (a fixed value or an object), and Hugging Face keys training does not need (metadata, inference).
static bool is_other_known_key(const std::string& k) {
    static const char* keys[] = {"rope_scaling", "rope_parameters", "hidden_act", "tie_word_embeddings",
        "moe_layer_freq", "scoring_func", "topk_method",
        "architectures", "auto_map", "model_type", "torch_dtype", "dtype", "transformers_version", "qk_head_dim",
        "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "attention_bias", "attention_dropout",
        "pretraining_tp", "ep_size", "num_key_value_heads", "seq_aux", "quantization_config", "_name_or_path",
        "head_dim", "rope_interleave", "initializer_factor", "output_router_logits", "router_aux_loss_coef"};
    for (const char* key : keys) if (k == key) return true;
    return false;
}

static int get_int(const json& j, const char* key, int fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number_integer()) throw std::runtime_error(std::string("'") + key + "' must be an integer");
    int64_t v = j[key].get<int64_t>();
    if (v < 0 || v > (int64_t)1 << 30) throw std::runtime_error(std::string("'") + key + "' is out of range");
    return (int)v;
}
static float get_float(const json& j, const char* key, float fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) throw std::runtime_error(std::string("'") + key + "' must be a number");
    float v = j[key].get<float>();
    if (!std::isfinite(v)) throw std::runtime_error(std::string("'") + key + "' is not a finite float");
    return v;
}

// YaRN's settings from a rope_scaling (transformers 4) or rope_parameters (transformers 5) object whose type is yarn
static void read_yarn(const json& rs, Config& c) {
    c.yarn_factor = get_float(rs, "factor", 1.0f);
    c.yarn_original_max_position = get_int(rs, "original_max_position_embeddings", 4096);
    c.yarn_beta_fast = get_float(rs, "beta_fast", 32.0f);
    c.yarn_beta_slow = get_float(rs, "beta_slow", 1.0f);
    c.yarn_mscale = get_float(rs, "mscale", 1.0f);
    c.yarn_mscale_all_dim = get_float(rs, "mscale_all_dim", 0.0f);
}

// An object's rope type ("type" in transformers 4's rope_scaling, "rope_type" in 5), "default" when it has none
static std::string rope_type(const json& rs) {
    const json& t = rs.contains("rope_type") ? rs["rope_type"] : rs.contains("type") ? rs["type"] : json("default");
    if (!t.is_string()) throw std::runtime_error("the rope type must be a string");
    return t.get<std::string>();
}

static bool notes_on = true;
void config_notes(bool on) { notes_on = on; }

// A note on stderr, unless config_notes(false)
__attribute__((format(printf, 1, 2))) static void note(const char* format, ...) {
    if (!notes_on) return;
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
}

Config parse_config_json(const std::string& text, const std::string& source) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {  // a syntax error, or a number too large for a double
        throw std::runtime_error(source + ": malformed JSON (" + e.what() + ")");
    }
    if (!j.is_object()) throw std::runtime_error(source + ": the config must be a JSON object");
    Config c;
    try {
        for (const ConfigKey& k : config_keys) {
            if (k.i) {
                c.*k.i = get_int(j, k.name, c.*k.i);
            } else if (k.f) {
                c.*k.f = get_float(j, k.name, c.*k.f);
            } else if (j.contains(k.name)) {  // norm_topk_prob
                if (!j[k.name].is_boolean()) throw std::runtime_error("'norm_topk_prob' must be true or false");
                c.norm_topk_prob = j[k.name].get<bool>();
            }
        }
        if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
            const json& rs = j["rope_scaling"];
            if (!rs.is_object()) throw std::runtime_error("'rope_scaling' must be an object or null");
            const std::string type = rope_type(rs);
            if (type != "yarn")
                throw std::runtime_error("rope_scaling type '" + type + "' is not supported (only yarn)");
            read_yarn(rs, c);
        }
        // transformers 5 keeps rope_theta and the scaling in rope_parameters
        if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
            const json& rp = j["rope_parameters"];
            if (!rp.is_object()) throw std::runtime_error("'rope_parameters' must be an object or null");
            const float theta = get_float(rp, "rope_theta", c.rope_theta);
            if (j.contains("rope_theta") && theta != c.rope_theta)
                throw std::runtime_error("rope_theta " + std::to_string(c.rope_theta) + " and rope_parameters' " +
                                         std::to_string(theta) + " differ");
            c.rope_theta = theta;
            const std::string type = rope_type(rp);
            if (type == "yarn") read_yarn(rp, c);
            else if (type != "default")
                throw std::runtime_error("rope_parameters type '" + type + "' is not supported (default or yarn)");
        }
        if (j.contains("qk_head_dim") && j["qk_head_dim"] != c.qk_nope_head_dim + c.qk_rope_head_dim)
            throw std::runtime_error("qk_head_dim " + j["qk_head_dim"].dump() + " is not qk_nope_head_dim + " +
                                     "qk_rope_head_dim = " + std::to_string(c.qk_nope_head_dim + c.qk_rope_head_dim));
        if (j.contains("rope_interleave") && j["rope_interleave"] != true)
            throw std::runtime_error(
                "rope_interleave must be true (moe.cu's RoPE rotates DeepSeek's interleaved pairs)");
        // Keys that must have the one value this trainer implements.
        if (j.contains("hidden_act") && j["hidden_act"] != "silu")
            throw std::runtime_error("hidden_act must be \"silu\" (SwiGLU experts)");
        if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"] != false)
            throw std::runtime_error("tie_word_embeddings must be false (DeepSeek's head is untied)");
        if (j.contains("moe_layer_freq") && j["moe_layer_freq"] != 1)
            throw std::runtime_error("moe_layer_freq must be 1 (every layer after first_k_dense_replace is MoE)");
        if (j.contains("scoring_func") && j["scoring_func"] != "sigmoid")
            note("%s: note: scoring_func %s is replaced by DeepSeek-V3's sigmoid router\n", source.c_str(),
                 j["scoring_func"].dump().c_str());
        if (j.contains("topk_method") && j["topk_method"] != "noaux_tc")
            note("%s: note: topk_method %s is replaced by DeepSeek-V3's group-limited top-k with bias\n",
                 source.c_str(), j["topk_method"].dump().c_str());
        for (auto it = j.begin(); it != j.end(); ++it) {
            bool found = is_other_known_key(it.key());
            for (const ConfigKey& k : config_keys) found = found || it.key() == k.name;
            if (!found) note("%s: note: unknown key '%s' is ignored\n", source.c_str(), it.key().c_str());
        }
        validate_config(c);
    } catch (const std::exception& e) {  // json's and ours
        throw std::runtime_error(source + ": " + e.what());
    }
    // A file that leaves out an architectural key gets moe.cu's default, which need not be Hugging Face's: say so.
    std::string defaulted;
    for (const ConfigKey& k : config_keys)
        if (k.shape && !j.contains(k.name)) defaulted += (defaulted.empty() ? "" : ", ") + std::string(k.name);
    if (!defaulted.empty())
        note("%s: note: not given, so moe.cu's defaults are used (see model/config.h): %s\n", source.c_str(),
             defaulted.c_str());
    return c;
}

// Parameters of one MLA block, of one SwiGLU of width w, and of one MoE layer.
static int64_t mla_params(const Config& c) {
    int64_t d = c.hidden_size, H = c.num_attention_heads, dq = c.qk_head_dim();
    int64_t q = c.q_lora_rank > 0 ? d * c.q_lora_rank + c.q_lora_rank + (int64_t)c.q_lora_rank * H * dq : d * H * dq;
    int64_t kv = d * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank +
                 (int64_t)c.kv_lora_rank * H * (c.qk_nope_head_dim + c.v_head_dim);
    return q + kv + H * c.v_head_dim * d;
}
static int64_t swiglu_params(const Config& c, int64_t width) { return 3 * width * c.hidden_size; }

int64_t count_block_params(const Config& c, int layer, bool active_only) {
    int64_t n = 2 * (int64_t)c.hidden_size + mla_params(c);  // two norms + attention
    if (!c.is_moe_layer(layer)) return n + swiglu_params(c, c.intermediate_size);
    int64_t experts = active_only ? c.num_experts_per_tok : c.n_routed_experts;
    n += (int64_t)c.n_routed_experts * c.hidden_size;  // router (all scores are computed per token)
    n += swiglu_params(c, (int64_t)c.n_shared_experts * c.moe_intermediate_size);
    n += experts * swiglu_params(c, c.moe_intermediate_size);
    return n;
}

// The head and the final norm, the input embedding unless active_only (a lookup, not counted as active: docs/design.md
// §1.6, V3's published 37B), and the main blocks.
static int64_t model_params(const Config& c, bool active_only) {
    int64_t n = (active_only ? 1 : 2) * (int64_t)c.vocab_size * c.hidden_size + c.hidden_size;
    for (int l = 0; l < c.num_hidden_layers; l++) n += count_block_params(c, l, active_only);
    return n;
}

int64_t count_total_params(const Config& c) { return model_params(c, false); }

int64_t count_active_params(const Config& c) { return model_params(c, true); }

int64_t count_mtp_params(const Config& c) {
    if (c.num_nextn_predict_layers == 0) return 0;
    int64_t d = c.hidden_size;
    return 3 * d + 2 * d * d + count_block_params(c, c.num_hidden_layers, false);  // enorm, hnorm, head norm; eh_proj
}

void validate_config(const Config& c) {
    auto require = [](bool ok, const std::string& msg) {
        if (!ok) throw std::runtime_error(msg);
    };
    // Bounds far above any real model (DeepSeek-V3: vocabulary 129280, widths up to 18432, 256 experts, 61 layers).
    // They keep every size exact in int and int64 arithmetic, and stop a corrupt file asking for an absurd model.
    auto at_most = [&](int64_t limit, std::initializer_list<std::pair<const char*, int>> keys) {
        for (const auto& [name, value] : keys)
            require(value <= limit, std::string(name) + " " + std::to_string(value) + " is above moe.cu's limit of " +
                                        std::to_string(limit));
    };
    at_most(MAX_VOCAB_SIZE, {{"vocab_size", c.vocab_size}});
    at_most(1 << 24, {{"max_position_embeddings", c.max_position_embeddings},
                      {"rope_scaling.original_max_position_embeddings", c.yarn_original_max_position}});
    at_most(1 << 20, {{"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
                      {"moe_intermediate_size", c.moe_intermediate_size}, {"q_lora_rank", c.q_lora_rank},
                      {"kv_lora_rank", c.kv_lora_rank}});
    at_most(1 << 16, {{"n_routed_experts", c.n_routed_experts}});
    at_most(1 << 14, {{"qk_nope_head_dim", c.qk_nope_head_dim}, {"v_head_dim", c.v_head_dim}});
    at_most(1 << 12, {{"num_attention_heads", c.num_attention_heads}, {"num_hidden_layers", c.num_hidden_layers}});
    at_most(1 << 10, {{"n_shared_experts", c.n_shared_experts}});
    require(c.vocab_size >= 2, "vocab_size must be at least 2");
    require(c.hidden_size >= 1 && c.intermediate_size >= 1 && c.moe_intermediate_size >= 1,
            "hidden_size, intermediate_size and moe_intermediate_size must be positive");
    require(c.num_hidden_layers >= 1, "num_hidden_layers must be at least 1");
    require(c.num_attention_heads >= 1, "num_attention_heads must be at least 1");
    require(c.kv_lora_rank >= 1, "kv_lora_rank must be positive (MLA compresses keys and values)");
    require(c.qk_nope_head_dim >= 1 && c.v_head_dim >= 1, "qk_nope_head_dim and v_head_dim must be positive");
    require(c.qk_rope_head_dim >= 2 && c.qk_rope_head_dim % 2 == 0 && c.qk_rope_head_dim <= 1024,
            "qk_rope_head_dim must be even and between 2 and 1024");
    require(c.n_routed_experts >= 1, "n_routed_experts must be at least 1");
    require(c.n_group >= 1 && c.n_routed_experts % c.n_group == 0,
            "n_routed_experts (" + std::to_string(c.n_routed_experts) + ") must be divisible by n_group (" +
                std::to_string(c.n_group) + ")");
    require(c.n_group <= 64, "n_group must be at most 64");
    require(c.topk_group >= 1 && c.topk_group <= c.n_group, "topk_group must be between 1 and n_group");
    int allowed = c.topk_group * (c.n_routed_experts / c.n_group);
    require(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= allowed,
            "num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) +
                ") must be between 1 and the experts of the topk_group best groups (" + std::to_string(allowed) + ")");
    require(c.first_k_dense_replace >= 0 && c.first_k_dense_replace <= c.num_hidden_layers,
            "first_k_dense_replace must be between 0 and num_hidden_layers");
    require(c.num_nextn_predict_layers == 0 || c.num_nextn_predict_layers == 1,
            "num_nextn_predict_layers must be 0 or 1");
    require(c.rms_norm_eps > 0 && c.rope_theta > 0, "rms_norm_eps and rope_theta must be positive");
    require(c.routed_scaling_factor > 0, "routed_scaling_factor must be positive");
    require(c.initializer_range > 0, "initializer_range must be positive");
    require(c.aux_loss_alpha >= 0 && c.bias_update_speed >= 0 && c.mtp_loss_weight >= 0,
            "aux_loss_alpha, bias_update_speed and mtp_loss_weight must not be negative");
    require(c.yarn_factor >= 1.0f, "rope_scaling.factor must be at least 1");
    require(c.yarn_factor == 1.0f || (c.yarn_beta_fast > c.yarn_beta_slow && c.yarn_beta_slow > 0 &&
                                      c.yarn_original_max_position >= 1),
            "rope_scaling needs beta_fast > beta_slow > 0 and original_max_position_embeddings >= 1");
    require(c.max_position_embeddings >= 1, "max_position_embeddings must be positive");
    // Under the bounds above no block overflows int64 (< 2^58); the first, last and MTP blocks cover both kinds.
    const int64_t max_params = (int64_t)1 << 42;
    const int64_t largest_block =
        std::max({count_block_params(c, 0, false), count_block_params(c, c.num_hidden_layers - 1, false),
                  c.num_nextn_predict_layers > 0 ? count_block_params(c, c.num_hidden_layers, false) : 0});
    const int64_t total = largest_block > max_params ? largest_block : count_total_params(c) + count_mtp_params(c);
    if (total > max_params) {
        char msg[160];
        snprintf(msg, sizeof msg, "the config has %.3g parameters%s, above moe.cu's limit of %.3g", (double)total,
                 largest_block > max_params ? " in one block" : "", (double)max_params);
        throw std::runtime_error(msg);
    }
}

Config parse_config_file(const std::string& name) {
    if (const char* text = preset_json(name)) return parse_config_json(text, "preset " + name);
    if (access(name.c_str(), R_OK) != 0)
        throw std::runtime_error("config " + name +
                                 ": no such preset (tiny, small, deepseek-v2-lite, deepseek-v3) or readable file");
    std::string text;
    try {
        text = read_file(name, MAX_CONFIG_BYTES);
    } catch (const std::runtime_error& e) {
        throw std::runtime_error("config " + name + ": " + e.what());
    }
    return parse_config_json(text, "config " + name);
}

Config load_config(const std::string& name) {
    try {
        return parse_config_file(name);
    } catch (const std::runtime_error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        exit(1);
    }
}

// The shortest decimal that reads back as the same float: 1e-06, not the double 9.999999974752427e-07.
static json float_json(float v) {
    char buf[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof(buf), "%.*g", digits, v);
        if (strtof(buf, nullptr) == v) break;
    }
    return json(strtod(buf, nullptr));
}

std::string config_to_json(const Config& c) {
    json j;
    j["architectures"] = {"DeepseekV3ForCausalLM"};
    j["model_type"] = "deepseek_v3";
    for (const ConfigKey& k : config_keys)
        j[k.name] = k.i ? json(c.*k.i) : k.f ? float_json(c.*k.f) : json(c.norm_topk_prob);
    if (c.q_lora_rank == 0) j["q_lora_rank"] = nullptr;
    j["num_key_value_heads"] = c.num_attention_heads;
    j["moe_layer_freq"] = 1;
    j["hidden_act"] = "silu";
    j["scoring_func"] = "sigmoid";
    j["topk_method"] = "noaux_tc";
    j["tie_word_embeddings"] = false;
    if (c.yarn_factor > 1.0f)
        j["rope_scaling"] = {{"type", "yarn"}, {"factor", float_json(c.yarn_factor)},
                             {"original_max_position_embeddings", c.yarn_original_max_position},
                             {"beta_fast", float_json(c.yarn_beta_fast)}, {"beta_slow", float_json(c.yarn_beta_slow)},
                             {"mscale", float_json(c.yarn_mscale)}, {"mscale_all_dim", float_json(c.yarn_mscale_all_dim)}};
    else
        j["rope_scaling"] = nullptr;
    return j.dump(2);
}
