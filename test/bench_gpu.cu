// make bench: the GPU trainer's speed on one GPU, with the device's own ceilings measured in the same run as the
// denominators. A benchmark, not a test: it asserts nothing about the timings.
//   usage: ./bench_gpu [--config NAME|PATH] [--layers N] [--batch B] [--seq T] [--steps S] [--dtype bf16|fp32|fp8]
//                      [--recompute]
//          ./bench_gpu --smoke
//
// The bench preset: DeepSeek-V2-Lite's per-layer shapes (load_config("deepseek-v2-lite"): d 2048, 16 MLA heads,
// 64 routed experts of width 1408 with 6 per token, 2 shared experts, vocabulary 102400) with num_hidden_layers
// cut to the largest L <= 27 whose gpu_memory_plan fits in 90% of the free GPU memory (the FP32 master weights,
// gradients and AdamW moments of all 27 layers alone are 250 GB). B = 2 sequences of T = 4096 tokens: V2-Lite
// was trained at 4K context, and 8K tokens per micro-batch is a realistic per-GPU batch for it (the routed experts
// then get 8192 x 6 / 64 = 768 rows each, GEMMs large enough to run near the tensor cores' rate). --config,
// --layers, --batch, --seq, --dtype override the preset for experiments (--layers skips the fit); --recompute runs
// the step as train --recompute does (one activation set per kind of block and one chunk of logits kept, so more
// layers fit; the recomputed forwards are a region of their own in the step's table, and not model FLOPs: MFU
// counts the work the model needs).
// --smoke runs every part once on small shapes (config small, 1 layer, 1 x 64 tokens, 1 MiB copy, 128^3 square
// GEMM, 64K-value optimizer tensor, one timed call per figure): a check that the benchmark runs end to end, which
// `make test` makes on the kernel emulator (./bench_gpu_emulated); its figures mean nothing.
//
// What it prints, in order:
//   1. ceilings: device-to-device cudaMemcpyAsync of 1 GiB (GB/s counting bytes read + written, best of 10), and
//      the cuBLASLt BF16 GEMM rate through gpu::matmul_forward with a BF16 weight copy (TFLOP/s = 2 M N K / time,
//      best of 3 runs after warm-up) on a square 8192^3 product, the dense FFN's up projection (M = B*T, K 2048,
//      N 10944) and one routed expert's gate projection (M = B*T*6/64, K 2048, N 1408). matmul_forward casts the
//      FP32 activation operand to BF16 first, as every GEMM of the model does: "fwd" (the cast included) is what
//      the model gets, "GEMM" subtracts that cast's time (measured alone) and is the tensor-core ceiling. Then the
//      gate projections of all 64 experts (768 rows each) in one gpu::grouped_matmul_forward, with its groups on
//      one stream and spread over gpu::MATMUL_STREAMS: what running the small expert GEMMs concurrently gains; and
//      in BF16 the same in one launch of kernels/grouped_gemm.cuh on offsets in device memory, the cast included (the
//      model's BF16 experts). With --dtype fp8, the same table again with FP8 inputs (gpu::matmul_forward with the
//      weight's E4M3 copies, the input quantized in 1 x 128 tiles: "quant ms"), the rate those GEMMs work with.
//   2. the training step: 2 warm-up steps, then S timed ones of zero_grads, forward, backward, grad norm, AdamW,
//      router bias (the trainer's step without data loading, one GPU, no NCCL): tokens/s, ms/step (wall clock),
//      model TFLOP/s = tokens/s x model_flops_per_token(c, T) (Megatron-style: 6 x active params + causal
//      attention) and MFU against the datasheet's dense BF16 peak (gpu_peak_flops) and against the measured GEMM
//      ceiling.
//   3. one more step with the model's RegionTimer on: milliseconds per named region (CUDA events on the model's
//      stream, so a region includes the host's gaps inside it, e.g. the expert-count sync in "permute"), sorted,
//      and the attention kernels' share ("attention forward" + "attention backward"). The timer's events cost a
//      little, so this step's total is a bit above the timed steps'.
//   4. the memory-bound kernels alone on the preset's shapes (N = B*T rows): bytes each must move (every input
//      read once, every output written once: the compulsory traffic, counted beside each call) / time = GB/s, and
//      that as % of the measured copy rate. "<70%" marks those under the target; a kernel whose implementation
//      makes several passes over its data (rmsnorm_backward, cross-entropy) shows that here as a lower %.
//   5. the attention kernels alone on the preset's shapes, in both precisions (BF16: the tensor-core kernels of
//      kernels/attention_bf16.cuh on BF16 q, k, v, dO, as the model stores them, in blocks of 4 warps, the model's,
//      and of 8, which stream half the bytes per product; FP32: kernels/attention.cuh's): ms
//      and TFLOP/s counted as the model counts them (forward B H T^2 (dqk + dv): the causal half of the
//      2 T^2 (dqk + dv) of QK^T and PV; backward twice that).
// Weights from model_init_weights (N(0, initializer_range) matrices, norms 1), tokens uniformly random:
// the router then spreads the rows evenly, the balanced case.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "comm/comm.h"
#include "gpu/model.h"
#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/fp8.cuh"
#include "kernels/grouped_gemm.cuh"
#include "kernels/grouped_matmul.cuh"
#include "kernels/matmul.cuh"
#include "kernels/permute.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/swiglu.cuh"
#include "model/config.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "model/params.h"
#include "trainer/plan.h"
#include "model/rng.h"
#include "model/rope.h"
#include "test/random_model.h"

namespace {

constexpr double GiB = 1073741824.0;
constexpr double GPU_MEMORY_SHARE = 0.90;    // of the free memory the model may plan for
constexpr double HOST_MEMORY_SHARE = 0.80;   // of the host's RAM the host copy may take (12 bytes per parameter)
constexpr double MEMORY_BOUND_TARGET = 0.70; // of the copy rate
constexpr int WARMUP_STEPS = 2;
constexpr uint64_t SEED = 1337;

struct Options {
    std::string config = "deepseek-v2-lite";
    int layers = 0;  // 0: the largest that fits
    int B = 2, T = 4096, steps = 5;
    Precision precision = Precision::BF16;
    // the sizes of the ceilings' and the optimizer kernels' buffers, and how each figure is timed (time_ms)
    int64_t copy_bytes = (int64_t)1 << 30, square = 8192, optimizer_values = (int64_t)1 << 28;
    int iters = 0, trials = 3, copy_trials = 10;
    bool smoke = false;
    ActivationLayout layout;  // --recompute
};

// Every part once, on small shapes: see the header comment.
Options smoke_options() {
    Options o;
    o.smoke = true;
    o.config = "small";
    o.layers = 1;
    o.B = 1;
    o.T = 64;
    o.steps = 1;
    o.copy_bytes = (int64_t)1 << 20;
    o.square = 128;
    o.optimizer_values = (int64_t)1 << 16;
    o.iters = o.trials = o.copy_trials = 1;
    return o;
}

[[noreturn]] void usage(const char* problem) {
    if (problem) fprintf(stderr, "bench_gpu: %s\n", problem);
    fprintf(problem ? stderr : stdout,
            "usage: ./bench_gpu [--config NAME|PATH] [--layers N] [--batch B] [--seq T] [--steps S] "
            "[--dtype bf16|fp32|fp8] [--recompute]\n"
            "       ./bench_gpu --smoke   (every part once on small shapes: checks that it runs; no figures)\n"
            "  defaults: deepseek-v2-lite, the most layers that fit, B 2, T 4096, S 5, bf16\n");
    exit(problem ? 2 : 0);
}

int positive_int(const std::string& flag, const char* text) {
    char* end = nullptr;
    const long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 1 || v > (1L << 24)) usage((flag + " needs a positive integer").c_str());
    return (int)v;
}

