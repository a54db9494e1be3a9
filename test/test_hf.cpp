// Hugging Face export/import (io/hf.h): bit-exact F32 round trips and the identical next training
// step, BF16 rounding checked against an independent rounding, the published tensor naming, sharded directories,
// and one-line errors that leave the model untouched.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "comm/comm.h"
#include "io/hf.h"
#include "io/safetensors.h"
#include "test_helpers.h"

namespace {

std::string temp_dir() {
    char pattern[] = "/tmp/moe_hf_XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    return pattern;
}

void remove_dir(const std::string& dir) { REQUIRE(system(("rm -rf '" + dir + "'").c_str()) == 0); }

void spit(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    REQUIRE(f.good());
}

Model tiny_model(uint64_t seed) {
    Model m;
    model_init(m, load_config("tiny"));  // tiny has MTP, q_lora, a dense layer, shared experts
    randomize_for_test(m, seed);
    return m;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// Every tensor of a safetensors file, bytes included (small files only).
struct RawTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
};
std::vector<RawTensor> read_all(const std::string& path) {
    SafetensorsReader r(path);
    std::vector<RawTensor> out;
    for (const auto& kv : r.tensors()) {
        RawTensor t{kv.first, kv.second.dtype, kv.second.shape, std::string(kv.second.end - kv.second.begin, '\0')};
        r.read(t.name, t.dtype, t.shape, &t.bytes[0]);
        out.push_back(t);
    }
    return out;
}
void write_all(const std::string& path, const std::vector<RawTensor>& ts) {
    std::vector<TensorView> views;
    for (const RawTensor& t : ts) views.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
    safetensors_write(path, views, {{"format", "pt"}});
}

// A copy of the F32 export in SRC, with its tensors edited, as DST (which gets SRC's config.json).
std::string edited_copy(const std::string& src, const std::string& dst,
                        const std::function<void(std::vector<RawTensor>&)>& edit) {
    REQUIRE(system(("mkdir -p '" + dst + "'").c_str()) == 0);
    std::vector<RawTensor> ts = read_all(src + "/model.safetensors");
    edit(ts);
    write_all(dst + "/model.safetensors", ts);
    spit(dst + "/config.json", slurp(src + "/config.json"));
    return dst;
}

}  // namespace

TEST_CASE("hf: F32 export then import is bit-identical, and the next training step is identical") {
    std::string dir = temp_dir();
    Model m = tiny_model(11);
    export_hf(m, dir + "/out", ExportDType::F32);
    Model m2;
    model_init(m2, hf_config(dir + "/out"));
    REQUIRE(m2.table.total == m.table.total);
    import_hf(m2, dir + "/out");
    CHECK(same_bits(m.params, m2.params));

    // one forward/backward on the same batch: the same loss and the same gradients, bit for bit
    const int B = 2, T = 8;
    std::vector<int32_t> tok = random_tokens(B * T + 1, m.config.vocab_size, 3), in(B * T), tg(B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) in[b * T + t] = tok[b * T + t], tg[b * T + t] = tok[b * T + t + 1];
    LossParts l1 = model_forward(m, in.data(), tg.data(), B, T, true);
    model_backward(m, 1.0f);
    LossParts l2 = model_forward(m2, in.data(), tg.data(), B, T, true);
    model_backward(m2, 1.0f);
    CHECK(l1.total == l2.total);
    CHECK(l1.mtp == l2.mtp);
    CHECK(same_bits(m.grads, m2.grads));
    CHECK(m.expert_counts == m2.expert_counts);
    remove_dir(dir);
}

