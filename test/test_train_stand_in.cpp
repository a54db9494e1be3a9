// The GPU trainer's program on the CPU: ./train_stand_in is train.cu (the GpuBackend over gpu/gpu_model.cu, the
// shared trainer, make_nccl_comm) compiled as C++ against the stand-ins of test/cpu_stand_in/ (Makefile), so the
// trainer-level checks test/test_gpu_train.cu makes of ./train on a GPU run here against ./train_cpu: the
// GpuBackend, the trainer's load/store placement (init, resume, import; checkpoint, export), logs, evaluation,
// sampling, BF16 and expert parallelism under mpirun. The common run: `small`, the default data, batch 4 x 64,
// lr 3e-3, warmup 5, seed 7, 20 steps, a checkpoint every 10.
//
// Tolerances (relative; measured with the Makefile's flags on 2 cores in brackets):
//   - Fresh runs, steps 1-2: 1e-6 [<= 5e-9]. The stand-ins compute with the CPU reference's functions and differ
//     from it only where a kernel contract does (test/gpu_model_cpu_check.cpp: the attention backward from the
//     log-sum-exp, FP32 per-row losses): gradients within ~1e-7 of each tensor's largest value.
//   - Fresh runs, steps 3-20: loose, loss 1e-2 [1e-3] and gradient norm 0.2 [5e-2], the same training curve and
//     no more. The two runs really do part: AdamW's first update is lr g / (|g| + eps), eps = 1e-8, and many
//     gradient entries are of order eps (against tensor maxima ~1e-3), so a gradient difference of 5e-10 (1.5e-7
//     of the tensor's largest) moves such a weight by 1.4% of lr (measured at step 1: g = -9.39e-9 against
//     -9.94e-9 moves a layer-0 down_proj weight by 8.6e-6); by step 3 a few tokens pick other experts (the
//     experts' AdamW moments 10-25% apart) and from there on the two runs are two samples of the same training.
//     ./train on a GPU, whose sums differ from the CPU's more than the stand-ins' do, should part from train_cpu
//     the same way: test_gpu_train.cu's 2e-3 over steps 1-20 is not to be expected there.
//   - Resumed runs, steps 11-20, one process (--grad-accum 2 too): 1e-6 [<= 5e-9]. Resumed from the same step-10
//     checkpoint, both trainers start from the same weights and moments, and the moments of 10 steps put sqrt(v)
//     far above the gradient differences: no amplification, no expert changes in 10 steps.
//   - A checkpoint resumed by the program that wrote it: 1e-6 [0: bit-identical, BF16 too], i.e. the checkpoint
//     holds all the state (nothing left only on the device: router biases, moments, the BF16 copy is rebuilt).
//     BF16 resumes with --recompute, which must change no bit: its step-20 checkpoint is the first run's, byte for
//     byte.
//   - Under mpirun (EP 2, DP 2): the sums over tokens split over the ranks: 1e-5 [<= 4e-9] (gpu_model_cpu_check's
//     distributed bound).
//   - Evaluation (--eval-only, and --val during training): 1e-6 [equal to the 6 printed decimals]. Sampling: the
//     same text (a token changes only if the uniform draw falls within ~1e-7 of a boundary). Export of a resumed
//     checkpoint: byte-identical files (copies only, no arithmetic).
//   - BF16: loss within 2e-2 of the FP32 run at every step [4e-3; "a few %"], its own resume as above, and the
//     validation loss of a checkpoint within 1e-2 of FP32 [6e-6] (test_gpu's BF16 loss bound).
// And ./train_emulated, train.cu on the real kernels through the kernel emulator: 6 steps against train_cpu.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "test/test_helpers.h"

