// The GPU trainer's program on the CPU: ./train_emulated is train.cu on the real kernels of kernels/, the real GEMM
// code and the real NCCL Comm, through the kernel emulator (test/kernel_emulator/), checked against ./train_cpu
// through their command lines: the loop, the model's load and store around it (init, resume, import; checkpoint,
// export), logs, evaluation, sampling, BF16, FP8 and expert and data parallelism under mpirun.
// The common run: test/data/emu.json (a small model with every part of `small`: q_lora, MTP, groups, shared experts,
// widths that are multiples of 16 for FP8), the default data, batch 4 x 32, lr 3e-3, warmup 2, seed 7, 4 steps, a
// checkpoint every 2.
//
// Tolerances (relative; measured on the 2-core development machine in brackets):
//   - Fresh runs against train_cpu: steps 1-2 within 1e-5 [8e-7], steps 3-4 within 1e-4 [5e-6]. The kernels sum in
//     their own orders and the emulated cuBLASLt in double: ~1e-7 of each gradient tensor's largest value, which
//     AdamW's first updates amplify where a gradient entry is of order eps (the update is lr g / (|g| + eps)).
//   - Runs resumed from the same checkpoint by the two programs: 1e-6 [3e-9]: the moments of two steps already put
//     sqrt(v) far above the gradient differences.
//   - A checkpoint resumed by the program that wrote it: the same bytes at the last step (BF16 with --recompute too:
//     the checkpoint holds all the state, the weights' copies are remade at load, recomputation changes no bit).
//   - Under mpirun (EP 2 x DP 2): the sums over tokens are split over the ranks: 1e-5 [7e-7]. BF16 with EP 2: step 1
//     1e-6 [0], then BF16 roundings of weights that differ by roundoff may flip: 1e-3 [3e-7]; so with DP 2 [3e-7],
//     and a DP 2 checkpoint resumed on one rank [0]. FP8 with EP 2: a rank's
//     weight gradients quantize 128 x 1 tiles of its own tokens, so the layout changes the rounding: 1e-3 [2e-4].
//   - Evaluation: 1e-6 [1e-8]. Sampling: the same text (a token changes only if the uniform draw falls within ~1e-7
//     of a boundary). Export of a loaded checkpoint: the same bytes (copies only, no arithmetic).
//   - BF16 against FP32, and FP8 against train_cpu's FP8: the loss within 2e-2 at every step [2e-5, 1e-4]; the
//     validation loss of a checkpoint in BF16 within 1e-2 [1e-6] (test_gpu's BF16 loss bound).
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

using Job = CommandResult;
// 300 s: a job takes a few seconds alone, and up to four run at a time on two cores
Job sh(const std::string& name, const std::string& cmd) { return run_logged(cmd, "emu_" + name + ".txt", 300); }

std::string dir(const std::string& name) { return test_path("emu_" + name); }
std::string log_of(const std::string& name) { return test_path("emu_" + name + ".jsonl"); }
std::string checkpoint_of(const std::string& name, int step) {
    char file[64];
    snprintf(file, sizeof file, "/ckpt_%08d.safetensors", step);
    return dir(name) + file;
}

// A fresh checkpoint directory holding a copy of one checkpoint (the runs resumed from it write their own there).
void copy_checkpoint(const std::string& from_run, int step, const std::string& to_run) {
    const std::string to = dir(to_run);
    REQUIRE(system(("rm -rf " + to + " && mkdir -p " + to + " && cp " + checkpoint_of(from_run, step) + " " + to)
                       .c_str()) == 0);
}

const std::string COMMON = " --config test/data/emu.json --data 'data/default/train_*.bin' --steps 4 --seq 32 "
                           "--lr 3e-3 --warmup 2 --seed 7 --checkpoint-every 2";
const std::string VAL = " --val 'data/default/val_*.bin' --eval-every 2 --eval-batches 2";
// --eval-only of a model loaded by the flags that follow
const std::string EVAL = " --batch 4 --seq 32 --val 'data/default/val_*.bin' --eval-batches 2 --eval-only";
const std::string CPU = "env OMP_NUM_THREADS=1 ./train_cpu", EMU = "env OMP_NUM_THREADS=1 ./train_emulated";

