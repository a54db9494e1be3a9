// The command line shared by train_cpu and train.cu (one contract): parsing and validation.
// Bad flags or values print one line and exit with status 2.
#pragma once
#include <string>
#include <vector>

#include "model/fp8.h"
#include "model/optimizer.h"
#include "trainer/plan.h"

struct TrainArgs {
    std::string config = "small";   // --config PRESET|FILE.json
    std::string data;               // --data PATTERN   training shards
    std::string val;                // --val PATTERN    validation shards
    std::string tokenizer;          // --tokenizer FILE (default: tokenizer.bin beside the first training shard)
    int steps = 100;                // --steps N        total optimizer steps of the run (0: no training)
    int batch = 8;                  // --batch B        sequences per rank per micro-step
    int grad_accum = 1;             // --grad-accum N
    int seq = 128;                  // --seq T
    float lr = 3e-4f;               // --lr X           peak learning rate
    int warmup = -1;                // --warmup N       (default: steps / 10)
    int decay_steps = -1;           // --decay-steps N  the decay over the last N steps (default: all after warmup)
    float min_lr_ratio = 0.1f;      // --min-lr-ratio X the learning rate at the last step over the peak
    float weight_decay = 0.1f;      // --weight-decay X
    float grad_clip = 1.0f;         // --grad-clip X    (0: off)
    float skip_spikes = 0.0f;       // --skip-spikes Z  no update on a step Z deviations above its past (0: off)
    Moments moments = Moments::FP32;  // --moments fp32|bf16  how AdamW's m and v are stored
    unsigned long long seed = 1337; // --seed S
    int eval_every = 0;             // --eval-every N   (and always after the last step)
    int eval_batches = 20;          // --eval-batches N
    std::string checkpoint_dir;     // --checkpoint-dir DIR
    int checkpoint_every = 0;       // --checkpoint-every N (and after the last step when a directory is given)
    int keep_checkpoints = 0;       // --keep-checkpoints N  the newest N only (0: all)
    bool async_checkpoint = false;  // --async-checkpoint  each rank writes its part on a thread while training goes on
    bool resume = false;            // --resume
    std::string log;                // --log FILE       JSON lines
    int sample = 0;                 // --sample N       tokens to sample at the end
    std::string prompt = "The";     // --prompt TEXT
    float temperature = 1.0f;       // --temperature X
    int top_k = 0;                  // --top-k K        (0: all tokens)
    int ep = 1;                     // --ep N           expert-parallel ranks (world = PP x EP x DP, under mpirun)
    int pp = 1;                     // --pp N           pipeline stages
    std::vector<int> pp_split;      // --pp-split L1,L2 the first layer of stages 1.. (default: balanced by FLOPs)
    int vocab = 0;                  // --vocab N        override the config's vocab_size (e.g. 50257 for GPT-2 shards)
    std::string init_from_hf;       // --init-from-hf DIR  start from a Hugging Face directory
    std::string export_hf;          // --export-hf DIR  write a Hugging Face directory at the end
    std::string export_dtype = "bf16"; // --export-dtype bf16|f32
    std::string dtype;              // --dtype fp32|bf16|fp8  GEMM precision (empty: the program's default)
    bool recompute = false;         // --recompute      one activation set per kind of block; forwards run again
    bool eval_only = false;         // --eval-only      print the validation loss and exit
    std::string plot;               // --plot FILE.png  plot the --log at the end
    bool plot_log_scale = false;    // --plot-log-scale
    bool describe = false;          // --describe
    bool plan = false;              // --plan: memory, FLOPs, all-to-all and step time on paper, then exit
    bool plan_layouts = false;      // --plan-layouts: --plan's memory and throughput for every layout of --gpus
    PlanInputs plan_inputs;         // --gpus, --gpus-per-node, --matmul-tflops, --nvlink-gbps, --network-gbps,
                                    // --gpu-memory-gib; ep, batch, seq, grad_accum and recompute from the flags above
    // --dtype as a Precision, or `fallback` when it is not given
    Precision precision_or(Precision fallback) const {
        return dtype == "fp32" ? Precision::FP32 : dtype == "bf16" ? Precision::BF16 : dtype == "fp8" ? Precision::FP8
                                                                                                      : fallback;
    }
};

TrainArgs parse_train_args(int argc, char** argv, const char* program);
