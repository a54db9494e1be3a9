// AdamW on the FP32 master weights, the learning-rate schedule and global-norm clipping (docs/design.md §1.4):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
// With BF16 moments (DeepSeek-V3's) m and v are computed in FP32 from the stored values, used as they are for this
// step's update, and stored rounded to BF16: the values the GPU's BF16 buffers hold.
// The schedule: linear warmup, the peak, then cosine decay to min_lr_ratio of the peak at the last step, over every
// step after warmup or only the last decay_steps (warmup-stable-decay).
// The optimizer shard (ZeRO-1, docs/design.md §8): the moments and the update's work are cut over the ranks that
// hold each weight (a pipeline stage's ranks, or for experts its DP group), in buckets, pieces, tails and ranges.
// Every rank keeps the whole master weights of its stage.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "params.h"

enum class Moments { FP32, BF16 };  // how m and v are stored
inline int moment_bytes(Moments m) { return m == Moments::BF16 ? 2 : 4; }  // of one value of m, or of v

struct OptimizerConfig {
    float lr = 3e-4f;  // peak
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float weight_decay = 0.1f;  // on tensors with weight_decay set (matrices, embeddings)
    float grad_clip = 1.0f;     // global norm; 0 disables
    float min_lr_ratio = 0.1f;
    int warmup_steps = 0;
    int total_steps = 1;
    int decay_steps = -1;  // the decay's steps, the last of the run; -1: every step after warmup
    Moments moments = Moments::FP32;
};

struct AdamWState {
    std::vector<float> m, v;  // this rank's moments alone: OptimizerShard::moments values, at OptimizerRange::moments
                              // (with BF16 moments, values a BF16 holds; FP32 ones from a checkpoint are rounded)
    int64_t step = 0;         // updates done so far
};

// A bucket: adjacent trainable tensors held by the same ranks, values [first, first + count) of the buffer.
struct OptimizerBucket {
    int64_t first = 0, count = 0;
    Group group = Group::Stage;
    int ranks = 1, index = 0;  // the ranks holding it, and this rank's place among them
    int64_t piece = 0;         // rank i's piece: [first + i piece, first + (i+1) piece); the tail follows the last
};

// A range: one tensor's part of this rank's piece or of a tail, values [first, first + count) of the buffer.
struct OptimizerRange {
    int64_t first = 0, count = 0;
    int64_t moments = 0;        // where their moments start in a buffer of this rank's moments alone
    bool weight_decay = false;
    bool owned = true;          // counted in the norm and written by this rank alone (a tail: by index 0)
    int tensor = 0;             // its tensor's index in the table
};

struct OptimizerShard {
    std::vector<OptimizerBucket> buckets;
    std::vector<OptimizerRange> ranges;
    int64_t moments = 0;  // values in each of this rank's AdamW moments (m and v)
};

// This rank's optimizer shard of its stage's table, for rank `stage_rank` of a stage of `stage_size` ranks laid out
// as EP x DP (comm/comm.h).
OptimizerShard optimizer_shard(const ParamTable& table, int stage_size, int stage_rank, int dp_size, int dp_rank);
OptimizerShard optimizer_shard(const ParamTable& table, const Comm& comm);
// Zero moments for shard s, at step 0.
AdamWState adamw_state(const OptimizerShard& s);
// The values of `values` (laid out by the table) in shard s's ranges, laid out as its moments (the gaps zero), and
// back: the GPU's master weights to and from the host's weights.
std::vector<float> shard_pack(const OptimizerShard& s, const float* values);
void shard_unpack(const OptimizerShard& s, const std::vector<float>& packed, float* values);
// Sums the gradients over the ranks holding each bucket, where this rank needs them: its pieces and the tails.
// grads: host memory, or device memory with the NCCL Comm.
void shard_reduce_grads(const OptimizerShard& s, float* grads, Comm& comm);
// Copies every rank's pieces of `values` (laid out by the table) to every rank: the weights after an update.
void shard_gather(const OptimizerShard& s, float* values, Comm& comm);

// Learning rate of optimizer step `step` (0-based).
float learning_rate(const OptimizerConfig& oc, int64_t step);
// sum g^2 over one buffer in FP64, in fixed chunks of GRAD_NORM_CHUNK values summed in order: the same bits for any
// thread count, and the GPU's kernels/adamw.cuh cuts the same chunks. model_grad_norm sums these.
constexpr int64_t GRAD_NORM_CHUNK = 1 << 16;
double grad_sum_squares(const float* grads, int64_t n);
// The factor that brings the norm down to grad_clip (1 when below it).
float clip_factor(const OptimizerConfig& oc, double norm);
// One AdamW update of the shard's ranges, the gradients times grad_multiplier. params and grads are laid out by the
// table, state.m and state.v by the shard. The caller then gathers the weights (shard_gather).
void adamw_update(const OptimizerShard& shard, float* params, const float* grads, AdamWState& state,
                  const OptimizerConfig& oc, float lr, float grad_multiplier);
