// The run around the training loops of train_cpu and train (see run.h). Every check that can fail before training
// fails in start_run, on every rank together; during training a rank that fails says why once and ends the job.
#include "trainer/run.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "data/shards.h"
#include "io/files.h"
#include "io/hf.h"
#include "model/sample.h"
#include "tools/plot.h"
#include "trainer/pipeline.h"

static Comm* g_comm = nullptr;

[[noreturn]] void fail(const std::string& msg) {
    g_comm->abort(msg);
    exit(1);  // not reached: abort() ends the job (a virtual call hides that from the compiler)
}

// The lowest rank whose `mine` is non-zero, with that value, or {-1, 0}. Collective.
static std::pair<int, int64_t> first_rank_with(Comm& comm, int64_t mine) {
    std::vector<int64_t> values(comm.world, 0);
    values[comm.rank] = mine;
    comm.all_reduce_sum(values.data(), comm.world, Group::World);
    for (int rank = 0; rank < comm.world; rank++)
        if (values[rank]) return {rank, values[rank]};
    return {-1, 0};
}

// A check every rank makes at the same point: if any rank failed, the first of them prints its reason once and
// every rank exits 1, so the job neither hangs nor repeats the message N times.
static void agree_or_exit(const Run& r, const std::string& error, const std::function<void()>& clean_up = nullptr) {
    Comm& comm = *r.comm;
    const int failed = first_rank_with(comm, !error.empty()).first;
    if (failed < 0) return;
    if (clean_up) clean_up();
    if (failed == comm.rank)
        fprintf(stderr, "%s: %s%s\n", r.program,
                comm.world > 1 ? ("[rank " + std::to_string(failed) + "] ").c_str() : "", error.c_str());
    delete g_comm;
    exit(1);
}

void agree(Run& r, const std::function<void()>& f) {
    std::string error;
    try {
        f();
    } catch (const std::bad_alloc&) {
        error = "out of memory for the model and a batch of " + std::to_string(r.args.batch) + " x " +
                std::to_string(r.args.seq) + " tokens (lower --batch or --seq, or use a smaller config)";
    } catch (const std::exception& e) {
        error = e.what();
    }
    agree_or_exit(r, error);
}

// A failure every rank sees at once (the reduced loss): rank 0 reports it, the others wait to be ended with it.
[[noreturn]] static void halt_all(Comm& comm, const std::string& msg) {
    if (comm.rank == 0) fail(msg);
    comm.barrier();
    fail(msg);  // not reached: rank 0's abort ends the job
}

// `text` the same on every rank, or rank 0 names the first rank whose text differs (`what`) and the job ends
static void agree_on(Run& r, const std::string& text, const char* what) {
    Comm& comm = *r.comm;
    const uint64_t fingerprint = fnv1a(text, 1469598103934665603ull);
    uint64_t lead_fingerprint = fingerprint;
    comm.broadcast(&lead_fingerprint, sizeof(lead_fingerprint), 0);
    const int differs = first_rank_with(comm, lead_fingerprint != fingerprint).first;
    if (differs < 0) return;
    if (comm.rank == 0) fprintf(stderr, "%s: rank %d's %s from rank 0's\n", r.program, differs, what);
    delete g_comm;
    exit(1);
}

// SIGTERM (a kill) or SIGUSR1 (what mpirun forwards to every rank, and Slurm's --signal sends). With
// --checkpoint-dir the handler only notes it during training: the step in progress finishes, the ranks agree after
// it (end_step), a checkpoint is written and the job exits 128 + the signal's number. Otherwise the defaults.
static std::atomic<int> g_stop_signal{0};
static void note_stop_signal(int signal_number) { g_stop_signal = signal_number; }

static void catch_stop_signals(bool on) {
    struct sigaction action = {};
    action.sa_handler = on ? note_stop_signal : SIG_DFL;
    action.sa_flags = SA_RESTART;  // reads and writes in progress carry on
    sigemptyset(&action.sa_mask);
    for (int signal_number : {SIGTERM, SIGUSR1}) sigaction(signal_number, &action, nullptr);
}