namespace {

// The command's status and output (kept in test_path("stand_in_NAME.txt")), within 120 s.
using Job = CommandResult;
// 300 s: the jobs take ~30 s alone, and run two or four processes at a time on two cores
Job sh(const std::string& name, const std::string& cmd) { return run_logged(cmd, "stand_in_" + name + ".txt", 300); }

std::string dir(const std::string& name) { return test_path("stand_in_" + name); }
std::string log_of(const std::string& name) { return test_path("stand_in_" + name + ".jsonl"); }

// A fresh checkpoint directory holding a copy of one checkpoint (the runs resumed from it write their own there).
void copy_checkpoint(const std::string& from_run, int step, const std::string& to_run) {
    char file[64];
    snprintf(file, sizeof file, "/ckpt_%08d.safetensors", step);
    REQUIRE(system(("rm -rf " + dir(to_run) + " && mkdir -p " + dir(to_run) + " && cp " + dir(from_run) + file + " " +
                    dir(to_run) + "/")
                       .c_str()) == 0);
}

const std::string COMMON = " --config small --data 'data/default/train_*.bin' --steps 20 --seq 64 --lr 3e-3 "
                           "--warmup 5 --seed 7 --checkpoint-every 10";
const std::string VAL = " --val 'data/default/val_*.bin' --eval-every 5 --eval-batches 4";
const std::string MPIRUN = mpirun_command(2);

// program + the common run with `batch` sequences per rank, checkpoints in dir(name), log log_of(name)
std::string train(const std::string& program, const std::string& name, const std::string& extra, int batch = 4) {
    return program + COMMON + " --batch " + std::to_string(batch) + extra + " --checkpoint-dir " + dir(name) +
           " --log " + log_of(name);
}

// One field of every step of a trainer's JSON log, by step (index step - 1); NaN where a step lacks it.
std::vector<double> read_log(const std::string& path, const std::string& field) {
    std::ifstream in(path);
    std::vector<double> values;
    const std::string key = "\"" + field + "\": ";
    for (std::string line; std::getline(in, line);) {
        long long step = 0;
        const size_t at = line.find(key);
        if (sscanf(line.c_str(), "{\"step\": %lld", &step) != 1 || step < 1) continue;
        if ((long long)values.size() < step) values.resize(step, NAN);
        if (at != std::string::npos) values[step - 1] = atof(line.c_str() + at + key.size());
    }
    return values;
}

// The largest relative difference of the fields over steps [first, last] (1-based) where want has the field;
// infinity where got lacks a step want has (a missing or short log).
double worst_rel(const std::string& got_log, const std::string& want_log, std::initializer_list<const char*> fields,
                 int first, int last) {
    double worst = 0.0;
    int compared = 0;
    for (const char* field : fields) {
        const std::vector<double> got = read_log(got_log, field), want = read_log(want_log, field);
        for (int s = first; s <= last; s++) {
            const double w = s <= (int)want.size() ? want[s - 1] : NAN, g = s <= (int)got.size() ? got[s - 1] : NAN;
            if (std::isnan(w) && std::string(field) == "val_loss") continue;  // not evaluated at this step
            compared++;
            const double rel = std::isnan(g) || std::isnan(w) ? INFINITY : fabs(g - w) / fabs(w);
            worst = std::max(worst, rel);
        }
    }
    return compared > 0 ? worst : INFINITY;
}

void check_logs(const std::string& what, const std::string& got, const std::string& want,
                std::initializer_list<const char*> fields, int first, int last, double tol) {
    const double worst = worst_rel(log_of(got), log_of(want), fields, first, last);
    printf("train_stand_in: %-66s worst rel %8.2e  tol %.0e\n", what.c_str(), worst, tol);
    CHECK_MESSAGE(worst <= tol, what << ": worst relative difference " << worst << " > " << tol);
}

// "val_loss X" of an --eval-only run
double val_loss_of(const Job& j) {
    const size_t at = j.out.rfind("val_loss ");
    return at == std::string::npos ? NAN : atof(j.out.c_str() + at + 9);
}

// the sampled text (from the "sample (" line to the end)
std::string sample_of(const Job& j) {
    const size_t at = j.out.find("sample (");
    return at == std::string::npos ? "" : j.out.substr(at);
}

// The two 20-step reference runs, once per test_cpu process: train_cpu and train_stand_in --dtype fp32, both with a
// validation loss every 5 steps.
struct Base {
    Job cpu, fp32;
};
const Base& base() {
    static const Base b = [] {
        Base r;
        r.cpu = sh("cpu", "rm -rf " + dir("cpu") + " && " + train("./train_cpu", "cpu", VAL));
        r.fp32 = sh("fp32", "rm -rf " + dir("fp32") + " && " + train("./train_stand_in --dtype fp32", "fp32", VAL));
        return r;
    }();
    INFO(b.cpu.out << "\n" << b.fp32.out);
    REQUIRE(b.cpu.status == 0);
    REQUIRE(b.fp32.status == 0);
    return b;
}

}  // namespace

