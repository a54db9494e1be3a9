// train: the GPU trainer. The same program as train_cpu (trainer/trainer.cpp: command line, data, logs,
// checkpoints, sampling) with the arithmetic on the GPU (gpu/gpu_model.cu) and the ranks joined by NCCL, one GPU
// per rank (comm/nccl_comm.cu; under mpirun, or alone on GPU 0). --dtype bf16 (the default) runs the GEMMs on
// BF16 inputs with FP32 accumulation; --dtype fp32 runs everything in FP32 and follows train_cpu closely; --dtype fp8
// runs the linear layers inside the blocks in DeepSeek-V3's FP8 recipe and follows train_cpu --dtype fp8.
// --recompute keeps one activation set per kind of block (and one chunk of logits per head) and runs their forward
// again in the backward.
// At start rank 0 prints its GPU and the memory plan; each step line adds MFU against the GPU's BF16 peak.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "gpu/gpu_model.h"
#include "model/train_args.h"
#include "trainer/backend.h"
#include "trainer/trainer.h"

namespace {

class GpuBackend : public Backend {
public:
    GpuBackend(Model& host, const TrainArgs& args) {
        const gpu::Precision precision = args.dtype == "fp32"  ? gpu::Precision::FP32
                                         : args.dtype == "fp8" ? gpu::Precision::FP8
                                                               : gpu::Precision::BF16;
        int device = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        size_t free_before = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
        ActivationLayout layout;
        layout.recompute = args.recompute;
        gpu_model_init(model_, host.config, *host.comm, precision, args.batch, args.seq, layout);
        model_release_grads(host);  // the gradients live on the GPU only
        size_t free_after = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
        peak_ = gpu_peak_flops(prop);
        if (host.comm->rank != 0) return;
        const GpuMemoryPlan plan =
            gpu_memory_plan(host.config, host.comm->ep_size, host.comm->world, precision, args.batch, args.seq, layout);
        const double gib = 1024.0 * 1024.0 * 1024.0;
        const char* gemms = precision == gpu::Precision::FP8    ? "fp8 in the blocks' linear layers, bf16 elsewhere"
                            : precision == gpu::Precision::BF16 ? "bf16"
                                                                : "fp32";
        printf("GPU %d: %s, %.1f GiB; GEMM inputs %s (FP32 accumulation)\n", device, prop.name, total / gib, gemms);
        printf("memory plan per GPU: parameters %.2f GiB, gradients %.2f GiB, optimizer state %.2f GiB, activations "
               "%.2f GiB%s, expert rows %.2f GiB, workspace %.2f GiB; free %.2f GiB before, %.2f GiB after\n",
               plan.params / gib, plan.grads / gib, plan.optimizer / gib, plan.activations / gib,
               args.recompute ? " (--recompute: the blocks' inputs, one set per kind of block)" : "", plan.expert_rows / gib,
               plan.scratch / gib, free_before / gib, free_after / gib);
        if (peak_ == 0.0)
            printf("MFU: %s is not in the peak table (gpu_peak_flops, gpu/gpu_model.cu): not printed\n", prop.name);
    }
    ~GpuBackend() override { gpu_model_free(model_); }

    void load(const Model& host, const AdamWState& opt) override { gpu_model_upload(model_, host, opt); }
    void store(Model& host, AdamWState& opt) override { gpu_model_download(model_, host, opt); }
    LossParts forward(const int32_t* inputs, const int32_t* targets, int B, int T, bool training) override {
        if (T != model_.T)
            throw std::runtime_error("internal error: a forward over " + std::to_string(T) +
                                     " tokens per sequence; the GPU model holds " + std::to_string(model_.T));
        return gpu_model_forward(model_, inputs, targets, B, training);
    }
    void backward(float loss_scale) override { gpu_model_backward(model_, loss_scale); }
    void logits_row(int64_t row, float* out) override { gpu_model_logits_row(model_, row, out); }
    void zero_grads() override { gpu_model_zero_grads(model_); }
    void reduce_grads() override { gpu_model_reduce_grads(model_); }
    double grad_norm() override { return gpu_model_grad_norm(model_); }
    void adamw(AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier) override {
        gpu_model_adamw(model_, opt, oc, lr, grad_multiplier);
    }
    std::vector<std::vector<int64_t>>& expert_counts() override { return model_.expert_counts; }
    void update_router_bias(const std::vector<std::vector<int64_t>>& counts) override {
        gpu_model_update_router_bias(model_, counts);
    }
    double peak_flops() const override { return peak_; }

private:
    GpuModel model_;
    double peak_ = 0.0;
};

std::unique_ptr<Backend> make_gpu_backend(Model& host, const TrainArgs& args) {
    return std::make_unique<GpuBackend>(host, args);
}

}  // namespace

int main(int argc, char** argv) { return train_main(argc, argv, "train", make_nccl_comm, make_gpu_backend); }
