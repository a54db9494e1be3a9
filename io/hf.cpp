// Hugging Face export and import (see hf.h). Both directions share one list, hf_tensors: each entry a published
// name, a shape and a contiguous range of the parameter buffer (a routed expert is a slice of its stacked tensor).
// Export writes it with safetensors_write; import checks it against the files' headers, then reads it.
#include "io/hf.h"

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <sys/stat.h>

#include "comm/comm.h"
#include "io/safetensors.h"

using nlohmann::json;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

namespace {

struct HFTensor {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset, numel;  // floats into the parameter buffer; offset -1: an expert another EP rank holds
    bool keep_f32;          // e_score_correction_bias: always written in F32
};

// Every parameter of a table under its Hugging Face name, in table order. A stacked tensor becomes one tensor per
// expert, all E of them; those of other EP ranks than ep_rank have offset -1.
std::vector<HFTensor> hf_tensors(const ParamTable& table, const Config& c, int64_t ep_rank) {
    const std::string stacked = ".mlp.experts.";
    std::vector<HFTensor> out;
    for (const ParamTensor& t : table.tensors) {
        size_t at = t.name.find(stacked);
        if (at == std::string::npos) {
            out.push_back({t.name, t.shape, t.offset, t.numel, !t.trainable});
            continue;
        }
        // model.layers.N.mlp.experts.gate_proj.weight (E, o, i) -> ...mlp.experts.E.gate_proj.weight (o, i)
        const std::string head = t.name.substr(0, at + stacked.size()), tail = t.name.substr(at + stacked.size());
        const int64_t n = t.shape[1] * t.shape[2], local = t.shape[0], first = ep_rank * local;
        for (int64_t e = 0; e < c.n_routed_experts; e++) {
            const bool here = e >= first && e < first + local;
            out.push_back({head + std::to_string(e) + "." + tail, {t.shape[1], t.shape[2]},
                           here ? t.offset + (e - first) * n : -1, n, false});
        }
    }
    return out;
}

// The published checkpoints repeat the shared embedding and output head inside the MTP layer (a whole model's table).
std::vector<HFTensor> mtp_copies(const ParamTable& table, const Config& c) {
    if (c.num_nextn_predict_layers == 0) return {};
    const std::string p = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    const ParamTensor &e = table.at("model.embed_tokens.weight"), &h = table.at("lm_head.weight");
    return {{p + "embed_tokens.weight", e.shape, e.offset, e.numel, false},
            {p + "shared_head.head.weight", h.shape, h.offset, h.numel, false}};
}

std::string shape_str(const std::vector<int64_t>& s) { return json(s).dump(); }

bool is_file(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

void export_hf(const Model& m, const std::string& dir, ExportDType dtype) {
    if (m.comm->ep_size > 1)
        throw std::runtime_error("export_hf: this rank holds 1/" + std::to_string(m.comm->ep_size) +
                                 " of the routed experts; export a model that holds them all");
    if (!m.first_stage() || !m.last_stage())
        throw std::runtime_error("export_hf: this rank holds one pipeline stage; export a model that holds them all");
    make_dirs(dir);
    std::vector<HFTensor> ts = hf_tensors(m.table, m.config, 0), copies = mtp_copies(m.table, m.config);
    ts.insert(ts.end(), copies.begin(), copies.end());
    std::vector<TensorView> views;
    for (const HFTensor& t : ts)
        views.push_back({t.name, dtype == ExportDType::F32 || t.keep_f32 ? DType::F32 : DType::BF16, t.shape,
                         m.params.data() + t.offset, DType::F32});
    safetensors_write(dir + "/model.safetensors", views, {{"format", "pt"}});  // what transformers expects
    json config_json = json::parse(config_to_json(m.config));
    config_json["torch_dtype"] = dtype == ExportDType::F32 ? "float32" : "bfloat16";
    write_file_atomic(dir + "/config.json", config_json.dump(2) + "\n");
}

Config hf_config(const std::string& dir) {
    const std::string path = dir + "/config.json";
    if (!is_file(path)) throw std::runtime_error(path + ": not found (not a Hugging Face model directory?)");
    const std::string text = read_file(path, MAX_CONFIG_BYTES);
    json j = json::parse(text, nullptr, false);
    if (j.is_object() && j.contains("model_type")) {
        const json& t = j["model_type"];
        if (t != "deepseek_v3" && t != "deepseek_v2")
            throw std::runtime_error(path + ": model_type " + t.dump() + " is not deepseek_v3 (or deepseek_v2)");
    }
    // a config alone may take DeepSeek-V3's router instead (a note says so); weights trained with another may not
    for (const auto& [key, value] : {std::pair{"scoring_func", "sigmoid"}, std::pair{"topk_method", "noaux_tc"}})
        if (j.is_object() && j.contains(key) && j[key] != value)
            throw std::runtime_error(path + ": " + key + " " + j[key].dump() + ": weights trained with it need " +
                                     "another router than moe.cu's (" + key + " \"" + value + "\")");
    return parse_config_json(text, path);  // reports malformed JSON and bad values
}

void import_hf(Model& m, const std::string& dir) {
    // Where each tensor lives: file path by tensor name, and one open reader per file.
    std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
    std::map<std::string, std::string> where;
    const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
    std::string source = single;  // named when a tensor is missing
    if (is_file(single)) {
        readers[single].reset(new SafetensorsReader(single));
        for (const auto& kv : readers[single]->tensors()) where[kv.first] = single;
    } else if (is_file(index)) {
        source = index;
        json j = json::parse(read_file(index, 1 << 28), nullptr, false);
        if (j.is_discarded()) throw std::runtime_error(index + ": malformed JSON");
        if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
            throw std::runtime_error(index + ": no \"weight_map\" object");
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (!it.value().is_string())
                throw std::runtime_error(index + ": weight_map entry of '" + it.key() + "' is not a file name");
            const std::string path = dir + "/" + it.value().get<std::string>();
            if (!readers.count(path)) {
                if (!is_file(path))
                    throw std::runtime_error(index + ": weight_map points '" + it.key() + "' at " + path +
                                             ", which does not exist");
                readers[path].reset(new SafetensorsReader(path));
            }
            if (!readers[path]->has(it.key()))
                throw std::runtime_error(index + ": weight_map points '" + it.key() + "' at " + path +
                                         ", which does not hold it");
            where[it.key()] = path;
        }
    } else {
        throw std::runtime_error(dir + ": neither model.safetensors nor model.safetensors.index.json found");
    }

    // Check everything before reading any data: this rank reads its stage's tensors (need) and accepts the whole
    // model's (known).
    const Config& c = m.config;
    const std::vector<HFTensor> need = hf_tensors(m.table, c, m.comm->ep_rank);
    const ParamTable whole = build_param_table(c, m.comm->ep_size);
    std::set<std::string> known;
    for (const HFTensor& t : hf_tensors(whole, c, m.comm->ep_rank)) known.insert(t.name);
    for (const HFTensor& t : mtp_copies(whole, c)) known.insert(t.name);  // accepted and ignored
    std::string stray;  // the first tensor of the checkpoint that this model does not have (an empty one aside:
    for (const auto& kv : where)  // transformers saves n_shared_experts 0 as shared experts of width 0)
        if (!known.count(kv.first) && readers.at(kv.second)->info(kv.first).numel() > 0) {
            stray = kv.first;
            break;
        }
    // transformers' default config declares an MTP layer its model does not have: with none of its tensors in the
    // checkpoint, the MTP block keeps its initialisation, said once
    const std::string mtp_prefix = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    bool mtp_absent = c.num_nextn_predict_layers > 0 && m.last_stage();
    for (const HFTensor& t : need)
        if (t.name.rfind(mtp_prefix, 0) == 0 && where.count(t.name)) mtp_absent = false;
    if (mtp_absent)
        fprintf(stderr, "%s: note: no weights of the MTP block (layer %d): it starts from its initialisation\n",
                source.c_str(), m.config.num_hidden_layers);
    const std::string hint = " (another architecture, or a config.json that does not match the weights?)";
    std::vector<std::pair<const HFTensor*, const SafetensorsReader*>> jobs;
    for (const HFTensor& t : need) {
        if (t.offset < 0) continue;  // another EP rank's expert: it may be there, this rank does not read it
        if (mtp_absent && t.name.rfind(mtp_prefix, 0) == 0) continue;
        auto it = where.find(t.name);
        if (it == where.end())
            throw std::runtime_error(source + ": tensor '" + t.name + "' is missing" +
                                     (stray.empty() ? "" : "; the checkpoint has '" + stray + "' instead" + hint));
        const SafetensorsReader* r = readers.at(it->second).get();
        const TensorInfo& info = r->info(t.name);
        if (info.dtype != DType::F32 && info.dtype != DType::BF16)
            throw std::runtime_error(it->second + ": tensor '" + t.name + "' has dtype " + dtype_name(info.dtype) +
                                     "; only F32 and BF16 can be loaded");
        if (info.shape != t.shape)
            throw std::runtime_error(it->second + ": tensor '" + t.name + "' has shape " + shape_str(info.shape) +
                                     ", the model needs " + shape_str(t.shape) + hint);
        jobs.push_back({&t, r});
    }
    if (!stray.empty()) throw std::runtime_error(where[stray] + ": unexpected tensor '" + stray + "'" + hint);

    // Read, converting BF16 through one scratch buffer.
    std::vector<uint16_t> half;
    for (const auto& job : jobs) {
        const HFTensor& t = *job.first;
        float* dst = m.params.data() + t.offset;
        if (job.second->info(t.name).dtype == DType::F32) {
            job.second->read(t.name, DType::F32, t.shape, dst);
            continue;
        }
        half.resize((size_t)t.numel);
        job.second->read(t.name, DType::BF16, t.shape, half.data());
        for (int64_t i = 0; i < t.numel; i++) dst[i] = f32_from_bf16(half[i]);
    }
    if (const std::string bad = first_non_finite(m.table, m.params.data()); !bad.empty())
        throw std::runtime_error(source + ": " + bad + " is NaN or inf");
}
