// AdamW with decoupled weight decay on FP32 master weights, the learning-rate schedule (linear warmup, then cosine
// decay to min_lr_ratio of the peak at the last step) and global-norm gradient clipping (DESIGN §1.4).
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
#pragma once
#include <cstdint>
#include <vector>

#include "params.h"

struct OptimizerConfig {
    float lr = 3e-4f;  // peak
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float weight_decay = 0.1f;  // on tensors with weight_decay set (matrices, embeddings)
    float grad_clip = 1.0f;     // global norm; 0 disables
    float min_lr_ratio = 0.1f;
    int warmup_steps = 0;
    int total_steps = 1;
};

struct AdamWState {
    std::vector<float> m, v;  // same layout as the parameters
    int64_t step = 0;         // updates done so far
};

// Learning rate of optimizer step `step` (0-based).
float learning_rate(const OptimizerConfig& oc, int64_t step);
// sqrt(sum g^2) over one buffer in fp64, summed in fixed chunks in a fixed order (bit-identical for any thread
// count). model_grad_norm combines these over tensors and ranks.
double global_grad_norm(const float* grads, int64_t n);
// The factor that brings the norm down to grad_clip (1 when below it).
float clip_factor(const OptimizerConfig& oc, double norm);
// One AdamW update of every trainable tensor with gradients multiplied by grad_multiplier.
void adamw_update(const ParamTable& table, float* params, const float* grads, AdamWState& state,
                  const OptimizerConfig& oc, float lr, float grad_multiplier);
