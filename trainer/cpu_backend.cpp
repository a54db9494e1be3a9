// The CPU backend: every call is the model/model.h function of the same name on the trainer's host Model. The
// weights, gradients and AdamW moments it computes on are the host's own, so load and store have nothing to copy.
#include "trainer/cpu_backend.h"

#include <stdexcept>

#include "model/train_args.h"

namespace {

class CpuBackend : public Backend {
public:
    CpuBackend(Model& m, const TrainArgs& args) : m_(m) {
        if (args.dtype == "bf16")
            throw std::runtime_error(
                "the CPU trainer computes in fp32 (or fp8, simulated); --dtype bf16 is for the GPU trainer ./train");
        m_.linear_precision = args.dtype == "fp8" ? LinearPrecision::FP8 : LinearPrecision::FP32;
        m_.layout.recompute = args.recompute;
        model_reserve(m_, args.batch, args.seq);
        keep_freed_memory();
    }
    void load(const Model& host, const AdamWState& opt) override {}
    void store(Model& host, AdamWState& opt) override {}
    LossParts forward(const int32_t* inputs, const int32_t* targets, int B, int T, bool training) override {
        return model_forward(m_, inputs, targets, B, T, training);
    }
    void backward(float loss_scale) override { model_backward(m_, loss_scale); }
    void logits_row(int64_t row, float* out) override { model_logits_row(m_, row, out); }
    void zero_grads() override { model_zero_grads(m_); }
    void reduce_grads() override { model_reduce_grads(m_); }
    double grad_norm() override { return model_grad_norm(m_); }
    void adamw(AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier) override {
        model_adamw(m_, opt, oc, lr, grad_multiplier);
    }
    std::vector<std::vector<int64_t>>& expert_counts() override { return m_.expert_counts; }
    void update_router_bias(const std::vector<std::vector<int64_t>>& counts) override {
        model_update_router_bias(m_, counts);
    }

private:
    Model& m_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(Model& m, const TrainArgs& args) {
    return std::make_unique<CpuBackend>(m, args);
}
