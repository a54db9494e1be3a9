// test_gpu: every kernel of kernels/ against the CPU reference of model/ and comm/ (DESIGN §5).
// Fresh random inputs (model/rng.h, never zeros); outputs are poisoned first (0xFF bytes: NaN for floats, -1 for
// integers), so a value the kernel forgets to write fails; accumulated outputs start from random values instead.
// Error: max_i |gpu_i - cpu_i| / max_i |cpu_i|, relative to the tensor's scale (a per-element relative error
// means nothing near zero); a NaN or Inf from the GPU is an infinite error. Tolerances, with FP32 roundoff u = 6e-8:
//   0      the same operations in the same order: copies, sums in token / j order, the integer plan, the
//          router's choice (router_select run on the GPU's scores on both sides)
//   1e-6   elementwise, one or two roundings that differ (device expf is within 2 ulp; FMA contraction)
//   1e-5   longer elementwise chains, reductions over up to ~1000 terms in another order (typically sqrt(n) u)
//   1e-4   reductions over thousands of terms (bounded by ~n u)
//   1e-12  sums in double of squares that are exact in double (the gradient norm)
// One line per check, then `tests: N passed, M failed`; exit 1 on any failure or when there is no GPU.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/expert_plan.h"
#include "kernels/adamw.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/embedding.cuh"
#include "kernels/permute.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/router.cuh"
#include "kernels/swiglu.cuh"
#include "model/ops.h"
#include "model/optimizer.h"
#include "model/rng.h"
#include "model/moe.h"
#include "model/router.h"

static int passed = 0, failed = 0;

// A device copy of a host vector (or n uninitialised values), freed on scope exit.
template <typename T>
struct Dev {
    T* ptr = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, (n > 0 ? n : 1) * sizeof(T))); }
    explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
        CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~Dev() { CUDA_CHECK(cudaFree(ptr)); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    void poison() { CUDA_CHECK(cudaMemset(ptr, 0xFF, n * sizeof(T))); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

static std::string fmt(const char* format, ...) {
    char buf[256];
    va_list args;
    va_start(args, format);
    vsnprintf(buf, sizeof buf, format, args);
    va_end(args);
    return buf;
}

template <typename T>
static void check(const std::string& name, const std::vector<T>& got, const std::vector<T>& want, double tol) {
    double err = got.size() == want.size() ? 0.0 : INFINITY, scale = 0.0;
    for (size_t i = 0; i < got.size() && i < want.size(); i++) {
        double e = std::isfinite((double)got[i]) ? std::fabs((double)got[i] - (double)want[i]) : INFINITY;
        if (!(e <= err)) err = e;  // keeps a NaN
        scale = std::max(scale, std::fabs((double)want[i]));
    }
    if (scale > 0) err /= scale;
    const bool ok = err <= tol;
    printf("%-62s max err %9.2e  tol %6.0e  %s\n", name.c_str(), err, tol, ok ? "ok" : "FAIL");
    (ok ? passed : failed)++;
}

static std::vector<float> randn(size_t n, Rng& rng, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * rng.normal();
    return v;
}

static void test_embedding(Rng& rng) {
    struct Case { int64_t V, d, M; };
    for (Case tc : {Case{1001, 771, 3001}, Case{50, 33, 7}}) {
        const std::string shape = fmt("(V=%ld d=%ld M=%ld)", tc.V, tc.d, tc.M);
        std::vector<int32_t> tokens(tc.M);
        for (int32_t& t : tokens) t = (int32_t)(rng.next_u64() % tc.V);
        std::vector<float> embed = randn(tc.V * tc.d, rng), dout = randn(tc.M * tc.d, rng);
        std::vector<float> dembed = randn(tc.V * tc.d, rng), out(tc.M * tc.d);
        Dev<int32_t> d_tokens(tokens);
        Dev<float> d_embed(embed), d_out(out.size()), d_dout(dout), d_dembed(dembed);
        embedding_forward(out.data(), tokens.data(), embed.data(), tc.M, tc.d);
        d_out.poison();
        gpu::embedding_forward(d_out.ptr, d_tokens.ptr, d_embed.ptr, tc.M, tc.d, 0);
        check("embedding_forward out " + shape, d_out.get(), out, 0);
        embedding_backward(dembed.data(), dout.data(), tokens.data(), tc.M, tc.d);
        gpu::embedding_backward(d_dembed.ptr, d_dout.ptr, d_tokens.ptr, tc.M, tc.d, 0);
        check("embedding_backward dembed += " + shape, d_dembed.get(), dembed, 0);
    }
}

static void test_rmsnorm(Rng& rng) {
    struct Case { int64_t M, C; bool accumulate; };
    for (Case tc : {Case{1537, 1031, false}, Case{5, 37, true}, Case{300, 7168, true}}) {
        const std::string shape = fmt("(M=%ld C=%ld%s)", tc.M, tc.C, tc.accumulate ? " +=" : "");
        std::vector<float> inp = randn(tc.M * tc.C, rng), w = randn(tc.C, rng, 0.1f), dout = randn(tc.M * tc.C, rng);
        for (float& x : w) x += 1.0f;
        for (int64_t m = 0; m < tc.M; m++) {  // rows of very different scales
            const float row_scale = expf(3.0f * rng.uniform() - 1.5f);
            for (int64_t c = 0; c < tc.C; c++) inp[m * tc.C + c] *= row_scale;
        }
        std::vector<float> out(tc.M * tc.C), rstd(tc.M), dinp = randn(tc.M * tc.C, rng), dw = randn(tc.C, rng);
        Dev<float> d_inp(inp), d_w(w), d_dout(dout), d_out(out.size()), d_rstd(rstd.size()), d_dinp(dinp), d_dw(dw);
        Dev<float> scratch(gpu::rmsnorm_backward_scratch_floats(tc.M, tc.C));
        rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), tc.M, tc.C, 1e-6f);
        d_out.poison();
        d_rstd.poison();
        gpu::rmsnorm_forward(d_out.ptr, d_rstd.ptr, d_inp.ptr, d_w.ptr, tc.M, tc.C, 1e-6f, 0);
        const double forward_tol = tc.C > 1000 ? 1e-4 : 1e-5;  // mean(x^2) is a reduction over C terms
        check("rmsnorm_forward out " + shape, d_out.get(), out, forward_tol);
        check("rmsnorm_forward rstd " + shape, d_rstd.get(), rstd, forward_tol);
        rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), tc.M, tc.C,
                         tc.accumulate);
        if (!tc.accumulate) d_dinp.poison();
        scratch.poison();
        gpu::rmsnorm_backward(d_dinp.ptr, d_dw.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr, d_rstd.ptr, tc.M, tc.C,
                              tc.accumulate, scratch.ptr, 0);
        check("rmsnorm_backward dinp " + shape, d_dinp.get(), dinp, 1e-4);
        check("rmsnorm_backward dw += " + shape, d_dw.get(), dw, 1e-4);
    }
}

