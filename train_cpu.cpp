// train_cpu: the CPU reference trainer (FP32, or FP8 simulated; OpenMP; over MPI ranks under mpirun). It trains the
// host model of model/model.h in place; everything around the loop (flags, data, checkpoints, logs, evaluation,
// sampling) is trainer/run.h, shared with the GPU trainer train.cu, whose loop is this one on the GPU.
#include <stdexcept>

#include "trainer/pipeline.h"
#include "trainer/run.h"

int main(int argc, char** argv) {
    Run run;
    Model& model = run.model;  // the CPU trains the host model itself
    // its precision, and the activations of a batch now: out of memory is said before training
    const MakeModel prepare = [](Run& r) {
        r.model.precision = r.args.precision_or(Precision::FP32);
        if (r.model.precision == Precision::BF16)
            throw std::runtime_error("the CPU trainer computes in fp32 (or fp8, simulated); --dtype bf16 is for the "
                                     "GPU trainer ./train");
        r.model.layout.recompute = r.args.recompute;
        model_reserve(r.model, r.args.batch, r.args.seq);
        keep_freed_memory();
    };
    int status = 0;
    if (!start_run(run, argc, argv, "train_cpu", make_comm, prepare, &status)) return status;
    const int B = run.args.batch, T = run.args.seq;
    Comm& comm = *run.comm;
    // what the pipeline stages pass each other: activations forward, their gradients backward
    const int64_t message = stage_message_floats(run.config, B, T);
    std::vector<float> buffers(comm.pp_size > 1 ? 4 * message : 0);
    const StageMessages messages = stage_messages(comm.pp_size > 1 ? buffers.data() : nullptr, message);
    const ModelCalls calls{
        [&](const int32_t* inputs, const int32_t* targets, int b, bool training) {
            LossParts losses;
            pipeline_forward(comm, [&](const float* in, float* out) {
                losses = model_stage_forward(model, inputs, targets, b, T, training, in, out);
            }, messages);
            return losses;  // the last stage's heads; the balance losses of this stage's blocks
        },
        [&](int64_t row, float* out) { model_logits_row(model, row, out); },
        [] {}};  // the host model is the one trained
    if (run.args.eval_only) return eval_only(run, calls);

    start_training(run);
    try {
        for (int64_t step = run.state.step; step < run.args.steps; step++) {
            Step s = begin_step(run, step);  // every micro-step's batch, read and checked on every rank
            model_zero_grads(model);
            // every micro-step's forward and backward through the stages (one stage: forward, backward, forward, ...)
            const StageWork work{
                [&](int micro, int slot, const float* in, float* out) {
                    model_use_slot(model, slot);
                    s.add(model_stage_forward(model, s.inputs_of(micro), s.targets_of(micro), B, T, true, in, out));
                },
                [&](int, int slot, const float* dout, float* din) {
                    model_use_slot(model, slot);
                    model_stage_backward(model, s.loss_scale, dout, din);
                }};
            pipeline_train(comm, run.args.grad_accum, work, messages);
            model_reduce_grads(model);  // over the ranks that share each tensor
            s.grad_norm = model_grad_norm(model);
            reduce_step(run, s, model.expert_counts);  // losses and expert loads over the ranks, checked finite
            s.lr = learning_rate(run.oc, step);
            if (!s.skip_update) {  // --skip-spikes: an outlier step changes nothing
                model_adamw(model, run.opt, run.oc, s.lr, clip_factor(run.oc, s.grad_norm));
                model_update_router_bias(model, model.expert_counts);
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
