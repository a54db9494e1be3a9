// Command-line parsing: every flag takes one value (except the switches), numbers must parse completely.
#include "trainer/train_args.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

#include "model/config.h"

// How long a rank other than 0 waits before it reports a flag it rejects (bad(), below).
static const unsigned OTHER_RANK_FLAG_ERROR_DELAY_SECONDS = 5;

static const char* USAGE =
    "usage: %s [flags]\n"
    "  --config PRESET|FILE   tiny, small, deepseek-v2-lite, deepseek-v3, or a Hugging Face config.json (small)\n"
    "  --data PATTERN         training shards, e.g. 'data/default/train_*.bin'\n"
    "  --val PATTERN          validation shards\n"
    "  --tokenizer FILE       for sampling (default: tokenizer.bin beside the first training shard)\n"
    "  --steps N              total optimizer steps of the run, 0 for none (100)\n"
    "  --batch B              sequences per rank per micro-step (8)\n"
    "  --grad-accum N         micro-steps per optimizer step (1)\n"
    "  --seq T                tokens per sequence (128)\n"
    "  --lr X                 peak learning rate (3e-4); linear warmup, the peak, cosine decay to --min-lr-ratio\n"
    "  --warmup N             warmup steps (steps/10)\n"
    "  --decay-steps N        decay over the last N steps only, the peak held before them (warmup-stable-decay;\n"
    "                         0: no decay) (default: every step after warmup)\n"
    "  --min-lr-ratio X       the learning rate at the last step over the peak (0.1)\n"
    "  --weight-decay X       AdamW weight decay on matrices and embeddings (0.1)\n"
    "  --grad-clip X          global gradient-norm clip, 0 for none (1.0)\n"
    "  --skip-spikes Z        no update on a step whose loss or gradient norm is Z standard deviations above the last\n"
    "                         128 steps' mean (0: report such steps only) (0)\n"
    "  --moments fp32|bf16    how AdamW's moments are stored: bf16 as DeepSeek-V3 trains, half their memory (fp32)\n"
    "  --seed S               initialisation and sampling seed (1337)\n"
    "  --eval-every N         validation loss every N steps and after the last (0: only after the last)\n"
    "  --eval-batches N       batches per validation (20)\n"
    "  --checkpoint-dir DIR   where checkpoints go (then SIGTERM or SIGUSR1, under mpirun SIGUSR1 sent to mpirun,\n"
    "                         stops the training after the step in progress, with a checkpoint)\n"
    "  --checkpoint-every N   checkpoint every N steps, and after the last step\n"
    "  --keep-checkpoints N   keep only the newest N checkpoints in --checkpoint-dir (default 0: all)\n"
    "  --async-checkpoint     each rank writes its part of a checkpoint on a thread while training goes on (a host\n"
    "                         copy of that part meanwhile: 12 bytes per value of its optimizer shard)\n"
    "  --resume               continue from the newest checkpoint in --checkpoint-dir\n"
    "  --log FILE             one JSON line per step\n"
    "  --sample N             tokens to sample after training (0)\n"
    "  --prompt TEXT          sampling prompt (\"The\")\n"
    "  --temperature X        sampling temperature (1.0)\n"
    "  --top-k K              sample among the K most likely tokens, 0 for all (0)\n"
    "  --ep N                 split the routed experts over N ranks (launch with mpirun; world = PP x EP x DP) (1)\n"
    "  --pp N                 cut the layers into N pipeline stages, run 1F1B over the --grad-accum micro-batches (1)\n"
    "  --pp-split L1,L2,...   the first layer of stages 1 to N-1 (default: the cut that balances their FLOPs)\n"
    "  --vocab N              override the config's vocab_size (e.g. 50257 for llm.c's GPT-2 shards)\n"
    "  --init-from-hf DIR     start from a Hugging Face directory (config.json + safetensors)\n"
    "  --export-hf DIR        write a Hugging Face directory at the end (with --export-dtype bf16|f32, bf16)\n"
    "  --dtype fp32|bf16|fp8  GEMM precision: fp32; bf16 inputs (GPU only; the GPU default); fp8: the linear layers\n"
    "                         inside the blocks in DeepSeek-V3's FP8 recipe (on the CPU: E4M3 values, FP32 sums)\n"
    "  --recompute            activation checkpointing: keep the blocks' inputs and the activations of one block of\n"
    "                         each kind (dense, MoE) and one chunk of logits per head; the backward runs their\n"
    "                         forward again (the same results, about a third more FLOPs)\n"
    "  --eval-only            print the validation loss of the model (--resume or --init-from-hf) and exit\n"
    "  --plot FILE.png        plot the --log at the end (--plot-log-scale for a logarithmic loss axis)\n"
    "  --describe             print the config and parameter counts, then exit\n"
    "  --plan                 plan a run on paper: memory, FLOPs, all-to-all bytes, predicted step time; with\n"
    "                         --gpus N (8) --gpus-per-node N (8) --pp P --ep M --batch B --seq T --grad-accum N\n"
    "                         --matmul-tflops X (400) --nvlink-gbps X (160) --network-gbps X (40) --gpu-memory-gib X (80)\n"
    "  --plan-layouts         --plan's memory and throughput for every PP x EP x DP of --gpus, and the best that\n"
    "                         fits\n";