// The end of every run: the log, the model's resources before the ranks' transport they may use, the transport
static void end_job(Run& r) {
    if (r.log) fclose(r.log);
    r.log = nullptr;
    if (r.on_end) r.on_end();
    delete g_comm;
}

// Fault injection for the failure tests, MOE_FAULT=RANK:STEP:KIND: whether this rank is to fail at this step this way
// (crash, error: at the start of step STEP, 0-based; write: its part of the checkpoint of step STEP).
static bool fault_requested(const Comm& comm, int64_t step, const char* kind) {
    const char* spec = getenv("MOE_FAULT");
    int rank = -1;
    long long at = -1;
    char requested[16] = {0};
    return spec && sscanf(spec, "%d:%lld:%15s", &rank, &at, requested) == 3 && rank == comm.rank && at == step &&
           !strcmp(requested, kind);
}

// The newest checkpoint in --checkpoint-dir whose checksums hold (the ranks share the reading), or "" when there is
// none. A damaged one is named and passed over; when every one is damaged the job ends with the last one's fault.
static std::string newest_intact_checkpoint(Run& r) {
    Comm& comm = *r.comm;
    const std::vector<std::string> found = checkpoints_newest_first(r.args.checkpoint_dir);
    std::string listing;
    for (const std::string& path : found) listing += path.substr(path.find_last_of('/') + 1) + "\n";
    agree_on(r, listing, "checkpoints in --checkpoint-dir differ");  // a shared file system's cache
    for (size_t i = 0; i < found.size(); i++) {
        std::string error = checkpoint_verify(found[i], comm.rank, comm.world);
        if (i + 1 == found.size()) {  // nothing older to fall back on
            if (!error.empty() && i > 0) error += "; no checkpoint in " + r.args.checkpoint_dir + " is intact";
            agree_or_exit(r, error);
        }
        const int damaged = first_rank_with(comm, !error.empty()).first;
        if (damaged < 0) {
            if (i > 0 && comm.rank == 0)
                fprintf(stderr, "%s: resuming from %s, the newest intact checkpoint\n", r.program, found[i].c_str());
            return found[i];
        }
        if (damaged == comm.rank) fprintf(stderr, "%s: %s: passed over\n", r.program, error.c_str());
    }
    return "";
}

// The config from the checkpoint when resuming, from the Hugging Face directory, else from --config, and the
// same on every rank (the same flags, config, build and newest checkpoint, compared through fingerprints).
static void resolve_config(Run& r) {
    const TrainArgs& args = r.args;
    Comm& comm = *r.comm;
    config_notes(comm.rank == 0);
    // first: ranks given another --ep, --steps, ... would take other layouts or steps, and hang or corrupt the
    // collectives
    agree_on(r, r.flags + " built " __DATE__ " " __TIME__, "flags or build differ");
    if (args.resume) r.resume_from = newest_intact_checkpoint(r);
    agree(r, [&] {
        r.config = !r.resume_from.empty()        ? checkpoint_config(r.resume_from)
                   : !args.init_from_hf.empty() ? hf_config(args.init_from_hf)
                                                : parse_config_file(args.config);
        if (args.vocab > 0 && args.vocab != r.config.vocab_size) {
            if (!r.resume_from.empty() || !args.init_from_hf.empty())
                throw std::runtime_error("--vocab " + std::to_string(args.vocab) + " differs from the loaded model's " +
                                         std::to_string(r.config.vocab_size));
            r.config.vocab_size = args.vocab;
            validate_config(r.config);  // the bounds on the parameter count
        }
        if (r.config.n_routed_experts % args.ep != 0)
            throw std::runtime_error("--ep " + std::to_string(args.ep) + " does not divide n_routed_experts " +
                                     std::to_string(r.config.n_routed_experts));
        r.stage_first = pipeline_cut(r.config, args.pp, args.pp_split, args.seq);
        if (!args.export_hf.empty() && (args.ep != 1 || args.pp != 1))
            throw std::runtime_error("--export-hf needs --ep 1 and --pp 1 (resume the checkpoint on one rank to "
                                     "export it)");
        if (args.eval_only && args.resume && r.resume_from.empty())
            throw std::runtime_error("--eval-only --resume: there is no checkpoint in " + args.checkpoint_dir);
    });
    // a directory no rank can write to, or (nodes without a shared file system) one the ranks do not share, found
    // before any step
    if (!args.checkpoint_dir.empty() && !args.eval_only && !args.describe)
        agree_or_exit(r, checkpoint_check_dir(args.checkpoint_dir, comm));
    // ranks whose listings of --checkpoint-dir differ (a shared file system's cache) would resume from other steps
    agree_on(r, config_to_json(r.config) + " resuming " + r.resume_from, "config or newest checkpoint differ");
    if (args.resume && r.resume_from.empty() && comm.rank == 0)
        fprintf(stderr, "%s: no checkpoint in %s yet; starting from step 0\n", r.program, args.checkpoint_dir.c_str());
}