// program + the common run with `batch` sequences per rank, checkpoints in dir(name), log log_of(name)
std::string train(const std::string& program, const std::string& name, const std::string& extra, int batch = 4) {
    return program + COMMON + " --batch " + std::to_string(batch) + extra + " --checkpoint-dir " + dir(name) +
           " --log " + log_of(name);
}
// the same, from an empty directory
std::string fresh(const std::string& program, const std::string& name, const std::string& extra, int batch = 4) {
    return "rm -rf " + dir(name) + " && " + train(program, name, extra, batch);
}

// A job to run: where its result goes, its name (its output in emu_NAME.txt) and its command line.
struct Planned {
    Job* job;
    std::string name, cmd;
};

// Runs the jobs two at a time (this machine has two cores); each must succeed.
void run_all(std::initializer_list<Planned> jobs) {
    const std::vector<Planned> list(jobs);
    for (size_t i = 0; i < list.size(); i += 2) {
        std::thread second;
        if (i + 1 < list.size())
            second = std::thread([&, i] { *list[i + 1].job = sh(list[i + 1].name, list[i + 1].cmd); });
        *list[i].job = sh(list[i].name, list[i].cmd);
        if (second.joinable()) second.join();
    }
    for (const Planned& p : list) {
        INFO(p.cmd << "\n" << p.job->out);
        REQUIRE(p.job->status == 0);
    }
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
            worst = std::max(worst, std::isnan(g) || std::isnan(w) ? INFINITY : fabs(g - w) / fabs(w));
        }
    }
    return compared > 0 ? worst : INFINITY;
}

void check_logs(const std::string& what, const std::string& got, const std::string& want,
                std::initializer_list<const char*> fields, int first, int last, double tol) {
    const double worst = worst_rel(log_of(got), log_of(want), fields, first, last);
    printf("train_emulated: %-66s worst rel %8.2e  tol %.0e\n", what.c_str(), worst, tol);
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

// The two reference runs, once per test_cpu process: train_cpu and train_emulated --dtype fp32, with a validation
// loss every 2 steps.
void base() {
    static bool done = false;
    if (done) return;
    Job cpu, fp32;
    run_all({{&cpu, "cpu", fresh(CPU, "cpu", VAL)}, {&fp32, "fp32", fresh(EMU + " --dtype fp32", "fp32", VAL)}});
    CHECK(fp32.out.find("GPU 0: kernel emulator") != std::string::npos);  // train.cu's banner
    done = true;
}

}  // namespace

