// Bad input to train_cpu and prepare_data: one clear line on stderr, a non-zero exit, no crash, no hang, and no
// good file overwritten.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/shards.h"
#include "model/optimizer.h"
#include "test/test_helpers.h"

namespace {

struct Result {
    int status;  // exit status, or 128 + signal
    std::string err;
};

Result run_capture(const std::string& cmd) {
    const std::string err_path = test_path("cli_stderr.txt");
    int rc = system(("timeout 60 " + cmd + " > /dev/null 2> " + err_path).c_str());
    std::ifstream f(err_path);
    std::stringstream ss;
    ss << f.rdbuf();
    int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
    return {status, ss.str()};
}

int count_lines(const std::string& s) {
    int n = 0;
    for (char ch : s) n += ch == '\n';
    return n;
}

// Exit 1 or 2 (not a signal, not the 124 of a timeout), exactly one line, mentioning `expect`.
void expect_clean_failure(const std::string& cmd, const std::string& expect) {
    Result r = run_capture(cmd);
    INFO("command: " << cmd << "\nstderr: " << r.err);
    CHECK((r.status == 1 || r.status == 2));
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find(expect) != std::string::npos);
}

const std::string DATA = " --data 'data/default/train_*.bin'";

// Runs a train_cpu command line with --log, which must succeed, and returns the log's lines (one per step).
std::vector<nlohmann::json> train_log(const std::string& cmd) {
    const std::string log = test_path("cli_train_log.jsonl");
    remove(log.c_str());
    const Result run = run_capture(cmd + " --log " + log);
    REQUIRE_MESSAGE(run.status == 0, cmd << "\n" << run.err);
    std::vector<nlohmann::json> lines;
    std::ifstream f(log);
    for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
}

}  // namespace

TEST_CASE("cli: nonsense flags and values are one-line errors") {
    expect_clean_failure("./train_cpu --bogus 1" + DATA, "unknown flag --bogus");
    expect_clean_failure("./train_cpu --steps -3" + DATA, "--steps");
    expect_clean_failure("./train_cpu --steps 12abc" + DATA, "--steps");
    expect_clean_failure("./train_cpu --lr" + DATA.substr(0, 0), "--lr needs a value");
    expect_clean_failure("./train_cpu --config small", "--data");
    expect_clean_failure("./train_cpu --resume" + DATA, "--checkpoint-dir");
    expect_clean_failure("./train_cpu --steps 100 --warmup 10 --decay-steps 91" + DATA,
                         "--decay-steps 91 exceeds the 90 steps after warmup");
    expect_clean_failure("./train_cpu --decay-steps 1" + DATA, "--decay-steps 1 lowers nothing");
    expect_clean_failure("./train_cpu --min-lr-ratio 1.5" + DATA, "--min-lr-ratio");
}