// This process's rank in its job, from the launcher's environment (mpirun's, or srun's with PMIx or PMI): the
// flags are parsed before MPI starts. "0" when there is no launcher.
static std::string launcher_rank() {
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
        if (const char* rank = getenv(name)) return rank;
    return "0";
}

// Prints why a flag is rejected and exits 2. Rank 0 speaks at once; its exit makes the launcher end the others
// (mpirun; srun with --kill-on-bad-exit). Another rank waits first, so its line is seen only when rank 0 accepted
// its own flags: the ranks got different flags, and rank 0 waits in MPI's start for this one, which alone knows why.
[[noreturn]] static void bad(const char* program, const std::string& msg) {
    const std::string rank = launcher_rank();
    if (rank == "0") {
        fprintf(stderr, "%s: %s (see --help)\n", program, msg.c_str());
    } else {
        sleep(OTHER_RANK_FLAG_ERROR_DELAY_SECONDS);
        fprintf(stderr, "%s: [rank %s] %s (see --help; start every rank with the same flags)\n", program,
                rank.c_str(), msg.c_str());
    }
    exit(2);
}

static long long parse_int(const char* program, const char* flag, const char* text, long long lo, long long hi) {
    char* end = nullptr;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < lo || v > hi)
        bad(program, std::string(flag) + " needs an integer between " + std::to_string(lo) + " and " +
                         std::to_string(hi) + ", got '" + text + "'");
    return v;
}

static float parse_float(const char* program, const char* flag, const char* text, double lo, double hi) {
    char* end = nullptr;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end != '\0' || !(v >= lo && v <= hi))
        bad(program, std::string(flag) + " needs a number between " + std::to_string(lo) + " and " +
                         std::to_string(hi) + ", got '" + text + "'");
    return (float)v;
}

