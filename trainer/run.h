// What train_cpu and train share around their training loops: the command line, the ranks, the config, the data,
// the host model (fresh, imported or resumed), evaluation, logs, checkpoints, the Hugging Face export, plots,
// sampling, stop signals and faults. Each trainer's main (train_cpu.cpp, train.cu) holds the loop itself and calls
// these for everything else. The host Model is the record of the weights and this rank's AdamW moments for all that
// touches files; the CPU trains it in place, the GPU trains a device copy and brings it level when asked (store).
// Under mpirun every rank runs this; rank 0 alone prints and logs, and every rank writes its part of a checkpoint.
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "model/rng.h"
#include "trainer/outliers.h"
#include "trainer/train_args.h"

using MakeComm = std::unique_ptr<Comm> (*)(int ep_size, int pp_size, const char* program);
struct Run;
// Makes the program's model for the host model just built (its memory, before the weights are read).
using MakeModel = std::function<void(Run&)>;

// How the shared code reaches the model, wherever it lives: a forward (evaluation, sampling), a row of the last
// forward's logits (sampling), and bringing the host model level with it (checkpoints, export).
struct ModelCalls {
    std::function<LossParts(const int32_t* inputs, const int32_t* targets, int B, bool training)> forward;
    std::function<void(int64_t row, float* out)> logits_row;
    std::function<void()> store;
};

// Everything one run holds, set up once by start_run and carried through the loop.
struct Run {
    const char* program = nullptr;  // names the error lines
    std::string flags;              // the command line after the program's name, compared across ranks
    TrainArgs args;
    Comm* comm = nullptr;
    Config config;
    std::vector<int> stage_first;  // the pipeline cut: stage s holds main blocks [stage_first[s], stage_first[s+1])
    std::string resume_from;       // the checkpoint resumed from, if any
    Model model;                   // the host model: this rank's stage
    OptimizerConfig oc;
    AdamWState opt;
    TrainState state;
    Rng rng;
    std::unique_ptr<DataLoader> train, val;
    int eval_batches = 0;
    Tokenizer tokenizer;
    FILE* log = nullptr;
    double peak_flops = 0.0;        // one device's dense peak for MFU, 0 when unknown (the CPU)
    OutlierDetector loss_outliers, norm_outliers;  // spikes of the loss and the gradient norm
    int64_t divergence_noted = -OUTLIER_WINDOW;     // the last step whose loss's rise was reported
    std::function<void()> on_end;  // frees the model's resources before the ranks' transport goes
    int64_t first_step = 0;
    double train_seconds = 0.0;  // the steps after the first of this process (the first pays for warm-up)
    int timed_steps = 0;
    // --async-checkpoint: this rank's part of the checkpoint being written, and its write on a thread (the error it
    // met, or "")
    CheckpointWrite pending;
    std::future<std::string> writing;
};

// One optimizer step: its micro-steps' batches, the losses and numbers it logs.
struct Step {
    int64_t step = 0;
    int B = 0, T = 0;
    float loss_scale = 0;  // 1 / (grad_accum x EP x DP): each micro-step's share of the global mean loss
    std::vector<int32_t> inputs, targets;  // every micro-step's batch, B*T tokens each
    double loss[4] = {0, 0, 0, 0};         // total, main, MTP, balance: this rank's, then the global means
    double grad_norm = 0, seconds = 0, val_loss = NAN;
    double fp8_in_bf16 = 0;  // FP8 products cuBLASLt refused, run in BF16: this rank's, then every rank's
    OutlierDetector::Score loss_score, norm_score;  // against the steps before (reduce_step)
    bool skip_update = false;                       // --skip-spikes: the step is an outlier, its update skipped
    float lr = 0;
    std::string load_imbalance;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    const int32_t* inputs_of(int micro) const { return &inputs[(int64_t)micro * B * T]; }
    const int32_t* targets_of(int micro) const { return &targets[(int64_t)micro * B * T]; }
    void add(const LossParts& l);  // a micro-step's losses, weighted by loss_scale
    double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
};

// The flags, the ranks, the config, the data, the host model (initialised, imported or resumed; make_model runs
// once it is initialised) and the tokenizer, every rank agreeing on any error (one line, exit 1). False when the
// program is done (--plan, --describe): then exit with *status.
bool start_run(Run& r, int argc, char** argv, const char* program, MakeComm make_comm, const MakeModel& make_model,
               int* status);
// A failure during training: this rank says why, once, and the whole job ends.
[[noreturn]] void fail(const std::string& why);
// Runs f on every rank; if it throws on any (bad_alloc included), the first such rank prints why and all exit 1.
void agree(Run& r, const std::function<void()>& f);
// --eval-only: prints the validation loss; the exit status.
int eval_only(Run& r, const ModelCalls& calls);
// Before the loop: the log opened, the opening lines printed, stop signals caught (with --checkpoint-dir).
void start_training(Run& r);
// The step's batches, read and checked on every rank, and its clock.
Step begin_step(Run& r, int64_t step);
// After the backward and the gradient norm (s.grad_norm): the losses, FP8 fallbacks and expert loads summed over the
// ranks (counts in place; each stage counts its own blocks), the load imbalance; a loss or gradient norm that is not
// finite ends the job.
void reduce_step(Run& r, Step& s, std::vector<std::vector<int64_t>>& expert_counts);
bool eval_due(const Run& r, int64_t step);
// The mean main-head loss over the validation batches of every rank.
double evaluate(Run& r, const ModelCalls& calls);
void log_step(Run& r, const Step& s);  // the progress line and the JSON log line (rank 0)
// After the step: counts it, commits a finished --async-checkpoint, and returns the stop signal any rank received
// (0: none). Collective.
int end_step(Run& r, int64_t step);
bool checkpoint_due(const Run& r, int stop);
void save_checkpoint(Run& r, const ModelCalls& calls);  // every rank its part (io/checkpoint.h); throws on failure
// After a stop signal: the checkpoint completed, the job ended; the exit status (128 + the signal).
int stop_run(Run& r, int stop);
// After the last step: the checkpoint completed, then export, plot and sample; the exit status.
int finish_run(Run& r, const ModelCalls& calls);