TEST_CASE("train_stand_in --dtype fp32 follows train_cpu for 20 steps; step-10 checkpoints resume across the two") {
    const Base& b = base();
    CHECK(b.fp32.out.find("GPU 0: CPU stand-in") != std::string::npos);  // the GpuBackend's banner
    check_logs("fp32 vs train_cpu, steps 1-2 (loss, grad norm)", "fp32", "cpu", {"loss", "grad_norm"}, 1, 2, 1e-6);
    check_logs("fp32 vs train_cpu, steps 3-20 (loss): the same curve", "fp32", "cpu", {"loss"}, 3, 20, 1e-2);
    check_logs("fp32 vs train_cpu, steps 3-20 (grad norm): the same curve", "fp32", "cpu", {"grad_norm"}, 3, 20, 0.2);
    // train_cpu's checkpoint on the stand-in and the other way round, with evaluations at steps 15 and 20
    copy_checkpoint("cpu", 10, "c2s");
    copy_checkpoint("fp32", 10, "s2c");
    copy_checkpoint("fp32", 10, "s2s");
    const Job c2s = sh("c2s", train("./train_stand_in --dtype fp32 --resume", "c2s", VAL));
    const Job s2c = sh("s2c", train("./train_cpu --resume", "s2c", VAL));
    // the stand-in's own checkpoint, without the evaluations: they must not touch the training either
    const Job s2s = sh("s2s", train("./train_stand_in --dtype fp32 --resume", "s2s", ""));
    for (const Job* j : {&c2s, &s2c, &s2s}) {
        INFO(j->out);
        REQUIRE(j->status == 0);
        CHECK(j->out.find("resumed from ") != std::string::npos);
        CHECK(j->out.find("ckpt_00000010.safetensors at step 10") != std::string::npos);
    }
    check_logs("train_cpu's step 10 resumed on the stand-in, steps 11-20", "c2s", "cpu",
               {"loss", "grad_norm", "val_loss"}, 11, 20, 1e-6);
    check_logs("the stand-in's step 10 resumed on train_cpu, steps 11-20", "s2c", "fp32",
               {"loss", "grad_norm", "val_loss"}, 11, 20, 1e-6);
    check_logs("the stand-in's step 10 resumed on itself, no evals, steps 11-20", "s2s", "fp32", {"loss", "grad_norm"},
               11, 20, 1e-6);
    // two micro-steps of 2 sequences (the same global batch): the gradients accumulate over backward calls
    copy_checkpoint("cpu", 10, "accum_cpu");
    copy_checkpoint("cpu", 10, "accum_si");
    const Job accum_cpu = sh("accum_cpu", train("./train_cpu --resume --grad-accum 2", "accum_cpu", "", 2));
    const Job accum_si =
        sh("accum_si", train("./train_stand_in --dtype fp32 --resume --grad-accum 2", "accum_si", "", 2));
    INFO(accum_cpu.out << accum_si.out);
    REQUIRE(accum_cpu.status == 0);
    REQUIRE(accum_si.status == 0);
    check_logs("--grad-accum 2 --batch 2 from train_cpu's step 10, steps 11-20", "accum_si", "accum_cpu",
               {"loss", "grad_norm"}, 11, 20, 1e-6);
}