TEST_CASE("train_emulated --dtype fp32 follows train_cpu; checkpoints resume across the two and on itself") {
    base();
    check_logs("fp32 vs train_cpu, steps 1-2 (loss, grad norm)", "fp32", "cpu", {"loss", "grad_norm"}, 1, 2, 1e-5);
    check_logs("fp32 vs train_cpu, steps 3-4 (loss, grad norm, val loss)", "fp32", "cpu",
               {"loss", "grad_norm", "val_loss"}, 3, 4, 1e-4);
    // train_cpu's step-2 checkpoint on the emulated GPU trainer and the other way round, with evaluations; the
    // emulated trainer's own without them (they must not touch the training); --grad-accum 2 of 2 sequences (the
    // same global batch: the gradients accumulate over backward calls); --moments bf16 (train_cpu's FP32 moments
    // rounded where they are read)
    for (auto [from, to] : {std::pair<const char*, const char*>{"cpu", "c2e"}, {"fp32", "e2c"}, {"fp32", "e2e"},
                            {"cpu", "accum_cpu"}, {"cpu", "accum_emu"}, {"cpu", "moments_cpu"}, {"cpu", "moments_emu"}})
        copy_checkpoint(from, 2, to);
    Job c2e, e2c, e2e, accum_cpu, accum_emu, moments_cpu, moments_emu;
    run_all({{&c2e, "c2e", train(EMU + " --dtype fp32 --resume", "c2e", VAL)},
             {&e2c, "e2c", train(CPU + " --resume", "e2c", VAL)},
             {&e2e, "e2e", train(EMU + " --dtype fp32 --resume", "e2e", "")},
             {&accum_cpu, "accum_cpu", train(CPU + " --resume --grad-accum 2", "accum_cpu", "", 2)},
             {&accum_emu, "accum_emu", train(EMU + " --dtype fp32 --resume --grad-accum 2", "accum_emu", "", 2)},
             {&moments_emu, "moments_emu", train(EMU + " --dtype fp32 --resume --moments bf16", "moments_emu", "")},
             {&moments_cpu, "moments_cpu", train(CPU + " --resume --moments bf16", "moments_cpu", "")}});
    for (const Job* j : {&c2e, &e2c, &e2e})
        CHECK(j->out.find("ckpt_00000002.safetensors at step 2") != std::string::npos);
    check_logs("train_cpu's step 2 resumed on train_emulated, steps 3-4", "c2e", "cpu",
               {"loss", "grad_norm", "val_loss"}, 3, 4, 1e-6);
    check_logs("train_emulated's step 2 resumed on train_cpu, steps 3-4", "e2c", "fp32",
               {"loss", "grad_norm", "val_loss"}, 3, 4, 1e-6);
    check_logs("--grad-accum 2 --batch 2 from train_cpu's step 2, steps 3-4", "accum_emu", "accum_cpu",
               {"loss", "grad_norm"}, 3, 4, 1e-6);
    check_logs("--moments bf16 from train_cpu's step 2, steps 3-4", "moments_emu", "moments_cpu",
               {"loss", "grad_norm"}, 3, 4, 1e-6);
    CHECK(moments_emu.out.find("(BF16 moments)") != std::string::npos);
    // the step-3 update with rounded moments moved the weights otherwise: step 4's loss differs, within 1e-3
    const double rounded = read_log(log_of("moments_cpu"), "loss").at(3), fp32 = read_log(log_of("cpu"), "loss").at(3);
    CHECK(rounded != fp32);
    CHECK_REL(rounded, fp32, 1e-3);
    const std::string last = slurp(checkpoint_of("fp32", 4));
    CHECK(last.size() > 100000);
    CHECK_MESSAGE(slurp(checkpoint_of("e2e", 4)) == last, "train_emulated resumed on itself: a different checkpoint");
}

TEST_CASE("train_emulated: evaluation, sampling, Hugging Face export and import") {
    base();
    for (const char* to : {"final_cpu", "final_emu"}) copy_checkpoint("cpu", 4, to);
    const std::string val = EVAL + " --resume";
    // no steps left: the loaded model is sampled and exported as it is (store right after load)
    const std::string sample = " --resume --sample 12 --export-dtype f32 --export-hf ";
    Job eval_cpu, eval_emu, sample_cpu, sample_emu, eval_hf;
    run_all({{&eval_cpu, "eval_cpu", CPU + val + " --checkpoint-dir " + dir("final_cpu")},
             {&eval_emu, "eval_emu", EMU + " --dtype fp32" + val + " --checkpoint-dir " + dir("final_emu")},
             {&sample_cpu, "sample_cpu", train(CPU, "final_cpu", sample + dir("hf_cpu"))},
             {&sample_emu, "sample_emu", train(EMU + " --dtype fp32", "final_emu", sample + dir("hf_emu"))}});
    run_all({{&eval_hf, "eval_hf", EMU + " --dtype fp32" + EVAL + " --init-from-hf " + dir("hf_emu")}});
    printf("train_emulated: --eval-only val_loss %.6f (emulated) vs %.6f (train_cpu), %.6f (its export)\n",
           val_loss_of(eval_emu), val_loss_of(eval_cpu), val_loss_of(eval_hf));
    CHECK_REL(val_loss_of(eval_emu), val_loss_of(eval_cpu), 1e-6);
    CHECK_REL(val_loss_of(eval_hf), val_loss_of(eval_cpu), 1e-6);
    CHECK(sample_of(sample_cpu).size() > 20);
    CHECK(sample_of(sample_emu) == sample_of(sample_cpu));
    CHECK(slurp(dir("hf_emu") + "/config.json") == slurp(dir("hf_cpu") + "/config.json"));
    const std::string weights = slurp(dir("hf_cpu") + "/model.safetensors");
    CHECK(weights.size() > 100000);
    CHECK(slurp(dir("hf_emu") + "/model.safetensors") == weights);
}

