// gpu_model_emulated_check: the GPU model (gpu/) on the real kernels of kernels/, compiled as C++ against the kernel
// emulator (test/kernel_emulator/: the CUDA runtime on host memory, the threads of each block as fibers, a CPU model
// of cuBLASLt), compared with the CPU reference model.
//   alone:                      the single-process checks, then the distributed check with one rank
//   mpirun -np N ... --ep E:    the distributed check: EP = E, DP = N / E, against one process (as ep_check)
// Single process, four configs: tiny (q_lora, groups, shared experts, MTP, balance loss), plain (none of these,
// B=3, T=70: not a multiple of 64), routed (every block MoE, no shared experts, k=3, no balance loss, YaRN RoPE)
// and dense (no MoE block). FP32: the memory plan against what init allocates; the loss parts, every gradient
// and the expert counts, for one and two micro-batches (the gradients accumulate); the gradient norm; the
// router-bias rule; AdamW; upload/download; sampling (B=1 below the allocated batch, no targets: the logits); a
// B=1 training step; an evaluation forward; the region timer; free. BF16: the loss, the gradient direction and
// the BF16 weight copy after upload and AdamW; FP8 (tiny with 16-wide head dims, against the CPU model's FP8 linear
// layers): the same, and the weights' E4M3 copies byte for byte
// against the CPU's quantization. --recompute (tiny, routed and dense in FP32, tiny in BF16, tiny16 in FP8): the same
// bits as without (test/recompute_check.h), its plan against what init allocates. Then the error paths (odd RoPE
// dim, FP8 widths, out of memory, batch too large, NaN router). Distributed (tiny): loss, gradients, counts, norm,
// router bias, the first step again with --recompute (the same bits), 5 optimizer steps.
// One line per check; exit status 1 when any fails. test/test_kernel_emulator.cpp runs it from test_cpu.
//
// Tolerances. The kernels sum in their own orders (trees of warp shuffles, online softmax), the emulated cuBLASLt
// in double, and the attention backward works from the log-sum-exp instead of the stored probabilities: a few FP32
// ulp per entry, summed and amplified by the chains of GEMMs. Measured: losses agree to ~1e-8 relative, gradients to
// ~1e-6 of each tensor's largest value. So: 1e-6 for the losses and the gradient norm, 1e-5 for every gradient
// tensor (max |diff| over max |CPU value|). Where the expressions are the same as the CPU's (the logits of a forward; AdamW from equal
// gradients) the results are bit-identical with the Makefile's flags, but the compiler may fuse a different
// product into an FMA at another optimisation level (-O1: 1e-7): 1e-6. Exact where no arithmetic differs: the
// expert counts, the router-bias rule (+-gamma), copies.
// Any orchestration error (a wrong buffer, a missing accumulate, a wrong scale or offset, a missed
// synchronisation) shows up as an O(1) error, far above these bounds. BF16 (operands rounded to 8 mantissa
// bits): the loss within 2e-2 relative, the gradient vector's norm within 2% and its cosine >= 0.999 less 3e-3 per
// assignment that changed experts, of which at most 1% + 1 (test/random_model.h; as test_gpu).
// Distributed: the sums over tokens are split over ranks and reordered: 1e-5 for the loss, the gradients (ep_check
// allows 1e-4; measured 7e-7) and the norm, and ep_check's 1e-4 for the losses over 5 optimizer steps.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "gpu/model.h"
#include "model/fp8.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "model/rng.h"
#include "test/device_array.h"
#include "test/random_model.h"
#include "test/recompute_check.h"

