// AdamW, the schedule and clipping.
#include "optimizer.h"

#include <cmath>

float learning_rate(const OptimizerConfig& oc, int64_t step) {
    if (step < oc.warmup_steps) return oc.lr * (float)(step + 1) / oc.warmup_steps;
    int64_t decay_steps = oc.total_steps - oc.warmup_steps;
    if (decay_steps <= 1) return oc.lr;
    double progress = std::min(1.0, (double)(step - oc.warmup_steps) / (decay_steps - 1));
    double cosine = 0.5 * (1.0 + cos(M_PI * progress));  // 1 -> 0
    return (float)(oc.lr * (oc.min_lr_ratio + (1.0 - oc.min_lr_ratio) * cosine));
}

double global_grad_norm(const float* grads, int64_t n) {
    const int64_t chunk = 1 << 16, chunks = (n + chunk - 1) / chunk;
    std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        double sum = 0.0;
        for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); i++) sum += (double)grads[i] * grads[i];
        partial[c] = sum;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return sqrt(total);
}

float clip_factor(const OptimizerConfig& oc, double norm) {
    if (oc.grad_clip <= 0.0f || norm <= oc.grad_clip) return 1.0f;
    return (float)(oc.grad_clip / norm);
}

void adamw_update(const ParamTable& table, float* params, const float* grads, AdamWState& s,
                  const OptimizerConfig& oc, float lr, float grad_multiplier) {
    s.step++;
    const float bias1 = 1.0f - powf(oc.beta1, (float)s.step), bias2 = 1.0f - powf(oc.beta2, (float)s.step);
    for (const ParamTensor& t : table.tensors) {
        if (!t.trainable) continue;
        const float decay = t.weight_decay ? oc.weight_decay : 0.0f;
#pragma omp parallel for schedule(static)
        for (int64_t i = t.offset; i < t.offset + t.numel; i++) {
            float g = grads[i] * grad_multiplier;
            s.m[i] = oc.beta1 * s.m[i] + (1.0f - oc.beta1) * g;
            s.v[i] = oc.beta2 * s.v[i] + (1.0f - oc.beta2) * g * g;
            float m_hat = s.m[i] / bias1, v_hat = s.v[i] / bias2;
            params[i] -= lr * (m_hat / (sqrtf(v_hat) + oc.eps) + decay * params[i]);
        }
    }
}