static void test_swiglu(Rng& rng) {
    for (int64_t n : {int64_t(1000003), int64_t(37)}) {
        const std::string shape = fmt("(n=%ld)", n);
        std::vector<float> g = randn(n, rng, 3.0f), u = randn(n, rng), dout = randn(n, rng);
        std::vector<float> out(n), dg(n), du(n);
        Dev<float> d_g(g), d_u(u), d_dout(dout), d_out(n), d_dg(n), d_du(n);
        swiglu_forward(out.data(), g.data(), u.data(), n);
        swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), n);
        d_out.poison();
        d_dg.poison();
        d_du.poison();
        gpu::swiglu_forward(d_out.ptr, d_g.ptr, d_u.ptr, n, 0);
        gpu::swiglu_backward(d_dg.ptr, d_du.ptr, d_dout.ptr, d_g.ptr, d_u.ptr, n, 0);
        check("swiglu_forward out " + shape, d_out.get(), out, 1e-5);
        check("swiglu_backward dg " + shape, d_dg.get(), dg, 1e-5);
        check("swiglu_backward du " + shape, d_du.get(), du, 1e-5);
    }
}

// Rows with target -1 (every ignore_every-th) are ignored; row 1 is shifted by +1000 (needs the max subtraction).
static void test_cross_entropy(Rng& rng) {
    struct Case { int64_t M, V; float loss_scale; int ignore_every; };
    for (Case tc : {Case{67, 50257, 1.0f / 67, 1000}, Case{300, 1023, 0.5f, 7}}) {
        const std::string shape = fmt("(M=%ld V=%ld)", tc.M, tc.V);
        std::vector<float> logits = randn(tc.M * tc.V, rng, 3.0f);
        for (int64_t v = 0; v < tc.V; v++) logits[tc.V + v] += 1000.0f;
        std::vector<int32_t> targets(tc.M);
        for (int64_t m = 0; m < tc.M; m++)
            targets[m] = m % tc.ignore_every == 3 ? -1 : (int32_t)(rng.next_u64() % tc.V);
        std::vector<float> losses(tc.M), dlogits(tc.M * tc.V);
        for (int64_t m = 0; m < tc.M; m++)  // row by row, for the per-row losses
            losses[m] = (float)cross_entropy_forward_backward(dlogits.data() + m * tc.V, logits.data() + m * tc.V,
                                                              &targets[m], 1, tc.V, tc.loss_scale);
        Dev<float> d_logits(logits), d_losses(tc.M), d_dlogits(dlogits.size());
        Dev<int32_t> d_targets(targets);
        d_losses.poison();
        d_dlogits.poison();
        gpu::cross_entropy_forward_backward(d_losses.ptr, d_dlogits.ptr, d_logits.ptr, d_targets.ptr, tc.M, tc.V,
                                            tc.loss_scale, 0);
        check("cross_entropy losses " + shape, d_losses.get(), losses, 1e-5);
        check("cross_entropy dlogits " + shape, d_dlogits.get(), dlogits, 1e-4);
        d_losses.poison();
        gpu::cross_entropy_forward_backward(d_losses.ptr, nullptr, d_logits.ptr, d_targets.ptr, tc.M, tc.V,
                                            tc.loss_scale, 0);
        check("cross_entropy losses, no dlogits " + shape, d_losses.get(), losses, 1e-5);
    }
}

