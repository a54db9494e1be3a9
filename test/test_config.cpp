// Tests of the model config (docs/design.md §1.6): presets, parameter counts against the published figures, real Hugging Face
// config.json files, rejection of invalid values with a message naming the key, unknown keys, JSON round trips.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

#include "model/config.h"
#include "model/params.h"
#include "test_helpers.h"

using nlohmann::json;


namespace {

const char* PRESETS[] = {"tiny", "small", "deepseek-v2-lite", "deepseek-v3"};

std::string read_file(const std::string& path) {
    std::ifstream f(path);
    REQUIRE_MESSAGE(f.good(), "cannot read " << path << " (run the tests from the repository root)");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

void check_same_config(const Config& a, const Config& b) {
#define SAME(field) CHECK_MESSAGE(a.field == b.field, #field)
    SAME(vocab_size); SAME(hidden_size); SAME(intermediate_size); SAME(moe_intermediate_size);
    SAME(num_hidden_layers); SAME(num_attention_heads); SAME(max_position_embeddings);
    SAME(q_lora_rank); SAME(kv_lora_rank); SAME(qk_nope_head_dim); SAME(qk_rope_head_dim); SAME(v_head_dim);
    SAME(n_routed_experts); SAME(n_shared_experts); SAME(num_experts_per_tok); SAME(n_group); SAME(topk_group);
    SAME(routed_scaling_factor); SAME(norm_topk_prob); SAME(first_k_dense_replace);
    SAME(num_nextn_predict_layers); SAME(mtp_loss_weight);
    SAME(rms_norm_eps); SAME(rope_theta); SAME(initializer_range);
    SAME(yarn_factor); SAME(yarn_original_max_position); SAME(yarn_beta_fast); SAME(yarn_beta_slow);
    SAME(yarn_mscale); SAME(yarn_mscale_all_dim);
    SAME(aux_loss_alpha); SAME(bias_update_speed);
#undef SAME
}

// The tiny preset as JSON with one key replaced.
std::string tiny_with(const std::string& key, const json& value) {
    json j = json::parse(config_to_json(load_config("tiny")));
    j[key] = value;
    return j.dump();
}

}  // namespace

TEST_CASE("config: presets load, validate, and count parameters like the published models") {
    for (const char* name : PRESETS) {
        CAPTURE(name);
        Config c = load_config(name);  // exits on error, so reaching the next line is the check
        CHECK_NOTHROW(validate_config(c));
        // The counts agree with the parameter table the trainer allocates: its trainable tensors are exactly the
        // main model (count_total_params) plus the MTP block (count_mtp_params); the correction biases are buffers.
        ParamTable table = build_param_table(c);
        int64_t trainable = 0;
        for (const ParamTensor& t : table.tensors) trainable += t.trainable ? t.numel : 0;
        CHECK(trainable == count_total_params(c) + count_mtp_params(c));
        CHECK(count_active_params(c) <= count_total_params(c));
    }
    Config v3 = load_config("deepseek-v3");
    CHECK(v3.hidden_size == 7168);
    CHECK(v3.num_hidden_layers == 61);
    CHECK(v3.n_group == 8);
    CHECK(v3.topk_group == 4);
    const double v3_total = (double)count_total_params(v3), v3_active = (double)count_active_params(v3);
    MESSAGE("deepseek-v3: total " << v3_total << ", active " << v3_active << ", mtp " << count_mtp_params(v3));
    CHECK_REL(v3_total, 671e9, 0.01);  // published: 671B total (MTP excluded)
    CHECK_REL(v3_active, 37e9, 0.02);  // published: 37B activated per token (36.63B here)

    Config lite = load_config("deepseek-v2-lite");
    CHECK(lite.q_lora_rank == 0);
    const double lite_total = (double)count_total_params(lite), lite_active = (double)count_active_params(lite);
    MESSAGE("deepseek-v2-lite: total " << lite_total << ", active " << lite_active);
    CHECK_REL(lite_total, 15.7e9, 0.01);  // published: 15.7B total
    // Published: 2.4B activated. By hand from the shapes (d 2048, V 102400, 27 layers, 1 dense of 10944, 26 MoE of
    // 64 + 2 shared experts of 1408, top-6, MLA 16 heads 128/64/128, kv_lora 512, no q_lora):
    //   attention 2048*16*192 + 2048*576 + 512 + 512*16*256 + 16*128*2048 = 13,895,168 per layer;
    //   dense SwiGLU 3*10944*2048 = 67,239,936; per MoE layer router 131,072 + (2 + 6) * 3*1408*2048 = 69,337,088;
    //   norms 4096 per layer; head 209,715,200; final norm 2048; the input embedding is a lookup, not counted.
    //   Sum = 2,451,435,008 = 2.45B (2.1% above the rounded published figure).
    CHECK(count_active_params(lite) == 2451435008LL);
}

TEST_CASE("config: real Hugging Face config.json files load as is") {
    // test/data/*.json are written by hand from the key set and values of the published config.json files of
    // deepseek-ai/DeepSeek-V3 and deepseek-ai/DeepSeek-V2-Lite (from memory, not downloaded), metadata included
    // (architectures, auto_map, model_type, torch_dtype, quantization_config, ...).
    std::string v3_note;
    Config v3;
    v3_note = capture_stderr([&] { v3 = parse_config_json(read_file("test/data/deepseek-v3-config.json"), "v3"); });
    CHECK(v3.hidden_size == 7168);
    CHECK(v3.q_lora_rank == 1536);
    CHECK(v3.n_routed_experts == 256);
    CHECK(v3.num_experts_per_tok == 8);
    CHECK(v3.n_group == 8);
    CHECK(v3.topk_group == 4);
    CHECK(v3.num_nextn_predict_layers == 1);
    CHECK(v3.first_k_dense_replace == 3);
    CHECK(v3.routed_scaling_factor == 2.5f);
    CHECK(v3.norm_topk_prob);
    CHECK(v3.yarn_factor == 40.0f);
    CHECK(v3.yarn_original_max_position == 4096);
    CHECK(v3.yarn_mscale_all_dim == 1.0f);
    CHECK(v3.aux_loss_alpha == 0.001f);
    CHECK(v3.vocab_size == 129280);
    CHECK(count_total_params(v3) == count_total_params(load_config("deepseek-v3")));  // same shapes as the preset
    CHECK_MESSAGE(v3_note.find("unknown key") == std::string::npos, v3_note);  // every published key is known

    Config lite;
    std::string lite_note = capture_stderr(
        [&] { lite = parse_config_json(read_file("test/data/deepseek-v2-lite-config.json"), "v2-lite"); });
    CHECK(lite.hidden_size == 2048);
    CHECK(lite.q_lora_rank == 0);  // "q_lora_rank": null
    CHECK(lite.n_routed_experts == 64);
    CHECK(lite.n_shared_experts == 2);
    CHECK(lite.num_experts_per_tok == 6);
    CHECK(lite.n_group == 1);
    CHECK(lite.topk_group == 1);
    CHECK(lite.num_nextn_predict_layers == 0);  // absent from V2 configs
    CHECK(!lite.norm_topk_prob);
    CHECK(lite.yarn_factor == 40.0f);
    CHECK(lite.yarn_mscale == 0.707f);
    CHECK(count_total_params(lite) == count_total_params(load_config("deepseek-v2-lite")));
    // softmax scoring and greedy top-k are V2's router: loading notes that the V3 router replaces them
    CHECK(lite_note.find("scoring_func") != std::string::npos);
    CHECK(lite_note.find("topk_method") != std::string::npos);
    CHECK_MESSAGE(lite_note.find("unknown key") == std::string::npos, lite_note);
}

TEST_CASE("config: invalid values throw naming the key") {
    auto rejects = [](const std::string& text, const char* key) {
        CAPTURE(text);
        CHECK_THROWS_WITH_AS(parse_config_json(text, "bad.json"), doctest::Contains(key), std::runtime_error);
        // and the message names the source
        CHECK_THROWS_WITH_AS(parse_config_json(text, "bad.json"), doctest::Contains("bad.json"), std::runtime_error);
    };
    rejects(tiny_with("n_group", 3), "n_group");                     // 8 experts in 3 groups
    rejects(tiny_with("n_routed_experts", 10), "n_routed_experts");  // 10 experts in tiny's 4 groups
    rejects(tiny_with("topk_group", 5), "topk_group");               // tiny has 4 groups
    rejects(tiny_with("num_experts_per_tok", 5), "num_experts_per_tok");  // 2 groups of 2 experts allow 4
    rejects(tiny_with("num_experts_per_tok", 0), "num_experts_per_tok");
    rejects(tiny_with("qk_rope_head_dim", 5), "qk_rope_head_dim");
    rejects(tiny_with("num_nextn_predict_layers", 2), "num_nextn_predict_layers");
    rejects(tiny_with("hidden_size", -64), "hidden_size");
    rejects(tiny_with("num_attention_heads", -1), "num_attention_heads");
    rejects(tiny_with("vocab_size", 0), "vocab_size");
    rejects(tiny_with("rms_norm_eps", -1e-6), "rms_norm_eps");
    rejects(tiny_with("aux_loss_alpha", -0.1), "aux_loss_alpha");
    rejects(tiny_with("first_k_dense_replace", 3), "first_k_dense_replace");  // tiny has 2 layers
    rejects(tiny_with("hidden_size", "big"), "hidden_size");
    rejects(tiny_with("hidden_size", 64.5), "hidden_size");
    rejects(tiny_with("routed_scaling_factor", "2.5"), "routed_scaling_factor");
    rejects(tiny_with("norm_topk_prob", 1), "norm_topk_prob");
    rejects(tiny_with("hidden_act", "gelu"), "hidden_act");
    rejects(tiny_with("tie_word_embeddings", true), "tie_word_embeddings");
    rejects(tiny_with("tie_word_embeddings", 1), "tie_word_embeddings");
    rejects(tiny_with("rope_scaling", json{{"type", "linear"}, {"factor", 2.0}}), "rope_scaling");
    rejects(tiny_with("rope_scaling", json{{"type", "yarn"}, {"factor", 0.5}}), "factor");
    rejects(tiny_with("rope_parameters", json{{"rope_type", "linear"}, {"factor", 2.0}}), "rope_parameters type");
    rejects(tiny_with("rope_parameters", json{{"rope_theta", 50000.0}}), "rope_theta");  // tiny says 10000 at the top
    rejects(tiny_with("rope_interleave", false), "rope_interleave must be true");
    rejects(tiny_with("qk_head_dim", 8), "qk_head_dim 8 is not qk_nope_head_dim + qk_rope_head_dim");
    rejects(R"({"hidden_size": 64,)", "malformed JSON");
    rejects("[1, 2, 3]", "JSON object");
    rejects("42", "JSON object");
    // validate_config on a Config built in code
    Config c;
    c.n_group = 3;
    CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("n_group"), std::runtime_error);
    c = Config();
    c.topk_group = 2;  // default n_group is 1
    CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("topk_group"), std::runtime_error);
    CHECK_NOTHROW(validate_config(Config()));
}

