// Training checkpoints: one safetensors file per save, DIR/ckpt_STEP.safetensors (STEP zero-padded to 8 digits),
// holding every parameter under its table name (bias buffers included), the AdamW moments as
// optimizer.m.NAME / optimizer.v.NAME, and in the metadata the config, the step, the data position and the RNG.
// Written to a temporary file and renamed, so a crash never destroys the last good checkpoint. Tensors are always
// whole, so the file does not depend on the number of ranks (and is meant for the GPU trainer too).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model.h"
#include "optimizer.h"
#include "safetensors.h"

struct TrainState {
    int64_t step = 0;           // optimizer steps completed
    int64_t data_shard = 0;     // the training loader's position
    int64_t data_position = 0;
    std::string data_file;      // that shard's file name and token count: a resume on changed data is refused
    int64_t data_tokens = 0;
    uint64_t rng_state = 0;
    std::string run;            // the run's schedule and batch, e.g. "lr=0.003 warmup=40 steps=400 ...", to
                                // warn when a resume changes them
};

std::string checkpoint_path(const std::string& dir, int64_t step);
// Path of the checkpoint with the highest step in dir, or "" when there is none.
std::string checkpoint_find_latest(const std::string& dir);
// Removes all but the newest `keep` checkpoints in dir up to step `written` (the one just written; later ones belong
// to another run and stay, as do other files). One that cannot go is named on stderr: the new one is safe already.
void checkpoint_prune(const std::string& dir, int keep, int64_t written);
// Collective over m.comm: the EP ranks of data-parallel replica 0 send their experts to rank 0, which writes
// whole tensors (so rank 0 briefly holds every expert's weights and moments); the others wait for the rename.
// checkpoint_collect and checkpoint_write are its two halves.
void checkpoint_save(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st);

// A checkpoint gathered for writing: on rank 0 its file, every tensor whole and the metadata; nothing elsewhere.
struct CheckpointData {
    std::string path;
    std::vector<std::vector<float>> owned;  // the gathered expert tensors, and with copies every other tensor
    std::vector<TensorView> views;          // into the model, or with copies into `owned` only
    std::map<std::string, std::string> meta;
};
// The collective half of checkpoint_save. copies: rank 0's data owns every value, so the model may train on while
// the file is written (--async-checkpoint: 12 more bytes a parameter on rank 0 meanwhile).
CheckpointData checkpoint_collect(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st,
                                  bool copies);
// Rank 0's half, on any thread: the file, through a temporary file and a rename (nothing on the other ranks).
void checkpoint_write(const CheckpointData& data);
// The config stored in a checkpoint (throws std::runtime_error on a foreign or damaged file).
Config checkpoint_config(const std::string& path);
// Loads into a model built with model_init(checkpoint_config(path), comm); each rank reads its own experts, so a
// checkpoint saved with any EP x DP layout loads into any other. Throws naming the file and tensor on mismatch.
void checkpoint_load(const std::string& path, Model& m, AdamWState& opt, TrainState& st);