TEST_CASE("cli: missing or foreign files are one-line errors") {
    expect_clean_failure("./train_cpu --config nosuch" + DATA, "no such preset");
    expect_clean_failure("./train_cpu --data '/tmp/definitely_missing_*.bin'", "no files match");
    std::ofstream(test_path("cli_bad.json")) << "{\"hidden_size\": 64,";
    expect_clean_failure("./train_cpu --config " + test_path("cli_bad.json") + DATA, "malformed JSON");
    std::ofstream(test_path("cli_inconsistent.json")) << "{\"n_routed_experts\": 6, \"n_group\": 4}";
    expect_clean_failure("./train_cpu --config " + test_path("cli_inconsistent.json") + DATA, "divisible by n_group");
    std::ofstream(test_path("cli_foreign.bin")) << std::string(4096, 'x');
    expect_clean_failure("./train_cpu --config small --data " + test_path("cli_foreign.bin"), "magic");
    // data whose tokens do not fit the model's vocabulary
    expect_clean_failure("./train_cpu --config tiny" + DATA, "vocab_size");
    expect_clean_failure("./train_cpu --config small" + DATA + " --seq 5000", "max_position_embeddings");
    expect_clean_failure("./train_cpu --config /dev/zero" + DATA, "/dev/zero is larger than 67108864 bytes");
    // --vocab within its own bound, the parameters (an embedding and a head of 2^24 x 2^20) beyond 2^42
    std::ofstream(test_path("cli_wide.json"))
        << R"({"vocab_size": 512, "hidden_size": 1048576, "intermediate_size": 128, "moe_intermediate_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 32,
              "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8,
              "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
              "routed_scaling_factor": 1.0, "norm_topk_prob": true, "first_k_dense_replace": 1})";
    expect_clean_failure("./train_cpu --config " + test_path("cli_wide.json") + DATA + " --vocab 16777216",
                         "above moe.cu's limit of 4.4e+12");
    // data too short for the batch is said before the batch's activations (tens of GB here) are allocated (the
    // default data's shard holds 67590 tokens, far fewer than these 64 million)
    expect_clean_failure("./train_cpu --config small" + DATA + " --batch 1000000 --seq 64", "fewer than B*T*world+1");
    // a checkpoint directory no file can be created in (/proc, even as root), found at start on one rank too: no
    // step is trained first
    const std::string log = test_path("cli_unwritable.jsonl");
    remove(log.c_str());
    expect_clean_failure("./train_cpu --config small --steps 2 --batch 2 --seq 32 --log " + log +
                             " --checkpoint-dir /proc" + DATA,
                         "cannot write /proc/");
    std::stringstream logged;
    logged << std::ifstream(log).rdbuf();
    CHECK(logged.str().find("\"step\"") == std::string::npos);
}

TEST_CASE("cli: --dtype bf16 is refused by the CPU trainer, an unknown --dtype by every trainer") {
    expect_clean_failure("./train_cpu --config small --dtype bf16" + DATA, "--dtype bf16 is for the GPU trainer");
    expect_clean_failure("./train_cpu --config small --dtype fp16" + DATA, "--dtype must be fp32, bf16 or fp8");
}

TEST_CASE("cli: a damaged checkpoint is refused and left alone") {
    const std::string ckpt = test_path("cli_ckpt");
    system(("rm -rf " + ckpt + " && mkdir -p " + ckpt).c_str());
    std::ofstream(ckpt + "/ckpt_00000005.safetensors") << std::string(20, '\x7f');
    expect_clean_failure("./train_cpu --config small --resume --checkpoint-dir " + ckpt + DATA,
                         "ckpt_00000005.safetensors");
    std::ifstream f(ckpt + "/ckpt_00000005.safetensors", std::ios::binary | std::ios::ate);
    CHECK(f.tellg() == 20);
    // a checkpoint whose output head was overwritten (bytes 0xFF, NaN): refused by its checksum before sampling could
    // print tokens from it
    system(("rm -rf " + ckpt).c_str());
    const std::string run = "./train_cpu --config small" + DATA + " --steps 1 --batch 1 --seq 16 --checkpoint-dir " + ckpt;
    REQUIRE(system((run + " > /dev/null").c_str()) == 0);
    const std::string path = ckpt + "/ckpt_00000001.safetensors";
    std::string bytes = slurp(path);
    uint64_t header_bytes = 0;
    memcpy(&header_bytes, bytes.data(), 8);
    const auto head = nlohmann::json::parse(bytes.substr(8, header_bytes))["lm_head.weight"]["data_offsets"];
    std::fill(bytes.begin() + 8 + header_bytes + head[0].get<int64_t>(),
              bytes.begin() + 8 + header_bytes + head[1].get<int64_t>(), '\xff');
    std::ofstream(path, std::ios::binary) << bytes;
    expect_clean_failure(run + " --resume --sample 5", "ckpt_00000001.safetensors: data bytes 0 to");
    system(("rm -rf " + ckpt).c_str());
}