// What makes two runs the same run: a resume that changes it is told so. replicas: the ranks of a stage.
static std::string run_record(const TrainArgs& args, int replicas) {
    return "lr=" + std::to_string(args.lr) + " warmup=" + std::to_string(args.warmup) +
           " steps=" + std::to_string(args.steps) +
           (args.decay_steps >= 0 ? " decay_steps=" + std::to_string(args.decay_steps) : "") +
           (args.min_lr_ratio != 0.1f ? " min_lr_ratio=" + std::to_string(args.min_lr_ratio) : "") +
           " seq=" + std::to_string(args.seq) +
           " global_batch=" + std::to_string((int64_t)args.batch * replicas * args.grad_accum) +
           " weight_decay=" + std::to_string(args.weight_decay) + " grad_clip=" + std::to_string(args.grad_clip);
}

// The data, the host model (fresh, imported or resumed), the program's model, the tokenizer and the checkpoint
// directory.
static void setup_model_and_data(Run& r, const MakeModel& make_model) {
    const TrainArgs& args = r.args;
    Comm& comm = *r.comm;
    const int B = args.batch, T = args.seq;
    r.oc.lr = args.lr;
    r.oc.weight_decay = args.weight_decay;
    r.oc.grad_clip = args.grad_clip;
    r.oc.moments = args.moments;
    r.oc.warmup_steps = args.warmup;
    r.oc.total_steps = args.steps;
    r.oc.decay_steps = args.decay_steps;
    r.oc.min_lr_ratio = args.min_lr_ratio;
    r.rng = Rng(args.seed);
    if (T > r.config.max_position_embeddings)
        throw std::runtime_error("--seq " + std::to_string(T) + " exceeds max_position_embeddings " +
                                 std::to_string(r.config.max_position_embeddings));
    // each rank of a stage reads its own slice of every global batch, the stages alike; first, so that data too
    // short for the batch is said before the model's memory is taken
    const int replica = comm.group_rank(Group::Stage), replicas = comm.stage_size();
    if (!args.data.empty())
        r.train = std::make_unique<DataLoader>(args.data, B, T, replica, replicas, r.config.vocab_size);
    if (!args.val.empty()) {
        r.val = std::make_unique<DataLoader>(args.val, B, T, replica, replicas, r.config.vocab_size);
        // never more batches than one pass over the validation data, so no token is counted twice
        r.eval_batches = (int)std::min<int64_t>(args.eval_batches, r.val->batches_per_pass());
    }
    model_init(r.model, r.config, &comm, r.stage_first[comm.pp_rank], r.stage_first[comm.pp_rank + 1]);
    model_init_weights(r.model, args.seed);
    make_model(r);  // its memory before the weights are read: a batch that does not fit is said first
    r.opt = adamw_state(r.model.shard);
    if (!args.init_from_hf.empty()) import_hf(r.model, args.init_from_hf);
    if (!r.resume_from.empty()) {
        checkpoint_load(r.resume_from, r.model, r.opt, r.state);
        if (r.train)
            r.train->restore({r.state.data_shard, r.state.data_position, r.state.data_file, r.state.data_tokens});
        r.rng.state = r.state.rng_state;
    }
    if (args.sample > 0) {
        std::string path = args.tokenizer;
        if (path.empty() && args.data.empty())
            throw std::runtime_error("--sample needs --tokenizer FILE when there is no --data");
        if (path.empty()) {  // tokenizer.bin beside the first training shard, as prepare_data writes it
            const std::string first = glob_files(args.data)[0];
            const size_t slash = first.find_last_of('/');
            path = (slash == std::string::npos ? std::string(".") : first.substr(0, slash)) + "/tokenizer.bin";
        }
        r.tokenizer = Tokenizer::load(path);
        if (r.tokenizer.vocab_size() > r.config.vocab_size)
            throw std::runtime_error("the tokenizer " + path + " has " + std::to_string(r.tokenizer.vocab_size()) +
                                     " tokens, more than the model's vocab_size " +
                                     std::to_string(r.config.vocab_size));
    }
    if (!args.checkpoint_dir.empty() && comm.rank == 0) make_dirs(args.checkpoint_dir);
}