// The `small` model's parameter table: trainable and frozen tensors, with and without weight decay.
static void test_adamw(Rng& rng) {
    const Config config = load_config("small");
    const ParamTable table = build_param_table(config);
    const int64_t n = table.total;
    OptimizerConfig oc;
    AdamWState state;
    state.step = 6;
    std::vector<float> params = randn(n, rng, 0.1f), grads = randn(n, rng, 0.01f);
    state.m = randn(n, rng, 0.001f);
    state.v = randn(n, rng, 0.001f);
    for (float& x : state.v) x *= x;
    Dev<float> d_params(params), d_grads(grads), d_m(state.m), d_v(state.v);
    const float lr = 1e-3f, multiplier = 0.37f;
    adamw_update(table, params.data(), grads.data(), state, oc, lr, multiplier);
    gpu::adamw_update(table, d_params.ptr, d_grads.ptr, d_m.ptr, d_v.ptr, oc, lr, state.step, multiplier, 0);
    const std::string shape = fmt("(small: %ld values, step %ld)", n, state.step);
    check("adamw params " + shape, d_params.get(), params, 1e-6);
    check("adamw m " + shape, d_m.get(), state.m, 1e-6);
    check("adamw v " + shape, d_v.get(), state.v, 1e-6);

    for (int64_t count : {n, int64_t(12345)}) {
        Dev<double> d_sumsq(1), scratch(gpu::grad_norm_scratch_doubles(count));
        d_sumsq.poison();
        scratch.poison();
        gpu::grad_norm_squared(d_sumsq.ptr, d_grads.ptr, count, scratch.ptr, 0);
        const std::vector<double> got = {std::sqrt(d_sumsq.get()[0])}, want = {global_grad_norm(grads.data(), count)};
        check(fmt("global grad norm (n=%ld)", count), got, want, 1e-12);
    }
}