TEST_CASE("cli: --eval-only reports a bad token in a later validation shard in one line") {
    // the loader checks a shard's tokens against the vocabulary when it reaches that shard, inside the evaluation
    std::vector<uint32_t> good(64);
    for (size_t i = 0; i < good.size(); i++) good[i] = (uint32_t)(i * 7 % 64);
    std::vector<uint32_t> bad = good;
    bad[5] = 100;  // tiny's vocabulary is 64
    write_shard(test_path("cli_eval_train.bin"), good, 1);
    write_shard(test_path("cli_eval_val_0.bin"), good, 1);
    write_shard(test_path("cli_eval_val_1.bin"), bad, 1);
    const std::string ckpt = test_path("cli_eval_ckpt");
    REQUIRE(system(("./train_cpu --config tiny --batch 1 --seq 8 --steps 1 --data " + test_path("cli_eval_train.bin") +
                    " --checkpoint-dir " + ckpt + " > /dev/null").c_str()) == 0);
    expect_clean_failure("./train_cpu --resume --checkpoint-dir " + ckpt + " --eval-only --batch 1 --seq 8 " +
                             "--eval-batches 100 --val '" + test_path("cli_eval_val_*.bin") + "'",
                         "100");
}

TEST_CASE("cli: prepare_data rejects a missing input and an unknown flag") {
    expect_clean_failure("./prepare_data --input /nonexistent/file --out-dir " + test_path("cli_out"), "prepare_data");
    expect_clean_failure("./prepare_data --bogus", "unknown flag --bogus");
    expect_clean_failure("./prepare_data --input --out-dir " + test_path("cli_out"), "--input needs a value");
    expect_clean_failure("./prepare_data --input x --out-dir y --shard-tokens 0", "--shard-tokens");
    // a device would never end: files, directories and pipes are read
    expect_clean_failure("./prepare_data --input /dev/zero --out-dir " + test_path("cli_out"),
                         "input /dev/zero is a device, not a file");
    // JSON lines: the error names the line, without repeating a megabyte of it; a number beyond a double too
    std::ofstream(test_path("cli_long.jsonl")) << "{\"text\": \"" << std::string(1 << 20, 'a') << "\x01\"}\n";
    const Result long_line = run_capture("./prepare_data --input " + test_path("cli_long.jsonl") + " --out-dir " +
                                         test_path("cli_out"));
    CHECK(long_line.status == 1);
    CHECK(long_line.err.find("cli_long.jsonl line 1: not valid JSON") != std::string::npos);
    CHECK(long_line.err.size() < 600);
    std::ofstream(test_path("cli_huge.jsonl")) << "{\"text\": \"x y\", \"n\": 1e999}\n";
    expect_clean_failure("./prepare_data --input " + test_path("cli_huge.jsonl") + " --out-dir " + test_path("cli_out"),
                         "cli_huge.jsonl line 1: not valid JSON");
    expect_clean_failure("./plot --log /dev/zero --out " + test_path("cli_plot.png"), "the log /dev/zero is a device");
}

TEST_CASE("cli: a loss or gradient norm that stops being finite ends the run with the step; a tokenizer larger than "
          "the vocabulary is refused") {
    // learning rate 10 without clipping: the weights blow up within a few dozen steps
    expect_clean_failure("./train_cpu --config small" + DATA + " --steps 80 --batch 2 --seq 32 --lr 10 --warmup 0 "
                         "--grad-clip 0",
                         "at step");
    std::vector<uint32_t> tokens(256);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint32_t)(i % 64);
    write_shard(test_path("cli_tiny_train.bin"), tokens, 1);
    expect_clean_failure("./train_cpu --config tiny --data " + test_path("cli_tiny_train.bin") + " --steps 1 " +
                             "--batch 1 --seq 8 --sample 5 --tokenizer data/default/tokenizer.bin",
                         "more than the model's vocab_size 64");
}

TEST_CASE("cli: --eval-every evaluates every N steps and after the last; a resume with another schedule says so") {
    const std::string log = test_path("cli_eval_every.jsonl"), ckpt = test_path("cli_eval_every_ckpt");
    const std::string train = "./train_cpu --config test/data/ep-tiny.json" + DATA + " --val 'data/default/val_*.bin' " +
                              "--seq 32 --batch 2 --eval-every 2 --eval-batches 1 --checkpoint-dir " + ckpt;
    REQUIRE(run_capture(train + " --steps 5 --log " + log).status == 0);
    std::ifstream f(log);
    std::vector<int> evaluated;
    for (std::string line; std::getline(f, line);)
        if (line.find("\"val_loss\"") != std::string::npos) evaluated.push_back(atoi(line.c_str() + 9));  // {"step": N
    CHECK(evaluated == std::vector<int>{2, 4, 5});
    const Result resumed = run_capture(train + " --steps 7 --lr 1e-3 --resume");
    CHECK(resumed.status == 0);
    CHECK(resumed.err.find("note: the checkpoint's run had") != std::string::npos);
}

