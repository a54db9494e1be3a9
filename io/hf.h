// Hugging Face checkpoints: export to and import from a directory laid out like a published DeepSeek-V3 model
// (config.json with DeepseekV3Config keys, model_type deepseek_v3, and model.safetensors or a sharded
// model.safetensors.index.json). Tensor names are the published ones: our stacked routed experts [E, out, in] are
// written as one tensor per expert, model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight [out, in], and the MTP
// block (layer L = num_hidden_layers) carries model.layers.L.embed_tokens.weight and
// model.layers.L.shared_head.head.weight, copies of the shared embedding and head (ignored on import).
// Both directions stream tensor by tensor: at most one extra copy of the largest tensor is ever held in memory.
// Every failure throws std::runtime_error with a one-line message naming the file (and the tensor).
#pragma once
#include <string>

#include "model/config.h"
#include "model/model.h"

enum class ExportDType { F32, BF16 };

// Creates DIR (and its parents) and writes DIR/config.json (torch_dtype float32 or bfloat16) and
// DIR/model.safetensors (metadata format: pt), each through a temporary file and a rename.
// e_score_correction_bias is always F32; every other tensor is F32 or BF16 (round to nearest even of the fp32
// value), per dtype. The model must hold every routed expert (not one rank's expert-parallel shard).
void export_hf(const Model& m, const std::string& dir, ExportDType dtype);

// The config of a Hugging Face directory (DIR/config.json); model_type, when present, must be deepseek_v2/v3.
Config hf_config(const std::string& dir);

// Loads DIR/model.safetensors or, when it is absent, the files of DIR/model.safetensors.index.json's weight_map,
// into m (built from a config with the shapes of the checkpoint). Each tensor may be F32 or BF16. Every tensor is
// checked (present, shape, dtype, no unexpected extra tensor) before any data is read, so a checkpoint that fails
// a check leaves m unchanged; only an I/O error while reading the data itself can leave m partly loaded.
// On one rank of an expert-parallel model (m.comm->ep_size > 1) only that rank's routed experts are read.
void import_hf(Model& m, const std::string& dir);
