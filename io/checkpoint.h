// Training checkpoints: one safetensors file per save, DIR/ckpt_STEP.safetensors (STEP zero-padded to 8 digits),
// holding every parameter under its table name (bias buffers included), the AdamW moments as
// optimizer.m.NAME / optimizer.v.NAME, and in the metadata the config, the step, the data position and the RNG.
// Written to a temporary file and renamed, so a crash never destroys the last good checkpoint. Tensors are always
// whole, so the file does not depend on the number of ranks, and every rank writes its own values into it: those of
// its optimizer pieces (model/optimizer.h: weights and both moments), rank 0 also the tensors outside the
// optimizer (the router biases). No rank gathers another's values, the host keeps a rank's moments alone, and
// the ranks' write bandwidths add up. The directory must be one file system for all ranks (as Megatron's and
// torchtitan's distributed checkpoints require): a shared one across nodes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/optimizer.h"

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
// checkpoint_begin, checkpoint_write_part, checkpoint_commit: collective over m.comm (opt: this rank's moments). For
// one process and tests: a rank whose part fails throws while the others wait (the trainer agrees on errors first).
void checkpoint_save(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st);

// This rank's part of a checkpoint being written.
struct CheckpointWrite {
    int64_t step = 0;
    std::string path, temporary;  // the checkpoint, and the file it is written as until the rename
    struct Part {
        uint64_t offset;  // in the file
        const float* values;
        int64_t count;
    };
    std::vector<Part> parts;
    std::vector<float> copies;  // with copies: the parts' values, which they point into
};
// Collective: rank 0 creates the temporary file, its header and its full length (and removes the temporary files
// of writes that never finished: one write at a time per directory); returns this rank's parts. copies: the
// parts own their values, so the model may train on while they are written (--async-checkpoint: 12 bytes per value
// of this rank's optimizer pieces meanwhile).
CheckpointWrite checkpoint_begin(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st,
                                 bool copies);
// This rank's part, on any thread: written into the temporary file and synced. Throws naming the file.
void checkpoint_write_part(const CheckpointWrite& w);
// Collective, once every rank's part is written: rank 0 renames the temporary file to the checkpoint.
void checkpoint_commit(const CheckpointWrite& w, Comm& comm);
// Collective, before training: rank 0 creates dir if needed and a file in it, and every rank looks for it, so that
// ranks that do not share the directory find out at the start instead of at the first checkpoint. Returns this
// rank's error, or "".
std::string checkpoint_check_dir(const std::string& dir, Comm& comm);
// The config stored in a checkpoint (throws std::runtime_error on a foreign or damaged file).
Config checkpoint_config(const std::string& path);
// Loads into a model built with model_init(checkpoint_config(path), comm); each rank reads its own experts and the
// moments of its optimizer shard (opt = adamw_state(m.shard)), so a checkpoint saved with any EP x DP layout loads
// into any other. Throws naming the file and tensor on mismatch.
void checkpoint_load(const std::string& path, Model& m, AdamWState& opt, TrainState& st);