// Group-limited and plain routing, with and without normalised gates. Every fourth token's logits are rounded to
// multiples of 1/2, so ties in scores (and group scores) occur. alpha is large where set, so that the balance term
// is of the gate term's size and shows in a scale-relative comparison.
static void test_router(Rng& rng) {
    struct Case { int E, G, topk_group, k; bool norm; float scaling, alpha; int64_t B, T; };
    for (Case tc : {Case{64, 8, 3, 6, true, 2.5f, 2000.0f, 3, 171}, Case{37, 1, 1, 5, false, 1.0f, 0.0f, 2, 129},
                   Case{256, 8, 4, 8, true, 2.5f, 5000.0f, 2, 300}}) {
        Config c;
        c.n_routed_experts = tc.E;
        c.n_group = tc.G;
        c.topk_group = tc.topk_group;
        c.num_experts_per_tok = tc.k;
        c.norm_topk_prob = tc.norm;
        c.routed_scaling_factor = tc.scaling;
        c.aux_loss_alpha = tc.alpha;
        const int64_t N = tc.B * tc.T, E = tc.E;
        const float balance_scale = 0.5f;
        const std::string shape = fmt("(E=%d G=%d/%d k=%d N=%ld%s)", tc.E, tc.G, tc.topk_group, tc.k, N,
                                      tc.norm ? " norm" : "");
        std::vector<float> logits = randn(N * E, rng, 2.0f), bias = randn(E, rng, 0.1f);
        for (int64_t t = 0; t < N; t += 4)
            for (int64_t e = 0; e < E; e++) logits[t * E + e] = std::round(2.0f * logits[t * E + e]) / 2.0f;
        std::vector<float> scores(N * E);
        for (int64_t i = 0; i < N * E; i++) scores[i] = sigmoidf_(logits[i]);
        Dev<float> d_logits(logits), d_bias(bias), d_scores(N * E), d_weights(N * tc.k), scratch(N * E);
        Dev<int32_t> d_chosen(N * tc.k);
        d_scores.poison();
        d_weights.poison();
        d_chosen.poison();
        gpu::router_forward(d_scores.ptr, d_chosen.ptr, d_weights.ptr, scratch.ptr, d_logits.ptr, d_bias.ptr, c, N, 0);
        const std::vector<float> gpu_scores = d_scores.get();
        check("router_forward scores " + shape, gpu_scores, scores, 1e-6);
        // the selection on the GPU's scores, so that a 1-ulp difference in a sigmoid cannot flip a near tie
        std::vector<int32_t> chosen(N * tc.k);
        std::vector<float> weights(N * tc.k), select_scratch(E);
        for (int64_t t = 0; t < N; t++)
            router_select(c, gpu_scores.data() + t * E, bias.data(), select_scratch.data(), chosen.data() + t * tc.k,
                          weights.data() + t * tc.k);
        const std::vector<int32_t> gpu_chosen = d_chosen.get();
        check("router_forward chosen " + shape, gpu_chosen, chosen, 0);
        check("router_forward gate weights " + shape, d_weights.get(), weights, 1e-6);

        std::vector<float> dgw = randn(N * tc.k, rng);
        std::vector<float> dlogits(N * E);
        router_backward(c, gpu_scores.data(), gpu_chosen.data(), dgw.data(), dlogits.data(), tc.B, tc.T, balance_scale);
        Dev<float> d_dgw(dgw), d_dlogits(N * E);
        Dev<int> counts_scratch(tc.B * E);
        d_dlogits.poison();
        gpu::router_backward(d_dlogits.ptr, d_dgw.ptr, d_scores.ptr, d_chosen.ptr, c, tc.B, tc.T, balance_scale,
                             counts_scratch.ptr, 0);
        check("router_backward dlogits " + shape, d_dlogits.get(), dlogits, 1e-5);
    }
}

