// AdamW, the schedule, clipping and the optimizer shard (docs/design.md §8).
#include "optimizer.h"

#include <algorithm>
#include <cmath>

#include "model/bf16.h"

float learning_rate(const OptimizerConfig& oc, int64_t step) {
    if (step < oc.warmup_steps) return oc.lr * (float)(step + 1) / oc.warmup_steps;
    const int64_t decay_steps = oc.decay_steps >= 0 ? oc.decay_steps : oc.total_steps - oc.warmup_steps;
    const int64_t decay_start = oc.total_steps - decay_steps;
    if (step < decay_start || decay_steps <= 1) return oc.lr;
    double progress = std::min(1.0, (double)(step - decay_start) / (decay_steps - 1));
    double cosine = 0.5 * (1.0 + cos(M_PI * progress));  // 1 -> 0
    return (float)(oc.lr * (oc.min_lr_ratio + (1.0 - oc.min_lr_ratio) * cosine));
}

OptimizerShard optimizer_shard(const ParamTable& table, int stage_size, int stage_rank, int dp_size, int dp_rank) {
    OptimizerShard s;
    std::vector<const ParamTensor*> tensors;  // in the buffer's order
    for (const ParamTensor& t : table.tensors) tensors.push_back(&t);
    std::sort(tensors.begin(), tensors.end(), [](const ParamTensor* a, const ParamTensor* b) {
        return a->offset < b->offset;
    });
    for (size_t first = 0, last = 0; first < tensors.size(); first = last) {
        last = first + 1;  // the bucket: tensors [first, last), all read in FP32 or all GEMM weights
        if (!tensors[first]->trainable) continue;
        while (last < tensors.size() && tensors[last]->trainable &&
               tensors[last]->expert_shard == tensors[first]->expert_shard &&
               tensors[last]->gemm_weight == tensors[first]->gemm_weight)
            last++;
        OptimizerBucket b;
        b.first = tensors[first]->offset;
        b.count = tensors[last - 1]->offset + tensors[last - 1]->numel - b.first;
        b.group = tensors[first]->expert_shard ? Group::DataParallel : Group::Stage;
        b.ranks = b.group == Group::Stage ? stage_size : dp_size;
        b.index = b.group == Group::Stage ? stage_rank : dp_rank;
        b.piece = b.ranks == 1 ? b.count : b.count / (b.ranks * PARAM_ALIGN) * PARAM_ALIGN;
        // This rank's ranges: its piece, then the tail, cut at tensor boundaries, gaps skipped. Their moments span
        // the whole piece or tail, gaps included, so every rank keeps as many.
        const int64_t piece_first = b.first + b.index * b.piece, tail_first = b.first + b.ranks * b.piece;
        const int64_t spans[2][2] = {{piece_first, piece_first + b.piece}, {tail_first, b.first + b.count}};
        for (int span = 0; span < 2; span++) {
            for (size_t i = first; i < last; i++) {
                const ParamTensor& t = *tensors[i];
                const int64_t lo = std::max(spans[span][0], t.offset);
                const int64_t hi = std::min(spans[span][1], t.offset + t.numel);
                if (lo < hi)
                    s.ranges.push_back({lo, hi - lo, s.moments + lo - spans[span][0], t.weight_decay,
                                        span == 0 || b.index == 0, (int)(&t - table.tensors.data())});
            }
            s.moments += spans[span][1] - spans[span][0];
        }
        s.buckets.push_back(b);
    }
    return s;
}

OptimizerShard optimizer_shard(const ParamTable& table, const Comm& comm) {
    return optimizer_shard(table, comm.stage_size(), comm.group_rank(Group::Stage), comm.dp_size, comm.dp_rank);
}

AdamWState adamw_state(const OptimizerShard& s) {
    return {std::vector<float>(s.moments), std::vector<float>(s.moments), 0};
}

std::vector<float> shard_pack(const OptimizerShard& s, const float* values) {
    std::vector<float> packed(s.moments, 0.0f);
    for (const OptimizerRange& r : s.ranges)
        std::copy(values + r.first, values + r.first + r.count, packed.begin() + r.moments);
    return packed;
}

void shard_unpack(const OptimizerShard& s, const std::vector<float>& packed, float* values) {
    for (const OptimizerRange& r : s.ranges)
        std::copy(packed.begin() + r.moments, packed.begin() + r.moments + r.count, values + r.first);
}

void shard_reduce_grads(const OptimizerShard& s, float* grads, Comm& comm) {
    for (const OptimizerBucket& b : s.buckets) {
        if (b.ranks == 1) continue;
        comm.reduce_scatter_sum(grads + b.first, b.piece, b.group);
        const int64_t tail = b.count - b.ranks * b.piece;
        if (tail > 0) comm.all_reduce_sum(grads + b.first + b.ranks * b.piece, tail, b.group);
    }
}

void shard_gather(const OptimizerShard& s, float* values, Comm& comm) {
    for (const OptimizerBucket& b : s.buckets)
        if (b.ranks > 1) comm.all_gather(values + b.first, b.piece, b.group);
}

double grad_sum_squares(const float* grads, int64_t n) {
    const int64_t chunk = GRAD_NORM_CHUNK, chunks = (n + chunk - 1) / chunk;
    std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        double sum = 0.0;
        for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); i++) sum += (double)grads[i] * grads[i];
        partial[c] = sum;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
}

float clip_factor(const OptimizerConfig& oc, double norm) {
    if (oc.grad_clip <= 0.0f || norm <= oc.grad_clip) return 1.0f;
    return (float)(oc.grad_clip / norm);
}

void adamw_update(const OptimizerShard& shard, float* params, const float* grads, AdamWState& s,
                  const OptimizerConfig& oc, float lr, float grad_multiplier) {
    s.step++;
    const float bias1 = 1.0f - powf(oc.beta1, (float)s.step), bias2 = 1.0f - powf(oc.beta2, (float)s.step);
    const bool bf16 = oc.moments == Moments::BF16;
    for (const OptimizerRange& r : shard.ranges) {
        const float decay = r.weight_decay ? oc.weight_decay : 0.0f;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < r.count; k++) {
            float &p = params[r.first + k], &m = s.m[r.moments + k], &v = s.v[r.moments + k];
            const float g = grads[r.first + k] * grad_multiplier;
            const float mi = oc.beta1 * (bf16 ? bf16_round(m) : m) + (1.0f - oc.beta1) * g;
            const float vi = oc.beta2 * (bf16 ? bf16_round(v) : v) + (1.0f - oc.beta2) * g * g;
            m = bf16 ? bf16_round(mi) : mi;
            v = bf16 ? bf16_round(vi) : vi;
            const float m_hat = mi / bias1, v_hat = vi / bias2;
            p -= lr * (m_hat / (sqrtf(v_hat) + oc.eps) + decay * p);
        }
    }
}