// transformers' default config declares an MTP layer that its model does not have, so its checkpoints hold none of
// the MTP block's tensors: the block keeps its initialisation, with a note. With n_shared_experts 0 it saves shared
// experts of width 0: those empty tensors are passed over.
TEST_CASE("hf: a checkpoint without the MTP block's tensors, or with empty shared experts, loads") {
    std::string dir = temp_dir();
    Model src = tiny_model(31);
    export_hf(src, dir + "/full", ExportDType::F32);
    const std::string mtp = "model.layers." + std::to_string(src.config.num_hidden_layers) + ".";
    edited_copy(dir + "/full", dir + "/no_mtp", [&](std::vector<RawTensor>& ts) {
        ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const RawTensor& t) { return t.name.rfind(mtp, 0) == 0; }),
                 ts.end());
    });
    Model m = tiny_model(32);
    const std::vector<float> before = m.params;
    const std::string notes = capture_stderr([&] { import_hf(m, dir + "/no_mtp"); });
    CHECK(notes.find("no weights of the MTP block") != std::string::npos);
    for (const ParamTensor& t : m.table.tensors) {
        CAPTURE(t.name);
        const std::vector<float>& want = t.name.rfind(mtp, 0) == 0 ? before : src.params;
        CHECK(std::equal(m.params.begin() + t.offset, m.params.begin() + t.offset + t.numel, want.begin() + t.offset));
    }

    Config c = src.config;
    c.n_shared_experts = 0;
    Model plain;
    model_init(plain, c);
    randomize_for_test(plain, 33);
    export_hf(plain, dir + "/plain", ExportDType::F32);
    const std::string shared = "model.layers.1.mlp.shared_experts.";
    edited_copy(dir + "/plain", dir + "/empty_shared", [&](std::vector<RawTensor>& ts) {
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
            ts.push_back({shared + proj + ".weight", DType::F32, {0, c.hidden_size}, ""});
    });
    Model m2;
    model_init(m2, c);
    import_hf(m2, dir + "/empty_shared");
    CHECK(same_bits(m2.params, plain.params));
    remove_dir(dir);
}

// A NaN or inf anywhere, the router's correction bias included, is refused naming the tensor: it would train on
// (the bias only selects experts) and be exported as it is.
TEST_CASE("hf: weights that hold NaN or inf are refused at import") {
    std::string dir = temp_dir();
    for (const bool in_bias : {true, false}) {
        Model m = tiny_model(21);
        const std::string name =
            in_bias ? "model.layers.1.mlp.gate.e_score_correction_bias" : "model.layers.0.self_attn.o_proj.weight";
        m.params[m.table.at(name).offset + 2] = in_bias ? NAN : -INFINITY;
        export_hf(m, dir + "/bad", ExportDType::F32);
        Model m2 = tiny_model(22);
        const std::string expected = "tensor '" + name + "' (element 2) is NaN or inf";
        CHECK_THROWS_WITH_AS(import_hf(m2, dir + "/bad"), doctest::Contains(expected.c_str()), std::runtime_error);
    }
    remove_dir(dir);
}