bool start_run(Run& r, int argc, char** argv, const char* program, MakeComm make_comm, const MakeModel& make_model,
               int* status) {
    r.program = program;
    // compared across ranks at start; a checkpoint directory's path apart (checkpoint_check_dir says more about it)
    for (int i = 1; i < argc; i++) {
        const bool directory = i > 1 && !strcmp(argv[i - 1], "--checkpoint-dir") && argv[i][0];
        r.flags += (directory ? "DIR" : std::string(argv[i])) + '\n';
    }
    r.args = parse_train_args(argc, argv, program);
    const TrainArgs& args = r.args;
    *status = 0;
    if (args.plan) {
        try {
            const Config config = parse_config_file(args.config);
            if (config.n_routed_experts % args.ep != 0)
                throw std::runtime_error("--ep " + std::to_string(args.ep) + " does not divide n_routed_experts");
            pipeline_cut(config, args.pp, args.pp_split, args.seq);  // a --pp the model's layers cannot take
            if (args.plan_layouts) print_layouts(config, args.plan_inputs);
            else print_plan(config, args.plan_inputs);
        } catch (const std::exception& e) {
            fprintf(stderr, "%s: %s\n", program, e.what());
            *status = 1;
        }
        return false;
    }
    g_comm = make_comm(args.ep, args.pp, program).release();  // lives until exit; fail() ends the job through it
    r.comm = g_comm;
    resolve_config(r);
    if (args.describe) {
        if (r.comm->rank == 0) {
            printf("config:\n%s\n", config_to_json(r.config).c_str());
            printf("total_params %lld\nactive_params %lld\nmtp_params %lld\n", (long long)count_total_params(r.config),
                   (long long)count_active_params(r.config), (long long)count_mtp_params(r.config));
        }
        delete g_comm;
        return false;
    }
    agree(r, [&] { setup_model_and_data(r, make_model); });
    const std::string record = run_record(args, r.comm->stage_size());
    if (r.comm->rank == 0 && !args.eval_only && !r.resume_from.empty() && r.state.run != record &&
        !r.state.run.empty())
        fprintf(stderr, "%s: note: the checkpoint's run had %s; this one has %s (the schedule changes)\n", program,
                r.state.run.c_str(), record.c_str());
    r.state.run = record;
    return true;
}

void Step::add(const LossParts& l) {
    loss[0] += l.total * loss_scale;
    loss[1] += l.main * loss_scale;
    loss[2] += l.mtp * loss_scale;
    loss[3] += l.balance * loss_scale;
}

// The next `count` batches of B x T from loader (from its start when `from_start`), batch i at i * B * T, all read
// before any collective that uses them: a bad shard is found when a rank reaches it, and reported here, once.
static void read_batches(Run& r, DataLoader& loader, bool from_start, int count, std::vector<int32_t>& inputs,
                         std::vector<int32_t>& targets) {
    const int64_t batch_tokens = (int64_t)r.args.batch * r.args.seq;
    inputs.resize(count * batch_tokens);
    targets.resize(count * batch_tokens);
    agree(r, [&] {
        if (from_start) loader.reset();
        for (int i = 0; i < count; i++) loader.next_batch(&inputs[i * batch_tokens], &targets[i * batch_tokens]);
    });
}

