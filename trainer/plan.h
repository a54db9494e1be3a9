// Planning on paper (train_cpu --plan): for a config spread over G GPUs as PP x EP x DP, what one GPU holds and does
// per step, and a step time predicted from a stated matmul rate and stated link bandwidths. No hardware needed.
#pragma once
#include <vector>

#include "model/config.h"

struct PlanInputs {
    int gpus = 8, gpus_per_node = 8;
    int ep = 1, pp = 1, batch = 0, seq = 0, grad_accum = 0;  // the training flags --ep, --pp, --batch (per GPU),
                                                              // --seq, --grad-accum
    double matmul_tflops = 400;   // sustained dense BF16 rate per GPU (not the datasheet peak)
    double nvlink_gbps = 160;     // GB/s per GPU to GPUs of the same node, achieved for all-to-all
    double network_gbps = 40;     // GB/s per GPU to other nodes (400 Gb/s InfiniBand ~ 50 GB/s, ~80% achieved)
    double gpu_memory_gib = 80;
    bool recompute = false;       // --recompute: one activation set per kind of block kept, the forward run twice
    int moment_bytes = 4;         // --moments: 4 (fp32) or 2 (bf16) bytes for each of AdamW's m and v on the GPU
    std::vector<int> pp_split;    // --pp-split, or empty: the balanced cut (trainer/pipeline.h)
};

void print_plan(const Config& c, const PlanInputs& p);
// --plan-layouts: every PP x EP x DP of p.gpus (each cut balanced, the other inputs as given), and the fastest that
// fits.
void print_layouts(const Config& c, const PlanInputs& p);
// Training FLOPs per token for sequences of T tokens (forward and backward): 6 x the active parameters (shared
// experts and MTP included) + the attention scores, causal halved. The numerator of MFU.
double model_flops_per_token(const Config& c, int T);
// Its parts: main block `layer`'s, and the rest (the heads and MTP, on the last pipeline stage).
double block_flops_per_token(const Config& c, int layer, int T);
double heads_flops_per_token(const Config& c, int T);