TEST_CASE("hf: BF16 export rounds to nearest even; the router bias stays F32") {
    std::string dir = temp_dir();
    Model m = tiny_model(12);
    // hand-picked values and their BF16 roundings, written out in bits
    const uint32_t cases[][2] = {
        {0x3F80C000u, 0x3F810000u},  // above the halfway point: rounds up
        {0x3F804000u, 0x3F800000u},  // below: rounds down
        {0x3F808000u, 0x3F800000u},  // a tie, 0x3F80 is even: stays
        {0x3F818000u, 0x3F820000u},  // a tie, 0x3F81 is odd: goes up to the even 0x3F82
        {0xBF80C000u, 0xBF810000u},  // negative, rounds away from zero (to the nearer)
        {0xBF818000u, 0xBF820000u},  // negative tie to even
        {0xBE4CCCCDu, 0xBE4D0000u},  // -0.2
        {0x3F7FFFFFu, 0x3F800000u},  // the carry runs into the exponent: 1.0
    };
    const int n_cases = sizeof(cases) / sizeof(cases[0]);
    const ParamTensor& emb = m.table.at("model.embed_tokens.weight");
    const ParamTensor& expert = m.table.at("model.layers.1.mlp.experts.down_proj.weight");
    const int64_t expert5 = expert.offset + 5 * expert.shape[1] * expert.shape[2] + 3;  // expert 5, element 3
    for (int i = 0; i < n_cases; i++) m.params[emb.offset + i] = from_bits(cases[i][0]);
    m.params[expert5] = from_bits(cases[3][0]);
    const ParamTensor& bias = m.table.at("model.layers.1.mlp.gate.e_score_correction_bias");
    m.params[bias.offset] = from_bits(0x3C23D70Bu);  // not representable in BF16
    export_hf(m, dir, ExportDType::BF16);
    Model m2;
    model_init(m2, hf_config(dir));
    import_hf(m2, dir);
    for (int i = 0; i < n_cases; i++) CHECK(bits(m2.params[emb.offset + i]) == cases[i][1]);
    CHECK(bits(m2.params[expert5]) == cases[3][1]);
    CHECK(bits(m2.params[bias.offset]) == 0x3C23D70Bu);
    // every value: the independent rounding, except the router biases, which are exact
    int64_t wrong = 0;
    for (const ParamTensor& t : m.table.tensors)
        for (int64_t i = t.offset; i < t.offset + t.numel; i++) {
            const float want = t.trainable ? bf16_reference(m.params[i]) : m.params[i];
            wrong += bits(m2.params[i]) != bits(want);
        }
    CHECK(wrong == 0);
    SafetensorsReader r(dir + "/model.safetensors");
    CHECK(r.info("model.layers.1.mlp.gate.e_score_correction_bias").dtype == DType::F32);
    CHECK(r.info("model.layers.1.mlp.gate.weight").dtype == DType::BF16);
    CHECK(r.info("model.layers.1.mlp.experts.0.up_proj.weight").dtype == DType::BF16);
    remove_dir(dir);
}

TEST_CASE("hf: the exported file has the published names and shapes, and config.json parses back") {
    std::string dir = temp_dir();
    Model m = tiny_model(13);
    const Config& c = m.config;
    export_hf(m, dir, ExportDType::F32);
    SafetensorsReader r(dir + "/model.safetensors");
    CHECK(r.metadata_value("format") == "pt");
    const int64_t d = c.hidden_size, I = c.moe_intermediate_size, E = c.n_routed_experts, V = c.vocab_size;
    int moe_layers = 0;
    for (int l = 0; l < c.num_blocks(); l++) {
        const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
        if (!c.is_moe_layer(l)) {
            CHECK(!r.has(p + "0.gate_proj.weight"));
            continue;
        }
        moe_layers++;
        for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
            CHECK(!r.has(p + w + ".weight"));  // no stacked tensors
            for (int64_t e = 0; e < E; e++) {
                const std::string name = p + std::to_string(e) + "." + w + ".weight";
                REQUIRE(r.has(name));
                CHECK(r.info(name).shape == (std::string(w) == "down_proj" ? std::vector<int64_t>{d, I}
                                                                           : std::vector<int64_t>{I, d}));
            }
        }
    }
    CHECK(moe_layers == 2);  // layer 1 and the MTP block
    // expert 5 of layer 1 is slice 5 of the stacked tensor
    const ParamTensor& st = m.table.at("model.layers.1.mlp.experts.down_proj.weight");
    std::vector<float> slice(d * I);
    r.read("model.layers.1.mlp.experts.5.down_proj.weight", DType::F32, {d, I}, slice.data());
    CHECK(memcmp(slice.data(), m.params.data() + st.offset + 5 * d * I, slice.size() * 4) == 0);
    // the MTP layer, as in the published DeepSeek-V3 checkpoint
    const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    CHECK(r.info(mtp + "enorm.weight").shape == std::vector<int64_t>{d});
    CHECK(r.info(mtp + "hnorm.weight").shape == std::vector<int64_t>{d});
    CHECK(r.info(mtp + "eh_proj.weight").shape == std::vector<int64_t>{d, 2 * d});
    CHECK(r.info(mtp + "shared_head.norm.weight").shape == std::vector<int64_t>{d});
    CHECK(r.has(mtp + "self_attn.q_a_proj.weight"));
    std::vector<float> copy(V * d);
    r.read(mtp + "embed_tokens.weight", DType::F32, {V, d}, copy.data());
    CHECK(memcmp(copy.data(), m.params.data() + m.table.at("model.embed_tokens.weight").offset, copy.size() * 4) == 0);
    r.read(mtp + "shared_head.head.weight", DType::F32, {V, d}, copy.data());
    CHECK(memcmp(copy.data(), m.params.data() + m.table.at("lm_head.weight").offset, copy.size() * 4) == 0);
    // the count: the table, stacked experts expanded, plus the two MTP copies
    CHECK(r.tensors().size() == m.table.tensors.size() + (size_t)moe_layers * 3 * (E - 1) + 2);
    // config.json
    const std::string text = slurp(dir + "/config.json");
    CHECK(nlohmann::json::parse(text)["model_type"] == "deepseek_v3");
    CHECK(nlohmann::json::parse(text)["torch_dtype"] == "float32");
    Config back = parse_config_json(text, "config.json");
    CHECK(build_param_table(back).total == m.table.total);
    CHECK(back.hidden_size == c.hidden_size);
    CHECK(back.n_routed_experts == c.n_routed_experts);
    CHECK(back.q_lora_rank == c.q_lora_rank);
    CHECK(back.num_nextn_predict_layers == c.num_nextn_predict_layers);
    CHECK(back.first_k_dense_replace == c.first_k_dense_replace);
    // no temporary files left
    CHECK(system(("test -z \"$(ls " + dir + " | grep tmp)\"").c_str()) == 0);
    remove_dir(dir);
}

