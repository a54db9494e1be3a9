// test_gpu, part 2: the whole GPU training step against the CPU reference, then the GPU trainer against
// train_cpu through their command lines.
//   step:    one forward and backward of the same random model and batch on both; the loss parts and every
//            gradient tensor are compared. FP32: GEMMs by cuBLASLt in FP32 (no TF32) and the kernels of kernels/,
//            so only the order of the sums differs; gradients come out of chains of GEMMs summing hundreds to
//            thousands of terms, hence 1e-4 relative to each tensor's scale (the kernel checks' bound for long
//            reductions), and 1e-5 for the losses (a mean over the rows of sums of a few hundred terms).
//            BF16: every GEMM and attention input rounded to 8 bits of mantissa (u = 2^-8 = 3.9e-3 relative); the
//            errors of ~10 GEMMs in a chain partly cancel, so the loss lands within ~u of the FP32 one: 1e-2
//            relative (2.5 u). The gradient vector as a whole: norm within 2% of the CPU's, cosine >= 0.999 less
//            3e-3 per assignment that changed experts (at most 1% + 1 may: test/random_model.h); with the same
//            routing, also each tensor's relative L2 error <= 0.1 (a moved token shifts whole rows of an expert's
//            gradient), tight enough to catch a wrong offset or a missing term (errors of order 1).
//            FP8: against the CPU model with its FP8 linear layers (model/fp8.h): both quantize the same way, but the
//            GPU's BF16 elsewhere flips some E4M3 roundings, and those move the router's inputs: up to 3% of the
//            assignments may move and the cosine must be >= 0.98, the loss and norm bounds as BF16's
//            (test/random_model.h: the FP8 model's own sensitivity, measured). The FP8 GEMMs themselves are held
//            to 1e-3 call by call (test_gpu_matmul.cu), and the orchestration they share with BF16 by the FP32 step.
//   recompute: the same step with --recompute, against the same model without, to the bit (test/recompute_check.h):
//            every kernel and cuBLASLt call is deterministic (the same algorithm per shape, no atomics in any sum).
//   trainer: ./train --dtype fp32 and ./train_cpu, 20 steps of the `small` config on the default data with the
//            same seed, and a checkpoint written at step 10 by either trainer resumed by the other, compared with
//            the run that wrote it. The first step of a run (or after a resume) starts from the same weights and
//            moments, the second one update later: loss and gradient norm within 1e-4 relative for both (the
//            whole-step bounds above, with margin for that one update).
//            Later steps only follow the same curve: loss within 2e-2. Bit-level agreement cannot last: AdamW's
//            first update is lr g / (|g| + eps) with eps = 1e-8, so gradient entries of size ~eps move their weight
//            by a sizeable fraction of lr on rounding differences alone, and by step 3 some tokens choose other
//            experts. These runs go through NCCL (train always does, --ep 1 included).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gpu/model.h"
#include "model/config.h"
#include "test/gpu_check.cuh"
#include "test/random_model.h"
#include "test/recompute_check.h"