namespace {

int passed = 0, failed = 0;
bool verbose_rank = true;  // rank 0 prints every check, the other ranks their failures
std::string rank_tag;       // "[rank r] " on the other ranks

void report(const std::string& name, bool ok, const std::string& detail) {
    (ok ? passed : failed)++;
    if (verbose_rank || !ok)
        printf("%s%-64s %s  %s\n", rank_tag.c_str(), name.c_str(), detail.c_str(), ok ? "ok" : "FAIL");
    fflush(stdout);
}

std::string fmt(const char* f, double a, double b = 0.0) {
    char buf[128];
    snprintf(buf, sizeof buf, f, a, b);
    return buf;
}

// max |a - b| / max |b| (|a - b| where b is all zero); NaN anywhere gives infinity
double rel_error(const float* a, const float* b, int64_t n) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - (double)b[i]);
        if (!(e == e)) return INFINITY;
        diff = std::max(diff, e);
        scale = std::max(scale, (double)fabsf(b[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

void check_value(const std::string& name, double got, double want, double tol) {
    const double rel = want != 0 ? fabs(got - want) / fabs(want) : fabs(got);
    report(name, rel <= tol, fmt("got %.9g want %.9g", got, want) + fmt("  rel %.2e tol %.0e", rel, tol));
}

void check_array(const std::string& name, const float* got, const float* want, int64_t n, double tol) {
    const double rel = rel_error(got, want, n);
    report(name, rel <= tol, fmt("rel %.2e tol %.0e", rel, tol));
}

// Every trainable tensor's gradient; one line for the worst, one per tensor that fails.
void check_grads(const std::string& name, const std::vector<float>& got, const Model& cpu, double tol) {
    double worst = 0.0;
    std::string worst_name;
    for (const ParamTensor& t : cpu.table.tensors) {
        if (!t.trainable) {  // e_score_correction_bias: no gradient on either side
            bool zero = true;
            for (int64_t i = 0; i < t.numel; i++) zero = zero && got[t.offset + i] == 0.0f;
            if (!zero) report(name + " d " + t.name + " (not trainable) is zero", false, "");
            continue;
        }
        const double rel = rel_error(got.data() + t.offset, cpu.grads.data() + t.offset, t.numel);
        if (rel > tol) report(name + " d " + t.name, false, fmt("rel %.2e tol %.0e", rel, tol));
        if (!(rel <= worst)) {
            worst = rel;
            worst_name = t.name;
        }
    }
    report(name + " gradients (every tensor)", worst <= tol,
           fmt("worst rel %.2e tol %.0e", worst, tol) + " (" + worst_name + ")");
}

void check_counts(const std::string& name, const std::vector<std::vector<int64_t>>& got,
                  const std::vector<std::vector<int64_t>>& want) {
    report(name, got == want, "rows counted " + std::to_string(total_assignments(want)));
}

// Runs body; a thrown error (an emulator error, or the model's own) is one failed check.
void guarded(const std::string& name, const std::function<void()>& body) {
    try {
        body();
    } catch (const std::exception& e) {
        stand_in::discard_all();
        report(name + ": " + e.what(), false, "threw");
    }
}

// Runs body and expects it to throw std::runtime_error whose message contains `expect`.
void expect_throw(const std::string& name, const std::string& expect, const std::function<void()>& body) {
    std::string what = "(nothing thrown)";
    try {
        body();
    } catch (const std::runtime_error& e) {
        what = e.what();
    } catch (const std::exception& e) {
        what = std::string("wrong exception: ") + e.what();
    }
    stand_in::discard_all();
    report(name, what.find(expect) != std::string::npos, "\"" + what.substr(0, 60) + "\"");
}

// A rank's optimizer moments (its shard's layout) laid out by the table, every rank's pieces gathered in. Collective.
std::vector<float> moments_by_table(const Model& m, const std::vector<float>& moments) {
    std::vector<float> whole(m.table.total, 0.0f);
    shard_unpack(m.shard, moments, whole.data());
    shard_gather(m.shard, whole.data(), *m.comm);
    return whole;
}

// gm for host's config on comm, uploaded from host's weights and opt (zero moments): the emulated device memory
// that init allocates must be exactly what gpu_memory_plan says. Returns the live bytes before init (for checking
// that free releases everything).
int64_t init_uploaded(GpuModel& gm, const std::string& name, const Model& host, Comm& comm, Precision p, int B,
                      int T, AdamWState& opt, const ActivationLayout& layout = {}) {
    const int64_t before = stand_in::memory().live_bytes;
    gpu_model_init(gm, host.config, comm, p, B, T, layout);
    const GpuMemoryPlan plan = gpu_memory_plan(host.config, comm.ep_size, comm.world, p, B, T, layout);
    const int64_t allocated = stand_in::memory().live_bytes - before;
    report(name + " memory plan = what init allocates", allocated == plan.total(),
           fmt("allocated %.0f bytes, plan %.0f", (double)allocated, (double)plan.total()));
    if (p != Precision::FP32) {  // the distributed optimizer (docs/design.md §8)
        const double per_parameter = (double)(plan.params - plan.fp8_weights + plan.grads) / gm.table.total;
        report(name + " weights and gradients: 6 to 8 bytes a parameter", per_parameter >= 6 && per_parameter <= 8,
               fmt("%.2f bytes", per_parameter));
        report(name + " the optimizer shard: m, v and the master weight, 12 bytes a value",
               plan.optimizer == 12 * gm.shard.moments, fmt("%.2f bytes", (double)plan.optimizer / gm.shard.moments));
    }
    opt = adamw_state(host.shard);
    gpu_model_upload(gm, host, opt);
    return before;
}

// The model's working copy of every weight as floats, table layout (the GEMM weights' BF16 values widened)
static std::vector<float> working_copy(const GpuModel& m) {
    CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t f = m.table.fp32_total;
    std::vector<float> w(m.table.total);
    for (int64_t i = 0; i < m.table.total; i++) w[i] = i < f ? m.params[i] : __bfloat162float(m.params_bf16[i - f]);
    return w;
}
// BF16 and FP8 modes: the values of this rank's shard whose working copy is not its master weight (rounded to BF16
// for the GEMM weights)
static int64_t working_copy_mismatches(const GpuModel& m) {
    const std::vector<float> w = working_copy(m);
    int64_t wrong = 0;
    for (const OptimizerRange& r : m.shard.ranges)
        for (int64_t k = 0; k < r.count; k++) {
            const float master = m.master[r.moments + k];
            const float rounded = __bfloat162float(__float2bfloat16_rn(master));
            wrong += w[r.first + k] != (r.first < m.table.fp32_total ? master : rounded);
        }
    return wrong;
}

// ---- one process --------------------------------------------------------------------------------------------

void check_fp32(const std::string& tag, const Config& c, int B, int T, uint64_t seed,
                const ActivationLayout& layout = {}) {
    const float loss_scale = 0.75f;  // not 1: it must reach every term, the balance loss's included
    Model cpu;
    model_init(cpu, c);
    randomize_for_test(cpu, seed);
    const int64_t N = (int64_t)B * T;
    const std::vector<int32_t> in1 = random_tokens(N, c.vocab_size, seed + 1), tg1 = random_tokens(N, c.vocab_size, seed + 2);
    const std::vector<int32_t> in2 = random_tokens(N, c.vocab_size, seed + 3), tg2 = random_tokens(N, c.vocab_size, seed + 4);

    GpuModel gm;
    AdamWState opt;
    const int64_t before = init_uploaded(gm, tag, cpu, local_comm(), Precision::FP32, B, T, opt, layout);

    // one micro-batch
    model_zero_grads(cpu);
    const LossParts want = model_forward(cpu, in1.data(), tg1.data(), B, T, true);
    model_backward(cpu, loss_scale);
    gpu_model_zero_grads(gm);
    gpu_model_forward(gm, in1.data(), tg1.data(), B, true);
    const LossParts got = gpu_model_losses(gm)[0];
    gpu_model_backward(gm, loss_scale);
    check_value(tag + " loss main", got.main, want.main, 1e-6);
    if (c.num_nextn_predict_layers > 0) check_value(tag + " loss mtp", got.mtp, want.mtp, 1e-6);
    if (c.aux_loss_alpha > 0) check_value(tag + " loss balance", got.balance, want.balance, 1e-6);
    check_value(tag + " loss total", got.total, want.total, 1e-6);
    check_grads(tag, gpu_model_grads(gm), cpu, 1e-5);
    check_counts(tag + " expert counts", gm.expert_counts, cpu.expert_counts);

    // a second micro-batch accumulates onto the first's gradients and counts
    model_forward(cpu, in2.data(), tg2.data(), B, T, true);
    model_backward(cpu, loss_scale);
    gpu_model_forward(gm, in2.data(), tg2.data(), B, true);
    gpu_model_backward(gm, loss_scale);
    gpu_model_losses(gm);  // and the counts
    check_grads(tag + " 2 micro-batches", gpu_model_grads(gm), cpu, 1e-5);
    check_counts(tag + " 2 micro-batches expert counts", gm.expert_counts, cpu.expert_counts);
    check_value(tag + " grad norm", gpu_model_grad_norm(gm), model_grad_norm(cpu), 1e-6);

    // the router-bias rule on the same counts, and the counts reset
    const std::vector<std::vector<int64_t>> counts = cpu.expert_counts;
    model_update_router_bias(cpu, counts);
    gpu_model_update_router_bias(gm, counts);
    Model back;
    model_init(back, c);
    AdamWState opt_back;
    gpu_model_download(gm, back, opt_back);
    double bias_diff = 0.0;
    for (int l = 0; l < c.num_blocks(); l++)
        if (c.is_moe_layer(l))
            bias_diff = std::max(bias_diff, rel_error(back.w.blocks[l].router_bias, cpu.w.blocks[l].router_bias,
                                                      c.n_routed_experts));
    bool reset = true;
    for (const auto& layer : gm.expert_counts)
        for (int64_t n : layer) reset = reset && n == 0;
    report(tag + " router-bias update, counts reset", bias_diff == 0.0 && reset,
           fmt("bias rel %.2e", bias_diff) + (reset ? "" : ", counts not reset"));
    check_array(tag + " router-bias update leaves the other weights", back.params.data(), cpu.params.data(),
                cpu.table.total, 0.0);

    // AdamW from the same gradients (the CPU's, copied in) and random moments: params, moments, step
    Rng rng(seed + 5);
    AdamWState opt_cpu = adamw_state(cpu.shard);
    for (const OptimizerRange& r : cpu.shard.ranges)  // the gaps between tensors stay 0
        for (int64_t i = r.moments; i < r.moments + r.count; i++) {
            opt_cpu.m[i] = 1e-3f * rng.normal();
            opt_cpu.v[i] = 1e-6f * fabsf(rng.normal());
        }
    opt_cpu.step = 3;
    AdamWState opt_gpu = opt_cpu;
    gpu_model_upload(gm, cpu, opt_gpu);
    CUDA_CHECK(cudaMemcpy(gm.grads, cpu.grads.data(), cpu.table.total * sizeof(float), cudaMemcpyHostToDevice));
    OptimizerConfig oc;
    const float lr = 1e-2f, multiplier = 0.5f;
    model_adamw(cpu, opt_cpu, oc, lr, multiplier);
    gpu_model_adamw(gm, opt_gpu, oc, lr, multiplier);
    gpu_model_download(gm, back, opt_back);
    check_array(tag + " AdamW params", back.params.data(), cpu.params.data(), cpu.table.total, 1e-6);
    check_array(tag + " AdamW m", opt_back.m.data(), opt_cpu.m.data(), cpu.shard.moments, 1e-6);
    check_array(tag + " AdamW v", opt_back.v.data(), opt_cpu.v.data(), cpu.shard.moments, 1e-6);
    report(tag + " AdamW step count", opt_gpu.step == opt_cpu.step, std::to_string(opt_gpu.step));

    // upload, then download, give back what was uploaded (random params and moments)
    Model rnd;
    model_init(rnd, c);
    randomize_for_test(rnd, seed + 6);
    AdamWState opt_rnd = adamw_state(rnd.shard);
    for (int64_t i = 0; i < rnd.shard.moments; i++) {
        opt_rnd.m[i] = rng.normal();
        opt_rnd.v[i] = rng.normal();
    }
    gpu_model_upload(gm, rnd, opt_rnd);
    gpu_model_download(gm, back, opt_back);
    report(tag + " upload, download round trip",
           back.params == rnd.params && opt_back.m == opt_rnd.m && opt_back.v == opt_rnd.v, "exact");

    // sampling: B = 1 below the allocated batch, no targets, not training: the logits of every position
    gpu_model_upload(gm, cpu, opt_cpu);
    model_forward(cpu, in1.data(), nullptr, 1, T, false);
    gpu_model_forward(gm, in1.data(), nullptr, 1, false);
    std::vector<float> logits((int64_t)T * c.vocab_size);
    for (int t = 0; t < T; t++) gpu_model_logits_row(gm, t, logits.data() + (int64_t)t * c.vocab_size);
    check_array(tag + " sampling B=1: logits", logits.data(), cpu.acts.logits, (int64_t)T * c.vocab_size, 1e-6);
    check_counts(tag + " sampling leaves the expert counts", gm.expert_counts, cpu.expert_counts);

    // a training step on a smaller batch than the allocated one
    model_zero_grads(cpu);
    const LossParts want1 = model_forward(cpu, in2.data(), tg2.data(), 1, T, true);
    model_backward(cpu, 1.0f);
    gpu_model_zero_grads(gm);
    gpu_model_forward(gm, in2.data(), tg2.data(), 1, true);
    const LossParts got1 = gpu_model_losses(gm)[0];
    gpu_model_backward(gm, 1.0f);
    check_value(tag + " B=1 step: loss total", got1.total, want1.total, 1e-6);
    check_grads(tag + " B=1 step", gpu_model_grads(gm), cpu, 1e-5);
    check_counts(tag + " B=1 step expert counts", gm.expert_counts, cpu.expert_counts);

    // an evaluation forward (targets, not training), under the region timer (every region lasts 0 ms here)
    std::map<std::string, double> regions;
    gm.timer.enabled = true;
    gpu_model_forward(gm, in1.data(), tg1.data(), B, false);
    const LossParts got_eval = gpu_model_losses(gm)[0];
    gm.timer.finish(regions);
    gm.timer.enabled = false;
    const LossParts want_eval = model_forward(cpu, in1.data(), tg1.data(), B, T, false);
    check_value(tag + " evaluation forward: loss total", got_eval.total, want_eval.total, 1e-6);
    if (c.aux_loss_alpha > 0) check_value(tag + " evaluation forward: loss balance", got_eval.balance, want_eval.balance, 1e-6);
    check_counts(tag + " evaluation forward leaves the expert counts", gm.expert_counts, cpu.expert_counts);
    report(tag + " region timer", regions.count("attention forward") && regions.count("head") &&
                                      regions.count("embedding") && !regions.count("end"),
           std::to_string(regions.size()) + " regions");

    gpu_model_free(gm);
    report(tag + " free releases everything", stand_in::memory().live_bytes == before,
           fmt("%.0f bytes left", (double)(stand_in::memory().live_bytes - before)));
}

// BF16, or FP8 (against the CPU model's FP8 linear layers): the loss, the gradient direction, and the weights' BF16
// (and FP8) copies after upload and after AdamW.
void check_low_precision(const std::string& tag, const Config& c, Precision precision, int B, int T,
                         uint64_t seed) {
    Model cpu;
    model_init(cpu, c);
    cpu.precision = precision == Precision::FP8 ? Precision::FP8 : Precision::FP32;
    // BF16: the test's wide random weights. FP8: the trainer's initialisation; with the wide ones this small model's
    // FP8 gradients turn chaotic (a 2^-8 perturbation of its weights alone moves them to cosine 0.958, measured),
    // where with the trainer's they stay at 0.9999, so the BF16 bounds below apply to FP8 as they are.
    if (precision == Precision::FP8)
        model_init_weights(cpu, seed);
    else
        randomize_for_test(cpu, seed);
    const int64_t N = (int64_t)B * T;
    const std::vector<int32_t> in = random_tokens(N, c.vocab_size, seed + 1),
                               tg = random_tokens(N, c.vocab_size, seed + 2);
    const LossParts want = model_forward(cpu, in.data(), tg.data(), B, T, true);
    model_zero_grads(cpu);
    model_backward(cpu, 1.0f);

    GpuModel gm;
    AdamWState opt;
    init_uploaded(gm, tag, cpu, local_comm(), precision, B, T, opt);
    auto copy_is_fresh = [&]() { return working_copy_mismatches(gm) == 0; };
    auto fp8_is_fresh = [&]() {  // every FP8 copy == the CPU's quantization of the params, byte and scale
        CUDA_CHECK(cudaDeviceSynchronize());
        for (const auto& entry : gm.fp8_weights) {
            const Fp8Tensor& f = entry.second;
            const int64_t size = f.rows * f.cols, down = (f.rows + 127) / 128, across = (f.cols + 127) / 128;
            const int64_t S = gpu::fp8_blk128_scales(f.rows, f.cols), St = gpu::fp8_blk128_scales(f.cols, f.rows);
            std::vector<float> q(size), scales(down * across), w(size);
            for (int64_t z = 0; z < f.batch; z++) {
                for (int64_t i = 0; i < size; i++) w[i] = __bfloat162float(f.w[z * size + i]);
                fp8_quantize(q.data(), scales.data(), w.data(), f.rows, f.cols, FP8_TILE, FP8_TILE);
                for (int64_t r = 0; r < f.rows; r++)
                    for (int64_t col = 0; col < f.cols; col++) {
                        const __nv_fp8_storage_t want =
                            __nv_cvt_float_to_fp8(q[r * f.cols + col], __NV_SATFINITE, __NV_E4M3);
                        if (f.q[z * size + r * f.cols + col] != want || f.qt[z * size + col * f.rows + r] != want)
                            return false;
                    }
                for (int64_t rb = 0; rb < down; rb++)
                    for (int64_t b = 0; b < across; b++)
                        if (f.scales[z * S + rb * gpu::round_up(across, 4) + b] != scales[rb * across + b] ||
                            f.scales_t[z * St + b * gpu::round_up(down, 4) + rb] != scales[rb * across + b])
                            return false;
            }
        }
        return true;
    };
    const bool fp8 = precision == Precision::FP8;
    report(tag + " BF16 copy after upload", copy_is_fresh(), "");
    if (fp8) {
        // the weights the CPU's Precision::FP8 multiplies in FP8 (model/mla.cpp, model/moe.cpp), by offset
        std::set<int64_t> want_fp8;
        for (const BlockWeights& w : cpu.w.blocks)
            for (const float* linear : {w.q_a, w.q_b, w.q, w.kv_a, w.kv_b, w.o, w.gate, w.up, w.down, w.expert_gate,
                                        w.expert_up, w.expert_down})
                if (linear) want_fp8.insert(linear - cpu.params.data());
        std::set<int64_t> got_fp8;
        for (const auto& entry : gm.fp8_weights) got_fp8.insert(entry.first);
        report(tag + " FP8 copies of exactly the blocks' linear layers", got_fp8 == want_fp8,
               fmt("%.0f of %.0f", (double)got_fp8.size(), (double)want_fp8.size()));
        report(tag + " FP8 copies after upload", fp8_is_fresh(), "");
    }
    gpu_model_zero_grads(gm);
    const int64_t allocated = stand_in::memory().live_bytes;
    gpu_model_forward(gm, in.data(), tg.data(), B, true);
    const LossParts got = gpu_model_losses(gm)[0];
    gpu_model_backward(gm, 1.0f);
    // what init allocated holds the step (on one rank R = N k rows exactly): no buffer grows (the emulated build runs
    // the real kernels/matmul.cuh, whose cast and FP8 buffers grow when the sizes init gave them are too small)
    report(tag + " the step allocates nothing", stand_in::memory().live_bytes == allocated,
           fmt("%.0f bytes more", (double)(stand_in::memory().live_bytes - allocated)));
    check_value(tag + " loss total", got.total, want.total, 2e-2);
    const std::vector<float> grads = gpu_model_grads(gm);
    const GradientAgreement a = gradient_agreement(cpu.table, grads.data(), cpu.grads.data());
    const int64_t assignments = total_assignments(cpu.expert_counts);
    const int64_t moved = moved_assignments(gm.expert_counts, cpu.expert_counts);
    report(tag + " expert counts: assignments that changed experts", moved <= bf16_max_moved(assignments),
           fmt("%.0f of %.0f moved", (double)moved, (double)assignments));
    report(tag + " gradients: cosine, norm ratio",
           a.cosine >= bf16_min_cosine(moved) && fabs(a.norm_ratio - 1.0) <= 0.02,
           fmt("cos %.6f norm ratio %.4f", a.cosine, a.norm_ratio) + fmt(" (cos >= %.3f)", bf16_min_cosine(moved)));
    report(tag + " gradients: the worst tensor", a.worst_relative <= (moved > 0 ? MOVED_MAX_TENSOR_ERROR : 0.1),
           fmt("%.3f ", a.worst_relative) + a.worst_name);
    OptimizerConfig oc;
    gpu_model_adamw(gm, opt, oc, 1e-2f, 1.0f);
    report(tag + " BF16 copy after AdamW", copy_is_fresh(), "");
    if (fp8) report(tag + " FP8 copies after AdamW", fp8_is_fresh(), "");
    gpu_model_free(gm);
}

// With recompute: test/recompute_check.h's comparison (the same bits as without, two micro-batches and the logits of
// a sampling forward; the forwards ran again; fewer activation bytes), with the heads in chunks of 5 rows, and the
// recomputing model's plan against what its init allocates.
void check_recompute(const std::string& tag, const Config& c, Precision p, int B, int T, uint64_t seed) {
    ActivationLayout layout;
    layout.recompute = true;
    layout.head_chunk_values = 5 * (int64_t)c.vocab_size;
    const RecomputeComparison r = compare_recompute(c, p, B, T, seed, layout.head_chunk_values);
    report(tag + " recompute: the same loss parts", r.same_losses, "bit for bit");
    report(tag + " recompute: the same gradients", r.same_grads, "bit for bit, 2 micro-batches");
    report(tag + " recompute: the same expert counts", r.same_counts, "");
    report(tag + " recompute: the same logits of a sampling forward", r.same_logits, "bit for bit, every row");
    report(tag + " recompute: the blocks' forwards ran again", r.recomputed, "a \"recompute\" region");
    report(tag + " recompute: fewer activation bytes", r.kept_bytes_recompute < r.kept_bytes,
           fmt("%.0f bytes, %.0f without", (double)r.kept_bytes_recompute, (double)r.kept_bytes));
    Model host;
    model_init(host, c);
    GpuModel gm;
    AdamWState opt;
    init_uploaded(gm, tag + " recompute", host, local_comm(), p, B, T, opt, layout);
    gpu_model_free(gm);
}

// What gpu_model_init asks of the GPU, on emulated devices other than the default Hopper one
void check_device_refusals(const Config& tiny) {
    cudaDeviceProp& device = stand_in::device_properties();
    const cudaDeviceProp hopper = device;
    GpuModel gm;
    Config fp8_widths = tiny, wide_heads = tiny, deepseek_heads = tiny;
    fp8_widths.qk_nope_head_dim = fp8_widths.qk_rope_head_dim = 16;
    wide_heads.qk_nope_head_dim = 192, wide_heads.qk_rope_head_dim = 64, wide_heads.v_head_dim = 256;
    deepseek_heads.qk_nope_head_dim = 128, deepseek_heads.qk_rope_head_dim = 64, deepseek_heads.v_head_dim = 128;
    device.major = 7, device.minor = 5;
    expect_throw("init: a GPU older than Ampere is refused", "older than the Ampere GPUs", [&] {
        gpu_model_init(gm, tiny, local_comm(), Precision::FP32, 1, 8);
    });
    device.major = 8, device.minor = 6, device.sharedMemPerBlockOptin = 99 << 10;  // an RTX 3090's
    expect_throw("init: fp8 on a GPU other than Hopper is refused", "which Hopper GPUs", [&] {
        gpu_model_init(gm, fp8_widths, local_comm(), Precision::FP8, 1, 8);
    });
    device = hopper;
    stand_in::cublaslt_version() = 120801;  // 12.8.1: no block-scaled FP8
    expect_throw("init: fp8 with a cuBLASLt before 12.9 is refused", "needs cuBLASLt 12.9 or newer", [&] {
        gpu_model_init(gm, fp8_widths, local_comm(), Precision::FP8, 1, 8);
    });
    stand_in::cublaslt_version() = 130000;
    device.major = 8, device.minor = 6, device.sharedMemPerBlockOptin = 99 << 10;
    // head dims 256 / 256: 2 x (64 x 264 x 2) x 2 + 512 bytes = 132 KiB a backward block
    expect_throw("init: tensor-core attention above the GPU's shared memory is refused", "needs 132 KiB",
                 [&] { gpu_model_init(gm, wide_heads, local_comm(), Precision::BF16, 1, 8); });
    auto accepted = [&](const std::string& name, const Config& c, Precision p) {
        std::string error;
        try {
            gpu_model_init(gm, c, local_comm(), p, 1, 8);
            gpu_model_free(gm);
        } catch (const std::exception& e) {
            error = e.what();
        }
        stand_in::discard_all();
        report(name, error.empty(), error);
    };
    accepted("init: DeepSeek's head dims 192 / 128 fit an sm_86 GPU (84.5 of 99 KiB)", deepseek_heads,
             Precision::BF16);
    accepted("init: wide heads in fp32 take the FP32 kernels, which fit", wide_heads, Precision::FP32);
    device = hopper;
}

void check_errors(const Config& tiny) {
    GpuModel gm;
    Config odd = tiny;
    odd.qk_rope_head_dim = 5;
    expect_throw("init: odd qk_rope_head_dim is refused", "is odd", [&] {
        gpu_model_init(gm, odd, local_comm(), Precision::FP32, 1, 8);
    });
    const int64_t before = stand_in::memory().live_bytes;
    expect_throw("init: fp8 with widths that are not multiples of 16 is refused", "multiples of 16", [&] {
        gpu_model_init(gm, tiny, local_comm(), Precision::FP8, 1, 8);
    });
    expect_throw("init: deepseek-v3 does not fit in 16 GiB", "GiB of GPU memory", [&] {
        gpu_model_init(gm, load_config("deepseek-v3"), local_comm(), Precision::BF16, 1, 4096);
    });
    report("init: refused before allocating anything", stand_in::memory().live_bytes == before, "");
    check_device_refusals(tiny);

    Model cpu;
    model_init(cpu, tiny);
    randomize_for_test(cpu, 5);
    const std::vector<int32_t> tokens = random_tokens(2 * 8, tiny.vocab_size, 6);
    gm = GpuModel();
    gpu_model_init(gm, tiny, local_comm(), Precision::FP32, 2, 8);
    AdamWState opt = adamw_state(cpu.shard);
    expect_throw("forward: a batch above the allocated one", "allocated for 2", [&] {
        gpu_model_forward(gm, tokens.data(), tokens.data(), 3, true);
    });
    // all of a router NaN: every score is, fewer than k experts are left to choose (one NaN weight would only
    // rule out its expert, on the CPU as well)
    for (int64_t i = 0; i < (int64_t)tiny.n_routed_experts * tiny.hidden_size; i++) cpu.w.blocks[1].router[i] = NAN;
    gpu_model_upload(gm, cpu, opt);
    expect_throw("forward: NaN router weights are reported", "not finite", [&] {
        gpu_model_forward(gm, tokens.data(), tokens.data(), 2, true);
    });
    gpu_model_free(gm);
}

// ---- expert and data parallelism ----------------------------------------------------------------------------

// to's tensors from from's (a one-process model): this EP rank's slice of each expert tensor
void copy_params_by_name(const Model& from, Model& to, int ep_rank) {
    for (const ParamTensor& t : to.table.tensors) {
        const ParamTensor& src = from.table.at(t.name);
        const int64_t first = src.offset + (t.expert_shard ? (int64_t)ep_rank * t.numel : 0);
        std::copy(from.params.begin() + first, from.params.begin() + first + t.numel, to.params.begin() + t.offset);
    }
}

// As ep_check's train_step, on the GPU model: the gradients of this rank's batch, reduced over the world, the
// loss and the expert counts summed over the world; then (update) one optimizer step and the router-bias rule.
double gpu_gradients(GpuModel& gm, const int32_t* inputs, const int32_t* targets, int B) {
    Comm& comm = *gm.comm;
    gpu_model_zero_grads(gm);
    gpu_model_forward(gm, inputs, targets, B, true);
    double loss = gpu_model_losses(gm)[0].total / comm.world;
    gpu_model_backward(gm, 1.0f / comm.world);
    gpu_model_reduce_grads(gm);
    comm.all_reduce_sum(&loss, 1, Group::World);
    for (std::vector<int64_t>& counts : gm.expert_counts)
        comm.all_reduce_sum(counts.data(), (int64_t)counts.size(), Group::World);
    return loss;
}
void gpu_update(GpuModel& gm, AdamWState& opt, const OptimizerConfig& oc, int64_t step) {
    const double norm = gpu_model_grad_norm(gm);
    gpu_model_adamw(gm, opt, oc, learning_rate(oc, step), clip_factor(oc, norm));
    gpu_model_update_router_bias(gm, gm.expert_counts);
}
double cpu_train_step(Model& m, AdamWState& opt, const OptimizerConfig& oc, int64_t step, const int32_t* inputs,
                      const int32_t* targets, int B, int T, bool update) {
    model_zero_grads(m);
    const double loss = model_forward(m, inputs, targets, B, T, true).total;
    model_backward(m, 1.0f);
    if (update) model_adamw(m, opt, oc, learning_rate(oc, step), clip_factor(oc, model_grad_norm(m)));
    model_update_router_bias(m, m.expert_counts);
    return loss;
}

// The worst relative error over the trainable tensors of `values` (laid out by this rank's table `host`; expert
// tensors all-gathered over the EP group) against `alone` (laid out by the one-process table), on rank
// 0; each tensor over tol is reported. Collective.
double worst_tensor_error(Comm& comm, const std::string& tag, const ParamTable& host, const float* values,
                          const ParamTable& alone_table, const float* alone, double tol, std::string& worst_name) {
    double worst = 0.0;
    for (const ParamTensor& t : host.tensors) {
        if (!t.trainable) continue;
        const int pieces = t.expert_shard ? comm.ep_size : 1, mine = t.expert_shard ? comm.ep_rank : 0;
        std::vector<float> tensor(t.numel * pieces);
        std::copy(values + t.offset, values + t.offset + t.numel, tensor.begin() + mine * t.numel);
        if (t.expert_shard) comm.all_gather(tensor.data(), t.numel, Group::ExpertParallel);
        if (comm.rank != 0) continue;
        const double rel = rel_error(tensor.data(), alone + alone_table.at(t.name).offset, (int64_t)tensor.size());
        if (rel > tol) report(tag + " " + t.name, false, fmt("rel %.2e tol %.0e", rel, tol));
        if (!(rel <= worst)) {
            worst = rel;
            worst_name = t.name;
        }
    }
    return worst;
}

void check_distributed(Comm& comm) {
    Config c = load_config("tiny");
    c.aux_loss_alpha = 0.05f;  // make the balance loss's gradient visible
    const int B_global = 4, T = 16;
    if (B_global % comm.world) comm.abort("the world size must divide 4");
    const int B = B_global / comm.world;
    const std::string tag = "distributed world " + std::to_string(comm.world) + " (EP " + std::to_string(comm.ep_size) +
                            " x DP " + std::to_string(comm.dp_size) + ")";
    const std::vector<int32_t> inputs = random_tokens(B_global * T, c.vocab_size, 4242);
    const std::vector<int32_t> targets = random_tokens(B_global * T, c.vocab_size, 4243);
    const int32_t* my_inputs = inputs.data() + comm.rank * B * T;
    const int32_t* my_targets = targets.data() + comm.rank * B * T;

    Model alone, host;  // the one-process reference (trained on rank 0 only), and this rank's slice of it
    model_init(alone, c);
    randomize_for_test(alone, 77);
    model_init(host, c, &comm);
    copy_params_by_name(alone, host, comm.ep_rank);
    GpuModel gm;
    AdamWState opt_gpu, opt_alone = adamw_state(alone.shard);
    init_uploaded(gm, tag, host, comm, Precision::FP32, B, T, opt_gpu);  // each rank checks its own plan
    OptimizerConfig oc;
    oc.lr = 1e-2f;
    oc.total_steps = 6;

    double loss = gpu_gradients(gm, my_inputs, my_targets, B);
    const double loss_first = loss;
    const std::vector<float> grads = gpu_model_grads(gm);
    std::vector<float> whole = grads;  // each rank has the sums its optimizer shard updates: gathered whole
    shard_gather(gm.shard, whole.data(), comm);
    double loss_alone = 0.0;
    if (comm.rank == 0) {
        model_zero_grads(alone);
        loss_alone = model_forward(alone, inputs.data(), targets.data(), B_global, T, true).total;
        model_backward(alone, 1.0f);
    }
    std::string worst_name;
    const double worst = worst_tensor_error(comm, tag + " d", host.table, whole.data(), alone.table,
                                            alone.grads.data(), 1e-5, worst_name);
    const double norm = gpu_model_grad_norm(gm);  // collective: every rank
    if (comm.rank == 0) {
        check_value(tag + " loss", loss, loss_alone, 1e-5);
        report(tag + " gradients (every tensor)", worst <= 1e-5,
               fmt("worst rel %.2e tol %.0e", worst, 1e-5) + " (" + worst_name + ")");
        check_counts(tag + " expert counts summed over the world", gm.expert_counts, alone.expert_counts);
        check_value(tag + " grad norm", norm, model_grad_norm(alone), 1e-5);
    }
    // the router bias after one update from the global counts: exact, on every rank's copy (checked on rank 0)
    gpu_model_update_router_bias(gm, gm.expert_counts);
    if (comm.rank == 0) model_update_router_bias(alone, alone.expert_counts);
    Model back;
    model_init(back, c, &comm);
    AdamWState opt_back;
    gpu_model_download(gm, back, opt_back);
    if (comm.rank == 0) {
        double diff = 0.0;
        for (int l = 0; l < c.num_blocks(); l++)
            if (c.is_moe_layer(l))
                diff = std::max(diff, rel_error(back.w.blocks[l].router_bias, alone.w.blocks[l].router_bias,
                                                c.n_routed_experts));
        report(tag + " router bias from the global expert counts", diff == 0.0, fmt("rel %.2e", diff));
    }
    // the first step again with recompute (the recomputed forwards exchange their rows again): the same loss and
    // gradients on every rank, to the bit
    GpuModel again;
    AdamWState opt_again;
    ActivationLayout recomputing;
    recomputing.recompute = true;
    init_uploaded(again, tag + " recompute", host, comm, Precision::FP32, B, T, opt_again, recomputing);
    const double loss_again = gpu_gradients(again, my_inputs, my_targets, B);
    double differing_ranks = loss_again == loss_first && gpu_model_grads(again) == grads ? 0.0 : 1.0;
    comm.all_reduce_sum(&differing_ranks, 1, Group::World);
    report(tag + " recompute: the same loss and gradients", differing_ranks == 0.0,
           fmt("%.0f ranks differ", differing_ranks));
    gpu_model_free(again);
    // five optimizer steps in both layouts
    double worst_loss = 0.0;
    for (int64_t step = 1; step <= 5; step++) {
        loss = gpu_gradients(gm, my_inputs, my_targets, B);
        gpu_update(gm, opt_gpu, oc, step);
        if (comm.rank == 0) {
            loss_alone = cpu_train_step(alone, opt_alone, oc, step, inputs.data(), targets.data(), B_global, T, true);
            worst_loss = std::max(worst_loss, fabs(loss - loss_alone) / fabs(loss_alone));
        }
    }
    if (comm.rank == 0) report(tag + " losses over 5 optimizer steps", worst_loss <= 1e-4, fmt("worst rel %.2e tol 1e-04", worst_loss));
    // the AdamW moments of every rank's optimizer shard, gathered whole, against the one process's after the same 5
    // steps (the same tolerance as the losses: 5 steps of reordered sums)
    gpu_model_download(gm, back, opt_back);
    for (int which = 0; which < 2; which++) {
        const char* name = which == 0 ? "m" : "v";
        std::string worst_moment;
        const std::vector<float> mine = moments_by_table(back, which == 0 ? opt_back.m : opt_back.v);
        const std::vector<float> alone_moments = moments_by_table(alone, which == 0 ? opt_alone.m : opt_alone.v);
        const double moment = worst_tensor_error(comm, tag + " AdamW " + name, host.table, mine.data(), alone.table,
                                                 alone_moments.data(), 1e-4, worst_moment);
        if (comm.rank == 0)
            report(tag + " AdamW " + name + " gathered from the ranks' shards", moment <= 1e-4,
                   fmt("worst rel %.2e tol 1e-04", moment) + " (" + worst_moment + ")");
    }
    gpu_model_free(gm);
    // BF16: after an update and the gather, every rank's working copy holds its shard's master weights (the GEMM
    // weights rounded), and every rank holding a tensor the same copy of it (the stage's ranks a replicated tensor,
    // the DP group an expert tensor)
    GpuModel bf16;
    AdamWState opt_bf16;
    init_uploaded(bf16, tag + " bf16", host, comm, Precision::BF16, B, T, opt_bf16);
    gpu_gradients(bf16, my_inputs, my_targets, B);
    gpu_update(bf16, opt_bf16, oc, 1);
    double stale = (double)working_copy_mismatches(bf16);
    comm.all_reduce_sum(&stale, 1, Group::World);
    report(tag + " bf16: the working copy = the master shards", stale == 0.0, fmt("%.0f values differ", stale));
    const std::vector<float> mine = working_copy(bf16);
    const int64_t n = (int64_t)mine.size();
    double differing = 0.0;  // tensors, counted once per pair of ranks
    for (Group g : {Group::Stage, Group::DataParallel}) {
        std::vector<float> all(comm.group_size(g) * n);
        std::copy(mine.begin(), mine.end(), all.begin() + comm.group_rank(g) * n);
        comm.all_gather(all.data(), n, g);
        for (const ParamTensor& t : bf16.table.tensors)
            for (int r = 0; t.expert_shard == (g == Group::DataParallel) && r < comm.group_size(g); r++)
                differing += !std::equal(mine.begin() + t.offset, mine.begin() + t.offset + t.numel,
                                         all.begin() + r * n + t.offset);
    }
    comm.all_reduce_sum(&differing, 1, Group::World);
    report(tag + " bf16: the ranks' working copies agree", differing == 0.0,
           fmt("%.0f tensors differ", differing));
    gpu_model_free(bf16);
}

// ---- pipeline stages -------------------------------------------------------------------------------------------

// Stage [first, end) of c on one process, in its second activation slot: init allocates the memory plan of one slot,
// the second slot's first use the plan of two (with recompute sharing the first's activation sets); from the same
// message in, the forward gives the CPU stage's message out (or the heads' losses on the last stage), the backward
// from the same message back the CPU stage's gradients and message back; free releases everything.
void check_stage(const std::string& tag, const Config& c, int first, int end, const ActivationLayout& layout) {
    const int B = 2, T = 12;
    const float loss_scale = 0.75f;
    const int64_t N = (int64_t)B * T, message = stage_message_floats(c, B, T);
    Model cpu;
    model_init(cpu, c, nullptr, first, end);
    cpu.layout = layout;
    randomize_for_test(cpu, 41);
    const int64_t before = stand_in::memory().live_bytes;
    const auto allocated = [&] { return (double)(stand_in::memory().live_bytes - before); };
    const auto plan = [&](int slots) {
        return (double)gpu_memory_plan(c, 1, 1, Precision::FP32, B, T, layout, Moments::FP32, first, end, slots)
            .total();
    };
    GpuModel gm;
    gpu_model_init(gm, c, local_comm(), Precision::FP32, B, T, layout, Moments::FP32, first, end);
    report(tag + " memory plan = what init allocates", allocated() == plan(1),
           fmt("allocated %.0f bytes, plan %.0f", allocated(), plan(1)));
    AdamWState opt = adamw_state(cpu.shard);
    gpu_model_upload(gm, cpu, opt);
    model_use_slot(cpu, 1);
    gpu_model_use_slot(gm, 1);
    report(tag + " a second slot: the plan of two", allocated() == plan(2),
           fmt("allocated %.0f bytes, plan %.0f", allocated(), plan(2)));

    Rng rng(42);
    const std::vector<float> in = randn(message, rng), dout = randn(message, rng, 1e-3f);
    const std::vector<int32_t> x = random_tokens(N, c.vocab_size, 43), y = random_tokens(N, c.vocab_size, 44);
    const bool first_stage = cpu.first_stage(), last = cpu.last_stage();
    std::vector<float> out(message), din(message);
    model_zero_grads(cpu);
    const LossParts want = model_stage_forward(cpu, x.data(), y.data(), B, T, true, in.data(), out.data());
    model_stage_backward(cpu, loss_scale, dout.data(), din.data());
    {
        DeviceArray<float> d_in(in), d_out(message), d_dout(dout), d_din(message);
        gpu_model_zero_grads(gm);
        gpu_model_forward(gm, x.data(), y.data(), B, true, d_in.ptr, d_out.ptr);
        const LossParts got = gpu_model_losses(gm)[0];
        gpu_model_backward(gm, loss_scale, d_dout.ptr, d_din.ptr);
        check_value(tag + " loss total", got.total, want.total, 1e-6);
        if (!last) check_array(tag + " message out", d_out.get().data(), out.data(), message, 1e-5);
        if (!first_stage) check_array(tag + " message back", d_din.get().data(), din.data(), message, 1e-5);
        check_grads(tag, gpu_model_grads(gm), cpu, 1e-5);
    }
    gpu_model_free(gm);
    report(tag + " free releases everything", allocated() == 0, fmt("%.0f bytes live", allocated()));
}

}  // namespace

int main(int argc, char** argv) {
    const int ep = argc == 3 && !strcmp(argv[1], "--ep") ? atoi(argv[2]) : 1;
    std::unique_ptr<Comm> comm = make_comm(ep, 1, "gpu_model_emulated_check");
    verbose_rank = comm->rank == 0;
    if (comm->rank > 0) rank_tag = "[rank " + std::to_string(comm->rank) + "] ";
    if (comm->world == 1) {
        const Config tiny = load_config("tiny");  // q_lora, groups, shared experts, MTP, balance loss
        Config plain = tiny;  // no q_lora, no MTP, no groups, no normalisation, T not a multiple of 64
        plain.q_lora_rank = 0;
        plain.num_nextn_predict_layers = 0;
        plain.n_group = plain.topk_group = 1;
        plain.norm_topk_prob = false;
        plain.hidden_size = 48;
        // every block MoE, no shared experts, k = 3, no balance loss, YaRN RoPE (magnitude and softmax scale != 1)
        Config routed = tiny;
        routed.first_k_dense_replace = 0;
        routed.n_shared_experts = 0;
        routed.num_experts_per_tok = 3;
        routed.aux_loss_alpha = 0.0f;
        routed.yarn_factor = 4.0f;
        routed.yarn_original_max_position = 64;
        routed.yarn_mscale = 0.707f;
        routed.yarn_mscale_all_dim = 0.5f;
        Config dense = tiny;  // no MoE block at all (MTP included)
        dense.first_k_dense_replace = dense.num_blocks();
        guarded("tiny B=2 T=12", [&] { check_fp32("tiny B=2 T=12", tiny, 2, 12, 11); });
        guarded("plain B=3 T=70", [&] { check_fp32("plain B=3 T=70", plain, 3, 70, 12); });
        guarded("routed B=2 T=20", [&] { check_fp32("routed B=2 T=20", routed, 2, 20, 13); });
        guarded("dense B=2 T=9", [&] { check_fp32("dense B=2 T=9", dense, 2, 9, 14); });
        ActivationLayout chunked;  // the output heads over chunks of 5 rows (the last one of 4)
        chunked.head_chunk_values = 5 * (int64_t)tiny.vocab_size;
        guarded("tiny chunked heads",
                [&] { check_fp32("tiny B=2 T=12 heads in 5-row chunks", tiny, 2, 12, 11, chunked); });
        // FP8 needs the linear layers' widths in multiples of 16: tiny with 16-wide rope and nope head dims
        Config tiny16 = tiny;
        tiny16.qk_nope_head_dim = tiny16.qk_rope_head_dim = 16;
        const Precision bf16 = Precision::BF16, fp8 = Precision::FP8;
        guarded("tiny bf16", [&] { check_low_precision("tiny B=2 T=12 bf16", tiny, bf16, 2, 12, 11); });
        guarded("plain bf16", [&] { check_low_precision("plain B=3 T=70 bf16", plain, bf16, 3, 70, 12); });
        guarded("routed bf16", [&] { check_low_precision("routed B=2 T=20 bf16", routed, bf16, 2, 20, 13); });
        guarded("tiny16 fp8", [&] { check_low_precision("tiny16 B=2 T=40 fp8", tiny16, fp8, 2, 40, 15); });
        const Precision fp32 = Precision::FP32;
        guarded("tiny recompute", [&] { check_recompute("tiny B=2 T=12", tiny, fp32, 2, 12, 16); });
        guarded("routed recompute", [&] { check_recompute("routed B=2 T=20", routed, fp32, 2, 20, 17); });
        guarded("dense recompute", [&] { check_recompute("dense B=2 T=9", dense, fp32, 2, 9, 18); });
        guarded("tiny bf16 recompute", [&] { check_recompute("tiny B=2 T=12 bf16", tiny, bf16, 2, 12, 19); });
        guarded("tiny16 fp8 recompute", [&] { check_recompute("tiny16 B=2 T=40 fp8", tiny16, fp8, 2, 40, 20); });
        guarded("errors", [&] { check_errors(tiny); });
        Config three = tiny;  // 3 layers: a first, a middle and a last stage
        three.num_hidden_layers = 3;
        ActivationLayout recomputing;
        recomputing.recompute = true;
        guarded("stages", [&] {
            check_stage("stage [0, 1) of 3 layers", three, 0, 1, {});
            check_stage("stage [1, 2) of 3 layers", three, 1, 2, {});
            check_stage("stage [2, 3) of 3 layers", three, 2, 3, {});
            check_stage("stage [1, 3) of 3 layers recompute", three, 1, 3, recomputing);
        });
    }
    try {  // an error on one rank would leave the others waiting in a collective: end the whole job
        check_distributed(*comm);
    } catch (const std::exception& e) {
        comm->abort(std::string("distributed check: ") + e.what());
    }
    int64_t status = failed;
    comm->all_reduce_sum(&status, 1, Group::World);
    if (comm->rank == 0)
        printf("gpu_model_emulated_check: world %d (EP %d x DP %d): %d checks passed, %d failed, %s\n", comm->world,
               comm->ep_size, comm->dp_size, passed, failed, status ? "FAILED" : "ok");
    return status ? 1 : 0;
}