void start_training(Run& r) {
    const TrainArgs& args = r.args;
    Comm& comm = *r.comm;
    agree(r, [&] {
        if (comm.rank != 0 || args.log.empty()) return;
        r.log = fopen(args.log.c_str(), r.resume_from.empty() ? "w" : "a");
        if (!r.log) throw std::runtime_error("cannot write the log file " + args.log);
    });
    if (comm.rank == 0) {
        if (!r.resume_from.empty())
            printf("resumed from %s at step %lld\n", r.resume_from.c_str(), (long long)r.state.step);
        printf("model: %lld parameters (%lld active per token, %lld in MTP); %d rank(s) (PP %d x EP %d x DP %d); "
               "batch %d x %d x %d micro-steps per rank; %d steps\n",
               (long long)count_total_params(r.config), (long long)count_active_params(r.config),
               (long long)count_mtp_params(r.config), comm.world, comm.pp_size, comm.ep_size, comm.dp_size,
               args.batch, args.seq, args.grad_accum, args.steps);
        if (comm.pp_size > 1) {
            printf("pipeline stages, their first layers:");
            for (int stage = 0; stage < comm.pp_size; stage++) printf(" %d", r.stage_first[stage]);
            printf("\n");
        }
    }
    if (!args.checkpoint_dir.empty()) catch_stop_signals(true);
    r.first_step = r.state.step;
}

Step begin_step(Run& r, int64_t step) {
    if (fault_requested(*r.comm, step, "crash")) raise(SIGKILL);
    if (fault_requested(*r.comm, step, "error"))
        fail("injected fault at step " + std::to_string(step) + " (MOE_FAULT)");
    Step s;
    s.step = step;
    s.B = r.args.batch;
    s.T = r.args.seq;
    s.loss_scale = 1.0f / (float)((int64_t)r.args.grad_accum * r.comm->stage_size());
    read_batches(r, *r.train, /*from_start*/ false, r.args.grad_accum, s.inputs, s.targets);
    return s;
}

// The per-block load imbalance as a JSON list
static std::string load_imbalance_json(const Config& c, const std::vector<std::vector<int64_t>>& expert_counts) {
    std::string s = "[";
    for (double imbalance : load_imbalance(c, expert_counts)) {
        char buf[32];
        snprintf(buf, sizeof(buf), "%s%.3f", s.size() > 1 ? "," : "", imbalance);
        s += buf;
    }
    return s + "]";
}

void reduce_step(Run& r, Step& s, std::vector<std::vector<int64_t>>& expert_counts) {
    Comm& comm = *r.comm;
    double sums[5] = {s.loss[0], s.loss[1], s.loss[2], s.loss[3], s.fp8_in_bf16};
    comm.all_reduce_sum(sums, 5, Group::World);
    std::copy(sums, sums + 4, s.loss);
    s.fp8_in_bf16 = sums[4];
    if (!std::isfinite(s.loss[0]))
        halt_all(comm, "the loss became " + std::to_string(s.loss[0]) + " at step " + std::to_string(s.step) +
                           " (try a lower --lr)");
    for (std::vector<int64_t>& counts : expert_counts)
        comm.all_reduce_sum(counts.data(), (int64_t)counts.size(), Group::World);
    s.load_imbalance = load_imbalance_json(r.config, expert_counts);
    if (!std::isfinite(s.grad_norm))
        halt_all(comm, "the gradient norm became " + std::to_string(s.grad_norm) + " at step " +
                           std::to_string(s.step) + " (try a lower --lr)");
    // every rank scores the same values alike; the skip is agreed all the same: the replicas must never part
    s.loss_score = r.loss_outliers.update(s.loss[0]);
    s.norm_score = r.norm_outliers.update(s.grad_norm);
    const double skip_z = r.args.skip_spikes;
    if (skip_z > 0)
        s.skip_update = first_rank_with(comm, s.loss_score.z > skip_z || s.norm_score.z > skip_z).first >= 0;
}