TEST_CASE("hf: a sharded directory (model.safetensors.index.json) loads, BF16 and F32 shards mixed") {
    std::string dir = temp_dir();
    Model m = tiny_model(14);
    export_hf(m, dir + "/f32", ExportDType::F32);
    export_hf(m, dir + "/bf16", ExportDType::BF16);
    std::vector<RawTensor> a = read_all(dir + "/f32/model.safetensors"), b = read_all(dir + "/bf16/model.safetensors");
    REQUIRE(a.size() == b.size());
    // first half of the names from the F32 file, second half from the BF16 file
    std::vector<RawTensor> s1(a.begin(), a.begin() + a.size() / 2), s2(b.begin() + b.size() / 2, b.end());
    const std::string out = dir + "/sharded";
    REQUIRE(system(("mkdir -p " + out).c_str()) == 0);
    write_all(out + "/model-00001-of-00002.safetensors", s1);
    write_all(out + "/model-00002-of-00002.safetensors", s2);
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    for (const RawTensor& t : s1) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
    for (const RawTensor& t : s2) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
    spit(out + "/model.safetensors.index.json", index.dump(2));
    spit(out + "/config.json", slurp(dir + "/f32/config.json"));

    Model whole, sharded;
    model_init(whole, hf_config(dir + "/bf16"));
    import_hf(whole, dir + "/bf16");
    model_init(sharded, hf_config(out));
    import_hf(sharded, out);
    std::set<std::string> from_f32;
    for (const RawTensor& t : s1) from_f32.insert(t.name);
    int64_t wrong = 0, n_f32 = 0;
    for (const ParamTensor& t : m.table.tensors) {
        // a stacked expert tensor comes from one file or the other per expert: compare per expert
        const bool stacked = t.shape.size() == 3;
        const int64_t parts = stacked ? t.shape[0] : 1, n = t.numel / parts;
        for (int64_t e = 0; e < parts; e++) {
            std::string name = t.name;
            if (stacked) name.insert(name.find(".mlp.experts.") + 13, std::to_string(e) + ".");
            const bool f32 = from_f32.count(name) > 0;
            n_f32 += f32;
            const std::vector<float>& want = f32 ? m.params : whole.params;
            const int64_t at = t.offset + e * n;
            wrong += memcmp(sharded.params.data() + at, want.data() + at, n * 4) != 0;
        }
    }
    CHECK(wrong == 0);
    CHECK(n_f32 > 10);
    remove_dir(dir);
}