// The schedule's flags as the optimizer sees them: each step's logged learning rate is learning_rate() of that step
// (0-based) for an OptimizerConfig built here from the same values (rel 1e-6: the log prints 7 digits), through
// warmup, the stable peak and the decay to --min-lr-ratio; and --weight-decay and --grad-clip change the run (the
// loss of step 3 moves by far more than the 9 digits it is logged with: a decay of 5 x lr 1e-2 shrinks every
// matrix by 5% a step; a clip to 1e-7 brings the gradients below AdamW's eps, which shrinks the first updates).
TEST_CASE("cli: the schedule, weight decay and clipping flags reach the optimizer") {
    const std::string train = "./train_cpu --config test/data/ep-tiny.json" + DATA + " --seq 32 --batch 2 --lr 1e-2";
    OptimizerConfig oc;
    oc.lr = 1e-2f;
    oc.warmup_steps = 2;
    oc.total_steps = 7;
    oc.decay_steps = 3;
    oc.min_lr_ratio = 0.5f;
    const std::vector<nlohmann::json> scheduled =
        train_log(train + " --steps 7 --warmup 2 --decay-steps 3 --min-lr-ratio 0.5");
    REQUIRE(scheduled.size() == 7);
    for (int step = 0; step < 7; step++) {
        INFO("step " << step + 1);
        CHECK(scheduled[step]["step"].get<int>() == step + 1);
        CHECK_REL(scheduled[step]["lr"].get<double>(), learning_rate(oc, step), 1e-6);
    }
    CHECK_REL(scheduled[6]["lr"].get<double>(), 5e-3, 1e-6);  // the floor: --min-lr-ratio of the peak

    auto third_loss = [&](const std::string& flags) {
        return train_log(train + " --steps 3" + flags)[2]["loss"].get<double>();
    };
    const double plain = third_loss("");
    CHECK(std::fabs(third_loss(" --weight-decay 5") - plain) > 1e-6 * plain);
    CHECK(std::fabs(third_loss(" --grad-clip 1e-7") - plain) > 1e-6 * plain);
}

// Gradient accumulation: batch 4 in one micro-step, 2 x 2 and 4 x 1 read the same sequences (the loader reads the
// micro-batches one after another) and average the same per-token losses, so the 6 steps' losses and gradient norms
// agree but for the order of float sums (the losses measured within 6e-9 relative; 1e-6, and the norms' printed
// sixth decimal). A parameter gradient written (=) where it should accumulate (+=) keeps only the last
// micro-batch's part: the norms then differ at the first step.
TEST_CASE("cli: --grad-accum 2 and 4 train as one micro-step of the whole batch") {
    const std::string train = "./train_cpu --config test/data/ep-tiny.json" + DATA + " --seq 32 --lr 1e-2 --steps 6";
    std::vector<std::vector<nlohmann::json>> runs;
    for (const char* layout : {" --batch 4", " --batch 2 --grad-accum 2", " --batch 1 --grad-accum 4"}) {
        runs.push_back(train_log(train + layout));
        REQUIRE(runs.back().size() == 6);
    }
    for (int r = 1; r < 3; r++)
        for (int step = 0; step < 6; step++) {
            INFO("layout " << r << " step " << step + 1);
            CHECK_REL(runs[r][step]["loss"].get<double>(), runs[0][step]["loss"].get<double>(), 1e-6);
            const double norm = runs[r][step]["grad_norm"].get<double>(), want = runs[0][step]["grad_norm"].get<double>();
            CHECK(std::fabs(norm - want) <= 1e-6 * want + 1e-6);  // the log prints the norm with 6 decimals
        }
}