namespace {

// The CPU and the GPU model from the same random weights, one training forward and backward each. spread: the
// test's wide random weights (randomize_for_test); otherwise the trainer's initialisation.
void compare_step(const std::string& name, const Config& c, Precision precision, int B, int T, uint64_t seed,
                  bool spread) {
    Model cpu;
    model_init(cpu, c);
    cpu.precision = precision == Precision::FP8 ? Precision::FP8 : Precision::FP32;
    if (spread)
        randomize_for_test(cpu, seed);
    else
        model_init_weights(cpu, seed);
    const std::vector<int32_t> inputs = random_tokens((int64_t)B * T, c.vocab_size, seed + 1);
    const std::vector<int32_t> targets = random_tokens((int64_t)B * T, c.vocab_size, seed + 2);
    const LossParts want = model_forward(cpu, inputs.data(), targets.data(), B, T, true);
    model_zero_grads(cpu);
    model_backward(cpu, 1.0f);

    GpuModel gm;
    gpu_model_init(gm, c, local_comm(), precision, B, T);
    AdamWState opt = adamw_state(cpu.shard);
    gpu_model_upload(gm, cpu, opt);
    gpu_model_zero_grads(gm);
    gpu_model_forward(gm, inputs.data(), targets.data(), B, true);
    const LossParts got = gpu_model_losses(gm)[0];
    gpu_model_backward(gm, 1.0f);
    const std::vector<float> grads = gpu_model_grads(gm);
    const bool fp32 = precision == Precision::FP32;
    const std::string tag =
        name + (fp32 ? " fp32" : precision == Precision::BF16 ? " bf16" : " fp8 (vs the CPU's fp8 linear layers)");
    const double loss_tol = fp32 ? 1e-5 : 1e-2;
    check(tag + " loss main", std::vector<double>{got.main}, std::vector<double>{want.main}, loss_tol);
    if (c.num_nextn_predict_layers > 0)
        check(tag + " loss mtp", std::vector<double>{got.mtp}, std::vector<double>{want.mtp}, loss_tol);
    if (c.aux_loss_alpha > 0)
        check(tag + " loss balance", std::vector<double>{got.balance}, std::vector<double>{want.balance}, loss_tol);
    if (fp32)  // BF16 rounding moves the router's inputs by ~u: a few tokens change experts, legitimately
        for (int l = 0; l < c.num_blocks(); l++)
            check(tag + fmt(" expert counts block %d", l), gm.expert_counts[l], cpu.expert_counts[l], 0);
    if (fp32) {
        for (const ParamTensor& t : cpu.table.tensors) {
            if (!t.trainable) continue;
            const float *got_first = grads.data() + t.offset, *want_first = cpu.grads.data() + t.offset;
            check(tag + " d " + t.name, std::vector<float>(got_first, got_first + t.numel),
                  std::vector<float>(want_first, want_first + t.numel), 1e-4);
        }
    } else {
        const GradientAgreement a = gradient_agreement(cpu.table, grads.data(), cpu.grads.data());
        const int64_t assignments = total_assignments(cpu.expert_counts);
        const int64_t moved = moved_assignments(gm.expert_counts, cpu.expert_counts);
        const bool fp8 = precision == Precision::FP8;
        const int64_t max_moved = fp8 ? fp8_max_moved(assignments) : bf16_max_moved(assignments);
        const double min_cosine = fp8 ? FP8_MIN_COSINE : bf16_min_cosine(moved);
        const bool ok = moved <= max_moved && a.cosine >= min_cosine && fabs(a.norm_ratio - 1.0) <= 0.02 &&
                        a.worst_relative <= (moved > 0 ? MOVED_MAX_TENSOR_ERROR : 0.1);
        printf("%-62s %ld of %ld assignments moved, cos %.6f norm ratio %.4f worst tensor %.3f (%s)  %s\n",
               (tag + " gradients").c_str(), (long)moved, (long)assignments, a.cosine, a.norm_ratio,
               a.worst_relative, a.worst_name.c_str(), ok ? "ok" : "FAIL");
        (ok ? passed : failed)++;
    }
    if (precision == Precision::FP8)  // every product in FP8: none refused and run in BF16 instead
        check(tag + " FP8 shapes refused", std::vector<double>{(double)gm.matmul.fp8_refused}, {0.0}, 0);
    gpu_model_free(gm);
}

// One field ("loss", "grad_norm") of every step of a trainer's JSON log, by step number.
std::vector<double> read_log(const std::string& path, const std::string& field) {
    std::ifstream in(path);
    std::vector<double> values;
    std::string line;
    const std::string key = "\"" + field + "\": ";
    while (std::getline(in, line)) {
        long long step = 0;
        const size_t at = line.find(key);
        if (sscanf(line.c_str(), "{\"step\": %lld", &step) != 1 || at == std::string::npos || step < 1) continue;
        if ((long long)values.size() < step) values.resize(step, NAN);
        values[step - 1] = atof(line.c_str() + at + key.size());
    }
    return values;
}

bool run(const std::string& cmd) {
    printf("$ %s\n", cmd.c_str());
    fflush(stdout);
    return system(cmd.c_str()) == 0;
}

// Steps [first, last) of two logs: the first two steps' loss and gradient norm within 1e-4, the later losses
// within 2e-2 (see the top).
void compare_logs(const std::string& name, const std::string& got_log, const std::string& want_log, int first,
                  int last) {
    double start = 0.0, later = 0.0;  // the worst relative differences
    for (const char* field : {"loss", "grad_norm"}) {
        const std::vector<double> got = read_log(got_log, field), want = read_log(want_log, field);
        for (int s = first; s < last; s++) {
            const bool early = s < first + 2;
            if (!early && std::string(field) != "loss") continue;
            const double g = s < (int)got.size() ? got[s] : NAN, w = s < (int)want.size() ? want[s] : NAN;
            const double rel = fabs(g - w) / fabs(w);
            double& worst = early ? start : later;
            if (!(rel <= worst)) worst = std::isnan(worst) ? worst : rel;  // a NaN (a missing step) stays
        }
    }
    const bool ok = start <= 1e-4 && later <= 2e-2;
    printf("%-62s first two %8.2e (1e-4), later %8.2e (2e-2)  %s\n", name.c_str(), start, later, ok ? "ok" : "FAIL");
    (ok ? passed : failed)++;
}

// --recompute on the GPU: the same bits as without (test/recompute_check.h), the heads in chunks of 100 rows
void check_recompute(const std::string& name, const Config& c, Precision precision, int B, int T, uint64_t seed) {
    const RecomputeComparison r = compare_recompute(c, precision, B, T, seed, 100 * (int64_t)c.vocab_size);
    const bool ok = r.same_losses && r.same_grads && r.same_counts && r.same_logits && r.recomputed &&
                    r.kept_bytes_recompute < r.kept_bytes;
    printf("%-62s losses %s, gradients %s, counts %s, logits %s, recomputed %s, activations %.1f of %.1f MiB  %s\n",
           (name + " --recompute: the same bits").c_str(), r.same_losses ? "same" : "DIFFER",
           r.same_grads ? "same" : "DIFFER", r.same_counts ? "same" : "DIFFER", r.same_logits ? "same" : "DIFFER",
           r.recomputed ? "yes" : "NO", r.kept_bytes_recompute / 1048576.0, r.kept_bytes / 1048576.0,
           ok ? "ok" : "FAIL");
    (ok ? passed : failed)++;
}

// With shards > 1 a process runs only every shards-th check from the shard-th on (test_gpu_emulated spreads the step
// checks over two processes).
struct StepShard {
    int shard, shards, index = 0;
    bool mine() { return index++ % shards == shard; }
};

}  // namespace