bool eval_due(const Run& r, int64_t step) {
    return r.val && (step + 1 == r.args.steps || (r.args.eval_every > 0 && (step + 1) % r.args.eval_every == 0));
}

double evaluate(Run& r, const ModelCalls& calls) {
    const int B = r.args.batch, T = r.args.seq;
    const int64_t batch_tokens = (int64_t)B * T;
    std::vector<int32_t> inputs, targets;
    read_batches(r, *r.val, /*from_start*/ true, r.eval_batches, inputs, targets);
    double total = 0.0;
    for (int i = 0; i < r.eval_batches; i++)
        total += calls.forward(&inputs[i * batch_tokens], &targets[i * batch_tokens], B, false).main;
    r.comm->all_reduce_sum(&total, 1, Group::World);  // the last stage's ranks hold the losses
    return total / r.eval_batches / r.comm->stage_size();
}

int eval_only(Run& r, const ModelCalls& calls) {
    try {
        const double val_loss = evaluate(r, calls);
        if (r.comm->rank == 0) printf("val_loss %.6f\n", val_loss);
    } catch (const std::exception& e) {
        fail(e.what());
    }
    end_job(r);
    return 0;
}

static std::string format_eta(double seconds) {
    char buf[32];
    const int s = (int)seconds;
    if (s >= 3600) snprintf(buf, sizeof(buf), "%dh%02dm", s / 3600, s / 60 % 60);
    else snprintf(buf, sizeof(buf), "%dm%02ds", s / 60, s % 60);
    return buf;
}

void log_step(Run& r, const Step& s) {
    if (s.step > r.first_step || r.args.steps - r.first_step == 1) {
        r.train_seconds += s.seconds;
        r.timed_steps++;
    }
    if (r.comm->rank != 0) return;
    const double eta = (r.timed_steps ? r.train_seconds / r.timed_steps : s.seconds) * (r.args.steps - s.step - 1);
    const double tokens_per_step = (double)s.B * s.T * r.args.grad_accum * r.comm->stage_size();
    const double tokens_per_s = tokens_per_step / s.seconds, tokens = tokens_per_step * (s.step + 1);
    const double* loss = s.loss;
    // model FLOPs utilisation of one device, when its peak is known
    const double mfu = r.peak_flops > 0
        ? tokens_per_s / r.comm->world * model_flops_per_token(r.config, r.args.seq) / r.peak_flops : NAN;
    printf("step %5lld/%d | loss %.4f (main %.4f mtp %.4f bal %.5f) | lr %.2e | norm %.3f | %.0f tok/s",
           (long long)s.step + 1, r.args.steps, loss[0], loss[1], loss[2], loss[3], s.lr, s.grad_norm, tokens_per_s);
    if (!std::isnan(mfu)) printf(" | MFU %.1f%%", 100 * mfu);
    printf(" | eta %s", format_eta(eta).c_str());
    if (!std::isnan(s.val_loss)) printf(" | val %.4f", s.val_loss);
    if (s.fp8_in_bf16 > 0) printf(" | %.0f FP8 products in BF16", s.fp8_in_bf16);
    printf("\n");
    const double spike_z = r.args.skip_spikes > 0 ? std::fmin(r.args.skip_spikes, OUTLIER_Z) : OUTLIER_Z;
    for (const auto& [name, value, score] : {std::tuple{"loss", loss[0], s.loss_score},
                                             std::tuple{"gradient norm", s.grad_norm, s.norm_score}})
        if (score.z > spike_z)
            printf("step %lld: the %s %.4g is %.1f standard deviations above the last %d steps' mean "
                   "(%.4g +- %.2g)%s\n", (long long)s.step + 1, name, value, score.z, OUTLIER_WINDOW, score.mean,
                   score.deviation, s.skip_update ? "; its update is skipped (--skip-spikes)" : "");
    if (s.loss_score.rise > DIVERGENCE_NATS && s.step >= r.divergence_noted + OUTLIER_WINDOW) {
        printf("step %lld: the loss is diverging: its mean over the last %d steps, %.4g, is %.2f above the lowest "
               "such mean of this run (try a lower --lr)\n", (long long)s.step + 1, OUTLIER_WINDOW,
               s.loss_score.mean, s.loss_score.rise);
        r.divergence_noted = s.step;
    }
    fflush(stdout);
    if (!r.log) return;
    fprintf(r.log,
            "{\"step\": %lld, \"loss\": %.9g, \"loss_main\": %.9g, \"loss_mtp\": %.9g, \"loss_balance\": %.9g, "
            "\"lr\": %.6e, \"grad_norm\": %.6f, \"tokens_per_s\": %.1f, \"tokens\": %.0f, \"load_imbalance\": %s",
            (long long)s.step + 1, loss[0], loss[1], loss[2], loss[3], s.lr, s.grad_norm, tokens_per_s, tokens,
            s.load_imbalance.c_str());
    if (!std::isnan(mfu)) fprintf(r.log, ", \"mfu\": %.3f", mfu);
    if (!std::isnan(s.val_loss)) fprintf(r.log, ", \"val_loss\": %.6f", s.val_loss);
    if (s.fp8_in_bf16 > 0) fprintf(r.log, ", \"fp8_in_bf16\": %.0f", s.fp8_in_bf16);
    if (s.skip_update) fprintf(r.log, ", \"skipped\": true");
    fprintf(r.log, "}\n");
    fflush(r.log);
}

