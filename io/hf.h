// Hugging Face checkpoints (docs/design.md §9): a directory like a published DeepSeek-V3 model, config.json and
// model.safetensors (or a sharded model.safetensors.index.json), with the published tensor names. A stacked expert
// tensor is one tensor per expert; the MTP layer's copies of the embedding and head are written, ignored on import.
// Both directions stream tensor by tensor: at most one extra copy of the largest tensor is in memory.
// Every failure throws std::runtime_error with one line naming the file (and the tensor).
#pragma once
#include <string>

#include "model/config.h"
#include "model/model.h"

enum class ExportDType { F32, BF16 };

// Creates DIR and writes config.json and model.safetensors atomically, in dtype (BF16: nearest, ties to even);
// e_score_correction_bias stays F32. The model must hold every routed expert (EP 1).
void export_hf(const Model& m, const std::string& dir, ExportDType dtype);

// The config of a Hugging Face directory (DIR/config.json); model_type, when present, must be deepseek_v2/v3.
Config hf_config(const std::string& dir);

// Loads DIR/model.safetensors, or else the files of DIR/model.safetensors.index.json, into m (built from a config
// of the checkpoint's shapes); F32 or BF16. Every tensor is checked (present, shape, dtype, none unexpected but empty
// ones) before any data is read, so only an I/O error or a NaN can leave m partly loaded. A checkpoint without any
// MTP tensor leaves the MTP block as it is (a note says so). Under EP a rank reads only its experts.
void import_hf(Model& m, const std::string& dir);