void test_training_step(int shard, int shards) {
    StepShard s{shard, shards};
    const Config tiny = load_config("tiny");  // q_lora, groups, shared experts, MTP, balance loss
    if (s.mine()) compare_step("step tiny B=2 T=12", tiny, Precision::FP32, 2, 12, 11, true);
    Config plain = tiny;  // no q_lora, no MTP, no groups, no normalisation, a full and a partial attention tile
    plain.q_lora_rank = 0;
    plain.num_nextn_predict_layers = 0;
    plain.n_group = plain.topk_group = 1;
    plain.norm_topk_prob = false;
    plain.hidden_size = 48;
    if (s.mine()) compare_step("step plain B=3 T=70", plain, Precision::FP32, 3, 70, 12, true);
    const Config small = load_config("small");
    if (s.mine()) compare_step("step small B=2 T=128", small, Precision::FP32, 2, 128, 13, true);
    if (s.mine()) compare_step("step small B=2 T=128", small, Precision::BF16, 2, 128, 13, false);
    if (s.mine()) check_recompute("step small B=2 T=128 fp32", small, Precision::FP32, 2, 128, 14);
    if (s.mine()) check_recompute("step small B=2 T=128 bf16", small, Precision::BF16, 2, 128, 14);
}

// FP8 (run last by test_gpu, as its GEMM checks). The longer check first: test_gpu_emulated's first shard has the
// shorter share of test_training_step.
void test_training_step_fp8(int shard, int shards) {
    StepShard s{shard, shards};
    if (s.mine()) check_recompute("step small B=2 T=128 fp8", load_config("small"), Precision::FP8, 2, 128, 14);
    if (s.mine()) compare_step("step small B=2 T=128", load_config("small"), Precision::FP8, 2, 128, 13, false);
}

