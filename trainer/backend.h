// Where the model's arithmetic runs. The trainer (trainer/trainer.cpp) keeps a host Model as the record of the
// config, the weights and this rank's AdamW moments for everything that touches files (init, Hugging Face import and
// export, checkpoints); a backend computes the training step on it (the CPU backend) or on a device copy of it
// (the GPU backend in train.cu, over gpu/gpu_model.cu), and the two are brought level where the trainer says:
//   load  after the host model changed (fresh init, --init-from-hf, --resume);
//   store after training steps, before the host model is read (a checkpoint, --export-hf).
// So train_cpu and train share one command line, one data path, one log format and one checkpoint format by
// construction: a checkpoint written by one resumes on the other.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/optimizer.h"

struct TrainArgs;

class Backend {
public:
    virtual ~Backend() = default;
    virtual void load(const Model& host, const AdamWState& opt) = 0;
    virtual void store(Model& host, AdamWState& opt) = 0;  // opt: this rank's moments (model/optimizer.h)
    // As model_forward / model_backward (model/model.h); inputs and targets are host arrays of B*T tokens.
    virtual LossParts forward(const int32_t* inputs, const int32_t* targets, int B, int T, bool training) = 0;
    virtual void backward(float loss_scale) = 0;
    // The V logits of row `row` of the last forward, into a host array (sampling).
    virtual void logits_row(int64_t row, float* out) = 0;
    virtual void zero_grads() = 0;
    virtual void reduce_grads() = 0;   // as model_reduce_grads
    virtual double grad_norm() = 0;    // as model_grad_norm
    // One AdamW update of this rank's optimizer shard (increments opt.step), gradients times grad_multiplier, then
    // the weights gathered from every rank's shard (collective).
    virtual void adamw(AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier) = 0;
    // Tokens routed to each expert of each block since the last bias update (host; as Model::expert_counts).
    virtual std::vector<std::vector<int64_t>>& expert_counts() = 0;
    virtual void update_router_bias(const std::vector<std::vector<int64_t>>& counts) = 0;
    // The dense peak FLOP/s of one device for MFU, 0 when unknown (the CPU, a GPU missing from the table).
    virtual double peak_flops() const { return 0.0; }
};

// Builds the backend for host model m (already model_init'ed and initialised) and batches of B x T: it allocates
// what it can now, so that "out of memory" mostly comes before training (std::bad_alloc or std::runtime_error with
// the reason): the GPU backend everything; the CPU backend the forward's activations, while the backward's scratch
// (the logits' gradients, the attention scores' gradients) is allocated in each step. The trainer calls load()
// before the first step.
using MakeBackend = std::unique_ptr<Backend> (*)(Model& m, const TrainArgs& args);
