// train: the GPU trainer, train_cpu's loop with the arithmetic on the GPU (gpu/model.h) and the ranks joined by NCCL,
// one GPU per rank (comm/nccl_comm.cu; under mpirun, or alone on GPU 0). Everything around the loop is
// trainer/run.h, shared with train_cpu. --dtype bf16 (the default) runs the GEMMs on BF16 inputs with FP32
// accumulation, fp32 everything in FP32 (it follows train_cpu closely), fp8 the linear layers inside the blocks in
// DeepSeek-V3's FP8 recipe (it follows train_cpu --dtype fp8).
#include <cstdio>
#include <stdexcept>

#include "gpu/model.h"
#include "trainer/pipeline.h"
#include "trainer/run.h"

// Rank 0's opening lines: the GPU, the GEMMs' precision, the memory plan against what was free.
static void print_device(const Run& run, int device, const cudaDeviceProp& prop, size_t free_before, size_t total) {
    size_t free_after = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    const TrainArgs& args = run.args;
    const Precision p = args.precision_or(Precision::BF16);
    const Comm& comm = *run.comm;
    const GpuMemoryPlan plan = gpu_memory_plan(run.config, comm.ep_size, comm.stage_size(), p, args.batch, args.seq,
                                               ActivationLayout{args.recompute}, run.oc.moments,
                                               run.model.first_layer, run.model.end_layer,
                                               pipeline_slots(comm, args.grad_accum));
    const double gib = 1024.0 * 1024.0 * 1024.0;
    printf("GPU %d: %s, %.1f GiB; GEMM inputs %s (FP32 accumulation)\n", device, prop.name, total / gib,
           p == Precision::FP8 ? "fp8 in the blocks' linear layers, bf16 elsewhere"
           : p == Precision::BF16 ? "bf16" : "fp32");
    printf("memory plan per GPU: parameters %.2f GiB, gradients %.2f GiB, optimizer state %.2f GiB (%s moments%s), "
           "activations %.2f GiB%s, expert rows %.2f GiB, workspace %.2f GiB; free %.2f GiB before, %.2f GiB after\n",
           plan.params / gib, plan.grads / gib, plan.optimizer / gib,
           run.oc.moments == Moments::BF16 ? "BF16" : "FP32", p == Precision::FP32 ? "" : ", FP32 master weights",
           plan.activations / gib,
           args.recompute ? " (--recompute: the blocks' inputs, one set per kind of block)" : "",
           plan.expert_rows / gib, plan.scratch / gib, free_before / gib, free_after / gib);
    if (run.peak_flops == 0.0)
        printf("MFU: %s is not in the peak table (gpu_peak_flops, gpu/model.cu): not printed\n", prop.name);
}

int main(int argc, char** argv) {
    Run run;
    GpuModel model;
    int device = 0;
    cudaDeviceProp prop;
    size_t free_before = 0, total = 0;
    float* pipe_buffers = nullptr;  // what the pipeline stages pass each other: activations forward, gradients back
    // the GPU's memory for the model and a batch, taken before the weights are read: what does not fit is said first
    const MakeModel allocate = [&](Run& r) {
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
        const Precision p = r.args.precision_or(Precision::BF16);
        if (!r.args.export_hf.empty() && r.args.export_dtype == "f32" && p != Precision::FP32 && r.comm->world > 1)
            throw std::runtime_error("--export-dtype f32 needs the FP32 master weights, which --dtype bf16 and fp8 "
                                     "shard over the ranks (export bf16, or resume the checkpoint on one rank)");
        gpu_model_init(model, r.config, *r.comm, p, r.args.batch, r.args.seq,
                       ActivationLayout{r.args.recompute}, r.oc.moments, r.model.first_layer, r.model.end_layer);
        if (r.comm->pp_size > 1)
            CUDA_CHECK(cudaMalloc(&pipe_buffers, 4 * stage_message_floats(r.config, r.args.batch, r.args.seq) * 4));
        r.on_end = [&] {
            CUDA_CHECK(cudaFree(pipe_buffers));
            gpu_model_free(model);
        };
        model_release_grads(r.model);  // the gradients live on the GPU only
    };
    int status = 0;
    if (!start_run(run, argc, argv, "train", make_nccl_comm, allocate, &status)) return status;
    const int B = run.args.batch;
    Comm& comm = *run.comm;
    agree(run, [&] { gpu_model_upload(model, run.model, run.opt); });
    const StageMessages messages = stage_messages(pipe_buffers, stage_message_floats(run.config, B, run.args.seq));
    // after a stage's forward or backward: the message it wrote is complete before the Comm sends it
    const auto hand_over = [&] {
        if (comm.pp_size > 1) comm_follows(model);
    };
    run.peak_flops = gpu_peak_flops(prop);
    if (run.comm->rank == 0) print_device(run, device, prop, free_before, total);
    const ModelCalls calls{
        [&](const int32_t* inputs, const int32_t* targets, int b, bool training) {
            pipeline_forward(comm, [&](const float* in, float* out) {
                gpu_model_forward(model, inputs, targets, b, training, in, out);
                hand_over();
            }, messages);
            return targets ? gpu_model_losses(model)[0] : LossParts{};  // without targets, only the logits
        },
        [&](int64_t row, float* out) { gpu_model_logits_row(model, row, out); },
        [&] { gpu_model_download(model, run.model, run.opt); }};  // the host copy checkpoints are written from
    if (run.args.eval_only) return eval_only(run, calls);

    start_training(run);
    try {
        for (int64_t step = run.state.step; step < run.args.steps; step++) {
            Step s = begin_step(run, step);  // every micro-step's batch, read and checked on every rank
            const int64_t fp8_in_bf16 = model.matmul.fp8_in_bf16;  // FP8 products run in BF16 so far
            gpu_model_zero_grads(model);
            // every micro-step's forward and backward through the stages (one stage: forward, backward, forward, ...)
            const StageWork work{
                [&](int micro, int slot, const float* in, float* out) {
                    gpu_model_use_slot(model, slot);
                    gpu_model_forward(model, s.inputs_of(micro), s.targets_of(micro), B, true, in, out);
                    hand_over();
                },
                [&](int, int slot, const float* dout, float* din) {
                    gpu_model_use_slot(model, slot);
                    gpu_model_backward(model, s.loss_scale, dout, din);
                    hand_over();
                }};
            pipeline_train(comm, run.args.grad_accum, work, messages);
            for (const LossParts& losses : gpu_model_losses(model)) s.add(losses);  // every micro-step's, one wait
            gpu_model_reduce_grads(model);  // over the ranks that share each tensor
            s.grad_norm = gpu_model_grad_norm(model);
            s.fp8_in_bf16 = (double)(model.matmul.fp8_in_bf16 - fp8_in_bf16);
            reduce_step(run, s, model.expert_counts);  // losses and expert loads over the ranks, checked finite
            s.lr = learning_rate(run.oc, step);
            if (!s.skip_update) {  // --skip-spikes: an outlier step changes nothing
                gpu_model_adamw(model, run.opt, run.oc, s.lr, clip_factor(run.oc, s.grad_norm));
                gpu_model_update_router_bias(model, model.expert_counts);
            }
            s.seconds = s.elapsed();  // the step's time, without the evaluation
            if (eval_due(run, step)) s.val_loss = evaluate(run, calls);
            log_step(run, s);
            const int stop = end_step(run, step);  // a stop signal any rank received
            if (checkpoint_due(run, stop)) save_checkpoint(run, calls);
            if (stop) return stop_run(run, stop);
        }
    } catch (const std::exception& e) {
        fail(e.what());
    }
    return finish_run(run, calls);
}