TEST_CASE("train_stand_in: evaluation, sampling, Hugging Face export and import through the GPU backend") {
    base();
    // train_cpu's final checkpoint, loaded by each program
    copy_checkpoint("cpu", 20, "final_cpu");
    copy_checkpoint("cpu", 20, "final_si");
    const std::string val = " --val 'data/default/val_*.bin' --eval-batches 4 --eval-only --resume";
    const Job eval_cpu =
        sh("eval_cpu", "./train_cpu --batch 4 --seq 64" + val + " --checkpoint-dir " + dir("final_cpu"));
    const Job eval_si = sh("eval_si", "./train_stand_in --dtype fp32 --batch 4 --seq 64" + val + " --checkpoint-dir " +
                                          dir("final_si"));
    // no steps left: the loaded model is sampled and exported as it is (store right after load)
    const std::string sample = " --resume --sample 20 --export-dtype f32 --export-hf ";
    const Job sample_cpu = sh("sample_cpu", train("./train_cpu", "final_cpu", sample + dir("hf_cpu")));
    const Job sample_si = sh("sample_si", train("./train_stand_in --dtype fp32", "final_si", sample + dir("hf_si")));
    for (const Job* j : {&eval_cpu, &eval_si, &sample_cpu, &sample_si}) {
        INFO(j->out);
        REQUIRE(j->status == 0);
    }
    printf("train_stand_in: --eval-only val_loss %.6f (stand-in) vs %.6f (train_cpu)\n", val_loss_of(eval_si),
           val_loss_of(eval_cpu));
    CHECK_REL(val_loss_of(eval_si), val_loss_of(eval_cpu), 1e-6);
    CHECK(sample_of(sample_cpu).size() > 30);
    CHECK(sample_of(sample_si) == sample_of(sample_cpu));
    CHECK(slurp(dir("hf_si") + "/config.json") == slurp(dir("hf_cpu") + "/config.json"));
    const std::string weights = slurp(dir("hf_cpu") + "/model.safetensors");
    CHECK(weights.size() > 1000000);
    CHECK(slurp(dir("hf_si") + "/model.safetensors") == weights);
    // the export imported again (load after --init-from-hf): the same validation loss
    const Job eval_hf = sh("eval_hf", "./train_stand_in --dtype fp32 --batch 4 --seq 64 --val 'data/default/val_*.bin' "
                                      "--eval-batches 4 --eval-only --init-from-hf " + dir("hf_si"));
    INFO(eval_hf.out);
    REQUIRE(eval_hf.status == 0);
    CHECK_REL(val_loss_of(eval_hf), val_loss_of(eval_cpu), 1e-6);
}

// The stand-in run of `dtype` (its log and checkpoints under that name) resumed from its step-10 checkpoint: steps
// 11-20 the same (loss and gradient norm within 1e-6: the precision's weight copies are remade at load)
// extra: flags of the resumed run only (--recompute, which must change nothing)
static void resumes_exactly(const std::string& dtype, const std::string& extra = "") {
    const std::string resumed = dtype + "_resumed";
    copy_checkpoint(dtype, 10, resumed);
    const Job job = sh(resumed, train("./train_stand_in --dtype " + dtype + " --resume" + extra, resumed, ""));
    INFO(job.out);
    REQUIRE(job.status == 0);
    check_logs(dtype + "'s step 10 resumed on itself" + extra + ", steps 11-20", resumed, dtype, {"loss", "grad_norm"},
               11, 20, 1e-6);
}