TEST_CASE("train_emulated --dtype bf16 and fp8: near fp32 and train_cpu's fp8, their own checkpoints resume exactly") {
    base();
    Job bf16, fp8, cpu_fp8;
    run_all({{&bf16, "bf16", fresh(EMU + " --dtype bf16", "bf16", "")},
             {&fp8, "fp8", fresh(EMU + " --dtype fp8", "fp8", "")},
             {&cpu_fp8, "cpu_fp8", fresh(CPU + " --dtype fp8", "cpu_fp8", "")}});
    CHECK(bf16.out.find("GEMM inputs bf16") != std::string::npos);
    CHECK(fp8.out.find("GEMM inputs fp8") != std::string::npos);
    check_logs("bf16 vs fp32 (loss), steps 1-4", "bf16", "fp32", {"loss"}, 1, 4, 2e-2);
    check_logs("fp8 vs train_cpu fp8 (loss), steps 1-4", "fp8", "cpu_fp8", {"loss"}, 1, 4, 2e-2);
    // each resumed from its step-2 checkpoint (bf16 with --recompute), to the last checkpoint's bytes; and
    // train_cpu's final checkpoint evaluated with BF16 GEMMs (the BF16 copy made at load)
    copy_checkpoint("bf16", 2, "bf16_resumed");
    copy_checkpoint("fp8", 2, "fp8_resumed");
    copy_checkpoint("cpu", 4, "final_bf16");
    const std::string val = EVAL + " --resume";
    Job bf16_resumed, fp8_resumed, eval_bf16, eval_fp32;
    run_all({{&bf16_resumed, "bf16_resumed", train(EMU + " --dtype bf16 --resume --recompute", "bf16_resumed", "")},
             {&fp8_resumed, "fp8_resumed", train(EMU + " --dtype fp8 --resume", "fp8_resumed", "")},
             {&eval_bf16, "eval_bf16", EMU + " --dtype bf16" + val + " --checkpoint-dir " + dir("final_bf16")},
             {&eval_fp32, "eval_fp32", CPU + val + " --checkpoint-dir " + dir("final_bf16")}});
    for (const char* dtype : {"bf16", "fp8"}) {
        const std::string last = slurp(checkpoint_of(dtype, 4));
        CHECK(last.size() > 100000);
        CHECK_MESSAGE(slurp(checkpoint_of(std::string(dtype) + "_resumed", 4)) == last,
                      dtype << " resumed on itself: a different checkpoint");
    }
    printf("train_emulated: --eval-only val_loss %.6f (bf16) vs %.6f (fp32)\n", val_loss_of(eval_bf16),
           val_loss_of(eval_fp32));
    CHECK_REL(val_loss_of(eval_bf16), val_loss_of(eval_fp32), 1e-2);
}