// The optimizer shard's collectives through the NCCL Comm on one GPU (ncclReduceScatter and ncclAllGather in place,
// over a world of one: the trainers skip them there), on a device buffer and on a staged host one: a sum over one
// rank and a gather from one leave every value as it was.
void test_nccl_shard_collectives() {
    std::unique_ptr<Comm> comm = make_nccl_comm(1, 1, "test_gpu");
    Rng rng(31);
    const int64_t piece = 3 * PARAM_ALIGN;
    std::vector<float> host(piece);
    for (float& x : host) x = rng.normal();
    DeviceArray<float> device(host);
    comm->reduce_scatter_sum(device.ptr, piece, Group::World);
    comm->all_gather(device.ptr, piece, Group::World);
    check("NCCL reduce-scatter, all-gather in place (1 rank, device)", device.get(), host, 0);
    std::vector<float> staged = host;
    comm->reduce_scatter_sum(staged.data(), piece, Group::World);
    comm->all_gather(staged.data(), piece, Group::World);
    check("NCCL reduce-scatter, all-gather in place (1 rank, host)", staged, host, 0);
}

void test_trainers() {
    char dir_template[] = "/tmp/moe_test_gpu_train_XXXXXX";  // this run's own directory
    if (!mkdtemp(dir_template)) {
        printf("%-62s cannot create a directory in /tmp  FAIL\n", "trainer runs");
        failed++;
        return;
    }
    const std::string dir = dir_template;
    printf("(trainer logs and checkpoints in %s)\n", dir.c_str());
    const std::string common = " --config small --data 'data/default/train_*.bin' --steps 20 --batch 4 --seq 64 "
                               "--lr 3e-3 --warmup 5 --seed 7 --checkpoint-every 10";
    if (!run("mkdir -p " + dir + "/c2g " + dir + "/g2c") ||
        !run("./train_cpu" + common + " --checkpoint-dir " + dir + "/cpu --log " + dir + "/cpu.jsonl > /dev/null") ||
        !run("./train --dtype fp32" + common + " --checkpoint-dir " + dir + "/gpu --log " + dir + "/gpu.jsonl") ||
        !run("cp " + dir + "/cpu/ckpt_00000010.safetensors " + dir + "/c2g/ && cp " + dir +
             "/gpu/ckpt_00000010.safetensors " + dir + "/g2c/") ||
        !run("./train --dtype fp32 --resume" + common + " --checkpoint-dir " + dir + "/c2g --log " + dir +
             "/c2g.jsonl > /dev/null") ||
        !run("./train_cpu --resume" + common + " --checkpoint-dir " + dir + "/g2c --log " + dir +
             "/g2c.jsonl > /dev/null")) {
        printf("%-62s a command failed  FAIL\n", "trainer runs");
        failed++;
        return;
    }
    compare_logs("train fp32 vs train_cpu, steps 1-20", dir + "/gpu.jsonl", dir + "/cpu.jsonl", 0, 20);
    compare_logs("resume CPU checkpoint on GPU, steps 11-20", dir + "/c2g.jsonl", dir + "/cpu.jsonl", 10, 20);
    compare_logs("resume GPU checkpoint on CPU, steps 11-20", dir + "/g2c.jsonl", dir + "/gpu.jsonl", 10, 20);
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (devices < 2) {
        printf("(one GPU: the 2-rank NCCL run of train --ep 2 needs two; not run)\n");
        return;
    }
    if (!run("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 ./train --dtype fp32 --ep 2" +
             common + " --batch 2 --checkpoint-dir " + dir + "/ep2 --log " + dir + "/ep2.jsonl > /dev/null")) {
        printf("%-62s mpirun failed  FAIL\n", "train --ep 2 on 2 GPUs");
        failed++;
        return;
    }
    compare_logs("train --ep 2 (2 GPUs, batch 2 each) vs 1 GPU batch 4", dir + "/ep2.jsonl", dir + "/gpu.jsonl", 0,
                 20);
}