TEST_CASE("hf: bad checkpoints give one-line errors naming the tensor and file, and leave the model unchanged") {
    std::string dir = temp_dir();
    Model src = tiny_model(15);
    const std::string good = dir + "/good";
    export_hf(src, good, ExportDType::F32);
    Model m = tiny_model(16);  // the model the bad checkpoints are loaded into
    const std::vector<float> before = m.params;
    auto fails = [&](const std::string& d, const std::string& a, const std::string& b) {
        std::string msg;
        try {
            import_hf(m, d);
        } catch (const std::runtime_error& e) {
            msg = e.what();
        }
        CAPTURE(msg);
        CHECK(msg.find(a) != std::string::npos);
        CHECK(msg.find(b) != std::string::npos);
        CHECK(msg.find('\n') == std::string::npos);  // one line
        CHECK(same_bits(m.params, before));
    };
    const std::string victim = "model.layers.1.mlp.experts.3.up_proj.weight";
    auto find = [&](std::vector<RawTensor>& ts, const std::string& name) -> RawTensor& {
        for (RawTensor& t : ts)
            if (t.name == name) return t;
        FAIL("no tensor " << name);
        return ts[0];
    };

    SUBCASE("a missing tensor") {
        std::string d = edited_copy(good, dir + "/missing", [&](std::vector<RawTensor>& ts) {
            ts.erase(std::find_if(ts.begin(), ts.end(), [&](const RawTensor& t) { return t.name == victim; }));
        });
        fails(d, "tensor '" + victim + "' is missing", d + "/model.safetensors");
    }
    SUBCASE("a wrong shape") {
        std::string d = edited_copy(good, dir + "/shape", [&](std::vector<RawTensor>& ts) {
            RawTensor& t = find(ts, victim);
            std::swap(t.shape[0], t.shape[1]);
        });
        fails(d, "'" + victim + "' has shape [32,16], the model needs [16,32]", d + "/model.safetensors");
    }
    SUBCASE("a dtype the importer does not load (I32)") {
        std::string d = edited_copy(good, dir + "/i32", [&](std::vector<RawTensor>& ts) { find(ts, victim).dtype = DType::I32; });
        fails(d, "'" + victim + "' has dtype I32", d + "/model.safetensors");
    }
    SUBCASE("a dtype unknown to the reader (F16, F8_E4M3)") {
        std::string d = edited_copy(good, dir + "/f16", [](std::vector<RawTensor>&) {});
        std::string bytes = slurp(d + "/model.safetensors");
        size_t at = bytes.find("\"dtype\":\"F32\"");
        REQUIRE(at != std::string::npos);
        bytes.replace(at, 13, "\"dtype\":\"F16\"");  // the header keeps its length
        spit(d + "/model.safetensors", bytes);
        fails(d, "unsupported dtype \"F16\"", d + "/model.safetensors");
        at = bytes.find("\"dtype\":\"F32\"");
        bytes.replace(at, 13, "\"dtype\":\"F8_E4M3\"");
        uint64_t len;
        memcpy(&len, bytes.data(), 8);
        len += 4;  // the header grew by 4 bytes
        bytes.replace(0, 8, std::string((const char*)&len, 8));
        spit(d + "/model.safetensors", bytes);
        fails(d, "unsupported dtype", "model.safetensors");
    }
    SUBCASE("an extra tensor of another architecture") {
        std::string d = edited_copy(good, dir + "/extra", [](std::vector<RawTensor>& ts) {
            ts.push_back({"model.layers.0.self_attn.k_proj.weight", DType::F32, {2, 2}, std::string(16, '\0')});
        });
        fails(d, "unexpected tensor 'model.layers.0.self_attn.k_proj.weight'", d + "/model.safetensors");
    }
    SUBCASE("weights of another config: more experts, and no q_lora") {
        Config c = src.config;
        c.n_routed_experts = 16;
        Model other;
        model_init(other, c);
        export_hf(other, dir + "/e16", ExportDType::BF16);
        fails(dir + "/e16", "'model.layers.1.mlp.gate.weight' has shape [16,32], the model needs [8,32]", "config.json");
        c = src.config;
        c.q_lora_rank = 0;
        model_init(other, c);
        export_hf(other, dir + "/noq", ExportDType::BF16);
        fails(dir + "/noq", "tensor 'model.layers.0.self_attn.q_a_proj.weight' is missing",
              "the checkpoint has 'model.layers.0.self_attn.q_proj.weight' instead");
    }
    SUBCASE("no weights, a missing config.json, another model_type or router") {
        REQUIRE(system(("mkdir -p " + dir + "/empty").c_str()) == 0);
        fails(dir + "/empty", dir + "/empty", "neither model.safetensors nor model.safetensors.index.json");
        CHECK_THROWS_WITH_AS(hf_config(dir + "/empty"), doctest::Contains((dir + "/empty/config.json").c_str()), std::runtime_error);
        spit(dir + "/empty/config.json", "{\"model_type\": \"llama\", \"hidden_size\": 64}");
        CHECK_THROWS_WITH_AS(hf_config(dir + "/empty"), doctest::Contains("model_type \"llama\""), std::runtime_error);
        spit(dir + "/empty/config.json", "{\"model_type\": \"deepseek_v3\", \"hidden_size\": ");
        CHECK_THROWS_WITH_AS(hf_config(dir + "/empty"), doctest::Contains("malformed JSON"), std::runtime_error);
        // DeepSeek-V2's weights were trained with its softmax router: importing them under V3's would mislead
        REQUIRE(system(("cp test/data/deepseek-v2-lite-config.json " + dir + "/empty/config.json").c_str()) == 0);
        CHECK_THROWS_WITH_AS(hf_config(dir + "/empty"), doctest::Contains("scoring_func \"softmax\""),
                             std::runtime_error);
    }
    SUBCASE("an index that points at a missing file, or at a file without the tensor") {
        const std::string d = dir + "/index";
        REQUIRE(system(("mkdir -p " + d + " && cp " + good + "/model.safetensors " + d + "/a.safetensors").c_str()) == 0);
        nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
        SafetensorsReader a(d + "/a.safetensors");
        for (const auto& kv : a.tensors()) index["weight_map"][kv.first] = "a.safetensors";
        index["weight_map"][victim] = "b.safetensors";
        spit(d + "/model.safetensors.index.json", index.dump());
        fails(d, d + "/b.safetensors", "does not exist");
        index["weight_map"]["model.norm.weight"] = "a.safetensors";
        index["weight_map"]["lm_head.weight"] = "c.safetensors";
        index["weight_map"][victim] = "a.safetensors";
        REQUIRE(system(("cp " + good + "/model.safetensors " + d + "/c.safetensors").c_str()) == 0);
        spit(d + "/model.safetensors.index.json", index.dump());
        import_hf(m, d);  // every tensor where the index says: loads
        CHECK(same_bits(m.params, src.params));
        m.params = before;
        write_all(d + "/c.safetensors", {});
        fails(d, "'lm_head.weight' at " + d + "/c.safetensors", "which does not hold it");
        spit(d + "/model.safetensors.index.json", "{\"weights\": {}}");
        fails(d, "model.safetensors.index.json", "no \"weight_map\"");
    }
    remove_dir(dir);
}

