// make bench-emulated: what one training step asks of the GPU, counted on the kernel emulator. It runs the GPU
// trainer's step (train.cu's loop body: zero the gradients, forward and backward of each micro-batch, their losses read,
// reduce, grad norm, the losses and expert loads summed over the ranks, AdamW, router bias) on the emulator, with the real NCCL Comm over the
// emulator's NCCL, and prints, per step: kernel launches by kernel, cuBLASLt products and heuristic lookups, the
// host's waits for the device, copies and memsets, NCCL calls and their bytes, the bytes the hand-written kernels
// read and write (each byte once per launch: the compulsory traffic, test/kernel_emulator/counts.h), and the same
// per region of make bench's table. Counts, not times: they are the same on any machine, and on a GPU the step does
// the same work.
//   usage: ./count_step_emulated [--config NAME|PATH] [--batch B] [--seq T] [--steps S] [--dtype bf16|fp32|fp8]
//                                [--moments fp32|bf16] [--recompute] [--ep E] [--grad-accum N]
//          STAND_IN_GPUS=N mpirun -np N ./count_step_emulated --ep E ...   (rank 0's counts)
// Weights from model_init_weights, tokens uniformly random, each rank its own (the router spreads the rows about
// evenly). One step runs first uncounted, so the counts show the steady state, not the first step's setup.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "gpu/model.h"
#include "model/rng.h"
#include "test/kernel_emulator/counts.h"

namespace {

using emulator::Record;
using emulator::Work;

struct Options {
    std::string config = "small";
    int B = 2, T = 64, steps = 2, ep = 1, grad_accum = 1;
    Precision precision = Precision::BF16;
    ActivationLayout layout;
    Moments moments = Moments::FP32;
};

[[noreturn]] void usage(const std::string& problem) {
    fprintf(stderr,
            "count_step: %s\nusage: ./count_step_emulated [--config NAME|PATH] [--batch B] [--seq T] [--steps S] "
            "[--dtype bf16|fp32|fp8] [--moments fp32|bf16] [--recompute] [--ep E] [--grad-accum N]\n"
            "  defaults: small, B 2, T 64, S 2, bf16, fp32 moments, EP 1, 1 micro-batch\n",
            problem.c_str());
    exit(2);
}

int positive(const std::string& flag, const char* text) {
    char* end = nullptr;
    const long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 1 || v > (1L << 20)) usage(flag + " needs a positive integer");
    return (int)v;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        if (flag == "--recompute") {
            o.layout.recompute = true;
            continue;
        }
        if (i + 1 >= argc) usage("missing value for " + flag);
        const char* value = argv[++i];
        const std::string v = value;
        if (flag == "--config") o.config = v;
        else if (flag == "--batch") o.B = positive(flag, value);
        else if (flag == "--seq") o.T = positive(flag, value);
        else if (flag == "--steps") o.steps = positive(flag, value);
        else if (flag == "--ep") o.ep = positive(flag, value);
        else if (flag == "--grad-accum") o.grad_accum = positive(flag, value);
        else if (flag == "--dtype" && (v == "bf16" || v == "fp32" || v == "fp8"))
            o.precision = v == "fp8" ? Precision::FP8 : v == "bf16" ? Precision::BF16 : Precision::FP32;
        else if (flag == "--moments" && (v == "fp32" || v == "bf16"))
            o.moments = v == "bf16" ? Moments::BF16 : Moments::FP32;
        else if (flag == "--dtype") usage("--dtype is bf16, fp32 or fp8");
        else if (flag == "--moments") usage("--moments is fp32 or bf16");
        else usage("unknown flag " + flag);
    }
    if (o.T < 2) usage("--seq must be at least 2");
    return o;
}

// "rmsnorm_kernel<true>" for "void rmsnorm_kernel<true>(float const*, ...)": the kernel and its template arguments.
std::string short_name(const std::string& name) {
    std::string s = name.compare(0, 5, "void ") == 0 ? name.substr(5) : name;
    int depth = 0;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '<') depth++;
        if (s[i] == '>') depth--;
        if (s[i] == '(' && depth == 0) return s.substr(0, i);
    }
    return s;
}