TEST_CASE("train_stand_in --dtype bf16: trains near fp32, resumes its own checkpoint exactly, evaluates near fp32") {
    base();
    const Job bf16 = sh("bf16", "rm -rf " + dir("bf16") + " && " + train("./train_stand_in --dtype bf16", "bf16", ""));
    INFO(bf16.out);
    REQUIRE(bf16.status == 0);
    CHECK(bf16.out.find("GEMM inputs bf16") != std::string::npos);
    check_logs("bf16 vs fp32 (loss), steps 1-20", "bf16", "fp32", {"loss"}, 1, 20, 2e-2);
    // resumed with --recompute (one activation set per kind of block, each block's forward run again): to the bit,
    // up to the step-20 checkpoint's bytes
    resumes_exactly("bf16", " --recompute");
    const std::string last = "/ckpt_00000020.safetensors", written = slurp(dir("bf16") + last);
    CHECK((!written.empty() && slurp(dir("bf16_resumed") + last) == written));
    // train_cpu's final checkpoint evaluated with BF16 GEMMs (the BF16 copy made at load)
    copy_checkpoint("cpu", 20, "final_bf16");
    const std::string val = " --batch 4 --seq 64 --val 'data/default/val_*.bin' --eval-batches 4 --eval-only --resume";
    const Job eval_bf16 =
        sh("eval_bf16", "./train_stand_in --dtype bf16" + val + " --checkpoint-dir " + dir("final_bf16"));
    const Job eval_fp32 = sh("eval_fp32", "./train_cpu" + val + " --checkpoint-dir " + dir("final_bf16"));
    INFO(eval_bf16.out << eval_fp32.out);
    REQUIRE(eval_bf16.status == 0);
    REQUIRE(eval_fp32.status == 0);
    printf("train_stand_in: --eval-only val_loss %.6f (bf16) vs %.6f (fp32)\n", val_loss_of(eval_bf16),
           val_loss_of(eval_fp32));
    CHECK_REL(val_loss_of(eval_bf16), val_loss_of(eval_fp32), 1e-2);
}

// --dtype fp8 (the linear layers inside the blocks in DeepSeek-V3's FP8 recipe, BF16 elsewhere) against train_cpu
// --dtype fp8 (FP32 elsewhere): the stand-in (its FP8 products from the weights' E4M3 copies, refreshed after every
// update) for 20 steps and train.cu on the emulated real kernels and FP8 GEMM code for 6, the loss within 2e-2 at
// every step (as BF16 against FP32: the BF16 elsewhere is the difference); the stand-in resumes its own checkpoint
// exactly (the E4M3 copies remade at load); and the emulated run under EP 2 follows the one-rank run.
TEST_CASE("--dtype fp8 in the GPU trainer follows train_cpu --dtype fp8 (stand-in and emulated), and resumes exactly") {
    Job emulated;  // about 30 s: beside the stand-in runs, on the other core
    const std::string six = " --config small --data 'data/default/train_*.bin' --steps 6 --seq 64 --lr 3e-3 "
                            "--warmup 5 --seed 7 --log ";
    std::thread emulated_run(
        [&] { emulated = sh("emu_fp8", "./train_emulated --dtype fp8 --batch 4" + six + log_of("emu_fp8")); });
    const Job cpu = sh("cpu_fp8", "rm -rf " + dir("cpu_fp8") + " && " + train("./train_cpu --dtype fp8", "cpu_fp8", ""));
    const Job fp8 = sh("fp8", "rm -rf " + dir("fp8") + " && " + train("./train_stand_in --dtype fp8", "fp8", ""));
    const Job cpu_six = sh("emu_cpu_fp8", "./train_cpu --dtype fp8 --batch 4" + six + log_of("emu_cpu_fp8"));
    emulated_run.join();
    INFO(cpu.out << fp8.out << cpu_six.out << emulated.out);
    REQUIRE(cpu.status == 0);
    REQUIRE(fp8.status == 0);
    REQUIRE(cpu_six.status == 0);
    REQUIRE(emulated.status == 0);
    CHECK(fp8.out.find("GEMM inputs fp8") != std::string::npos);
    check_logs("stand-in fp8 vs train_cpu fp8 (loss), steps 1-20", "fp8", "cpu_fp8", {"loss"}, 1, 20, 2e-2);
    check_logs("emulated fp8 vs train_cpu fp8 (loss), steps 1-6", "emu_fp8", "emu_cpu_fp8", {"loss"}, 1, 6, 2e-2);
    resumes_exactly("fp8");
    // EP 2 (each rank's expert shard with its own E4M3 copies) against one rank, with BF16 EP 2's bounds below
    // (measured: steps 1-2 equal to the last printed digit, 1.3e-4 of the loss by step 6)
    const Job ep2 = sh("emu_fp8_ep2", "env STAND_IN_GPUS=2 " + MPIRUN + "./train_emulated --dtype fp8 --ep 2 --batch 2" +
                                          six + log_of("emu_fp8_ep2"));
    INFO(ep2.out);
    REQUIRE(ep2.status == 0);
    check_logs("emulated fp8 EP 2 vs 1 rank, steps 1-2 (loss, grad norm)", "emu_fp8_ep2", "emu_fp8",
               {"loss", "grad_norm"}, 1, 2, 1e-4);
    check_logs("emulated fp8 EP 2 vs 1 rank, steps 3-6 (loss)", "emu_fp8_ep2", "emu_fp8", {"loss"}, 3, 6, 1e-3);
}