// Under mpirun, the real NCCL Comm over the emulator's NCCL (MPI). EP 2 x DP 2 on 4 ranks with batch 1 each against
// one rank with batch 4; a checkpoint of each layout resumed in the other; the 4-rank checkpoint evaluated by
// train_cpu; sampling on 2 ranks (every rank's forward, the experts split) the same text as one rank's; BF16 and FP8
// with EP 2 (the expert rows exchanged in BF16; each rank's own E4M3 copies) and BF16 with DP 2 (the master weights
// sharded over the two) against one rank; the DP 2 run resumed on itself to the same checkpoint bytes, and on one
// rank. Two ranks on a host with one GPU, and a rank that sees no GPU: one clear line, a non-zero exit.
TEST_CASE("train_emulated under mpirun: EP 2 x DP 2 and EP 2 follow one rank, in every precision") {
    base();
    const std::string ep2dp2 = " --dtype fp32 --ep 2", two = "env STAND_IN_GPUS=2 " + mpirun_command(2);
    const std::string four = "env STAND_IN_GPUS=4 " + mpirun_command(4);
    Job dist, bf16_ep2, fp8_ep2, bf16_one, fp8_one, bf16_dp2;
    run_all({{&dist, "dist", fresh(four + "./train_emulated" + ep2dp2, "dist", "", 1)},
             {&bf16_one, "bf16_one", fresh(EMU + " --dtype bf16", "bf16_one", "")},
             {&fp8_one, "fp8_one", fresh(EMU + " --dtype fp8", "fp8_one", "")},
             {&bf16_ep2, "bf16_ep2", fresh(two + "./train_emulated --dtype bf16 --ep 2", "bf16_ep2", "", 2)},
             {&fp8_ep2, "fp8_ep2", fresh(two + "./train_emulated --dtype fp8 --ep 2", "fp8_ep2", "", 2)},
             {&bf16_dp2, "bf16_dp2",
              fresh(two + "./train_emulated --dtype bf16", "bf16_dp2", " --export-hf " + dir("bf16_dp2_hf"), 2)}});
    CHECK(dist.out.find("4 rank(s) (PP 1 x EP 2 x DP 2)") != std::string::npos);
    check_logs("EP 2 x DP 2 vs 1 rank, steps 1-4 (loss, grad norm)", "dist", "fp32", {"loss", "grad_norm"}, 1, 4, 1e-5);
    check_logs("bf16 EP 2 vs 1 rank, step 1 (loss, grad norm)", "bf16_ep2", "bf16_one", {"loss", "grad_norm"}, 1, 1,
               1e-6);
    check_logs("bf16 EP 2 vs 1 rank, steps 2-4 (loss)", "bf16_ep2", "bf16_one", {"loss"}, 2, 4, 1e-3);
    check_logs("fp8 EP 2 vs 1 rank, steps 1-4 (loss)", "fp8_ep2", "fp8_one", {"loss"}, 1, 4, 1e-3);
    check_logs("bf16 DP 2 vs 1 rank, steps 1-4 (loss)", "bf16_dp2", "bf16_one", {"loss"}, 1, 4, 1e-3);
    // each rank writes its shard of the master weights: the checkpoint resumes to the same bytes, and on one rank;
    // rank 0's BF16 export (its working copy) is the one rank's export of the final checkpoint
    copy_checkpoint("bf16_dp2", 2, "bf16_dp2_resumed");
    copy_checkpoint("bf16_dp2", 2, "bf16_dp2_one");
    copy_checkpoint("bf16_dp2", 4, "bf16_dp2_final");
    Job bf16_dp2_resumed, bf16_dp2_one, bf16_dp2_final;
    run_all({{&bf16_dp2_resumed, "bf16_dp2_resumed",
              train(two + "./train_emulated --dtype bf16 --resume", "bf16_dp2_resumed", "", 2)},
             {&bf16_dp2_one, "bf16_dp2_one", train(EMU + " --dtype bf16 --resume", "bf16_dp2_one", "")},
             {&bf16_dp2_final, "bf16_dp2_final", train(EMU + " --dtype bf16 --resume", "bf16_dp2_final",
                                                       " --export-hf " + dir("bf16_dp2_final_hf"))}});
    CHECK_MESSAGE(slurp(checkpoint_of("bf16_dp2_resumed", 4)) == slurp(checkpoint_of("bf16_dp2", 4)),
                  "bf16 DP 2 resumed on itself: a different checkpoint");
    const std::string exported = slurp(dir("bf16_dp2_hf") + "/model.safetensors");
    CHECK(exported.size() > 100000);
    CHECK_MESSAGE(slurp(dir("bf16_dp2_final_hf") + "/model.safetensors") == exported,
                  "bf16 DP 2's export differs from its final checkpoint's");
    check_logs("bf16 DP 2 step 2 resumed on 1 rank, steps 3-4 (loss)", "bf16_dp2_one", "bf16_dp2", {"loss"}, 3, 4,
               1e-3);
    // no rank holds the whole FP32 master weights to export: refused before training, in one line
    const std::string f32 = " --export-hf " + dir("f32_export_hf") + " --export-dtype f32";
    const Job f32_export = sh("f32_export", two + train("./train_emulated --dtype bf16", "f32_export", f32, 2));
    INFO(f32_export.out);
    CHECK(f32_export.status != 0);
    CHECK(occurrences(f32_export.out, "--export-dtype f32 needs the FP32 master weights, which --dtype bf16 and fp8 "
                                      "shard over the ranks") == 1);
    copy_checkpoint("fp32", 2, "one2dist");
    copy_checkpoint("dist", 2, "dist2one");
    copy_checkpoint("cpu", 4, "sample_ep2");
    copy_checkpoint("cpu", 4, "sample_one");
    Job one2dist, dist2one, eval_dist, eval_one, sample_ep2, sample_one;
    run_all({{&one2dist, "one2dist", train(four + "./train_emulated --dtype fp32 --ep 2 --resume", "one2dist", "", 1)},
             {&dist2one, "dist2one", train(EMU + " --dtype fp32 --resume", "dist2one", "")},
             {&eval_dist, "eval_dist", CPU + EVAL + " --resume --checkpoint-dir " + dir("dist")},
             {&eval_one, "eval_one", CPU + EVAL + " --resume --checkpoint-dir " + dir("fp32")},
             {&sample_ep2, "sample_ep2",
              train(two + "./train_emulated --dtype fp32 --ep 2 --resume", "sample_ep2", " --sample 12", 2)},
             {&sample_one, "sample_one", train(CPU + " --resume", "sample_one", " --sample 12")}});
    check_logs("1-rank step 2 resumed on EP 2 x DP 2, steps 3-4", "one2dist", "fp32", {"loss", "grad_norm"}, 3, 4,
               1e-5);
    check_logs("EP 2 x DP 2 step 2 resumed on 1 rank, steps 3-4", "dist2one", "dist", {"loss", "grad_norm"}, 3, 4,
               1e-5);
    printf("train_emulated: val_loss of the step-4 checkpoints: %.6f (4 ranks) vs %.6f (1 rank)\n",
           val_loss_of(eval_dist), val_loss_of(eval_one));
    CHECK_REL(val_loss_of(eval_dist), val_loss_of(eval_one), 1e-5);
    CHECK(sample_of(sample_one).size() > 20);
    CHECK(sample_of(sample_ep2) == sample_of(sample_one));

    const Job crowded = sh("crowded", mpirun_command(2) + train("./train_emulated" + ep2dp2, "crowded", "", 1));
    INFO(crowded.out);
    CHECK(crowded.status != 0);
    const std::string why = "local ranks 0 and 1 share GPU 0000:00:00.0: start at most one rank per GPU";
    const size_t at = crowded.out.find(why);
    CHECK(at != std::string::npos);
    CHECK(crowded.out.find(why, at + 1) == std::string::npos);  // printed once, by rank 1
    // a problem on some hosts only (here rank 1 sees no GPU): that rank says so once, and no rank waits for it
    const std::string args = ep2dp2 + COMMON + " --batch 1 --checkpoint-dir " + dir("no_gpu");
    const Job no_gpu = sh("no_gpu", mpirun_env() + "mpirun --oversubscribe -np 1 -x STAND_IN_GPUS=2 ./train_emulated" +
                                    args + " : -np 1 -x STAND_IN_GPUS=0 ./train_emulated" + args);
    INFO(no_gpu.out);
    CHECK((no_gpu.status != 0 && no_gpu.status != 124));
    const std::string no_gpu_why = "[rank 1] no CUDA GPU found";
    const size_t no_gpu_at = no_gpu.out.find(no_gpu_why);
    CHECK(no_gpu_at != std::string::npos);
    CHECK(no_gpu.out.find(no_gpu_why, no_gpu_at + 1) == std::string::npos);
}

