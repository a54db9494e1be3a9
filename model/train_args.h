// The command line shared by train_cpu and train.cu (one contract, DESIGN §3): parsing and validation.
// Bad flags or values print one line and exit with status 2.
#pragma once
#include <string>

struct TrainArgs {
    std::string config = "small";   // --config PRESET|FILE.json
    std::string data;               // --data PATTERN   training shards
    std::string val;                // --val PATTERN    validation shards
    std::string tokenizer;          // --tokenizer FILE (default: tokenizer.bin beside the first training shard)
    int steps = 100;                // --steps N        total optimizer steps of the run
    int batch = 8;                  // --batch B        sequences per rank per micro-step
    int grad_accum = 1;             // --grad-accum N
    int seq = 128;                  // --seq T
    float lr = 3e-4f;               // --lr X           peak learning rate
    int warmup = -1;                // --warmup N       (default: steps / 10)
    float weight_decay = 0.1f;      // --weight-decay X
    float grad_clip = 1.0f;         // --grad-clip X    (0: off)
    unsigned long long seed = 1337; // --seed S
    int eval_every = 0;             // --eval-every N   (and always after the last step)
    int eval_batches = 20;          // --eval-batches N
    std::string checkpoint_dir;     // --checkpoint-dir DIR
    int checkpoint_every = 0;       // --checkpoint-every N (and after the last step when a directory is given)
    bool resume = false;            // --resume
    std::string log;                // --log FILE       JSON lines
    int sample = 0;                 // --sample N       tokens to sample at the end
    std::string prompt = "The";     // --prompt TEXT
    float temperature = 1.0f;       // --temperature X
    int top_k = 0;                  // --top-k K        (0: all tokens)
    int ep = 1;                     // --ep N           expert-parallel ranks (world = EP x DP, under mpirun)
    bool describe = false;          // --describe
    bool plan = false;              // --plan: memory, FLOPs, all-to-all and step time on paper, then exit
    int gpus = 8, gpus_per_node = 8;            // --gpus N, --gpus-per-node N
    double matmul_tflops = 400;                 // --matmul-tflops X
    double nvlink_gbps = 160, network_gbps = 40; // --nvlink-gbps X, --network-gbps X
    double gpu_memory_gib = 80;                 // --gpu-memory-gib X
};

TrainArgs parse_train_args(int argc, char** argv, const char* program);