// transformers 5 writes rope_theta and the YaRN settings inside rope_parameters, rope_interleave, qk_head_dim and
// dtype: each is read or checked, none ignored with a note.
TEST_CASE("config: transformers 5's rope_parameters and rope_interleave") {
    json j = json::parse(config_to_json(load_config("tiny")));
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j["rope_interleave"] = true;
    j["rope_parameters"] = {{"rope_theta", 50000.0}, {"rope_type", "default"}};
    j["qk_head_dim"] = j["qk_nope_head_dim"].get<int>() + j["qk_rope_head_dim"].get<int>();  // as transformers 5 writes
    j["dtype"] = "float32";
    std::string notes;
    Config c;
    notes = capture_stderr([&] { c = parse_config_json(j.dump(), "t5.json"); });
    CHECK(c.rope_theta == 50000.0f);
    CHECK(c.yarn_factor == 1.0f);
    CHECK_MESSAGE(notes.empty(), notes);
    j["rope_parameters"] = {{"rope_theta", 10000.0}, {"rope_type", "yarn"}, {"factor", 40.0},
                            {"original_max_position_embeddings", 4096}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                            {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
    j["max_position_embeddings"] = 163840;
    c = parse_config_json(j.dump(), "t5.json");
    const Config v3 = load_config("deepseek-v3");
    CHECK(c.rope_theta == 10000.0f);
    CHECK(c.yarn_factor == v3.yarn_factor);
    CHECK(c.yarn_original_max_position == v3.yarn_original_max_position);
    CHECK(c.yarn_beta_fast == v3.yarn_beta_fast);
    CHECK(c.yarn_beta_slow == v3.yarn_beta_slow);
    CHECK(c.yarn_mscale == v3.yarn_mscale);
    CHECK(c.yarn_mscale_all_dim == v3.yarn_mscale_all_dim);
}

TEST_CASE("config: sizes beyond moe.cu's bounds are refused before anything is allocated") {
    auto rejects = [](const std::string& text, const std::string& what) {
        CAPTURE(text);
        CHECK_THROWS_WITH_AS(parse_config_json(text, "t.json"), doctest::Contains(what.c_str()), std::runtime_error);
    };
    // head dimensions whose int sum wrapped to a negative tensor size (a heap overflow before the bound)
    json j = json::parse(tiny_with("qk_nope_head_dim", 1 << 30));
    j["v_head_dim"] = 1 << 30;
    j["num_attention_heads"] = 1;
    rejects(j.dump(), "qk_nope_head_dim 1073741824 is above moe.cu's limit of 16384");
    rejects(tiny_with("num_hidden_layers", 1 << 30), "num_hidden_layers");  // a parameter table of 20 billion names
    rejects(tiny_with("vocab_size", (1 << 24) + 1), "vocab_size");
    rejects(tiny_with("n_routed_experts", 1 << 17), "n_routed_experts");
    // every dimension within its bound, the whole beyond 2^42 parameters: in one MoE block, or over the layers
    j = json::parse(tiny_with("hidden_size", 1 << 20));
    j["moe_intermediate_size"] = 1 << 20;
    j["n_routed_experts"] = 1 << 16;
    rejects(j.dump(), "parameters in one block, above moe.cu's limit of 4.4e+12");
    j = json::parse(tiny_with("hidden_size", 1 << 16));
    j["intermediate_size"] = 1 << 16;
    j["num_hidden_layers"] = 4096;
    j["first_k_dense_replace"] = 4096;
    rejects(j.dump(), "parameters, above moe.cu's limit of 4.4e+12");
    // every block of the main stack dense and small, the MTP block (always MoE) beyond the bound
    j = json::parse(tiny_with("hidden_size", 1 << 16));
    j["moe_intermediate_size"] = 1 << 20;
    j["n_routed_experts"] = 1 << 16;
    j["first_k_dense_replace"] = j["num_hidden_layers"];
    j["num_nextn_predict_layers"] = 1;
    rejects(j.dump(), "parameters in one block, above moe.cu's limit of 4.4e+12");
}

TEST_CASE("config: unknown keys are reported, not an error") {
    Config c;
    std::string note = capture_stderr([&] { c = parse_config_json(tiny_with("my_unknown_key", 7), "extra.json"); });
    CHECK(note.find("my_unknown_key") != std::string::npos);
    CHECK(note.find("extra.json") != std::string::npos);
    check_same_config(c, load_config("tiny"));  // and nothing else changed
}

TEST_CASE("config: config_to_json round trips every preset") {
    for (const char* name : PRESETS) {
        CAPTURE(name);
        Config c = load_config(name);
        Config back;
        std::string note = capture_stderr([&] { back = parse_config_json(config_to_json(c), name); });
        check_same_config(c, back);
        CHECK_MESSAGE(note.empty(), note);  // the written document has no key the reader does not know
    }
    // a config with every field away from its default survives too
    Config c = load_config("deepseek-v3");
    c.mtp_loss_weight = 0.125f;
    c.bias_update_speed = 0.0005f;
    c.rms_norm_eps = 1e-5f;
    c.yarn_beta_fast = 16.0f;
    c.yarn_mscale = 0.707f;
    check_same_config(c, parse_config_json(config_to_json(c), "round trip"));
}