Options parse_options(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "--smoke") return smoke_options();
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        if (flag == "--help" || flag == "-h") usage(nullptr);
        if (flag == "--smoke") usage("--smoke takes no other flags");
        if (flag == "--recompute") {
            o.layout.recompute = true;
            continue;
        }
        if (i + 1 >= argc) usage(("missing value for " + flag).c_str());
        const char* value = argv[++i];
        if (flag == "--config") o.config = value;
        else if (flag == "--layers") o.layers = positive_int(flag, value);
        else if (flag == "--batch") o.B = positive_int(flag, value);
        else if (flag == "--seq") o.T = positive_int(flag, value);
        else if (flag == "--steps") o.steps = positive_int(flag, value);
        else if (flag == "--dtype") {
            const std::string d = value;
            if (d == "bf16") o.precision = Precision::BF16;
            else if (d == "fp32") o.precision = Precision::FP32;
            else if (d == "fp8") o.precision = Precision::FP8;
            else usage("--dtype is bf16, fp32 or fp8");
        } else usage(("unknown flag " + flag).c_str());
    }
    if (o.T < 2) usage("--seq must be at least 2");
    return o;
}

const char* precision_name(Precision p) {
    return p == Precision::FP8 ? "fp8" : p == Precision::BF16 ? "bf16" : "fp32";
}

// ---- device helpers -------------------------------------------------------------------------------------------

// One cudaMalloc'ed array, freed at scope end.
template <typename T>
struct DeviceArray {
    T* ptr = nullptr;
    int64_t n = 0;
    explicit DeviceArray(int64_t count) : n(count) {
        CUDA_CHECK(cudaMalloc(&ptr, (size_t)std::max<int64_t>(count, 1) * sizeof(T)));
    }
    ~DeviceArray() { CUDA_CHECK(cudaFree(ptr)); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    size_t bytes() const { return (size_t)n * sizeof(T); }
    void upload(const std::vector<T>& host) {
        CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
};

// x[i] uniform in [lo, hi), from a SplitMix64 hash of (seed, i)
__global__ void fill_uniform_kernel(float* x, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed * 0xD1B54A32D192ED03ull + (uint64_t)i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x[i] = lo + (hi - lo) * (float)(z >> 40) * (1.0f / 16777216.0f);
    }
}

void fill_uniform(DeviceArray<float>& x, uint64_t seed, float lo, float hi, cudaStream_t stream) {
    gpu::launch_kernel(fill_uniform_kernel, gpu::grid_stride_blocks(x.n, 256), 256, 0, stream, x.ptr, x.n, seed, lo, hi);
}

struct EventPair {
    cudaEvent_t start = nullptr, stop = nullptr;
    EventPair() {
        CUDA_CHECK(cudaEventCreate(&start));
        CUDA_CHECK(cudaEventCreate(&stop));
    }
    ~EventPair() {
        CUDA_CHECK(cudaEventDestroy(start));
        CUDA_CHECK(cudaEventDestroy(stop));
    }
    EventPair(const EventPair&) = delete;
    EventPair& operator=(const EventPair&) = delete;
};

// Milliseconds of one call of f (which queues work on stream): 2 warm-up calls, then `trials` runs of `iters`
// back-to-back calls timed with CUDA events; the best run's mean. iters 0: as many as take ~20 ms (3 to 1000).
template <typename F>
double time_ms(cudaStream_t stream, F&& f, int iters, int trials) {
    EventPair ev;
    f();
    f();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (iters <= 0) {
        CUDA_CHECK(cudaEventRecord(ev.start, stream));
        f();
        CUDA_CHECK(cudaEventRecord(ev.stop, stream));
        CUDA_CHECK(cudaEventSynchronize(ev.stop));
        float once = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&once, ev.start, ev.stop));
        iters = (int)std::min(1000.0, std::max(3.0, 20.0 / std::max(once, 1e-3f)));
    }
    double best = 1e30;
    for (int t = 0; t < trials; t++) {
        CUDA_CHECK(cudaEventRecord(ev.start, stream));
        for (int i = 0; i < iters; i++) f();
        CUDA_CHECK(cudaEventRecord(ev.stop, stream));
        CUDA_CHECK(cudaEventSynchronize(ev.stop));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
        best = std::min(best, (double)ms / iters);
    }
    return best;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- the preset -----------------------------------------------------------------------------------------------

double host_ram_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (double)pages * page : 0.0;
}

// The host copy at its peak: the parameters and the two AdamW moments (the host gradients are freed first).
double host_bytes_needed(const Config& c) { return 12.0 * (double)build_param_table(c, 1).total; }

// The largest layer count <= MAX_LAYERS that fits both memories, or 0; why: what limited it.
int fit_layers(Config c, const Options& o, double free_gpu, std::string& why) {
    const double ram = host_ram_bytes();
    why = "all fit";
    for (int L = c.num_hidden_layers; L >= 1; L--) {
        c.num_hidden_layers = L;
        const double gpu_need = (double)gpu_memory_plan(c, 1, 1, o.precision, o.B, o.T, o.layout).total();
        if (gpu_need > GPU_MEMORY_SHARE * free_gpu) {
            why = "the most that fit in GPU memory";
            continue;
        }
        if (ram > 0 && host_bytes_needed(c) > HOST_MEMORY_SHARE * ram) {
            why = "the most that fit in host memory";
            continue;
        }
        return L;
    }
    return 0;
}

template <typename T>
void release(std::vector<T>& v) {
    std::vector<T>().swap(v);
}

// ---- 1. ceilings ----------------------------------------------------------------------------------------------

struct Ceilings {
    double copy_gbs = 0.0;
    double gemm_tflops = 0.0;  // the best GEMM-only rate of the shapes measured
};