// ./train_emulated: train.cu on the real kernels and GEMM code, run by the kernel emulator (test/kernel_emulator/),
// with the real NCCL Comm (comm/nccl_comm.cu over the emulator's NCCL, which is MPI), for the first 6 steps of the
// common run. fp32 against train_cpu: steps 1-2 within 1e-4 (test_gpu_train.cu's bound for ./train on a GPU: the
// kernels sum in their own order), steps 3-6 the same curve; bf16 (tensor-core attention, BF16 GEMM inputs) within
// 2e-2 of fp32 at every step. Under mpirun on 4 ranks, EP 2 x DP 2 with batch 1 per rank, against one rank with
// batch 4: steps 1-2 within 1e-5 (the distributed bound above), steps 3-6 the same curve, and the step-6
// checkpoints (the 4-rank one gathered through NCCL) give train_cpu the same validation loss within 1e-5 (the
// weights differ by the steps' roundoff only, ~1e-8 of the losses). 2 ranks on a host with one GPU: one clear line,
// a non-zero exit. And bf16 with EP 2 (the expert rows exchanged in BF16) against bf16 on one rank.
TEST_CASE("train_emulated (train.cu on the real kernels, emulated) follows train_cpu in fp32 and bf16, and with EP 2") {
    const std::string six = " --config small --data 'data/default/train_*.bin' --steps 6 --seq 64 --lr 3e-3 "
                            "--warmup 5 --seed 7 --log ";
    Job fp32, bf16;  // about 25 s each: at once, on two cores
    std::thread bf16_run(
        [&] { bf16 = sh("emu_bf16", "./train_emulated --dtype bf16 --batch 4" + six + log_of("emu_bf16")); });
    fp32 = sh("emu_fp32", "rm -rf " + dir("emu_fp32") + " && ./train_emulated --dtype fp32 --batch 4 " +
                              "--checkpoint-every 6 --checkpoint-dir " + dir("emu_fp32") + six + log_of("emu_fp32"));
    bf16_run.join();
    const Job cpu = sh("emu_cpu", "./train_cpu --batch 4" + six + log_of("emu_cpu"));
    INFO(fp32.out << bf16.out << cpu.out);
    REQUIRE(fp32.status == 0);
    REQUIRE(bf16.status == 0);
    REQUIRE(cpu.status == 0);
    check_logs("emulated fp32 vs train_cpu, steps 1-2 (loss, grad norm)", "emu_fp32", "emu_cpu", {"loss", "grad_norm"},
               1, 2, 1e-4);
    check_logs("emulated fp32 vs train_cpu, steps 3-6 (loss)", "emu_fp32", "emu_cpu", {"loss"}, 3, 6, 1e-2);
    check_logs("emulated bf16 vs emulated fp32, steps 1-6 (loss)", "emu_bf16", "emu_fp32", {"loss"}, 1, 6, 2e-2);

    const std::string ep2_args = " --dtype fp32 --ep 2 --batch 1 --checkpoint-every 6 --checkpoint-dir " +
                                 dir("emu_ep2dp2") + six + log_of("emu_ep2dp2");
    const Job ep2dp2 = sh("emu_ep2dp2", "rm -rf " + dir("emu_ep2dp2") + " && env STAND_IN_GPUS=4 " +
                                            mpirun_command(4) + "./train_emulated" + ep2_args);
    INFO(ep2dp2.out);
    REQUIRE(ep2dp2.status == 0);
    CHECK(ep2dp2.out.find("4 rank(s) (EP 2 x DP 2)") != std::string::npos);
    check_logs("emulated NCCL EP 2 x DP 2 vs 1 rank, steps 1-2 (loss, grad norm)", "emu_ep2dp2", "emu_fp32",
               {"loss", "grad_norm"}, 1, 2, 1e-5);
    check_logs("emulated NCCL EP 2 x DP 2 vs 1 rank, steps 3-6 (loss)", "emu_ep2dp2", "emu_fp32", {"loss"}, 3, 6, 1e-2);
    const std::string val = " --batch 4 --seq 64 --val 'data/default/val_*.bin' --eval-batches 4 --eval-only --resume";
    const Job val_one = sh("emu_val_one", "./train_cpu" + val + " --checkpoint-dir " + dir("emu_fp32"));
    const Job val_four = sh("emu_val_four", "./train_cpu" + val + " --checkpoint-dir " + dir("emu_ep2dp2"));
    INFO(val_one.out << val_four.out);
    REQUIRE(val_one.status == 0);
    REQUIRE(val_four.status == 0);
    printf("train_stand_in: val_loss of the emulated step-6 checkpoints: %.6f (4 ranks) vs %.6f (1 rank)\n",
           val_loss_of(val_four), val_loss_of(val_one));
    CHECK_REL(val_loss_of(val_four), val_loss_of(val_one), 1e-5);
    const Job crowded = sh("emu_crowded", MPIRUN + "./train_emulated" + ep2_args);
    INFO(crowded.out);
    CHECK(crowded.status != 0);
    const std::string why = "local ranks 0 and 1 share GPU 0000:00:00.0: start at most one rank per GPU";
    const size_t at = crowded.out.find(why);
    CHECK(at != std::string::npos);
    CHECK(crowded.out.find(why, at + 1) == std::string::npos);  // printed once, by rank 1
    // a problem on some hosts only (here rank 1 sees no GPU): that rank says so once, and no rank waits for it
    const std::string mpmd = "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun "
                             "--oversubscribe -np 1 -x STAND_IN_GPUS=2 ./train_emulated" + ep2_args +
                             " : -np 1 -x STAND_IN_GPUS=0 ./train_emulated" + ep2_args;
    const Job no_gpu = sh("emu_no_gpu", mpmd);
    INFO(no_gpu.out);
    CHECK((no_gpu.status != 0 && no_gpu.status != 124));
    const std::string no_gpu_why = "[rank 1] no CUDA GPU found";
    const size_t no_gpu_at = no_gpu.out.find(no_gpu_why);
    CHECK(no_gpu_at != std::string::npos);
    CHECK(no_gpu.out.find(no_gpu_why, no_gpu_at + 1) == std::string::npos);

    // BF16 under EP 2 (the expert rows exchanged in BF16) against one rank: step 1 the same values (measured: equal
    // to the last printed digit), then BF16 roundings of weights that differ by roundoff can flip. Which ones flip
    // changes with any change of roundoff: the grad norm at step 2 differed by 2e-5 with the three-pass
    // cross-entropy and by 3.0e-4 with the online softmax's (2026-12-02; 7e-3 by step 5, so only step 2's is held
    // to a tolerance), the loss by 4e-5 and 1.2e-4 by step 6.
    const Job bf16_ep2 = sh("emu_bf16_ep2", "env STAND_IN_GPUS=2 " + MPIRUN +
                                                "./train_emulated --dtype bf16 --ep 2 --batch 2" + six +
                                                log_of("emu_bf16_ep2"));
    INFO(bf16_ep2.out);
    REQUIRE(bf16_ep2.status == 0);
    check_logs("emulated bf16 EP 2 vs 1 rank, step 1 (loss, grad norm)", "emu_bf16_ep2", "emu_bf16",
               {"loss", "grad_norm"}, 1, 1, 1e-6);
    check_logs("emulated bf16 EP 2 vs 1 rank, step 2 (grad norm)", "emu_bf16_ep2", "emu_bf16", {"grad_norm"}, 2, 2,
               1e-3);
    check_logs("emulated bf16 EP 2 vs 1 rank, steps 2-6 (loss)", "emu_bf16_ep2", "emu_bf16", {"loss"}, 2, 6, 1e-3);
}

