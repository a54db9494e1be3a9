// Training checkpoints (docs/design.md §9): DIR/ckpt_STEP.safetensors, every parameter whole under its table name,
// the AdamW moments as optimizer.m.NAME and optimizer.v.NAME, and the config, step, data position and RNG in the
// metadata. Every rank writes its owned ranges into the one file, which does not depend on the layout, and a rename
// commits it. The directory must be one file system for all ranks. The header holds XXH3-64 checksums of itself and
// of every 16 MiB of the data: a resume checks them before it reads anything else.
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
    std::string run;            // the schedule and batch ("lr=0.003 warmup=40 ..."): a resume notes a change
};

std::string checkpoint_path(const std::string& dir, int64_t step);
// Path of the checkpoint with the highest step in dir, or "" when there is none.
std::string checkpoint_find_latest(const std::string& dir);
// Every checkpoint in dir, the highest step first.
std::vector<std::string> checkpoints_newest_first(const std::string& dir);
// Removes all but the newest `keep` checkpoints in dir up to step `written` (the one just written; later ones belong
// to another run and stay, as do other files). One that cannot go is named on stderr: the new one is safe already.
void checkpoint_prune(const std::string& dir, int keep, int64_t written);
// checkpoint_begin, checkpoint_write_part and checkpoint_commit, collective over m.comm. For one process and tests:
// a rank whose part fails throws while the others wait (the trainer agrees on errors first).
void checkpoint_save(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st);

// This rank's part of a checkpoint being written.
struct CheckpointWrite {
    int64_t step = 0;
    std::string path, temporary;  // the checkpoint, and the file it is written as until the rename
    uint64_t data = 0, data_bytes = 0;  // where the data section starts in the file, and its size
    uint64_t checksums_at = 0;          // rank 0: where the header's "checksums" value starts
    struct Part {
        uint64_t offset;  // in the file
        const float* values;
        int64_t count;
    };
    std::vector<Part> parts;
    std::vector<float> copies;  // with copies: the parts' values, which they point into
};
// Collective: rank 0 creates the temporary file with its header at full length, and removes those of unfinished
// writes (one write at a time per directory). Returns this rank's parts. copies: the parts own their values, so
// training may go on while they are written (--async-checkpoint: 12 bytes per owned value).
CheckpointWrite checkpoint_begin(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st,
                                 bool copies);
// This rank's part, on any thread: written into the temporary file and synced. Throws naming the file.
void checkpoint_write_part(const CheckpointWrite& w);
// Collective, once every rank's part is written: the ranks hash the data back from the file, rank 0 writes the
// hashes into the header and renames the temporary file to the checkpoint. Throws on every rank if a read fails.
void checkpoint_commit(const CheckpointWrite& w, Comm& comm);
// The file's header and its data chunks c with c % parts == part checked against the checksums it holds (the ranks
// of a job share the reading). Returns what is wrong, naming the file, or "".
std::string checkpoint_verify(const std::string& path, int part = 0, int parts = 1);
// Collective, before training: rank 0 creates dir and a probe file, which every rank must see, so ranks that do not
// share the directory fail at the start. Returns this rank's error, or "".
std::string checkpoint_check_dir(const std::string& dir, Comm& comm);
// The config stored in a checkpoint (throws std::runtime_error on a foreign or damaged file).
Config checkpoint_config(const std::string& path);
// Loads into a model built by model_init(checkpoint_config(path), comm). Each rank reads its experts and the moments
// of its ranges, so any EP x DP layout loads any other. Throws naming the file and tensor on a mismatch.
void checkpoint_load(const std::string& path, Model& m, AdamWState& opt, TrainState& st);