// This rank's part of checkpoint w (on any thread: no Comm); the error it met, or "". injected_fault: fail instead.
static std::string write_checkpoint_part(const CheckpointWrite& w, bool injected_fault) {
    try {
        if (injected_fault) throw std::runtime_error("injected write failure (MOE_FAULT)");
        checkpoint_write_part(w);
        return "";
    } catch (const std::exception& e) {
        return e.what();
    }
}

// Once every rank has written its part of w (error: this rank's failure, if any): the checkpoint renamed into
// place and the old ones pruned. If a part failed, the first such rank names the reason, rank 0 removes the
// temporary file (a full disk stays no fuller) and the job ends.
static void commit_checkpoint(Run& r, const CheckpointWrite& w, const std::string& error) {
    agree_or_exit(r, error, [&] {
        if (r.comm->rank == 0) remove(w.temporary.c_str());
    });
    checkpoint_commit(w, *r.comm);
    if (r.args.keep_checkpoints > 0 && r.comm->rank == 0)
        checkpoint_prune(r.args.checkpoint_dir, r.args.keep_checkpoints, w.step);
}

// --async-checkpoint: waits for this rank's part of the checkpoint being written, if any, then commits it.
// Collective (every rank has a write in flight, or none).
static void finish_checkpoint_write(Run& r) {
    if (!r.writing.valid()) return;
    commit_checkpoint(r, r.pending, r.writing.get());
    r.pending = CheckpointWrite{};
}

int end_step(Run& r, int64_t step) {
    r.state.step = step + 1;
    const int stop = r.args.checkpoint_dir.empty() ? 0 : (int)first_rank_with(*r.comm, g_stop_signal).second;
    if (r.writing.valid() &&
        first_rank_with(*r.comm, r.writing.wait_for(std::chrono::seconds(0)) != std::future_status::ready).first < 0)
        finish_checkpoint_write(r);
    return stop;
}

bool checkpoint_due(const Run& r, int stop) {
    const int64_t step = r.state.step;
    return !r.args.checkpoint_dir.empty() &&
           (step == r.args.steps || stop || (r.args.checkpoint_every > 0 && step % r.args.checkpoint_every == 0));
}

// With --async-checkpoint each rank copies its part and writes it on a thread while training goes on, one write at
// a time: the ranks commit it after the first step at whose end all are done (end_step).
void save_checkpoint(Run& r, const ModelCalls& calls) {
    // every rank's loader is at the same global position; rank 0's is the one saved
    const DataLoaderState ds = r.train->state();
    r.state.data_shard = ds.shard;
    r.state.data_position = ds.position;
    r.state.data_file = ds.file;
    r.state.data_tokens = ds.tokens;
    r.state.rng_state = r.rng.state;
    calls.store();
    finish_checkpoint_write(r);
    const bool copies = r.args.async_checkpoint, fault = fault_requested(*r.comm, r.state.step, "write");
    r.pending = checkpoint_begin(r.args.checkpoint_dir, r.model, r.opt, r.state, copies);
    // written on a thread while training goes on, or (deferred) here and now
    r.writing = std::async(copies ? std::launch::async : std::launch::deferred,
                           [&r, fault] { return write_checkpoint_part(r.pending, fault); });
    if (!copies) finish_checkpoint_write(r);
}