TEST_CASE("cli: --describe prints the config and the parameter counts of docs/usage.md") {
    const CommandResult describe = run_logged("./train_cpu --config small --describe", "cli_describe.txt", 60);
    REQUIRE(describe.status == 0);
    const std::string& out = describe.out;
    CHECK(out.find("\"hidden_size\": 192") != std::string::npos);
    CHECK(out.find("total_params 3058496\nactive_params 1534784\nmtp_params 833120\n") != std::string::npos);
}

TEST_CASE("cli: --plan for DeepSeek-V3 on 256 GPUs, with and without --recompute or BF16 moments") {
    const CommandResult plan = run_logged(
        "./train_cpu --config deepseek-v3 --plan --gpus 256 --ep 64 --batch 1 --seq 4096 --grad-accum 16", "cli_plan.txt",
        60);
    REQUIRE(plan.status == 0);
    const std::string& out = plan.out;
    // FLOPs per token by hand: 6 x 38.24e9 active (36.63e9 + the MTP block's attention, shared and 8 routed experts,
    // and the head again: 129280 x 7168 = 0.93e9) + attention, causal: 3 x 128 heads x 4096 x (192 + 128) x 62 blocks
    // = 3.12e10  ->  2.606e11
    CHECK(out.find("FLOPs per token: 2.606e+11") != std::string::npos);
    // all-to-all: 4 x 59 MoE blocks x 4096 tokens x 8 rows x 7168 x 2 bytes = 111 GB
    CHECK(out.find("111 GB sent") != std::string::npos);
    CHECK(out.find("does NOT fit") != std::string::npos);  // 27.8B parameters x 6 bytes on one 80 GiB GPU
    // the optimizer shard, AdamW's m and v and the FP32 master weights: 12 bytes x (17.5e9 replicated / 256 GPUs +
    // 665e9 in experts / 64 / 4 = 2.66e9 values)
    CHECK(out.find("optimizer shard (moments, master weights) 29.8 GiB") != std::string::npos);
    // FP32 (plan.cpp's per-token counts) and the head's BF16 output gradient, 2 x 4096 x 129280 bytes = 0.99 GiB
    CHECK(out.find("activations 308.8 GiB") != std::string::npos);
    // the host: 27.8e9 FP32 weights = 103.7 GiB; a checkpoint, 12 bytes x 6.83e11 (the router biases' 58 x 256 without
    // moments), 1.5 x the AdamW shard's 21.3e9 bytes from each rank
    CHECK(out.find("host memory per GPU: weights 103.7 GiB, AdamW shard 19.9 GiB; a checkpoint: 8.19 TB, 32 GB written "
                   "by each rank") != std::string::npos);
    // --recompute: per token, the 62 blocks' inputs (62 x 7168) and one MLA + dense FFN and one MLA + MoE activation
    // set (142144 + 69632 + 142144 + 184576 values, plan.cpp's counts) kept instead of every block's, and one chunk
    // of logits per head (2^26 / 129280 = 519 rows), FP32: 4 x (982912 x 4096 + 2 x 519 x 129280) = 15.5 GiB, with
    // the head's output gradient (every row) 16.5 GiB; the
    // forward of the blocks and heads again: (2.606e11 - 6 x (the MTP projection 2 x 7168^2 + norms)) / 3 = 8.668e10
    // FLOPs; and the recomputed forward's dispatch and return: 6 / 4 of the 111 GB
    const CommandResult again = run_logged("./train_cpu --config deepseek-v3 --plan --gpus 256 --ep 64 --batch 1 --seq "
                                           "4096 --grad-accum 16 --recompute", "cli_plan_recompute.txt", 60);
    REQUIRE(again.status == 0);
    CHECK(again.out.find("activations (--recompute) 16.5 GiB") != std::string::npos);
    CHECK(again.out.find("+ 8.668e+10 recomputed") != std::string::npos);
    CHECK(again.out.find("166 GB sent") != std::string::npos);
    // BF16 moments: 4 bytes of the 12 less, 8 x 2.66e9; the host and the checkpoint keep FP32
    const CommandResult bf16 = run_logged("./train_cpu --config deepseek-v3 --plan --gpus 256 --ep 64 --batch 1 --seq "
                                          "4096 --grad-accum 16 --moments bf16", "cli_plan_bf16_moments.txt", 60);
    REQUIRE(bf16.status == 0);
    CHECK(bf16.out.find("(moments, master weights) 19.9 GiB, activations 308.8 GiB, total 486.2 of 80 GiB") !=
          std::string::npos);
    CHECK(bf16.out.find("host memory per GPU: weights 103.7 GiB, AdamW shard 19.9 GiB; a checkpoint: 8.19 TB, 32 GB "
                        "written by each rank") != std::string::npos);
    expect_clean_failure("./train_cpu --config small --moments fp16", "--moments must be fp32 or bf16");
    expect_clean_failure("./train_cpu --config deepseek-v3 --plan --gpus 64 --pp 64", "--pp 64 exceeds the model's 61 "
                         "layers");
    expect_clean_failure("./train_cpu --config deepseek-v3 --plan --gpus 256 --ep 3", "--ep x --pp must divide --gpus");
}