// Each token picks k distinct experts, never experts 3, 8 or the last one, so some experts get no rows.
static void test_permute(Rng& rng) {
    struct Case { int64_t N; int k, E; int64_t d; bool accumulate; };
    for (Case c : {Case{1001, 6, 37, 259, true}, Case{4099, 8, 256, 67, false}}) {
        const int64_t n = c.N * c.k, d = c.d;
        const std::string shape = fmt("(N=%ld k=%d E=%d d=%ld%s)", c.N, c.k, c.E, d, c.accumulate ? " +=" : "");
        std::vector<int32_t> chosen(n);
        for (int64_t t = 0; t < c.N; t++)
            for (int j = 0; j < c.k; j++) {
                int32_t e;
                bool taken;
                do {
                    e = (int32_t)(rng.next_u64() % c.E);
                    taken = e == 3 || e == 8 || e == c.E - 1;
                    for (int i = 0; i < j; i++) taken = taken || chosen[t * c.k + i] == e;
                } while (taken);
                chosen[t * c.k + j] = e;
            }
        const ExpertPlan plan = build_expert_plan(chosen.data(), n, c.E);
        Dev<int32_t> d_chosen(chosen);
        Dev<int64_t> d_counts(c.E), d_offsets(c.E + 1), d_row_of_slot(n), d_slot_of_row(n);
        d_counts.poison();
        d_offsets.poison();
        d_row_of_slot.poison();
        d_slot_of_row.poison();
        gpu::expert_plan_build(d_counts.ptr, d_offsets.ptr, d_row_of_slot.ptr, d_slot_of_row.ptr, d_chosen.ptr, n,
                               c.E, 0);
        check("expert_plan counts " + shape, d_counts.get(), plan.counts, 0);
        check("expert_plan offsets " + shape, d_offsets.get(), plan.offsets, 0);
        check("expert_plan row_of_slot " + shape, d_row_of_slot.get(), plan.row_of_slot, 0);
        check("expert_plan slot_of_row " + shape, d_slot_of_row.get(), plan.slot_of_row, 0);

        // gather: rows[r] = x[slot_of_row[r] / k]; backward dx[t] (=|+=) sum_j drows[row_of_slot[t*k+j]]
        std::vector<float> x = randn(c.N * d, rng), rows(n * d), drows = randn(n * d, rng), dx = randn(c.N * d, rng);
        Dev<float> d_x(x), d_rows(rows.size()), d_drows(drows), d_dx(dx);
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < d; i++) rows[r * d + i] = x[plan.slot_of_row[r] / c.k * d + i];
        for (int64_t t = 0; t < c.N; t++)
            for (int64_t i = 0; i < d; i++) {
                float acc = c.accumulate ? dx[t * d + i] : 0.0f;
                for (int j = 0; j < c.k; j++) acc += drows[plan.row_of_slot[t * c.k + j] * d + i];
                dx[t * d + i] = acc;
            }
        d_rows.poison();
        if (!c.accumulate) d_dx.poison();
        gpu::gather_forward(d_rows.ptr, d_x.ptr, d_slot_of_row.ptr, c.N, c.k, d, 0);
        gpu::gather_backward(d_dx.ptr, d_drows.ptr, d_row_of_slot.ptr, c.N, c.k, d, c.accumulate, 0);
        check("gather_forward rows " + shape, d_rows.get(), rows, 0);
        check("gather_backward dx " + shape, d_dx.get(), dx, 0);

        // combine: out[t] (=|+=) sum_j w_tj rows[row(t,j)]; backward drows[row] = w dout[t], dw = dout[t] . rows[row]
        std::vector<float> w = randn(n, rng), out = randn(c.N * d, rng), dout = randn(c.N * d, rng);
        std::vector<float> dw(n), drows_combine(n * d);
        Dev<float> d_w(w), d_out(out), d_dout(dout), d_dw(n), d_drows_combine(n * d);
        for (int64_t t = 0; t < c.N; t++)
            for (int j = 0; j < c.k; j++) {
                const int64_t a = t * c.k + j, row = plan.row_of_slot[a];
                float dot = 0.0f;
                for (int64_t i = 0; i < d; i++) {
                    drows_combine[row * d + i] = w[a] * dout[t * d + i];
                    dot += dout[t * d + i] * rows[row * d + i];
                }
                dw[a] = dot;
            }
        for (int64_t t = 0; t < c.N; t++)
            for (int64_t i = 0; i < d; i++) {
                float acc = c.accumulate ? out[t * d + i] : 0.0f;
                for (int j = 0; j < c.k; j++) acc += w[t * c.k + j] * rows[plan.row_of_slot[t * c.k + j] * d + i];
                out[t * d + i] = acc;
            }
        if (!c.accumulate) d_out.poison();
        d_dw.poison();
        d_drows_combine.poison();
        gpu::combine_forward(d_out.ptr, d_rows.ptr, d_w.ptr, d_row_of_slot.ptr, c.N, c.k, d, c.accumulate, 0);
        gpu::combine_backward(d_drows_combine.ptr, d_dw.ptr, d_dout.ptr, d_rows.ptr, d_w.ptr, d_row_of_slot.ptr, c.N,
                              c.k, d, 0);
        check("combine_forward out " + shape, d_out.get(), out, 1e-5);
        check("combine_backward drows " + shape, d_drows_combine.get(), drows_combine, 0);
        check("combine_backward dweights " + shape, d_dw.get(), dw, 1e-5);
    }
}

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("test_gpu: no CUDA GPU found\n");
        return 1;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("test_gpu on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    Rng rng(20261201);
    test_embedding(rng);
    test_rmsnorm(rng);
    test_swiglu(rng);
    test_cross_entropy(rng);
    test_adamw(rng);
    test_router(rng);
    test_permute(rng);
    printf("tests: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