int stop_run(Run& r, int stop) {
    finish_checkpoint_write(r);
    if (r.comm->rank == 0) {
        printf("stopped by %s after step %lld: checkpoint %s written; --resume continues the run\n",
               stop == SIGUSR1 ? "SIGUSR1" : "SIGTERM", (long long)r.state.step,
               checkpoint_path(r.args.checkpoint_dir, r.state.step).c_str());
        fflush(stdout);
    }
    end_job(r);
    return 128 + stop;
}

// Samples --sample tokens after the prompt, one full forward over a window of T tokens per token (no KV cache: the
// reference favours simplicity). Causal attention makes the padding after the last real token irrelevant.
static void sample_text(Run& r, const ModelCalls& calls) {
    const TrainArgs& args = r.args;
    const Tokenizer& tok = r.tokenizer;
    const int T = args.seq, V = r.config.vocab_size;
    std::vector<uint32_t> prompt = tok.encode(args.prompt);
    if (prompt.empty()) prompt.push_back('\n');
    std::vector<int32_t> context(prompt.begin(), prompt.end());
    std::vector<float> logits(V);
    Comm& comm = *r.comm;
    // the last stage's ranks sample the same tokens (EP needs them all); its first tells the others; rank 0 prints
    const bool speak = comm.rank == 0, samples = comm.pp_rank == comm.pp_size - 1;
    const int sampler = (comm.pp_size - 1) * comm.stage_size();
    if (speak) printf("sample (temperature %.2f, top-k %d):\n%s", args.temperature, args.top_k, args.prompt.c_str());
    for (int i = 0; i < args.sample; i++) {
        const int64_t start = std::max<int64_t>(0, (int64_t)context.size() - T);
        std::vector<int32_t> window(context.begin() + start, context.end());
        const int last = (int)window.size() - 1;
        window.resize(T, 0);
        calls.forward(window.data(), nullptr, 1, false);
        int32_t next = -1;  // -1: the logits are not finite
        if (samples) {
            calls.logits_row(last, logits.data());
            if (std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }))
                next = sample_token(logits.data(), V, args.temperature, args.top_k, r.rng);
        }
        if (comm.pp_size > 1) comm.broadcast(&next, sizeof(next), sampler);
        if (next < 0) halt_all(comm, "sampling: the logits are not finite (the model's weights are damaged)");
        context.push_back(next);
        if (speak && (uint32_t)next < (uint32_t)tok.vocab_size()) {
            printf("%s", tok.token_bytes(next).c_str());
            fflush(stdout);
        }
    }
    if (speak) printf("\n");
}

int finish_run(Run& r, const ModelCalls& calls) {
    const TrainArgs& args = r.args;
    const bool lead = r.comm->rank == 0;
    try {
        finish_checkpoint_write(r);  // while a signal still only stops: the last checkpoint is complete
        if (!args.checkpoint_dir.empty()) catch_stop_signals(false);
        if (r.log) fclose(r.log);  // complete for the plot
        r.log = nullptr;
        if (lead && !args.export_hf.empty()) {
            calls.store();
            export_hf(r.model, args.export_hf, args.export_dtype == "f32" ? ExportDType::F32 : ExportDType::BF16);
            printf("exported %s\n", args.export_hf.c_str());
        }
        if (lead && !args.plot.empty()) {
            PlotOptions po;
            po.log_scale = args.plot_log_scale;
            plot_training_log(args.log, args.plot, po);
            printf("plotted %s\n", args.plot.c_str());
        }
        if (args.sample > 0) sample_text(r, calls);
    } catch (const std::exception& e) {
        fail(e.what());
    }
    end_job(r);
    return 0;
}
