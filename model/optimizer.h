// AdamW with decoupled weight decay on FP32 master weights, the learning-rate schedule (linear warmup, the peak,
// then cosine decay to min_lr_ratio of the peak at the last step: over every step after warmup by default, or over
// the last decay_steps with the peak held before them, warmup-stable-decay, like DeepSeek-V3's) and global-norm
// gradient clipping (docs/design.md §1.4).
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
// The optimizer's work and moments are sharded over the ranks that hold a copy of the weights (ZeRO stage 1; llm.c's
// -z 1 and Megatron's distributed optimizer shard the FP32 master weights too, while here every rank keeps them
// whole: the GPU model reads them as the working weights in FP32 mode, its norms, router and embedding in FP32 in
// every mode, and FP8 quantizes from them): the trainable tensors fall into buckets, runs of adjacent
// tensors held by the same ranks (replicated ones by every rank, Group::World; expert shards by the dp_size ranks
// of their DataParallel group). A bucket held by n > 1 ranks is cut into n equal pieces, a multiple of PARAM_ALIGN
// values each, and a tail of what is left (under n x PARAM_ALIGN values). A step: the gradients are
// reduce-scattered (each rank gets the sum of its own piece; the tail is all-reduced), each rank updates its piece
// and the tail, and the pieces are all-gathered. The traffic is that of an all-reduce of the gradients, and a rank
// keeps the AdamW moments of its pieces and tails alone, 8 bytes per parameter / n, on the GPU and in host memory
// (each rank writes its own pieces of a checkpoint: io/checkpoint.h). A bucket held by one rank is one piece:
// the plain update.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "params.h"

struct OptimizerConfig {
    float lr = 3e-4f;  // peak
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float weight_decay = 0.1f;  // on tensors with weight_decay set (matrices, embeddings)
    float grad_clip = 1.0f;     // global norm; 0 disables
    float min_lr_ratio = 0.1f;
    int warmup_steps = 0;
    int total_steps = 1;
    int decay_steps = -1;  // the decay's steps, the last of the run; -1: every step after warmup
};

struct AdamWState {
    std::vector<float> m, v;  // this rank's moments alone: OptimizerShard::moments values, at OptimizerRange::moments
    int64_t step = 0;         // updates done so far
};

// A run of adjacent trainable tensors held by the same ranks: the values [first, first + count) of the buffer.
struct OptimizerBucket {
    int64_t first = 0, count = 0;
    Group group = Group::World;
    int ranks = 1, index = 0;  // the ranks holding it, and this rank's place among them
    int64_t piece = 0;         // rank i's piece: [first + i piece, first + (i+1) piece); the tail follows the last
};

// Values of one tensor this rank updates: [first, first + count) of the parameter buffer (a piece's or a tail's
// part of the tensor).
struct OptimizerRange {
    int64_t first = 0, count = 0;
    int64_t moments = 0;        // where their moments start in a buffer of this rank's moments alone
    bool weight_decay = false;
    bool owned = true;          // this rank's alone: counted in the gradient norm and written to checkpoints by it
                                // (a tail, which every rank of its bucket updates, is its bucket's rank 0's)
    int tensor = 0;             // its tensor's index in the table
};

struct OptimizerShard {
    std::vector<OptimizerBucket> buckets;
    std::vector<OptimizerRange> ranges;
    int64_t moments = 0;  // values in each of this rank's AdamW moments (m and v)
};

// This rank's shard of the table, for a world of `world` ranks of which this is `rank`, laid out as EP x DP
// (comm/comm.h: dp_size replicas of each expert shard, this rank being replica dp_rank).
OptimizerShard optimizer_shard(const ParamTable& table, int world, int rank, int dp_size, int dp_rank);
OptimizerShard optimizer_shard(const ParamTable& table, const Comm& comm);
// Zero moments for shard s, at step 0.
AdamWState adamw_state(const OptimizerShard& s);
// Sums the gradients over the ranks holding each bucket, where this rank needs them: its pieces and the tails.
// grads: host memory, or device memory with the NCCL Comm.
void shard_reduce_grads(const OptimizerShard& s, float* grads, Comm& comm);
// Copies every rank's pieces of the buffer `values` (laid out by the table) to every rank: the weights after an
// update.
void shard_gather(const OptimizerShard& s, float* values, Comm& comm);

// Learning rate of optimizer step `step` (0-based).
float learning_rate(const OptimizerConfig& oc, int64_t step);
// sum g^2 over one buffer in fp64, summed in fixed chunks of GRAD_NORM_CHUNK values in a fixed order (bit-identical
// for any thread count; the GPU's kernels/adamw.cuh cuts the same chunks). model_grad_norm combines these over
// ranges and ranks.
constexpr int64_t GRAD_NORM_CHUNK = 1 << 16;
double grad_sum_squares(const float* grads, int64_t n);
// The factor that brings the norm down to grad_clip (1 when below it).
float clip_factor(const OptimizerConfig& oc, double norm);
// One AdamW update of the shard's ranges with gradients multiplied by grad_multiplier (params and grads laid out
// by the table, state.m and state.v by the shard). The caller gathers the weights after it (shard_gather).
void adamw_update(const OptimizerShard& shard, float* params, const float* grads, AdamWState& state,
                  const OptimizerConfig& oc, float lr, float grad_multiplier);