namespace {
// A stand-in for one rank of an expert-parallel group: import and export use only its ep_size and ep_rank.
struct FakeEPComm : Comm {
    FakeEPComm(int size, int rank) { ep_size = world = size, ep_rank = this->rank = rank; }
    void all_reduce_sum(float*, int64_t, Group) override {}
    void all_reduce_sum(double*, int64_t, Group) override {}
    void all_reduce_sum(int64_t*, int64_t, Group) override {}
    void all_to_all(const int64_t*, int64_t*, int64_t) override {}
    void all_to_all_v(const float*, const int64_t*, float*, const int64_t*, int64_t) override {}
    void reduce_scatter_sum(float*, int64_t, Group) override {}
    void all_gather(float*, int64_t, Group) override {}
    void all_gather(uint16_t*, int64_t, Group) override {}
    void pipe_exchange(const PipeTransfer*, int) override {}
    void broadcast(void*, int64_t, int) override {}
    void barrier() override {}
    [[noreturn]] void abort(const std::string& message) override { throw std::runtime_error(message); }
};
}  // namespace

TEST_CASE("hf: each pipeline stage imports its own tensors of the whole model's files; export needs every stage") {
    std::string dir = temp_dir();
    Model full = tiny_model(19);
    export_hf(full, dir + "/all", ExportDType::F32);
    const Config c = hf_config(dir + "/all");  // tiny: 2 layers, MTP
    for (auto [first, end] : std::vector<std::pair<int, int>>{{0, 1}, {1, -1}}) {
        CAPTURE(first);
        Model stage;
        model_init(stage, c, nullptr, first, end);
        const std::string said = capture_stderr([&] { import_hf(stage, dir + "/all"); });
        CHECK(said.find("MTP") == std::string::npos);  // the MTP block is in the files, the stage's or not
        int64_t wrong = 0;
        for (const ParamTensor& t : stage.table.tensors) {
            const ParamTensor& f = full.table.at(t.name);
            wrong += memcmp(stage.params.data() + t.offset, full.params.data() + f.offset, t.numel * 4) != 0;
        }
        CHECK(wrong == 0);
        CHECK(stage.table.tensors.size() < full.table.tensors.size());
        CHECK_THROWS_WITH_AS(export_hf(stage, dir + "/no", ExportDType::F32), doctest::Contains("pipeline stage"),
                             std::runtime_error);
    }
    remove_dir(dir);
}

