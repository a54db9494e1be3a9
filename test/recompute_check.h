// The check of --recompute that both programs testing the GPU model make (gpu_model_emulated_check on the kernel
// emulator, test_gpu on a GPU): two GPU models from the same random weights, one keeping every
// block's activations and every chunk of logits and one recomputing them, two micro-batches of forward and backward
// each (B sequences, then B - 1: below the allocated batch), then a forward without targets (sampling's) and every
// row of its logits. Every kernel and GEMM is
// deterministic and the recomputations read the same inputs, so the loss parts, the gradients, the expert counts
// and the logits must be the same bits; the region timer shows whether the forwards really ran again.
// head_chunk_values: both models' (ActivationLayout), small in the tests to cut the heads into several chunks.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "gpu/model.h"
#include "test/random_model.h"

struct RecomputeComparison {
    bool same_losses = true, same_grads = false, same_counts = false, same_logits = true, recomputed = false;
    int64_t kept_bytes = 0, kept_bytes_recompute = 0;  // activations + expert rows, as the two plans count them
};

inline RecomputeComparison compare_recompute(const Config& c, Precision p, int B, int T, uint64_t seed,
                                             int64_t head_chunk_values) {
    Model host;
    model_init(host, c);
    randomize_for_test(host, seed);
    const AdamWState zero = adamw_state(host.shard);
    ActivationLayout keeping, recomputing;
    keeping.head_chunk_values = recomputing.head_chunk_values = head_chunk_values;
    recomputing.recompute = true;
    GpuModel keep, again;
    gpu_model_init(keep, c, local_comm(), p, B, T, keeping);
    gpu_model_init(again, c, local_comm(), p, B, T, recomputing);
    RecomputeComparison r;
    for (GpuModel* gm : {&keep, &again}) {
        gpu_model_upload(*gm, host, zero);
        gpu_model_zero_grads(*gm);
    }
    std::map<std::string, double> regions;
    again.timer.enabled = true;
    for (int batch : {B, std::max(1, B - 1)}) {
        const int64_t N = (int64_t)batch * T;
        const std::vector<int32_t> in = random_tokens(N, c.vocab_size, seed + 1 + batch),
                                   tg = random_tokens(N, c.vocab_size, seed + 2 + batch);
        gpu_model_forward(keep, in.data(), tg.data(), batch, true);
        gpu_model_forward(again, in.data(), tg.data(), batch, true);
        const LossParts a = gpu_model_losses(keep)[0], b = gpu_model_losses(again)[0];
        r.same_losses = r.same_losses && a.total == b.total && a.main == b.main && a.mtp == b.mtp &&
                        a.balance == b.balance;
        gpu_model_backward(keep, 0.75f);  // not 1: the scale must reach the recomputed blocks' gradients too
        gpu_model_backward(again, 0.75f);
    }
    again.timer.finish(regions);
    again.timer.enabled = false;
    r.recomputed = regions.count("recompute") == 1;
    r.same_grads = gpu_model_grads(keep) == gpu_model_grads(again);
    r.same_counts = keep.expert_counts == again.expert_counts;
    const std::vector<int32_t> prompt = random_tokens(T, c.vocab_size, seed + 5);
    gpu_model_forward(keep, prompt.data(), nullptr, 1, false);
    gpu_model_forward(again, prompt.data(), nullptr, 1, false);
    std::vector<float> row_keep(c.vocab_size), row_again(c.vocab_size);
    for (int t = 0; t < T; t++) {
        gpu_model_logits_row(keep, t, row_keep.data());
        gpu_model_logits_row(again, t, row_again.data());
        r.same_logits = r.same_logits && row_keep == row_again;
    }
    const GpuMemoryPlan plan = gpu_memory_plan(c, 1, 1, p, B, T, keeping),
                        plan_again = gpu_memory_plan(c, 1, 1, p, B, T, recomputing);
    r.kept_bytes = plan.activations + plan.expert_rows;
    r.kept_bytes_recompute = plan_again.activations + plan_again.expert_rows;
    gpu_model_free(keep);
    gpu_model_free(again);
    return r;
}