// Pipeline stages through the NCCL Comm over the emulator's NCCL (MPI): PP 2 with 2 micro-batches of 2 sequences
// (stage 0 keeps both in flight), with --recompute (the slots share the activation sets), in BF16, and PP 2 x EP 2
// with micro-batches of 1, against one rank's batch of 4; checkpoints resumed across layouts; sampling on 2 stages.
TEST_CASE("train_emulated under mpirun: PP 2, PP 2 with --recompute or in BF16, and PP 2 x EP 2 follow one rank") {
    base();
    const std::string two = "env STAND_IN_GPUS=2 " + mpirun_command(2);
    const std::string four = "env STAND_IN_GPUS=4 " + mpirun_command(4);
    const std::string pp2 = "./train_emulated --dtype fp32 --pp 2 --grad-accum 2";
    Job pp, pp_recompute, pp_ep, pp_bf16, one_bf16;
    run_all({{&pp, "pp2", fresh(two + pp2, "pp2", "", 2)},
             {&pp_recompute, "pp2_recompute", fresh(two + pp2 + " --recompute", "pp2_recompute", "", 2)},
             {&pp_ep, "pp2_ep2", fresh(four + pp2 + " --ep 2", "pp2_ep2", "", 1)},
             {&pp_bf16, "pp2_bf16",
              fresh(two + "./train_emulated --dtype bf16 --pp 2 --grad-accum 2", "pp2_bf16", "", 2)},
             {&one_bf16, "one_bf16", fresh(EMU + " --dtype bf16", "one_bf16", "")}});
    CHECK(pp_ep.out.find("4 rank(s) (PP 2 x EP 2 x DP 1)") != std::string::npos);
    check_logs("PP 2 vs 1 rank, steps 1-4 (loss, grad norm)", "pp2", "fp32", {"loss", "grad_norm"}, 1, 4, 1e-5);
    check_logs("PP 2 --recompute vs 1 rank, steps 1-4 (loss, grad norm)", "pp2_recompute", "fp32",
               {"loss", "grad_norm"}, 1, 4, 1e-5);
    check_logs("PP 2 x EP 2 vs 1 rank, steps 1-4 (loss, grad norm)", "pp2_ep2", "fp32", {"loss", "grad_norm"}, 1, 4,
               1e-5);
    check_logs("bf16 PP 2 vs 1 rank, step 1 (loss, grad norm)", "pp2_bf16", "one_bf16", {"loss", "grad_norm"}, 1, 1,
               1e-6);
    check_logs("bf16 PP 2 vs 1 rank, steps 2-4 (loss)", "pp2_bf16", "one_bf16", {"loss"}, 2, 4, 1e-3);
    copy_checkpoint("pp2_ep2", 2, "pp2ep2_to_one");
    copy_checkpoint("fp32", 2, "one_to_pp2");
    copy_checkpoint("cpu", 4, "sample_pp2");
    copy_checkpoint("cpu", 4, "sample_cpu");
    Job to_one, to_pp, sample_pp, sample_cpu;
    run_all({{&to_one, "pp2ep2_to_one", train(EMU + " --dtype fp32 --resume", "pp2ep2_to_one", "")},
             {&to_pp, "one_to_pp2", train(two + pp2 + " --resume", "one_to_pp2", "", 2)},
             {&sample_pp, "sample_pp2", train(two + pp2 + " --resume", "sample_pp2", " --sample 12", 2)},
             {&sample_cpu, "sample_cpu", train(CPU + " --resume", "sample_cpu", " --sample 12")}});
    check_logs("PP 2 x EP 2 step 2 resumed on 1 rank, steps 3-4", "pp2ep2_to_one", "fp32", {"loss", "grad_norm"}, 3,
               4, 1e-5);
    check_logs("1-rank step 2 resumed as PP 2, steps 3-4", "one_to_pp2", "fp32", {"loss", "grad_norm"}, 3, 4, 1e-5);
    CHECK(sample_of(sample_cpu).size() > 20);
    CHECK(sample_of(sample_pp) == sample_of(sample_cpu));  // the last stage samples; rank 0, the first, prints
}