TEST_CASE("cli: --plan with pipeline stages: DeepSeek-V3 as PP 16 x EP 64 x DP 2 on 2048 GPUs fits in 80 GiB") {
    const CommandResult plan = run_logged("./train_cpu --config deepseek-v3 --plan --gpus 2048 --pp 16 --ep 64 "
                                          "--batch 1 --seq 4096 --grad-accum 32 --recompute", "cli_plan_pp.txt", 60);
    REQUIRE(plan.status == 0);
    const std::string& out = plan.out;
    // 61 layers in 16 stages of 4, the last holding layer 60 with the heads and MTP
    CHECK(out.find("pipeline stages, their first layers: 0 4 8 12 16 20 24 28 32 36 40 44 48 52 56 60; the heaviest in "
                   "memory: stage 0 (layers 0-3, the embedding)") != std::string::npos);
    // stage 0: the embedding (0.93e9), 3 dense blocks (0.58e9 each) and one MoE block (0.23e9 replicated, 11.3e9 in
    // experts / 64) = 3.09e9 parameters, the embedding's (FP32 weight and gradient) at 8 bytes and the GEMM weights'
    // 2.16e9 (BF16 working copy, FP32 gradient) at 6 = 19.0 GiB; the optimizer shard: 2.9e9 replicated / 128 + 0.18e9
    // experts / 2 = 0.11e9 values of m, v and the master weights, 12 bytes each = 1.2 GiB; activations: 16
    // micro-batches in flight x 4 blocks' inputs (4096 x 7168 FP32) = 7.0 GiB, one dense and one MoE set (211776 +
    // 326720 values a token) = 8.2 GiB and the 4 messages (0.9 GiB): 16.1 GiB
    CHECK(out.find("weights+grads 19.0 GiB, optimizer shard (moments, master weights) 1.2 GiB, activations "
                   "(--recompute) 16.1 GiB, total 36.3 of 80 GiB  -> fits") != std::string::npos);
    // (16 - 1) / (32 + 16 - 1); a message is 4096 tokens x 7168 x (1 + MTP's embedding) FP32, each way
    CHECK(out.find("0.47 GB to and from each neighbouring stage per micro-step; 1F1B bubble 32%") != std::string::npos);
    const CommandResult split = run_logged("./train_cpu --config deepseek-v3 --plan --gpus 64 --pp 2 --ep 32 --batch 1 "
                                           "--seq 4096 --grad-accum 4 --pp-split 20", "cli_plan_split.txt", 60);
    CHECK(split.out.find("pipeline stages, their first layers: 0 20;") != std::string::npos);  // as given
    const CommandResult layouts = run_logged("./train_cpu --config deepseek-v3 --plan-layouts --gpus 72 "
                                             "--gpu-memory-gib 141 --batch 1 --seq 4096 --grad-accum 32 --recompute",
                                             "cli_plan_layouts.txt", 60);
    REQUIRE(layouts.status == 0);
    CHECK(layouts.out.find("none fits: the smallest needs 188.8 GiB per GPU") != std::string::npos);
}