TEST_CASE("hf: an expert-parallel rank imports its own experts only; export needs all experts") {
    std::string dir = temp_dir();
    Model full = tiny_model(17);
    export_hf(full, dir + "/all", ExportDType::F32);
    // rank 1's expert 6 of layer 1 is missing: rank 0 does not read it, rank 1 reports it
    const std::string lost = "model.layers.1.mlp.experts.6.gate_proj.weight";
    edited_copy(dir + "/all", dir + "/lost", [&](std::vector<RawTensor>& ts) {
        ts.erase(std::find_if(ts.begin(), ts.end(), [&](const RawTensor& t) { return t.name == lost; }));
    });
    for (int rank = 0; rank < 2; rank++) {
        CAPTURE(rank);
        FakeEPComm comm(2, rank);
        Model m;
        model_init(m, hf_config(dir + "/all"), &comm);
        import_hf(m, dir + "/all");
        int64_t wrong = 0;
        for (const ParamTensor& t : m.table.tensors) {
            const ParamTensor& f = full.table.at(t.name);
            const int64_t skip = t.expert_shard ? rank * t.numel : 0;  // this rank's experts: [rank*E/2, (rank+1)*E/2)
            wrong += memcmp(m.params.data() + t.offset, full.params.data() + f.offset + skip, t.numel * 4) != 0;
        }
        CHECK(wrong == 0);
        CHECK_THROWS_WITH_AS(export_hf(m, dir + "/no", ExportDType::F32), doctest::Contains("routed experts"),
                             std::runtime_error);
        if (rank == 0) {
            CHECK_NOTHROW(import_hf(m, dir + "/lost"));
        } else {
            CHECK_THROWS_WITH_AS(import_hf(m, dir + "/lost"), doctest::Contains(("'" + lost + "' is missing").c_str()),
                                 std::runtime_error);
        }
    }
    remove_dir(dir);
}