double measure_copy(const Options& o, cudaStream_t stream) {
    const int64_t n = o.copy_bytes;
    DeviceArray<char> src(n), dst(n);
    CUDA_CHECK(cudaMemsetAsync(src.ptr, 1, n, stream));
    const double ms = time_ms(
        stream, [&] { CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, n, cudaMemcpyDeviceToDevice, stream)); }, 1,
        o.copy_trials);
    return 2.0 * n / (ms * 1e-3) / 1e9;
}

struct GemmShape {
    std::string what;
    int64_t M, K, N;
};

// One row of the GEMM table: fwd = the call as the model makes it (the cast of the FP32 input, then the GEMMs),
// GEMM = fwd minus the cast alone. Returns the GEMM rate in TFLOP/s.
double gemm_row(const char* what, int64_t M, int64_t K, int64_t N, double ms, double cast_ms) {
    const double flops = 2.0 * M * N * K, gemm_ms = std::max(ms - cast_ms, 1e-6);
    printf("%-22s %6ld %6ld %6ld %9.3f %9.1f %9.3f %10.1f\n", what, (long)M, (long)K, (long)N, ms,
           flops / (ms * 1e-3) / 1e12, cast_ms, flops / (gemm_ms * 1e-3) / 1e12);
    return flops / (gemm_ms * 1e-3) / 1e12;
}

double measure_gemms(const Config& c, const Options& o, cudaStream_t stream) {
    const int64_t tokens = (int64_t)o.B * o.T, E = c.n_routed_experts;
    const int64_t expert_rows = std::max<int64_t>(1, tokens * c.num_experts_per_tok / E);
    const std::vector<GemmShape> shapes = {
        {"square", o.square, o.square, o.square},
        {"dense FFN up", tokens, c.hidden_size, c.intermediate_size},
        {"one expert's gate", expert_rows, c.hidden_size, c.moe_intermediate_size},
    };
    // the gate GEMMs of all routed experts of one MoE layer, each with the balanced share of rows
    const GemmShape experts{"experts' gate", E * expert_rows, c.hidden_size, c.moe_intermediate_size};
    std::vector<int64_t> offsets(E + 1);
    for (int64_t e = 0; e <= E; e++) offsets[e] = e * expert_rows;
    int64_t max_inp = experts.M * experts.K, max_w = E * experts.N * experts.K, max_out = experts.M * experts.N;
    for (const GemmShape& s : shapes) {
        max_inp = std::max(max_inp, s.M * s.K);
        max_w = std::max(max_w, s.N * s.K);
        max_out = std::max(max_out, s.M * s.N);
    }
    DeviceArray<float> inp(max_inp), W(max_w), out(max_out);
    DeviceArray<__nv_bfloat16> W16(max_w), inp16(max_inp);
    // the FP8 copies of W: as the model's, W (N, K) and W^T with their 128 x 128 scales, for the largest stack
    DeviceArray<__nv_fp8_storage_t> W8(max_w), W8t(max_w), inp8(max_inp);
    int64_t w_scales = E * std::max(gpu::fp8_blk128_scales(experts.N, experts.K),
                                    gpu::fp8_blk128_scales(experts.K, experts.N));
    for (const GemmShape& s : shapes)
        w_scales = std::max({w_scales, gpu::fp8_blk128_scales(s.N, s.K), gpu::fp8_blk128_scales(s.K, s.N)});
    DeviceArray<float> W8_scales(w_scales), W8t_scales(w_scales), inp8_scales(max_inp / 16 + 1024);
    fill_uniform(inp, 1, -1.0f, 1.0f, stream);
    fill_uniform(W, 2, -1.0f, 1.0f, stream);
    gpu::cast_to_bf16(W16.ptr, W.ptr, max_w, stream);
    gpu::Matmul mm;
    gpu::matmul_create(mm, stream, gpu::MatmulCasts{max_inp, max_out, max_inp}, true);
    double best = 0.0;
    // FP8 only when the run is about it (or a smoke run, which must run every line): a failing FP8 call exits, and
    // must not take the BF16 figures with it
    const bool with_fp8 = o.precision == Precision::FP8 || o.smoke;
    for (const bool fp8 : {false, true}) {
        if (fp8 && !with_fp8) break;
        // the input's cast (BF16) or quantization (FP8) alone, which fwd includes
        auto convert_ms = [&](int64_t M, int64_t K) {
            return time_ms(
                stream,
                [&] {
                    if (fp8)
                        gpu::fp8_quantize_rows(inp8.ptr, inp8_scales.ptr, inp.ptr, M, K, stream);
                    else
                        gpu::cast_to_bf16(inp16.ptr, inp.ptr, M * K, stream);
                },
                o.iters, o.trials);
        };
        // W as a stack of G matrices (N, K), with the copies this precision reads
        auto weight = [&](int64_t G, int64_t N, int64_t K) {
            if (!fp8) return gpu::GemmWeight(W.ptr, W16.ptr);
            gpu::fp8_quantize_blocks(W8.ptr, W8t.ptr, W8_scales.ptr, W8t_scales.ptr, W.ptr, G, N, K, stream);
            return gpu::GemmWeight(W.ptr, W16.ptr, {W8.ptr, W8t.ptr, W8_scales.ptr, W8t_scales.ptr});
        };
        printf("\n%-22s %6s %6s %6s %9s %9s %9s %10s\n", fp8 ? "GEMM, FP8 inputs" : "GEMM, BF16 inputs", "M", "K",
               "N", "fwd ms", "fwd TF/s", fp8 ? "quant ms" : "cast ms", "GEMM TF/s");
        for (const GemmShape& s : shapes) {
            const gpu::GemmWeight w = weight(1, s.N, s.K);
            const double ms = time_ms(
                stream, [&] { gpu::matmul_forward(mm, out.ptr, inp.ptr, w, s.M, s.K, s.N, false); }, o.iters,
                o.trials);
            const double rate = gemm_row(s.what.c_str(), s.M, s.K, s.N, ms, convert_ms(s.M, s.K));
            if (!fp8) best = std::max(best, rate);
        }
        const gpu::GemmWeight w = weight(E, experts.N, experts.K);
        const double experts_convert_ms = convert_ms(experts.M, experts.K);
        for (int streams : {1, gpu::MATMUL_STREAMS}) {
            mm.group_streams = streams;
            const double ms = time_ms(
                stream,
                [&] {
                    gpu::grouped_matmul_forward(mm, out.ptr, inp.ptr, w, offsets.data(), E, experts.K, experts.N);
                },
                o.iters, o.trials);
            char what[64];
            snprintf(what, sizeof what, "%ld experts, %d stream%s", (long)E, streams, streams > 1 ? "s" : "");
            gemm_row(what, experts.M, experts.K, experts.N, ms, experts_convert_ms);
        }
        if (!fp8 && gpu::grouped_gemm_takes(experts.K, experts.N)) {  // the model's BF16 experts
            DeviceArray<int64_t> device_offsets(E + 1);
            device_offsets.upload(offsets);
            const double ms = time_ms(
                stream,
                [&] {
                    gpu::cast_to_bf16(inp16.ptr, inp.ptr, experts.M * experts.K, stream);
                    gpu::grouped_gemm_forward(out.ptr, inp16.ptr, W16.ptr, device_offsets.ptr, (int)E, experts.M,
                                              experts.K, experts.N, stream);
                },
                o.iters, o.trials);
            char what[64];
            snprintf(what, sizeof what, "%ld experts, grouped", (long)E);
            gemm_row(what, experts.M, experts.K, experts.N, ms, experts_convert_ms);
        }
    }
    printf("fwd = gpu::matmul_forward (the FP32 input cast to BF16, or quantized to E4M3 in 1 x 128 tiles, then the "
           "cuBLASLt GEMM, as in the model); GEMM = fwd minus the cast or quantization.\nexperts: "
           "gpu::grouped_matmul_forward over %ld experts of %ld rows each, the groups on one stream, then spread over "
           "%d; in FP8 one quantization per expert. grouped: the model's BF16 experts, kernels/grouped_gemm.cuh in one "
           "launch\n",
           (long)E, (long)expert_rows, gpu::MATMUL_STREAMS);
    gpu::matmul_destroy(mm);
    return best;
}