TEST_CASE("train_stand_in under mpirun: EP 2 (and DP 2) with batch 2 per rank matches one rank with batch 4") {
    base();
    const Job ep2 = sh("ep2", "rm -rf " + dir("ep2") + " && " + MPIRUN +
                                  train("./train_stand_in --dtype fp32 --ep 2", "ep2", "", 2));
    INFO(ep2.out);
    REQUIRE(ep2.status == 0);
    CHECK(ep2.out.find("2 rank(s) (EP 2 x DP 1)") != std::string::npos);
    check_logs("EP 2 vs 1 rank, steps 1-2 (loss, grad norm)", "ep2", "fp32", {"loss", "grad_norm"}, 1, 2, 1e-5);
    check_logs("EP 2 vs 1 rank, steps 3-20 (loss): the same curve", "ep2", "fp32", {"loss"}, 3, 20, 1e-2);
    check_logs("EP 2 vs 1 rank, steps 3-20 (grad norm): the same curve", "ep2", "fp32", {"grad_norm"}, 3, 20, 0.2);
    // the 1-rank step-10 checkpoint on 2 ranks, and the 2-rank one (stored from both ranks' experts) on 1 rank
    copy_checkpoint("fp32", 10, "s2e");
    copy_checkpoint("ep2", 10, "e2s");
    const Job s2e = sh("s2e", MPIRUN + train("./train_stand_in --dtype fp32 --ep 2 --resume", "s2e", "", 2));
    const Job e2s = sh("e2s", train("./train_stand_in --dtype fp32 --resume", "e2s", ""));
    // data parallelism: 2 ranks holding every expert (EP 1 x DP 2), from the same 1-rank checkpoint
    copy_checkpoint("fp32", 10, "s2d");
    const Job s2d = sh("s2d", MPIRUN + train("./train_stand_in --dtype fp32 --ep 1 --resume", "s2d", "", 2));
    // sampling needs every rank's forward (the experts are split): the same text as one rank's
    copy_checkpoint("cpu", 20, "final_ep2");
    const Job sample_ep2 = sh("sample_ep2", MPIRUN + train("./train_stand_in --dtype fp32 --ep 2 --resume",
                                                           "final_ep2", " --sample 20", 2));
    copy_checkpoint("cpu", 20, "final_one");
    const Job sample_one = sh("sample_one", train("./train_cpu --resume", "final_one", " --sample 20"));
    for (const Job* j : {&s2e, &e2s, &s2d, &sample_ep2, &sample_one}) {
        INFO(j->out);
        REQUIRE(j->status == 0);
    }
    check_logs("1-rank step 10 resumed on EP 2, steps 11-20", "s2e", "fp32", {"loss", "grad_norm"}, 11, 20, 1e-5);
    check_logs("EP 2 step 10 resumed on 1 rank, steps 11-20", "e2s", "ep2", {"loss", "grad_norm"}, 11, 20, 1e-5);
    CHECK(s2d.out.find("2 rank(s) (EP 1 x DP 2)") != std::string::npos);
    check_logs("1-rank step 10 resumed on DP 2, steps 11-20", "s2d", "fp32", {"loss", "grad_norm"}, 11, 20, 1e-5);
    CHECK(sample_of(sample_one).size() > 30);
    CHECK(sample_of(sample_ep2) == sample_of(sample_one));
}