struct Tally {
    double count = 0, bytes_read = 0, bytes_written = 0, flops = 0;
    void add(const Record& r) {
        count += 1;
        bytes_read += (double)r.bytes_read;
        bytes_written += (double)r.bytes_written;
        flops += r.flops;
    }
};

// One region's work by kind (the columns of the region table)
struct RegionTally {
    Tally kernels, gemms, waits, other;
};

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const char* check = getenv("EMULATOR_CHECK");
    if (check && std::string(check) == "0")
        usage("the kernels' bytes come from the hazard checker: unset EMULATOR_CHECK");
    try {
        const Config c = load_config(o.config);
        const int64_t N = (int64_t)o.B * o.T;
        const std::unique_ptr<Comm> comm = make_nccl_comm(o.ep, 1, "count_step");
        Model host;
        model_init(host, c, comm.get());
        model_release_grads(host);
        model_init_weights(host, 1234);
        AdamWState opt = adamw_state(host.shard);
        GpuModel m;
        gpu_model_init(m, c, *comm, o.precision, o.B, o.T, o.layout, o.moments);
        gpu_model_upload(m, host, opt);

        std::vector<int32_t> inputs(N), targets(N);
        Rng rng(1234 + (uint64_t)comm->rank);
        for (int64_t i = 0; i < N; i++) {
            inputs[i] = (int32_t)(rng.next_u64() % (uint64_t)c.vocab_size);
            targets[i] = (int32_t)(rng.next_u64() % (uint64_t)c.vocab_size);
        }
        OptimizerConfig oc;
        oc.moments = o.moments;
        auto step = [&] {  // train.cu's step, with make bench's region names around the model's
            m.timer.mark("zero grads, tokens in");
            gpu_model_zero_grads(m);
            for (int micro = 0; micro < o.grad_accum; micro++) {
                gpu_model_forward(m, inputs.data(), targets.data(), o.B, /*training*/ true);
                gpu_model_backward(m, 1.0f / o.grad_accum);
            }
            m.timer.mark("grad norm");
            LossParts loss;
            for (const LossParts& l : gpu_model_losses(m))
                loss.total += l.total, loss.main += l.main, loss.mtp += l.mtp, loss.balance += l.balance;
            gpu_model_reduce_grads(m);
            const double norm = gpu_model_grad_norm(m);
            double losses[4] = {loss.total, loss.main, loss.mtp, loss.balance};  // as trainer/run.cpp's reduce_step
            comm->all_reduce_sum(losses, 4, Group::World);
            for (std::vector<int64_t>& counts : m.expert_counts)
                comm->all_reduce_sum(counts.data(), (int64_t)counts.size(), Group::World);
            gpu_model_adamw(m, opt, oc, oc.lr, clip_factor(oc, norm));
            m.timer.mark("router bias");
            gpu_model_update_router_bias(m, m.expert_counts);
            CUDA_CHECK(cudaStreamSynchronize(m.stream));
        };
        step();  // uncounted: the first step's allocations and lookups

        std::map<std::string, Tally> kernels, calls;
        std::map<std::string, RegionTally> regions;
        std::vector<std::string> region_order;  // as the step first reaches them
        std::map<Work, Tally> kinds;
        m.timer.enabled = true;
        for (int s = 0; s < o.steps; s++) {
            emulator::records().clear();
            emulator::counting() = true;
            step();
            emulator::counting() = false;
            // each record in the region whose mark the host made last before queueing it
            std::vector<std::pair<int64_t, std::string>> marks;
            for (const auto& mk : m.timer.marks) marks.emplace_back(mk.second->sequence, mk.first);
            m.timer.release();
            size_t at = 0;
            for (const Record& r : emulator::records()) {
                while (at + 1 < marks.size() && marks[at + 1].first < r.sequence) at++;
                if (!regions.count(marks[at].second)) region_order.push_back(marks[at].second);
                RegionTally& region = regions[marks[at].second];
                kinds[r.kind].add(r);
                if (r.kind == Work::kernel)
                    kernels[short_name(r.name)].add(r);
                else
                    calls[r.name].add(r);
                Tally& column = r.kind == Work::kernel      ? region.kernels
                                : r.kind == Work::gemm      ? region.gemms
                                : r.kind == Work::host_wait ? region.waits
                                                            : region.other;
                column.add(r);
            }
        }
        m.timer.enabled = false;

        if (comm->rank != 0) {
            gpu_model_free(m);
            return 0;
        }
        const double S = o.steps, MB = 1e6;
        printf("count_step: the GPU step on the kernel emulator, config %s, %d x %d tokens x %d micro-batches, %s%s%s, "
               "rank 0 of %d (EP %d x DP %d); per step, the mean of %d after one uncounted\n\n",
               o.config.c_str(), o.B, o.T, o.grad_accum, o.precision == Precision::FP8 ? "fp8" : o.precision == Precision::BF16
                                                                                        ? "bf16" : "fp32",
               o.moments == Moments::BF16 ? ", BF16 moments" : "", o.layout.recompute ? ", --recompute" : "",
               comm->world, comm->ep_size, comm->dp_size, o.steps);
        const struct {
            Work kind;
            const char* what;
        } rows[] = {{Work::kernel, "kernel launches"},        {Work::gemm, "cuBLASLt products"},
                    {Work::heuristic, "heuristic lookups"},   {Work::algo_check, "algorithm checks"},
                    {Work::host_wait, "host waits for the device"},
                    {Work::copy_to_host, "copies to the host"}, {Work::copy_to_device, "copies to the device"},
                    {Work::device_copy, "device-to-device copies"}, {Work::memset, "memsets"},
                    {Work::comm, "NCCL calls"}};
        printf("%-28s %10s %12s %12s %10s\n", "", "per step", "MB read", "MB written", "GFLOP");
        for (const auto& row : rows) {
            const Tally& t = kinds[row.kind];
            printf("%-28s %10.1f %12.3f %12.3f %10.4f\n", row.what, t.count / S, t.bytes_read / S / MB,
                   t.bytes_written / S / MB, t.flops / S / 1e9);
        }

        printf("\n%-26s %9s %9s %11s %9s %11s %9s %7s\n", "region", "launches", "kernel MB", "products",
               "GEMM MB", "GEMM GFLOP", "waits", "other");
        for (const std::string& name : region_order) {
            const RegionTally& t = regions[name];
            printf("%-26s %9.1f %9.3f %11.1f %9.3f %11.4f %9.1f %7.1f\n", name.c_str(), t.kernels.count / S,
                   (t.kernels.bytes_read + t.kernels.bytes_written) / S / MB, t.gemms.count / S,
                   (t.gemms.bytes_read + t.gemms.bytes_written) / S / MB, t.gemms.flops / S / 1e9, t.waits.count / S,
                   t.other.count / S);
        }
        printf("(kernel MB and GEMM MB: read + written; other: copies, memsets, lookups, NCCL calls)\n");

        printf("\n%-60s %9s %12s %12s\n", "kernel", "launches", "MB read", "MB written");
        for (const auto& k : kernels)
            printf("%-60s %9.1f %12.6f %12.6f\n", k.first.c_str(), k.second.count / S, k.second.bytes_read / S / MB,
                   k.second.bytes_written / S / MB);
        printf("\n%-60s %9s %10s %10s\n", "call", "per step", "MB read", "MB written");
        for (const auto& k : calls)
            printf("%-60s %9.1f %10.3f %10.3f\n", k.first.c_str(), k.second.count / S, k.second.bytes_read / S / MB,
                   k.second.bytes_written / S / MB);
        gpu_model_free(m);
    } catch (const std::exception& e) {
        fprintf(stderr, "count_step: %s\n", e.what());
        return 1;
    }
    return 0;
}