// ---- 2, 3. the training step ----------------------------------------------------------------------------------

struct StepResult {
    double ms_mean = 0.0, ms_min = 0.0, ms_max = 0.0, loss_first = 0.0, loss_last = 0.0;
};

void bench_model(const Config& c, const Options& o, const cudaDeviceProp& prop, const Ceilings& ceil) {
    const int B = o.B, T = o.T;
    const int64_t N = (int64_t)B * T;

    // host copy: random weights, zero moments; uploaded, then dropped
    auto t0 = std::chrono::steady_clock::now();
    Model host;
    model_init(host, c);
    release(host.grads);
    model_init_weights(host, SEED);
    AdamWState opt = adamw_state(host.shard);
    GpuModel m;
    gpu_model_init(m, c, local_comm(), o.precision, B, T, o.layout);
    gpu_model_upload(m, host, opt);
    const int64_t params = host.table.total;
    release(host.params);
    release(opt.m);
    release(opt.v);
    const GpuMemoryPlan plan = gpu_memory_plan(c, 1, 1, o.precision, B, T, o.layout);
    printf("\nmodel: %.3f B parameters (%.3f B active per token), GPU plan %.1f GiB (weights %.1f, grads %.1f, "
           "AdamW %.1f, activations %.1f, expert rows %.1f, scratch %.1f), init + upload %.1f s\n",
           params / 1e9, count_active_params(c) / 1e9, plan.total() / GiB, plan.params / GiB, plan.grads / GiB,
           plan.optimizer / GiB, plan.activations / GiB, plan.expert_rows / GiB, plan.scratch / GiB,
           seconds_since(t0));

    std::vector<int32_t> inputs(N), targets(N);
    Rng rng(SEED);
    for (int64_t i = 0; i < N; i++) {
        inputs[i] = (int32_t)(rng.next_u64() % (uint64_t)c.vocab_size);
        targets[i] = (int32_t)(rng.next_u64() % (uint64_t)c.vocab_size);
    }
    OptimizerConfig oc;
    oc.lr = 1e-4f;
    auto step = [&](bool timed_regions) {
        if (timed_regions) m.timer.mark("zero grads, tokens in");
        gpu_model_zero_grads(m);
        gpu_model_forward(m, inputs.data(), targets.data(), B, true);
        gpu_model_backward(m, 1.0f);
        const LossParts loss = gpu_model_losses(m)[0];
        if (timed_regions) m.timer.mark("grad norm");
        const double norm = gpu_model_grad_norm(m);
        gpu_model_adamw(m, opt, oc, oc.lr, clip_factor(oc, norm));
        if (timed_regions) m.timer.mark("router bias");
        gpu_model_update_router_bias(m, m.expert_counts);
        CUDA_CHECK(cudaStreamSynchronize(m.stream));
        return loss.total;
    };

    StepResult r;
    for (int s = 0; s < WARMUP_STEPS; s++) {
        const double loss = step(false);
        if (s == 0) r.loss_first = loss;
    }
    std::vector<double> ms;
    for (int s = 0; s < o.steps; s++) {
        const auto ts = std::chrono::steady_clock::now();
        r.loss_last = step(false);
        ms.push_back(1e3 * seconds_since(ts));
    }
    for (double v : ms) r.ms_mean += v / ms.size();
    r.ms_min = *std::min_element(ms.begin(), ms.end());
    r.ms_max = *std::max_element(ms.begin(), ms.end());

    const double tokens_per_s = N / (r.ms_mean * 1e-3);
    const double flops_per_token = model_flops_per_token(c, T);
    const double tflops = tokens_per_s * flops_per_token / 1e12;
    const double peak = gpu_peak_flops(prop);
    printf("\n%-34s %s\n", "training step", "(one GPU, no data loading)");
    printf("  %-32s %.1f (min %.1f, max %.1f) over %d steps after %d warm-up\n", "ms/step", r.ms_mean, r.ms_min,
           r.ms_max, o.steps, WARMUP_STEPS);
    printf("  %-32s %.0f\n", "tokens/s", tokens_per_s);
    printf("  %-32s %.3g\n", "model FLOPs/token", flops_per_token);
    printf("  %-32s %.1f\n", "model TFLOP/s", tflops);
    if (peak > 0)
        printf("  %-32s %.1f%% of %.1f TFLOP/s (datasheet dense BF16)\n", "MFU", 100.0 * tflops * 1e12 / peak,
               peak / 1e12);
    else
        printf("  %-32s unknown GPU: no peak\n", "MFU");
    if (ceil.gemm_tflops > 0)
        printf("  %-32s %.1f%% of %.1f TFLOP/s (the best BF16 GEMM measured above)\n", "vs GEMM ceiling",
               100.0 * tflops / ceil.gemm_tflops, ceil.gemm_tflops);
    printf("  %-32s %.4f -> %.4f\n", "loss (first warm-up -> last)", r.loss_first, r.loss_last);

    // one step with the region timer
    m.timer.enabled = true;
    const auto ts = std::chrono::steady_clock::now();
    step(true);
    std::map<std::string, double> totals;
    m.timer.finish(totals);
    const double wall_ms = 1e3 * seconds_since(ts);
    m.timer.enabled = false;
    std::vector<std::pair<std::string, double>> regions(totals.begin(), totals.end());
    std::sort(regions.begin(), regions.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    double sum = 0.0;
    for (const auto& rg : regions) sum += rg.second;
    printf("\n%-28s %10s %8s\n", "region (one step)", "ms", "% step");
    for (const auto& rg : regions)
        printf("%-28s %10.2f %7.1f%%\n", rg.first.c_str(), rg.second, sum > 0 ? 100.0 * rg.second / sum : 0.0);
    printf("%-28s %10.2f %7.1f%%   (wall clock of this step: %.2f ms)\n", "total", sum, 100.0, wall_ms);
    const double attention = (totals.count("attention forward") ? totals["attention forward"] : 0.0) +
                             (totals.count("attention backward") ? totals["attention backward"] : 0.0);
    printf("attention share: %.2f ms = %.1f%% of the step (\"attention forward\" + \"attention backward\")\n",
           attention, sum > 0 ? 100.0 * attention / sum : 0.0);

    gpu_model_free(m);
}

// ---- 4. memory-bound kernels ----------------------------------------------------------------------------------

struct KernelResult {
    std::string name, shape;
    double bytes, ms;
};

std::string dims(std::initializer_list<int64_t> sizes) {
    std::string s;
    for (int64_t v : sizes) s += (s.empty() ? "" : " x ") + std::to_string(v);
    return s;
}

std::vector<KernelResult> bench_kernels(const Config& c, const Options& o, cudaStream_t s) {
    const int64_t N = (int64_t)o.B * o.T, T = o.T, d = c.hidden_size, V = c.vocab_size;
    const int64_t k = c.num_experts_per_tok, E = c.n_routed_experts, I = c.moe_intermediate_size, R = N * k;
    const int64_t H = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
    const int64_t dqk = dn + dr, kr = c.kv_lora_rank;
    const double F = 4.0, I64 = 8.0, I32 = 4.0;  // bytes of a float, an int64, an int32
    std::vector<KernelResult> out;
    auto run = [&](const std::string& name, const std::string& shape, double bytes, auto&& f) {
        out.push_back({name, shape, bytes, time_ms(s, f, o.iters, o.trials)});
    };
    Rng rng(SEED + 1);

    {  // RMSNorm over the residual stream (N, d)
        DeviceArray<float> x(N * d), w(d), y(N * d), rstd(N), dy(N * d), dx(N * d), dw(d);
        DeviceArray<float> scratch(gpu::rmsnorm_backward_scratch_floats(N, d));
        DeviceArray<__nv_bfloat16> y16(N * d);
        fill_uniform(x, 3, -1.0f, 1.0f, s);
        fill_uniform(w, 4, 0.5f, 1.5f, s);
        fill_uniform(dy, 5, -1.0f, 1.0f, s);
        CUDA_CHECK(cudaMemsetAsync(dw.ptr, 0, dw.bytes(), s));
        // reads x (N d), w (d); writes y (N d), rstd (N), and in BF16 mode y's BF16 copy (N d, 2 bytes each)
        run("rmsnorm_forward", dims({N, d}), F * (2 * N * d + d + N),
            [&] { gpu::rmsnorm_forward(y.ptr, nullptr, rstd.ptr, x.ptr, w.ptr, N, d, c.rms_norm_eps, s); });
        run("rmsnorm_forward (+bf16)", dims({N, d}), F * (2 * N * d + d + N) + 2.0 * N * d,
            [&] { gpu::rmsnorm_forward(y.ptr, y16.ptr, rstd.ptr, x.ptr, w.ptr, N, d, c.rms_norm_eps, s); });
        // reads dy, x (N d each), w (d), rstd (N); writes dx (N d); dw (d) read and written. The implementation
        // reads dy and x twice (the dx pass, then the dw pass): at most ~60% of this count at full bandwidth.
        run("rmsnorm_backward", dims({N, d}), F * (3 * N * d + N + 3 * d), [&] {
            gpu::rmsnorm_backward(dx.ptr, dw.ptr, dy.ptr, x.ptr, w.ptr, rstd.ptr, N, d, nullptr, scratch.ptr, s);
        });
        // reads a, b (N d each), w (d); writes the sum and the normalised rows (N d each), rstd (N): the blocks'
        // residual adds with the norm that follows (in BF16 mode with the copy too, as the model runs it)
        run("residual_rmsnorm (+bf16)", dims({N, d}), F * (4 * N * d + d + N) + 2.0 * N * d, [&] {
            gpu::residual_rmsnorm_forward(dx.ptr, y.ptr, y16.ptr, rstd.ptr, x.ptr, dy.ptr, w.ptr, N, d, c.rms_norm_eps,
                                          s);
        });
    }
    {  // SwiGLU of the routed experts' rows (N k, I), as the MoE layer runs it
        const int64_t n = R * I;
        DeviceArray<float> g(n), u(n), a(n), da(n);
        fill_uniform(g, 6, -3.0f, 3.0f, s);
        fill_uniform(u, 7, -1.0f, 1.0f, s);
        fill_uniform(da, 8, -1.0f, 1.0f, s);
        // reads g, u; writes a (n each)
        run("swiglu_forward", dims({R, I}), F * 3 * n, [&] { gpu::swiglu_forward(a.ptr, g.ptr, u.ptr, n, s); });
        // reads g, u; writes a in BF16 (the model's --dtype bf16 path)
        DeviceArray<__nv_bfloat16> a16(n);
        run("swiglu_forward_bf16", dims({R, I}), F * 2 * n + 2.0 * n,
            [&] { gpu::swiglu_forward_bf16(a16.ptr, g.ptr, u.ptr, n, s); });
        // reads da, g, u; writes dg, du (n each)
        DeviceArray<float> dg(n), du(n);
        run("swiglu_backward", dims({R, I}), F * 5 * n,
            [&] { gpu::swiglu_backward(dg.ptr, du.ptr, da.ptr, g.ptr, u.ptr, n, s); });
    }
    {  // the routed-expert permutation: N tokens to k of E experts each (distinct, uniformly random)
        const std::vector<int32_t> chosen_host = random_routing(N, k, E, rng);
        DeviceArray<int32_t> chosen(R);
        chosen.upload(chosen_host);
        DeviceArray<int64_t> counts(E), offsets(E + 1), row_of_assignment(R), assignment_of_row(R);
        gpu::build_expert_plan(counts.ptr, offsets.ptr, row_of_assignment.ptr, assignment_of_row.ptr, chosen.ptr, R, (int)E, s);
        DeviceArray<float> x(N * d), rows(R * d), drows(R * d), weights(R), dweights(R), y(N * d);
        fill_uniform(x, 9, -1.0f, 1.0f, s);
        fill_uniform(rows, 10, -1.0f, 1.0f, s);
        fill_uniform(weights, 11, 0.0f, 0.3f, s);
        CUDA_CHECK(cudaMemsetAsync(y.ptr, 0, y.bytes(), s));
        const std::string shape = dims({N, k, d});
        // reads x (N d, each row once at least), assignment_of_row (N k int64); writes rows (N k d)
        run("permute_forward (permute)", shape, F * (N * d + R * d) + I64 * R,
            [&] { gpu::permute_forward(rows.ptr, x.ptr, assignment_of_row.ptr, N, (int)k, d, s); });
        // reads drows (N k d), row_of_assignment (N k int64), dx (N d: accumulates onto the shared experts' dx, as the
        // model does); writes dx (N d)
        run("permute_backward", shape, F * (R * d + 2 * N * d) + I64 * R,
            [&] { gpu::permute_backward(y.ptr, rows.ptr, row_of_assignment.ptr, N, (int)k, d, true, s); });
        // reads rows (N k d), weights (N k), row_of_assignment (N k int64), out (N d: accumulates onto the shared
        // experts' output, as the model does); writes out (N d)
        run("combine_forward (unpermute)", shape, F * (R * d + R + 2 * N * d) + I64 * R, [&] {
            gpu::combine_forward(y.ptr, rows.ptr, weights.ptr, row_of_assignment.ptr, N, (int)k, d, true, s);
        });
        // reads dout (N d), rows (N k d), weights (N k), row_of_assignment (N k int64); writes drows (N k d), dweights
        run("combine_backward", shape, F * (N * d + 2 * R * d + 2 * R) + I64 * R, [&] {
            gpu::combine_backward(drows.ptr, dweights.ptr, x.ptr, rows.ptr, weights.ptr, row_of_assignment.ptr, N, (int)k,
                                  d, s);
        });
    }
    {  // token embedding (V, d)
        std::vector<int32_t> tokens_host(N), packed(3 * N + 1);
        for (int32_t& t : tokens_host) t = (int32_t)(rng.next_u64() % (uint64_t)V);
        const int64_t distinct = gpu::token_rows_pack(tokens_host.data(), N, packed.data());
        DeviceArray<int32_t> rows(3 * N + 1);
        rows.upload(packed);
        DeviceArray<int32_t> tokens(N);
        tokens.upload(tokens_host);
        DeviceArray<float> embed(V * d), x(N * d);
        fill_uniform(embed, 12, -0.02f, 0.02f, s);
        // reads tokens (N int32), N rows of embed (N d); writes out (N d)
        run("embedding_forward", dims({N, d}), F * 2 * N * d + I32 * N,
            [&] { gpu::embedding_forward(x.ptr, tokens.ptr, embed.ptr, N, d, s); });
        // reads dout (N d), the grouped rows (3N int32); reads and writes dembed's distinct rows (2 x distinct x d)
        run("embedding_backward", dims({N, d}), F * (N * d + 2 * distinct * d) + I32 * 3 * N,
            [&] { gpu::embedding_backward(embed.ptr, x.ptr, gpu::TokenRows{rows.ptr, N, distinct}, d, s); });
    }
    {  // fused softmax + cross-entropy over the vocabulary (N, V)
        std::vector<int32_t> targets_host(N);
        for (int64_t i = 0; i < N; i++) targets_host[i] = (int32_t)(rng.next_u64() % (uint64_t)V);
        DeviceArray<int32_t> targets(N);
        targets.upload(targets_host);
        DeviceArray<float> logits(N * V), dlogits(N * V), losses(N);
        fill_uniform(logits, 13, -4.0f, 4.0f, s);
        // reads logits (N V), targets (N int32); writes losses (N): the bytes the result needs. The kernel reads a
        // row once for the loss, twice with dlogits (the online max and sum, then the write), from HBM.
        run("cross_entropy (loss)", dims({N, V}), F * (N * V + N) + I32 * N, [&] {
            gpu::cross_entropy_forward_backward(losses.ptr, nullptr, logits.ptr, targets.ptr, N, V, 0.0f, s);
        });
        // reads logits (N V), targets (N int32); writes dlogits (N V), losses (N)
        run("cross_entropy (+ dlogits)", dims({N, V}), F * (2 * N * V + N) + I32 * N, [&] {
            gpu::cross_entropy_forward_backward(losses.ptr, dlogits.ptr, logits.ptr, targets.ptr, N, V, 1.0f / N, s);
        });
        // the same with dlogits in BF16 (2 bytes each), as the model runs it in BF16 mode
        DeviceArray<__nv_bfloat16> dlogits16(N * V);
        run("cross_entropy (+ dlogits16)", dims({N, V}), F * (N * V + N) + 2.0 * N * V + I32 * N, [&] {
            gpu::cross_entropy_forward_backward_bf16(losses.ptr, dlogits16.ptr, logits.ptr, targets.ptr, N, V,
                                                     1.0f / N, s);
        });
    }
    {  // MLA's RoPE and head assembly, and the c_kv column copy
        DeviceArray<float> q(N * H * dqk), kv(N * H * (dn + dv)), kv_a(N * (kr + dr));
        DeviceArray<float> q_heads(N * H * dqk), k_heads(N * H * dqk), cos_t(T * dr / 2), sin_t(T * dr / 2);
        DeviceArray<float> c_kv(N * kr);
        fill_uniform(q, 14, -1.0f, 1.0f, s);
        fill_uniform(kv, 15, -1.0f, 1.0f, s);
        fill_uniform(kv_a, 16, -1.0f, 1.0f, s);
        gpu::rope_table(cos_t.ptr, sin_t.ptr, c, T, s);
        const std::string shape = dims({N, H, dqk});
        // reads q (N H dqk), the k_nope columns of kv (N H dn), the rope key of kv_a (N dr), the tables (T dr);
        // writes q_heads, k_heads (N H dqk each)
        run("rope_heads_forward", shape, F * (3 * N * H * dqk + N * H * dn + N * dr + T * dr), [&] {
            gpu::rope_heads_forward(q_heads.ptr, k_heads.ptr, q.ptr, kv.ptr, kv_a.ptr, cos_t.ptr, sin_t.ptr, N, T, H,
                                    dn, dr, dv, kr, s);
        });
        // the BF16 variant the model runs with --dtype bf16: reads as above and the v columns of kv (N H dv);
        // writes q_heads, k_heads (N H dqk each) and v_heads (N H dv) in BF16
        DeviceArray<__nv_bfloat16> q16(N * H * dqk), k16(N * H * dqk), v16(N * H * dv);
        run("rope_heads_forward_bf16", shape,
            F * (N * H * dqk + N * H * dn + N * H * dv + N * dr + T * dr) + 2.0 * N * H * (2 * dqk + dv), [&] {
                gpu::rope_heads_forward_bf16(q16.ptr, k16.ptr, v16.ptr, q.ptr, kv.ptr, kv_a.ptr, cos_t.ptr, sin_t.ptr,
                                             N, T, H, dn, dr, dv, kr, s);
            });
        // reads dq_heads, dk_heads (N H dqk each), the tables (T dr); writes dq (N H dqk), the k_nope columns of
        // dkv (N H dn), the rope columns of dkv_a (N dr)
        run("rope_heads_backward", shape, F * (3 * N * H * dqk + N * H * dn + N * dr + T * dr), [&] {
            gpu::rope_heads_backward(q.ptr, kv.ptr, kv_a.ptr, q_heads.ptr, k_heads.ptr, cos_t.ptr, sin_t.ptr, N, T, H,
                                     dn, dr, dv, kr, s);
        });
        // reads the first kr columns of kv_a, writes c_kv (N kr each)
        run("copy_columns (c_kv)", dims({N, kr}), F * 2 * N * kr,
            [&] { gpu::copy_columns(c_kv.ptr, kr, kv_a.ptr, kr + dr, N, kr, s); });
    }
    {  // --dtype fp8's quantizations: an expert-row input (R, d) as the GEMMs quantize it, and one MoE layer's
       // stacked expert weights (E, I, d) as after each AdamW step
        const int64_t rows_scales = gpu::fp8_vec128_scales(R, d), cols_scales = gpu::fp8_vec128_scales(d, R);
        const int64_t w_scales = E * gpu::fp8_blk128_scales(I, d), w_scales_t = E * gpu::fp8_blk128_scales(d, I);
        DeviceArray<float> x(R * d), W(E * I * d), scales(std::max(rows_scales, cols_scales));
        DeviceArray<float> W_scales(w_scales), W_scales_t(w_scales_t);
        DeviceArray<__nv_fp8_storage_t> q(std::max(R, E * I) * d), qt(E * I * d);
        fill_uniform(x, 21, -1.0f, 1.0f, s);
        fill_uniform(W, 22, -0.02f, 0.02f, s);
        DeviceArray<__nv_bfloat16> W16(E * I * d);  // the working copy the model quantizes
        gpu::cast_to_bf16(W16.ptr, W.ptr, E * I * d, s);
        // reads x (R d floats); writes q (R d bytes) and a scale per 128
        run("fp8_quantize_rows", dims({R, d}), F * R * d + R * d + F * rows_scales,
            [&] { gpu::fp8_quantize_rows(q.ptr, scales.ptr, x.ptr, R, d, s); });
        // the same, written transposed in 128 x 1 tiles (R is a multiple of 16 here: no padding)
        run("fp8_quantize_cols", dims({R, d}), F * R * d + R * d + F * cols_scales,
            [&] { gpu::fp8_quantize_cols(q.ptr, scales.ptr, x.ptr, R, d, gpu::round_up(R, 16), s); });
        // reads W (E I d BF16 values); writes q and q^T (E I d bytes each) and their block scales
        run("fp8_quantize_blocks", dims({E, I, d}), 4.0 * E * I * d + F * (w_scales + w_scales_t), [&] {
            gpu::fp8_quantize_blocks(q.ptr, qt.ptr, W_scales.ptr, W_scales_t.ptr, W16.ptr, E, I, d, s);
        });
    }
    {  // the optimizer's passes over one large tensor (256M values, 1 GiB per buffer)
        const int64_t n = o.optimizer_values;
        DeviceArray<float> p(n), g(n), m(n), v(n);
        OptimizerShard one;  // one range of n values, as adamw_update and range_norms_squared take them
        one.ranges.push_back(OptimizerRange{0, n, 0, true, true});
        const std::vector<int64_t> packed = gpu::shard_ranges_pack(one);
        DeviceArray<int64_t> table(packed.size());
        table.upload(packed);
        const gpu::ShardRanges ranges = gpu::shard_ranges_of(packed, table.ptr);
        DeviceArray<double> norm(1), norm_partials(ranges.chunks);
        DeviceArray<__nv_bfloat16> p16(n);
        fill_uniform(p, 17, -0.02f, 0.02f, s);
        fill_uniform(g, 18, -1e-3f, 1e-3f, s);
        fill_uniform(m, 19, -1e-4f, 1e-4f, s);
        fill_uniform(v, 20, 0.0f, 1e-6f, s);
        OptimizerConfig oc;
        int64_t step = 0;
        // reads the master weights, grads, m, v; writes the master weights, m, v (n each) and the BF16 working copy
        // (n x 2 bytes), as with --dtype bf16
        run("adamw_update", dims({n}), F * 7 * n + 2.0 * n, [&] {
            gpu::adamw_update(ranges, nullptr, p16.ptr, p.ptr, 0, g.ptr, m.ptr, v.ptr, oc, 1e-4f, ++step, 1.0f, s);
        });
        // reads grads (n); the partial sums (n / chunk doubles) are negligible
        run("range_norms_squared", dims({n}), F * n,
            [&] { gpu::range_norms_squared(norm.ptr, ranges, g.ptr, norm_partials.ptr, s); });
        // reads n floats, writes their BF16 copy (n x 2 bytes): the copies of the GEMM inputs, and dO
        run("cast_to_bf16", dims({n}), 6.0 * n, [&] { gpu::cast_to_bf16(p16.ptr, p.ptr, n, s); });
    }
    return out;
}

void print_kernels(const std::vector<KernelResult>& results, double copy_gbs) {
    printf("\n%-28s %-18s %9s %10s %9s %7s\n", "memory-bound kernel", "shape", "MB moved", "us", "GB/s", "% copy");
    int under = 0;
    for (const KernelResult& r : results) {
        const double gbs = r.bytes / (r.ms * 1e-3) / 1e9, share = copy_gbs > 0 ? gbs / copy_gbs : 0.0;
        const bool low = share < MEMORY_BOUND_TARGET;
        under += low;
        printf("%-28s %-18s %9.1f %10.1f %9.1f %6.1f%%%s\n", r.name.c_str(), r.shape.c_str(), r.bytes / 1e6,
               r.ms * 1e3, gbs, 100.0 * share, low ? "  <70%" : "");
    }
    printf("%d of %zu kernels under %.0f%% of the copy rate (%.1f GB/s)\n", under, results.size(),
           100.0 * MEMORY_BOUND_TARGET, copy_gbs);
}

// ---- 5. attention alone ---------------------------------------------------------------------------------------

void bench_attention(const Config& c, const Options& o, const cudaDeviceProp& prop, cudaStream_t s) {
    const int B = o.B, T = o.T, H = c.num_attention_heads, dn = c.qk_nope_head_dim, dqk = c.qk_head_dim();
    const int dv = c.v_head_dim;
    const int64_t N = (int64_t)B * T, ld = dn + dv;
    DeviceArray<float> q(N * H * dqk), k(N * H * dqk), kv(N * H * ld), out(N * H * dv), lse((int64_t)B * H * T);
    DeviceArray<float> dout(N * H * dv), dq(N * H * dqk), dk(N * H * dqk), dkv(N * H * ld);
    DeviceArray<float> scratch(gpu::attention_backward_scratch_floats(B, T, H));
    fill_uniform(q, 21, -1.0f, 1.0f, s);
    fill_uniform(k, 22, -1.0f, 1.0f, s);
    fill_uniform(kv, 23, -1.0f, 1.0f, s);
    fill_uniform(dout, 24, -1.0f, 1.0f, s);
    const float scale = attention_softmax_scale(c);
    const double forward_flops = (double)B * H * T * T * (dqk + dv);
    printf("\n%-22s %-24s %10s %10s %10s %10s\n", "attention kernels", "shape", "fwd ms", "fwd TF/s", "bwd ms",
           "bwd TF/s");
    const std::string shape = dims({B, T, H}) + " x " + std::to_string(dqk) + "/" + std::to_string(dv);
    auto row = [&](const char* name, double fwd, double bwd) {
        printf("%-22s %-24s %10.2f %10.1f %10.2f %10.1f\n", name, shape.c_str(), fwd,
               forward_flops / (fwd * 1e-3) / 1e12, bwd, 2 * forward_flops / (bwd * 1e-3) / 1e12);
    };
    if (gpu::attention_on_tensor_cores(Precision::BF16, dqk, dv)) {
        // the model's BF16 inputs: q, k, v (contiguous) and dO, cast once (not timed)
        DeviceArray<__nv_bfloat16> q16(q.n), k16(k.n), v16(N * H * dv), dout16(dout.n);
        gpu::cast_to_bf16(q16.ptr, q.ptr, q.n, s);
        gpu::cast_to_bf16(k16.ptr, k.ptr, k.n, s);
        gpu::cast_to_bf16(v16.ptr, kv.ptr, v16.n, s);  // any N*H*dv values: the timing does not depend on them
        gpu::cast_to_bf16(dout16.ptr, dout.ptr, dout.n, s);
        // blocks of 4 warps (the model's, ATTN_BF16_WARPS) and of 8 (half the streamed bytes per product)
        auto time_warps = [&](auto forward, auto backward, const char* name) {
            const double fwd = time_ms(
                s, [&] { forward(out.ptr, lse.ptr, q16.ptr, k16.ptr, v16.ptr, dv, B, T, H, dqk, dv, scale, s); },
                o.iters, o.trials);
            const double bwd = time_ms(
                s,
                [&] {
                    backward(dq.ptr, dk.ptr, dkv.ptr + dn, ld, scratch.ptr, dout.ptr, dout16.ptr, q16.ptr, k16.ptr,
                             v16.ptr, dv, out.ptr, lse.ptr, B, T, H, dqk, dv, scale, s);
                },
                o.iters, o.trials);
            row(name, fwd, bwd);
        };
        time_warps(gpu::attention_forward_bf16<4>, gpu::attention_backward_bf16<4>, "bf16 tensor, 4 warps");
        if (gpu::attn_bf16_backward_bytes(dqk, dv, 8) <= (int64_t)prop.sharedMemPerBlockOptin)
            time_warps(gpu::attention_forward_bf16<8>, gpu::attention_backward_bf16<8>, "bf16 tensor, 8 warps");
        else
            printf("%-22s %-24s not run: %lld bytes of shared memory per block, the GPU has %zu\n",
                   "bf16 tensor, 8 warps", shape.c_str(), (long long)gpu::attn_bf16_backward_bytes(dqk, dv, 8),
                   (size_t)prop.sharedMemPerBlockOptin);
    }
    const double fwd = time_ms(
        s,
        [&] {
            gpu::attention_forward(out.ptr, lse.ptr, q.ptr, k.ptr, kv.ptr + dn, ld, B, T, H, dqk, dv, scale, s);
        },
        o.iters, o.trials);
    const double bwd = time_ms(
        s,
        [&] {
            gpu::attention_backward(dq.ptr, dk.ptr, dkv.ptr + dn, scratch.ptr, dout.ptr, q.ptr, k.ptr, kv.ptr + dn, ld,
                                    out.ptr, lse.ptr, B, T, H, dqk, dv, scale, s);
        },
        o.iters, o.trials);
    row("fp32 CUDA cores", fwd, bwd);
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse_options(argc, argv);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {  // no device, or no driver: not an error
        (void)cudaGetLastError();                                        // to report, the answer itself
        fprintf(stderr, "bench_gpu: no CUDA GPU found\n");
        return 1;
    }
    try {
        CUDA_CHECK(cudaSetDevice(0));
        CUDA_CHECK(cudaFree(nullptr));  // creates the context, so the free memory below is what is left to us
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        size_t free_bytes = 0, total_bytes = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        int runtime = 0, driver = 0;
        CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
        CUDA_CHECK(cudaDriverGetVersion(&driver));

        Config c = load_config(o.config);
        std::string limit = "set by --layers";
        const int all_layers = c.num_hidden_layers;
        if (o.layers > 0) {
            c.num_hidden_layers = o.layers;
        } else {
            const int L = fit_layers(c, o, (double)free_bytes, limit);
            if (L == 0) {
                c.num_hidden_layers = 1;
                fprintf(stderr,
                        "bench_gpu: even 1 layer with a batch of %d x %d needs %.1f GiB of GPU memory (%.1f GiB "
                        "free) and %.1f GiB of host memory: lower --batch or --seq%s\n",
                        o.B, o.T, gpu_memory_plan(c, 1, 1, o.precision, o.B, o.T, o.layout).total() / GiB,
                        free_bytes / GiB, host_bytes_needed(c) / GiB,
                        o.layout.recompute ? "" : ", or add --recompute");
                return 1;
            }
            c.num_hidden_layers = L;
        }
        validate_config(c);

        char date[64];
        const time_t now = time(0);
        strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S", localtime(&now));
        printf("bench_gpu | %s | %s | %s shapes, %d of %d layers (%s), batch %d x %d = %ld tokens, %s%s%s\n",
               prop.name, date, o.config.c_str(), c.num_hidden_layers, all_layers, limit.c_str(), o.B, o.T,
               (long)o.B * o.T, precision_name(o.precision), o.layout.recompute ? ", --recompute" : "",
               o.smoke ? " (--smoke: the figures mean nothing)" : "");
        printf("device: sm_%d%d, %d SMs, %.1f GiB (%.1f free), CUDA runtime %d.%d, driver %d.%d\n", prop.major,
               prop.minor, prop.multiProcessorCount, total_bytes / GiB, free_bytes / GiB, runtime / 1000,
               (runtime % 1000) / 10, driver / 1000, (driver % 1000) / 10);

        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreate(&stream));
        Ceilings ceil;
        ceil.copy_gbs = measure_copy(o, stream);
        printf("\n%-34s %.1f GB/s (read + write, best of %d)\n", "device copy (cudaMemcpyAsync)", ceil.copy_gbs,
               o.copy_trials);
        ceil.gemm_tflops = measure_gemms(c, o, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));

        bench_model(c, o, prop, ceil);

        print_kernels(bench_kernels(c, o, stream), ceil.copy_gbs);
        bench_attention(c, o, prop, stream);
        CUDA_CHECK(cudaStreamDestroy(stream));
    } catch (const std::exception& e) {
        fprintf(stderr, "bench_gpu: %s\n", e.what());
        return 1;
    }
    return 0;
}