TrainArgs parse_train_args(int argc, char** argv, const char* program) {
    TrainArgs a;
    const long long BIG = 1000000000;
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            printf(USAGE, program);
            exit(0);
        }
        if (!strcmp(flag, "--resume")) { a.resume = true; continue; }
        if (!strcmp(flag, "--describe")) { a.describe = true; continue; }
        if (!strcmp(flag, "--plan")) { a.plan = true; continue; }
        if (!strcmp(flag, "--plan-layouts")) { a.plan = a.plan_layouts = true; continue; }
        if (!strcmp(flag, "--eval-only")) { a.eval_only = true; continue; }
        if (!strcmp(flag, "--plot-log-scale")) { a.plot_log_scale = true; continue; }
        if (!strcmp(flag, "--recompute")) { a.recompute = true; continue; }
        if (!strcmp(flag, "--async-checkpoint")) { a.async_checkpoint = true; continue; }
        if (strncmp(flag, "--", 2) != 0) bad(program, std::string("unexpected argument '") + flag + "'");
        if (i + 1 >= argc) bad(program, std::string(flag) + " needs a value");
        const char* v = argv[++i];
        if (!strcmp(flag, "--config")) a.config = v;
        else if (!strcmp(flag, "--data")) a.data = v;
        else if (!strcmp(flag, "--val")) a.val = v;
        else if (!strcmp(flag, "--tokenizer")) a.tokenizer = v;
        else if (!strcmp(flag, "--steps")) a.steps = (int)parse_int(program, flag, v, 0, BIG);
        else if (!strcmp(flag, "--batch")) a.batch = (int)parse_int(program, flag, v, 1, 1 << 20);
        else if (!strcmp(flag, "--grad-accum")) a.grad_accum = (int)parse_int(program, flag, v, 1, 1 << 20);
        else if (!strcmp(flag, "--seq")) a.seq = (int)parse_int(program, flag, v, 2, 1 << 24);
        else if (!strcmp(flag, "--lr")) a.lr = parse_float(program, flag, v, 0.0, 10.0);
        else if (!strcmp(flag, "--warmup")) a.warmup = (int)parse_int(program, flag, v, 0, BIG);
        else if (!strcmp(flag, "--decay-steps")) a.decay_steps = (int)parse_int(program, flag, v, 0, BIG);
        else if (!strcmp(flag, "--min-lr-ratio")) a.min_lr_ratio = parse_float(program, flag, v, 0.0, 1.0);
        else if (!strcmp(flag, "--weight-decay")) a.weight_decay = parse_float(program, flag, v, 0.0, 10.0);
        else if (!strcmp(flag, "--grad-clip")) a.grad_clip = parse_float(program, flag, v, 0.0, 1e6);
        else if (!strcmp(flag, "--skip-spikes")) a.skip_spikes = parse_float(program, flag, v, 0.0, 1e6);
        else if (!strcmp(flag, "--seed")) a.seed = (unsigned long long)parse_int(program, flag, v, 0, 1LL << 62);
        else if (!strcmp(flag, "--eval-every")) a.eval_every = (int)parse_int(program, flag, v, 0, BIG);
        else if (!strcmp(flag, "--eval-batches")) a.eval_batches = (int)parse_int(program, flag, v, 1, BIG);
        else if (!strcmp(flag, "--checkpoint-dir")) a.checkpoint_dir = v;
        else if (!strcmp(flag, "--checkpoint-every")) a.checkpoint_every = (int)parse_int(program, flag, v, 0, BIG);
        else if (!strcmp(flag, "--keep-checkpoints")) a.keep_checkpoints = (int)parse_int(program, flag, v, 0, BIG);
        else if (!strcmp(flag, "--log")) a.log = v;
        else if (!strcmp(flag, "--sample")) a.sample = (int)parse_int(program, flag, v, 0, 1 << 20);
        else if (!strcmp(flag, "--prompt")) a.prompt = v;
        else if (!strcmp(flag, "--temperature")) a.temperature = parse_float(program, flag, v, 1e-3, 100.0);
        else if (!strcmp(flag, "--top-k")) a.top_k = (int)parse_int(program, flag, v, 0, BIG);
        else if (!strcmp(flag, "--ep")) a.ep = (int)parse_int(program, flag, v, 1, 1 << 16);
        else if (!strcmp(flag, "--pp")) a.pp = (int)parse_int(program, flag, v, 1, 1 << 12);
        else if (!strcmp(flag, "--pp-split")) {
            a.pp_split.clear();
            for (const char* at = v; *at;) {
                const char* comma = strchr(at, ',');
                const std::string layer = comma ? std::string(at, comma) : std::string(at);
                a.pp_split.push_back((int)parse_int(program, flag, layer.c_str(), 1, 1 << 20));
                at = comma ? comma + 1 : at + layer.size();
            }
        }
        else if (!strcmp(flag, "--vocab")) a.vocab = (int)parse_int(program, flag, v, 2, MAX_VOCAB_SIZE);
        else if (!strcmp(flag, "--init-from-hf")) a.init_from_hf = v;
        else if (!strcmp(flag, "--export-hf")) a.export_hf = v;
        else if (!strcmp(flag, "--export-dtype")) a.export_dtype = v;
        else if (!strcmp(flag, "--dtype")) a.dtype = v;
        else if (!strcmp(flag, "--moments")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16")) bad(program, "--moments must be fp32 or bf16");
            a.moments = strcmp(v, "bf16") ? Moments::FP32 : Moments::BF16;
        }
        else if (!strcmp(flag, "--plot")) a.plot = v;
        else if (!strcmp(flag, "--gpus")) a.plan_inputs.gpus = (int)parse_int(program, flag, v, 1, 1 << 20);
        else if (!strcmp(flag, "--gpus-per-node")) a.plan_inputs.gpus_per_node = (int)parse_int(program, flag, v, 1, 1024);
        else if (!strcmp(flag, "--matmul-tflops")) a.plan_inputs.matmul_tflops = parse_float(program, flag, v, 1e-3, 1e6);
        else if (!strcmp(flag, "--nvlink-gbps")) a.plan_inputs.nvlink_gbps = parse_float(program, flag, v, 1e-3, 1e6);
        else if (!strcmp(flag, "--network-gbps")) a.plan_inputs.network_gbps = parse_float(program, flag, v, 1e-3, 1e6);
        else if (!strcmp(flag, "--gpu-memory-gib")) a.plan_inputs.gpu_memory_gib = parse_float(program, flag, v, 1e-3, 1e6);
        else bad(program, std::string("unknown flag ") + flag);
    }
    if (a.warmup < 0) a.warmup = a.steps / 10;
    if (a.decay_steps == 1)
        bad(program, "--decay-steps 1 lowers nothing (the first decay step is at the peak): give 2 or more, or 0 "
                     "for none");
    if (a.decay_steps > std::max(0, a.steps - a.warmup))
        bad(program, "--decay-steps " + std::to_string(a.decay_steps) + " exceeds the " +
                         std::to_string(std::max(0, a.steps - a.warmup)) + " steps after warmup");
    a.plan_inputs.ep = a.ep;
    a.plan_inputs.pp = a.pp;
    a.plan_inputs.pp_split = a.pp_split;
    a.plan_inputs.batch = a.batch;
    a.plan_inputs.seq = a.seq;
    a.plan_inputs.grad_accum = a.grad_accum;
    a.plan_inputs.recompute = a.recompute;
    a.plan_inputs.moment_bytes = moment_bytes(a.moments);
    if (a.plan && a.plan_inputs.gpus % (a.ep * a.pp) != 0) bad(program, "--ep x --pp must divide --gpus");
    if (!a.pp_split.empty() && (int)a.pp_split.size() != a.pp - 1)
        bad(program, "--pp-split gives " + std::to_string(a.pp_split.size()) + " layers; --pp " +
                         std::to_string(a.pp) + " needs " + std::to_string(a.pp - 1));
    if (a.export_dtype != "bf16" && a.export_dtype != "f32") bad(program, "--export-dtype must be bf16 or f32");
    if (!a.dtype.empty() && a.dtype != "fp32" && a.dtype != "bf16" && a.dtype != "fp8")
        bad(program, "--dtype must be fp32, bf16 or fp8");
    if (!a.plot.empty() && a.log.empty()) bad(program, "--plot needs --log FILE (the plot is drawn from the log)");
    if (a.eval_only && a.val.empty()) bad(program, "--eval-only needs --val PATTERN");
    if (a.eval_only && !a.resume && a.init_from_hf.empty())
        bad(program, "--eval-only needs a model: --resume --checkpoint-dir DIR or --init-from-hf DIR");
    if (a.resume && !a.init_from_hf.empty()) bad(program, "--resume and --init-from-hf exclude each other");
    if (a.checkpoint_every > 0 && a.checkpoint_dir.empty()) bad(program, "--checkpoint-every needs --checkpoint-dir");
    if (a.keep_checkpoints > 0 && a.checkpoint_dir.empty()) bad(program, "--keep-checkpoints needs --checkpoint-dir");
    if (a.async_checkpoint && a.checkpoint_dir.empty()) bad(program, "--async-checkpoint needs --checkpoint-dir");
    if (a.eval_every > 0 && a.val.empty()) bad(program, "--eval-every needs --val PATTERN");
    if (a.eval_only && (!a.export_hf.empty() || !a.plot.empty()))
        bad(program, "--eval-only only evaluates: drop --export-hf and --plot");
    if (a.steps > 0 && !a.eval_only && !a.describe && !a.plan && a.data.empty())
        bad(program, "--data PATTERN is required to train (training shards)");
    if (a.resume && a.checkpoint_dir.empty()) bad(program, "--resume needs --checkpoint-dir");
    return a;
}
