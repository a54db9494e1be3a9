// The kernel checks of test_gpu (make test-gpu; test/test_gpu.cu): every kernel of kernels/ against the CPU
// reference of model/ and comm/ (docs/design.md §5). The same checks run on the CPU in test_cpu, through the kernel emulator
// (test/kernel_emulator/: ./test_gpu_emulated).
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
// One line per check.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_bf16.h>

#include "model/expert_plan.h"
#include "test/gpu_check.cuh"
#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/fp8.cuh"
#include "kernels/matmul.cuh"
#include "kernels/permute.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/router.cuh"
#include "kernels/swiglu.cuh"
#include "model/fp8.h"
#include "model/mla.h"
#include "model/ops.h"
#include "model/optimizer.h"
#include "model/rng.h"
#include "model/moe.h"
#include "model/rope.h"
#include "model/router.h"

// x rounded to BF16 (round to nearest even, as __float2bfloat16_rn), as floats
static std::vector<float> bf16_rounded(const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); i++) r[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
    return r;
}
static std::vector<float> widened(const std::vector<__nv_bfloat16>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); i++) r[i] = __bfloat162float(x[i]);
    return r;
}

static void test_embedding(Rng& rng) {
    struct Case { int64_t V, d, M; };
    // many distinct tokens; few rows; three tokens repeated hundreds of times over more columns than a block has
    for (Case tc : {Case{1001, 771, 3001}, Case{50, 33, 7}, Case{3, 300, 1000}}) {
        const std::string shape = fmt("(V=%ld d=%ld M=%ld)", tc.V, tc.d, tc.M);
        std::vector<int32_t> tokens(tc.M);
        for (int32_t& t : tokens) t = (int32_t)(rng.next_u64() % tc.V);
        std::vector<float> embed = randn(tc.V * tc.d, rng), dout = randn(tc.M * tc.d, rng);
        std::vector<float> dembed = randn(tc.V * tc.d, rng), out(tc.M * tc.d);
        DeviceArray<int32_t> d_tokens(tokens);
        DeviceArray<float> d_embed(embed), d_out(out.size()), d_dout(dout), d_dembed(dembed);
        embedding_forward(out.data(), tokens.data(), embed.data(), tc.M, tc.d);
        d_out.poison();
        gpu::embedding_forward(d_out.ptr, d_tokens.ptr, d_embed.ptr, tc.M, tc.d, 0);
        check("embedding_forward out " + shape, d_out.get(), out, 0);
        embedding_backward(dembed.data(), dout.data(), tokens.data(), tc.M, tc.d);
        std::vector<int32_t> packed(3 * tc.M + 1);
        const int64_t distinct = gpu::token_rows_pack(tokens.data(), tc.M, packed.data());
        DeviceArray<int32_t> d_packed(packed);
        gpu::embedding_backward(d_dembed.ptr, d_dout.ptr, gpu::TokenRows{d_packed.ptr, tc.M, distinct}, tc.d, 0);
        check("embedding_backward dembed += " + shape, d_dembed.get(), dembed, 0);
    }
}

// a block of columns out of wider rows into narrower ones (MLA's c_kv out of kv_a): many rows, more columns than
// a thread block has threads; the columns around the block untouched
static void test_copy_columns(Rng& rng) {
    struct Case { int64_t rows, cols, src_ld, dst_ld, src_at, dst_at; };
    for (Case tc : {Case{4099, 3, 7, 5, 2, 1}, Case{33, 600, 640, 601, 40, 1}, Case{1, 1, 1, 1, 0, 0}}) {
        const std::string shape = fmt("(rows=%ld cols=%ld)", tc.rows, tc.cols);
        const std::vector<float> src = randn(tc.rows * tc.src_ld, rng), dst0 = randn(tc.rows * tc.dst_ld, rng);
        std::vector<float> want = dst0;
        for (int64_t r = 0; r < tc.rows; r++)
            for (int64_t c = 0; c < tc.cols; c++)
                want[r * tc.dst_ld + tc.dst_at + c] = src[r * tc.src_ld + tc.src_at + c];
        DeviceArray<float> d_src(src), d_dst(dst0);
        gpu::copy_columns(d_dst.ptr + tc.dst_at, tc.dst_ld, d_src.ptr + tc.src_at, tc.src_ld, tc.rows, tc.cols, 0);
        check("copy_columns " + shape, d_dst.get(), want, 0);
    }
}

// rows sent up together put at their offsets (the router biases into the parameters): out of order, wider than a
// thread block, and the values between them untouched
static void test_put_rows(Rng& rng) {
    const int64_t rows = 3, cols = 300;
    const std::vector<int64_t> offsets = {1700, 5, 900};
    const std::vector<float> src = randn(rows * cols, rng), dst0 = randn(2100, rng);
    std::vector<float> want = dst0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) want[offsets[r] + c] = src[r * cols + c];
    DeviceArray<float> d_src(src), d_dst(dst0);
    DeviceArray<int64_t> d_offsets(offsets);
    gpu::put_rows(d_dst.ptr, d_offsets.ptr, d_src.ptr, rows, cols, 0);
    check("put_rows (rows=3 cols=300)", d_dst.get(), want, 0);
}

// a pipeline stage's last residual add: sizes below one thread block, and above the grid's 4096 blocks (a stride)
static void test_add(Rng& rng) {
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t(4096) * 256 + 77}) {
        const std::vector<float> a = randn(n, rng), b = randn(n, rng);
        std::vector<float> want(n);
        for (int64_t i = 0; i < n; i++) want[i] = a[i] + b[i];
        DeviceArray<float> d_a(a), d_b(b), d_out(std::vector<float>(n, 0.0f));
        gpu::add(d_out.ptr, d_a.ptr, d_b.ptr, n, 0);
        check("add (n=" + std::to_string(n) + ")", d_out.get(), want, 0);
    }
}

static void test_rmsnorm(Rng& rng) {
    struct Case { int64_t M, C; bool accumulate; };
    for (Case tc : {Case{1537, 1031, false}, Case{5, 37, true}, Case{300, 7168, true}}) {
        const std::string shape = fmt("(M=%ld C=%ld%s)", tc.M, tc.C, tc.accumulate ? " +=" : "");
        std::vector<float> inp = randn(tc.M * tc.C, rng), w = randn(tc.C, rng, 0.1f), dout = randn(tc.M * tc.C, rng);
        for (float& x : w) x += 1.0f;
        for (int64_t m = 0; m < tc.M; m++) {  // rows of very different scales; every 4th with mean(x^2) near eps
            const float row_scale = expf(3.0f * rng.uniform() - 1.5f) * (m % 4 == 3 ? 1e-3f : 1.0f);
            for (int64_t c = 0; c < tc.C; c++) inp[m * tc.C + c] *= row_scale;
        }
        std::vector<float> out(tc.M * tc.C), rstd(tc.M), dinp = randn(tc.M * tc.C, rng), dw = randn(tc.C, rng);
        const std::vector<float> dw0 = dw;
        DeviceArray<float> d_inp(inp), d_w(w), d_dout(dout), d_out(out.size()), d_rstd(rstd.size()), d_dinp(dinp), d_dw(dw);
        DeviceArray<float> scratch(gpu::rmsnorm_backward_scratch_floats(tc.M, tc.C));
        rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), tc.M, tc.C, 1e-6f);
        DeviceArray<__nv_bfloat16> d_out16(out.size());  // the BF16 copy: exactly the FP32 output rounded
        d_out.poison();
        d_out16.poison();
        d_rstd.poison();
        gpu::rmsnorm_forward(d_out.ptr, d_out16.ptr, d_rstd.ptr, d_inp.ptr, d_w.ptr, tc.M, tc.C, 1e-6f, 0);
        const double forward_tol = tc.C > 1000 ? 1e-4 : 1e-5;  // mean(x^2) is a reduction over C terms
        check("rmsnorm_forward out " + shape, d_out.get(), out, forward_tol);
        check("rmsnorm_forward rstd " + shape, d_rstd.get(), rstd, forward_tol);
        check("rmsnorm_forward out16 = out rounded " + shape, widened(d_out16.get()), bf16_rounded(d_out.get()), 0);
        // the fused residual form, sum = a + b written in place over a (the aliasing the contract allows)
        std::vector<float> b = randn(tc.M * tc.C, rng), a(tc.M * tc.C), sum(tc.M * tc.C);
        for (int64_t i = 0; i < tc.M * tc.C; i++) a[i] = inp[i] - b[i];
        for (int64_t i = 0; i < tc.M * tc.C; i++) sum[i] = a[i] + b[i];
        rmsnorm_forward(out.data(), rstd.data(), sum.data(), w.data(), tc.M, tc.C, 1e-6f);
        DeviceArray<float> d_a(a), d_b(b);
        d_out.poison();
        d_out16.poison();
        d_rstd.poison();
        gpu::residual_rmsnorm_forward(d_a.ptr, d_out.ptr, d_out16.ptr, d_rstd.ptr, d_a.ptr, d_b.ptr, d_w.ptr, tc.M,
                                      tc.C, 1e-6f, 0);
        check("residual_rmsnorm_forward sum " + shape, d_a.get(), sum, 0);
        check("residual_rmsnorm_forward out " + shape, d_out.get(), out, forward_tol);
        check("residual_rmsnorm_forward rstd " + shape, d_rstd.get(), rstd, forward_tol);
        check("residual_rmsnorm_forward out16 = out rounded " + shape, widened(d_out16.get()),
              bf16_rounded(d_out.get()), 0);
        // the backward below takes the plain forward's rstd
        rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), tc.M, tc.C, 1e-6f);
        gpu::rmsnorm_forward(d_out.ptr, nullptr, d_rstd.ptr, d_inp.ptr, d_w.ptr, tc.M, tc.C, 1e-6f, 0);
        rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), tc.M, tc.C,
                         tc.accumulate);
        if (!tc.accumulate) d_dinp.poison();
        scratch.poison();
        gpu::rmsnorm_backward(d_dinp.ptr, d_dw.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr, d_rstd.ptr, tc.M, tc.C,
                              tc.accumulate ? d_dinp.ptr : nullptr, scratch.ptr, 0);
        check("rmsnorm_backward dinp " + shape, d_dinp.get(), dinp, 1e-4);
        check("rmsnorm_backward dw += " + shape, d_dw.get(), dw, 1e-4);
        // dw = (the first contribution of a step): written without reading the NaNs there
        d_dw.poison();
        gpu::rmsnorm_backward(d_dinp.ptr, d_dw.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr, d_rstd.ptr, tc.M, tc.C, nullptr,
                              scratch.ptr, 0, /*accumulate_dw*/ false);
        std::vector<float> dw_set = d_dw.get();
        for (int64_t c = 0; c < tc.C; c++) dw_set[c] += dw0[c];
        check("rmsnorm_backward dw = " + shape, dw_set, dw, 1e-4);
    }
    DeviceArray<float> d_dw(7);  // no rows: dw = sets zeros
    d_dw.poison();
    gpu::rmsnorm_backward(nullptr, d_dw.ptr, nullptr, nullptr, nullptr, nullptr, 0, 7, nullptr, nullptr, 0, false);
    check("rmsnorm_backward dw = with M=0", d_dw.get(), std::vector<float>(7, 0.0f), 0);
}

static void test_swiglu(Rng& rng) {
    for (int64_t n : {int64_t(1000003), int64_t(37)}) {
        const std::string shape = fmt("(n=%ld)", n);
        std::vector<float> g = randn(n, rng, 3.0f), u = randn(n, rng), dout = randn(n, rng);
        std::vector<float> out(n), dg(n), du(n);
        DeviceArray<float> d_g(g), d_u(u), d_dout(dout), d_out(n), d_dg(n), d_du(n);
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
        DeviceArray<__nv_bfloat16> d_out16(n);
        d_out16.poison();
        gpu::swiglu_forward_bf16(d_out16.ptr, d_g.ptr, d_u.ptr, n, 0);
        check("swiglu_forward_bf16 out = the FP32 kernel's rounded " + shape, widened(d_out16.get()),
              bf16_rounded(d_out.get()), 0);
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
        DeviceArray<float> d_logits(logits), d_losses(tc.M), d_dlogits(dlogits.size());
        DeviceArray<int32_t> d_targets(targets);
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
        DeviceArray<__nv_bfloat16> d_dlogits16(dlogits.size());  // the BF16 form: the same gradients rounded
        d_losses.poison();
        d_dlogits16.poison();
        gpu::cross_entropy_forward_backward_bf16(d_losses.ptr, d_dlogits16.ptr, d_logits.ptr, d_targets.ptr, tc.M,
                                                 tc.V, tc.loss_scale, 0);
        check("cross_entropy_bf16 losses " + shape, d_losses.get(), losses, 1e-5);
        check("cross_entropy_bf16 dlogits16 = dlogits rounded " + shape, widened(d_dlogits16.get()),
              bf16_rounded(d_dlogits.get()), 0);
    }
}

// The `small` model's parameter table: trainable and frozen tensors, with and without weight decay; the shard of
// one rank (whole tensors) and of rank 1 of 3 (pieces of buckets, a tail, the moments packed).
static void test_adamw(Rng& rng) {
    const Config config = load_config("small");
    const ParamTable table = build_param_table(config);
    const int64_t n = table.total;
    OptimizerConfig oc;
    const std::vector<float> params0 = randn(n, rng, 0.1f), grads = randn(n, rng, 0.01f);
    std::vector<float> m0 = randn(n, rng, 0.001f), v0 = randn(n, rng, 0.001f);
    for (float& x : v0) x *= x;
    DeviceArray<float> d_grads(grads);
    for (int ranks : {1, 3}) {
        const int rank = ranks > 1 ? 1 : 0;
        const OptimizerShard shard = optimizer_shard(table, ranks, rank, ranks, rank);
        const std::vector<int64_t> packed = gpu::shard_ranges_pack(shard);
        DeviceArray<int64_t> d_table(packed);
        const gpu::ShardRanges ranges = gpu::shard_ranges_of(packed, d_table.ptr);
        // both keep the moments of the shard's ranges alone, packed: m0 and v0's values of those ranges
        auto pack_moments = [&](const std::vector<float>& x) { return shard_pack(shard, x.data()); };
        AdamWState state{pack_moments(m0), pack_moments(v0), 6};
        std::vector<float> params = params0;
        DeviceArray<float> d_params(params), d_m(state.m), d_v(state.v);
        const float lr = 1e-3f, multiplier = 0.37f;
        adamw_update(shard, params.data(), grads.data(), state, oc, lr, multiplier);
        gpu::adamw_update(ranges, d_params.ptr, (__nv_bfloat16*)nullptr, nullptr, 0, d_grads.ptr, d_m.ptr, d_v.ptr, oc,
                          lr, state.step, multiplier, 0);
        const std::string shape =
            fmt("(small: %ld values, %ld ranges of rank %d of %d, step %ld)", n, ranges.ranges, rank, ranks, state.step);
        check("adamw params " + shape, d_params.get(), params, 1e-6);
        check("adamw m " + shape, d_m.get(), state.m, 1e-6);
        check("adamw v " + shape, d_v.get(), state.v, 1e-6);

        // BF16 mode: the update reads and writes the master shard, then writes the working copy of its ranges, FP32
        // before fp32_total and BF16 after it; everything else (other ranks' pieces, frozen tensors, the alignment
        // gaps) is left as it was (poison: NaN)
        const int64_t f = table.fp32_total;
        DeviceArray<float> d_master(pack_moments(params0)), d_working(f);
        DeviceArray<float> d_m2(pack_moments(m0)), d_v2(pack_moments(v0));
        DeviceArray<__nv_bfloat16> d_working16(n - f);
        d_working.poison();
        d_working16.poison();
        gpu::adamw_update(ranges, d_working.ptr, d_working16.ptr, d_master.ptr, f, d_grads.ptr, d_m2.ptr, d_v2.ptr, oc,
                          lr, state.step, multiplier, 0);
        const std::vector<float> master = d_master.get();
        check("adamw master shard " + shape, master, pack_moments(params), 1e-6);
        std::vector<float> got(n), want(n, NAN);
        const std::vector<float> got_fp32 = d_working.get(), got16 = widened(d_working16.get());
        std::copy(got_fp32.begin(), got_fp32.end(), got.begin());
        std::copy(got16.begin(), got16.end(), got.begin() + f);
        for (const OptimizerRange& r : shard.ranges)
            for (int64_t k = 0; k < r.count; k++) {
                const float updated = master[r.moments + k];
                want[r.first + k] = r.first < f ? updated : __bfloat162float(__float2bfloat16_rn(updated));
            }
        for (int64_t i = 0; i < n; i++)
            if (std::isnan(want[i]) && std::isnan(got[i])) want[i] = got[i] = 0.0f;  // poison left in place
        check("adamw working copy = the master, BF16 for the GEMM weights " + shape, got, want, 0);
        check("adamw, master shard: m " + shape, d_m2.get(), state.m, 1e-6);

        // --moments bf16, from FP32 moments (as after a checkpoint of a run without it): both round them where read.
        // The stored moments may differ by one BF16 step where the GPU's and the CPU's FP32 values fall on either
        // side of a rounding boundary: 2^-8 of the largest.
        OptimizerConfig oc16 = oc;
        oc16.moments = Moments::BF16;
        AdamWState state16{pack_moments(m0), pack_moments(v0), 6};
        std::vector<float> params_b = params0;
        DeviceArray<float> d_params_b(params0);
        std::vector<__nv_bfloat16> m16(shard.moments), v16(shard.moments);
        for (int64_t i = 0; i < shard.moments; i++) {
            m16[i] = __float2bfloat16_rn(state16.m[i]);
            v16[i] = __float2bfloat16_rn(state16.v[i]);
        }
        DeviceArray<__nv_bfloat16> d_m16(m16), d_v16(v16);
        adamw_update(shard, params_b.data(), grads.data(), state16, oc16, lr, multiplier);
        gpu::adamw_update(ranges, d_params_b.ptr, (__nv_bfloat16*)nullptr, nullptr, 0, d_grads.ptr, d_m16.ptr,
                          d_v16.ptr, oc16, lr, state16.step, multiplier, 0);
        check("adamw, BF16 moments: params " + shape, d_params_b.get(), params_b, 1e-6);
        check("adamw, BF16 moments: m " + shape, widened(d_m16.get()), state16.m, 4e-3);
        check("adamw, BF16 moments: v " + shape, widened(d_v16.get()), state16.v, 4e-3);

        // each range's squared norm (over several chunks where a range is longer than one)
        DeviceArray<double> d_norms(ranges.ranges), d_partials(std::max<int64_t>(1, ranges.chunks));
        d_norms.poison();
        d_partials.poison();
        gpu::range_norms_squared(d_norms.ptr, ranges, d_grads.ptr, d_partials.ptr, 0);
        std::vector<double> want_norms;
        for (const OptimizerRange& r : shard.ranges)
            want_norms.push_back(grad_sum_squares(grads.data() + r.first, r.count));
        check("range norms squared " + shape, d_norms.get(), want_norms, 1e-12);
    }
    // one range of all n values (several chunks) and one of 12345
    for (int64_t count : {n, int64_t(12345)}) {
        OptimizerShard one;
        one.ranges.push_back(OptimizerRange{0, count, 0, true, true});
        const std::vector<int64_t> packed = gpu::shard_ranges_pack(one);
        DeviceArray<int64_t> d_table(packed);
        const gpu::ShardRanges ranges = gpu::shard_ranges_of(packed, d_table.ptr);
        DeviceArray<double> d_sumsq(1), partials(ranges.chunks);
        d_sumsq.poison();
        partials.poison();
        gpu::range_norms_squared(d_sumsq.ptr, ranges, d_grads.ptr, partials.ptr, 0);
        const std::vector<double> got = {std::sqrt(d_sumsq.get()[0])},
                                  want = {std::sqrt(grad_sum_squares(grads.data(), count))};
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
        DeviceArray<float> d_logits(logits), d_bias(bias), d_scores(N * E), d_weights(N * tc.k), scratch(N * E);
        DeviceArray<int32_t> d_chosen(N * tc.k);
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
        DeviceArray<float> d_dgw(dgw), d_dlogits(N * E);
        DeviceArray<int> counts_scratch(tc.B * E);
        d_dlogits.poison();
        gpu::router_backward(d_dlogits.ptr, d_dgw.ptr, d_scores.ptr, d_chosen.ptr, c, tc.B, tc.T, balance_scale,
                             counts_scratch.ptr, 0);
        check("router_backward dlogits " + shape, d_dlogits.get(), dlogits, 1e-5);
    }
}

// Each token picks k distinct experts, never experts 3 or 8 (and in two cases not the last one either), so some
// experts get no rows, the last one included (its end offset is then the one before) or not.
static void test_permute(Rng& rng) {
    struct Case { int64_t N; int k, E; int64_t d; bool accumulate, last_idle; };
    // odd widths (the gather copies a value a thread) and 64 (16 bytes a thread, FP32 and BF16)
    for (Case c : {Case{1001, 6, 37, 259, true, true}, Case{4099, 8, 256, 67, false, true},
                   Case{300, 4, 16, 64, false, false}}) {
        const int64_t n = c.N * c.k, d = c.d;
        const std::string shape = fmt("(N=%ld k=%d E=%d d=%ld%s)", c.N, c.k, c.E, d, c.accumulate ? " +=" : "");
        std::vector<int32_t> chosen(n);
        for (int64_t t = 0; t < c.N; t++)
            for (int j = 0; j < c.k; j++) {
                int32_t e;
                bool taken;
                do {
                    e = (int32_t)(rng.next_u64() % c.E);
                    taken = e == 3 || e == 8 || (c.last_idle && e == c.E - 1);
                    for (int i = 0; i < j; i++) taken = taken || chosen[t * c.k + i] == e;
                } while (taken);
                chosen[t * c.k + j] = e;
            }
        const ExpertPlan plan = build_expert_plan(chosen.data(), n, c.E);
        DeviceArray<int32_t> d_chosen(chosen);
        DeviceArray<int64_t> d_counts(c.E), d_offsets(c.E + 1), d_row_of_assignment(n), d_assignment_of_row(n);
        d_counts.poison();
        d_offsets.poison();
        d_row_of_assignment.poison();
        d_assignment_of_row.poison();
        gpu::build_expert_plan(d_counts.ptr, d_offsets.ptr, d_row_of_assignment.ptr, d_assignment_of_row.ptr, d_chosen.ptr, n,
                               c.E, 0);
        check("expert_plan counts " + shape, d_counts.get(), plan.counts, 0);
        check("expert_plan offsets " + shape, d_offsets.get(), plan.offsets, 0);
        check("expert_plan row_of_assignment " + shape, d_row_of_assignment.get(), plan.row_of_assignment, 0);
        check("expert_plan assignment_of_row " + shape, d_assignment_of_row.get(), plan.assignment_of_row, 0);

        // gather: rows[r] = x[assignment_of_row[r] / k]; backward dx[t] (=|+=) sum_j drows[row_of_assignment[t*k+j]]
        std::vector<float> x = randn(c.N * d, rng), rows(n * d), drows = randn(n * d, rng), dx = randn(c.N * d, rng);
        DeviceArray<float> d_x(x), d_rows(rows.size()), d_drows(drows), d_dx(dx);
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < d; i++) rows[r * d + i] = x[plan.assignment_of_row[r] / c.k * d + i];
        for (int64_t t = 0; t < c.N; t++)
            for (int64_t i = 0; i < d; i++) {
                float acc = c.accumulate ? dx[t * d + i] : 0.0f;
                for (int j = 0; j < c.k; j++) acc += drows[plan.row_of_assignment[t * c.k + j] * d + i];
                dx[t * d + i] = acc;
            }
        d_rows.poison();
        if (!c.accumulate) d_dx.poison();
        gpu::permute_forward(d_rows.ptr, d_x.ptr, d_assignment_of_row.ptr, c.N, c.k, d, 0);
        gpu::permute_backward(d_dx.ptr, d_drows.ptr, d_row_of_assignment.ptr, c.N, c.k, d, c.accumulate, 0);
        check("permute_forward rows " + shape, d_rows.get(), rows, 0);
        check("permute_backward dx " + shape, d_dx.get(), dx, 0);
        std::vector<__nv_bfloat16> x16(x.size());  // the BF16 gather (the experts' input rows in BF16 mode)
        for (size_t i = 0; i < x.size(); i++) x16[i] = __float2bfloat16_rn(x[i]);
        DeviceArray<__nv_bfloat16> d_x16(x16), d_rows16(rows.size());
        d_rows16.poison();
        gpu::permute_forward(d_rows16.ptr, d_x16.ptr, d_assignment_of_row.ptr, c.N, c.k, d, 0);
        check("permute_forward rows, BF16 " + shape, widened(d_rows16.get()), bf16_rounded(rows), 0);

        // combine: out[t] (=|+=) sum_j w_tj rows[row(t,j)]; backward drows[row] = w dout[t], dw = dout[t] . rows[row]
        std::vector<float> w = randn(n, rng), out = randn(c.N * d, rng), dout = randn(c.N * d, rng);
        std::vector<float> dw(n), drows_combine(n * d);
        DeviceArray<float> d_w(w), d_out(out), d_dout(dout), d_dw(n), d_drows_combine(n * d);
        for (int64_t t = 0; t < c.N; t++)
            for (int j = 0; j < c.k; j++) {
                const int64_t a = t * c.k + j, row = plan.row_of_assignment[a];
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
                for (int j = 0; j < c.k; j++) acc += w[t * c.k + j] * rows[plan.row_of_assignment[t * c.k + j] * d + i];
                out[t * d + i] = acc;
            }
        if (!c.accumulate) d_out.poison();
        d_dw.poison();
        d_drows_combine.poison();
        gpu::combine_forward(d_out.ptr, d_rows.ptr, d_w.ptr, d_row_of_assignment.ptr, c.N, c.k, d, c.accumulate, 0);
        gpu::combine_backward(d_drows_combine.ptr, d_dw.ptr, d_dout.ptr, d_rows.ptr, d_w.ptr, d_row_of_assignment.ptr, c.N,
                              c.k, d, 0);
        check("combine_forward out " + shape, d_out.get(), out, 1e-5);
        check("combine_backward drows " + shape, d_drows_combine.get(), drows_combine, 0);
        check("combine_backward dweights " + shape, d_dw.get(), dw, 1e-5);
    }
}

// ---- FP8 quantization (kernels/fp8.cuh) against model/fp8.cpp ----

// The value of an E4M3 byte (sign, exponent bias 7, 3 mantissa bits; 0x7F / 0xFF NaN), written from the format
static float e4m3_decoded(__nv_fp8_storage_t byte) {
    const int e = (byte >> 3) & 15, m = byte & 7;
    const float magnitude = (e == 15 && m == 7) ? NAN : e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
    return byte & 0x80 ? -magnitude : magnitude;
}
static std::vector<float> e4m3_decoded(const std::vector<__nv_fp8_storage_t>& bytes) {
    std::vector<float> r(bytes.size());
    for (size_t i = 0; i < bytes.size(); i++) r[i] = e4m3_decoded(bytes[i]);
    return r;
}

// x (rows, cols) with rows of magnitudes 2^-12 .. 2^11 and one zero row, so tiles get very different scales and
// every E4M3 binade, subnormals included, is reached
static std::vector<float> fp8_test_matrix(int64_t rows, int64_t cols, Rng& rng) {
    std::vector<float> x = randn(rows * cols, rng);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            x[r * cols + c] = r == 3 ? 0.0f : std::ldexp(x[r * cols + c], (int)(r % 24) - 12);
    return x;
}

// Every value and scale exactly the CPU's (tolerance 0: the same tiles, the same IEEE division, the same rounding),
// read out of the GPU's layouts (kernels/fp8.cuh); outputs poisoned (0xFF: an E4M3 NaN) first. Shapes with partial
// tiles at every edge.
static void test_fp8(Rng& rng) {
    struct Case {
        int64_t rows, cols;
    };
    for (Case tc : {Case{7, 37}, Case{200, 300}}) {
        const int64_t rows = tc.rows, cols = tc.cols, across = gpu::ceil_div(cols, FP8_TILE),
                      down = gpu::ceil_div(rows, FP8_TILE);
        const std::string shape = fmt("(%ld x %ld)", (long)rows, (long)cols);
        const std::vector<float> x = fp8_test_matrix(rows, cols, rng);
        DeviceArray<float> d_x(x);
        // 1 x 128, from FP32 and from BF16
        for (bool from_bf16 : {false, true}) {
            const std::vector<float> input = from_bf16 ? bf16_rounded(x) : x;
            std::vector<float> q(gpu::round_up(rows, 4) * cols, 0.0f), scales(rows * across);  // padding rows zero
            fp8_quantize(q.data(), scales.data(), input.data(), rows, cols, 1, FP8_TILE);
            DeviceArray<__nv_fp8_storage_t> d_q(q.size());
            DeviceArray<float> d_scales(gpu::fp8_vec128_scales(rows, cols));
            d_q.poison();
            d_scales.poison();
            if (from_bf16) {
                std::vector<__nv_bfloat16> x16(x.size());
                for (size_t i = 0; i < x.size(); i++) x16[i] = __float2bfloat16_rn(x[i]);
                DeviceArray<__nv_bfloat16> d_x16(x16);
                gpu::fp8_quantize_rows(d_q.ptr, d_scales.ptr, d_x16.ptr, rows, cols, 0);
            } else {
                gpu::fp8_quantize_rows(d_q.ptr, d_scales.ptr, d_x.ptr, rows, cols, 0);
            }
            const std::vector<float> got_scales = d_scales.get();
            std::vector<float> scales_by_row(rows * across);  // (r, b) from b * round_up(rows, 4) + r
            for (int64_t r = 0; r < rows; r++)
                for (int64_t b = 0; b < across; b++)
                    scales_by_row[r * across + b] = got_scales[b * gpu::round_up(rows, 4) + r];
            const std::string from = from_bf16 ? " from BF16 " : " ";
            check("fp8_quantize_rows q" + from + shape, e4m3_decoded(d_q.get()), q, 0);
            check("fp8_quantize_rows scales" + from + shape, scales_by_row, scales, 0);
        }
        // 128 x 1, transposed, rows padded to a multiple of 16
        {
            const int64_t ld = gpu::round_up(rows, 16);
            std::vector<float> q(rows * cols), scales(down * cols);
            fp8_quantize(q.data(), scales.data(), x.data(), rows, cols, FP8_TILE, 1);
            std::vector<float> want_t(cols * ld, 0.0f);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) want_t[c * ld + r] = q[r * cols + c];
            DeviceArray<__nv_fp8_storage_t> d_qt(cols * ld);
            DeviceArray<float> d_scales(gpu::fp8_vec128_scales(cols, ld));
            d_qt.poison();
            d_scales.poison();
            gpu::fp8_quantize_cols(d_qt.ptr, d_scales.ptr, d_x.ptr, rows, cols, ld, 0);
            const std::vector<float> got_scales = d_scales.get();
            std::vector<float> scales_by_block(down * cols);  // (rb, c) from rb * round_up(cols, 4) + c
            for (int64_t rb = 0; rb < down; rb++)
                for (int64_t c = 0; c < cols; c++)
                    scales_by_block[rb * cols + c] = got_scales[rb * gpu::round_up(cols, 4) + c];
            check("fp8_quantize_cols q^T (zero-padded rows) " + shape, e4m3_decoded(d_qt.get()), want_t, 0);
            check("fp8_quantize_cols scales " + shape, scales_by_block, scales, 0);
        }
        // 128 x 128, two matrices, both copies
        {
            const int64_t batch = 2;
            const std::vector<float> W2 = fp8_test_matrix(batch * rows, cols, rng);
            std::vector<float> q(batch * rows * cols), scales(batch * down * across), want_t(batch * rows * cols);
            std::vector<float> want_scales_t(batch * down * across);
            for (int64_t z = 0; z < batch; z++) {
                fp8_quantize(q.data() + z * rows * cols, scales.data() + z * down * across, W2.data() + z * rows * cols,
                             rows, cols, FP8_TILE, FP8_TILE);
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c++)
                        want_t[z * rows * cols + c * rows + r] = q[z * rows * cols + r * cols + c];
            }
            const int64_t S = gpu::fp8_blk128_scales(rows, cols), St = gpu::fp8_blk128_scales(cols, rows);
            DeviceArray<float> d_W(W2), d_scales(batch * S), d_scales_t(batch * St);
            DeviceArray<__nv_fp8_storage_t> d_q(batch * rows * cols), d_qt(batch * rows * cols);
            for (auto* d : {&d_q, &d_qt}) d->poison();
            d_scales.poison();
            d_scales_t.poison();
            gpu::fp8_quantize_blocks(d_q.ptr, d_qt.ptr, d_scales.ptr, d_scales_t.ptr, d_W.ptr, batch, rows, cols, 0);
            const std::vector<float> got = d_scales.get(), got_t = d_scales_t.get();
            std::vector<float> by_block(batch * down * across), by_block_t(batch * down * across);
            for (int64_t z = 0; z < batch; z++)
                for (int64_t rb = 0; rb < down; rb++)
                    for (int64_t b = 0; b < across; b++) {
                        by_block[(z * down + rb) * across + b] = got[z * S + rb * gpu::round_up(across, 4) + b];
                        by_block_t[(z * down + rb) * across + b] = got_t[z * St + b * gpu::round_up(down, 4) + rb];
                    }
            check("fp8_quantize_blocks q " + shape + " x2", e4m3_decoded(d_q.get()), q, 0);
            check("fp8_quantize_blocks q^T " + shape + " x2", e4m3_decoded(d_qt.get()), want_t, 0);
            check("fp8_quantize_blocks scales " + shape + " x2", by_block, scales, 0);
            check("fp8_quantize_blocks scales of q^T " + shape + " x2", by_block_t, scales, 0);
            // from a BF16 working copy, as the model's: the CPU's quantization of the rounded values
            const std::vector<float> W2_16 = bf16_rounded(W2);
            std::vector<__nv_bfloat16> W2_bits(W2.size());
            for (size_t i = 0; i < W2.size(); i++) W2_bits[i] = __float2bfloat16_rn(W2[i]);
            for (int64_t z = 0; z < batch; z++)
                fp8_quantize(q.data() + z * rows * cols, scales.data() + z * down * across,
                             W2_16.data() + z * rows * cols, rows, cols, FP8_TILE, FP8_TILE);
            DeviceArray<__nv_bfloat16> d_W16(W2_bits);
            d_q.poison();
            gpu::fp8_quantize_blocks(d_q.ptr, d_qt.ptr, d_scales.ptr, d_scales_t.ptr, d_W16.ptr, batch, rows, cols, 0);
            check("fp8_quantize_blocks q, from BF16 " + shape + " x2", e4m3_decoded(d_q.get()), q, 0);
        }
    }
}

// ---- MLA attention (kernels/rope.cuh, kernels/attention.cuh) against model/mla.cpp ----

struct AttnCase {
    int B, T, H, dn, dr, dv;
    float weight_scale;
    bool yarn;
};

// One MLA layer run by the CPU reference (mla_forward) on random weights and input; its activations hold the
// inputs and outputs of the kernels under test: q, kv_a, kv, the RoPE tables, q_heads, k_heads, probs, o.
struct CpuMLA {
    Config c;
    int B, T;
    std::vector<float> wq, wkv_a, wkv_a_norm, wkv_b, wo, storage;
    MLAActs a{};
    CpuMLA(const AttnCase& tc, Rng& rng) : B(tc.B), T(tc.T) {
        c.hidden_size = 40;
        c.num_attention_heads = tc.H;
        c.q_lora_rank = 0;
        c.kv_lora_rank = 24;
        c.qk_nope_head_dim = tc.dn;
        c.qk_rope_head_dim = tc.dr;
        c.v_head_dim = tc.dv;
        if (tc.yarn) {  // YaRN with m != 1: the tables carry m, the softmax scale mscale^2
            c.yarn_factor = 4.0f;
            c.yarn_original_max_position = 32;
            c.yarn_mscale = 1.0f;
            c.yarn_mscale_all_dim = 0.8f;
        }
        const int64_t d = c.hidden_size, H = tc.H, dqk = tc.dn + tc.dr, kr = c.kv_lora_rank, N = (int64_t)B * T;
        // weights of scale weight_scale / sqrt(fan_in): q, k entries of about weight_scale, scores of about
        // weight_scale^2 (the softmax scale is 1/sqrt(dqk))
        wq = randn(H * dqk * d, rng, tc.weight_scale / std::sqrt((float)d));
        wkv_a = randn((kr + tc.dr) * d, rng, tc.weight_scale / std::sqrt((float)d));
        wkv_a_norm = randn(kr, rng, 0.1f);
        for (float& x : wkv_a_norm) x += 1.0f;
        wkv_b = randn(H * (tc.dn + tc.dv) * kr, rng, tc.weight_scale / std::sqrt((float)kr));
        wo = randn(d * H * tc.dv, rng, 1.0f / std::sqrt((float)(H * tc.dv)));
        BlockWeights w{};
        w.q = wq.data();
        w.kv_a = wkv_a.data();
        w.kv_a_norm = wkv_a_norm.data();
        w.kv_b = wkv_b.data();
        w.o = wo.data();
        carve_arena(storage, [&](Arena& arena) { mla_carve(arena, c, B, T, a); });
        std::vector<float> x = randn(N * d, rng), out(N * d);
        mla_forward(c, Precision::FP32, w, a, x.data(), out.data(), B, T);
    }
};

static std::vector<float> host_copy(const float* p, int64_t n) { return std::vector<float>(p, p + n); }

// columns [c0, c1) of each row of a (rows, width) matrix
static std::vector<float> columns(const std::vector<float>& m, int64_t width, int64_t c0, int64_t c1) {
    std::vector<float> out;
    for (size_t r = 0; r < m.size() / width; r++)
        out.insert(out.end(), m.begin() + r * width + c0, m.begin() + r * width + c1);
    return out;
}

// A random (rows, width) matrix whose columns [c0, c1) are NaN: the part a kernel must write (poisoned), the rest
// must come back untouched.
static std::vector<float> poisoned_columns(int64_t rows, int64_t width, int64_t c0, int64_t c1, Rng& rng) {
    std::vector<float> m = randn(rows * width, rng);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t col = c0; col < c1; col++) m[r * width + col] = NAN;
    return m;
}

// The table and the head assembly. Tolerances: the table 1e-6 (the same double computation on both sides, cos, sin,
// pow and log of two libraries: at most one float ulp, 6e-8, in rare entries); the rotations 1e-6 (x0 co - x1 si:
// FMA contraction may differ); copies 0; the rope key's gradient, a sum over the H heads in head order, 1e-6.
static void test_rope(const CpuMLA& m, Rng& rng, const std::string& shape) {
    const Config& c = m.c;
    const int64_t T = m.T, N = (int64_t)m.B * m.T, H = c.num_attention_heads, dn = c.qk_nope_head_dim;
    const int64_t dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr, kr = c.kv_lora_rank;
    const MLAActs& a = m.a;
    const std::vector<float> cos_table = host_copy(a.rope_cos, T * dr / 2);
    const std::vector<float> sin_table = host_copy(a.rope_sin, T * dr / 2);
    DeviceArray<float> d_cos(cos_table.size()), d_sin(sin_table.size());
    d_cos.poison();
    d_sin.poison();
    gpu::rope_table(d_cos.ptr, d_sin.ptr, c, T, 0);
    check("rope_table cos " + shape, d_cos.get(), cos_table, 1e-6);
    check("rope_table sin " + shape, d_sin.get(), sin_table, 1e-6);

    // forward, on the CPU's tables (so that this check does not depend on the one above)
    DeviceArray<float> cpu_cos(cos_table), cpu_sin(sin_table), d_q(host_copy(a.q, N * H * dqk));
    DeviceArray<float> d_kv(host_copy(a.kv, N * H * (dn + dv))), d_kv_a(host_copy(a.kv_a, N * (kr + dr)));
    DeviceArray<float> d_q_heads(N * H * dqk), d_k_heads(N * H * dqk);
    d_q_heads.poison();
    d_k_heads.poison();
    gpu::rope_heads_forward(d_q_heads.ptr, d_k_heads.ptr, d_q.ptr, d_kv.ptr, d_kv_a.ptr, cpu_cos.ptr, cpu_sin.ptr, N, T,
                            H, dn, dr, dv, kr, 0);
    check("rope_heads_forward q_heads " + shape, d_q_heads.get(), host_copy(a.q_heads, N * H * dqk), 1e-6);
    check("rope_heads_forward k_heads " + shape, d_k_heads.get(), host_copy(a.k_heads, N * H * dqk), 1e-6);

    // BF16: the same values rounded once, and v. Tolerance 8e-3, one BF16 ulp of the largest value (at most 2^-7 of
    // it): an FP32 value within 1e-6 of the CPU's can round to the neighbouring BF16; v is a copy, rounded from the
    // same floats.
    DeviceArray<__nv_bfloat16> q16(N * H * dqk), k16(N * H * dqk), v16(N * H * dv);
    q16.poison();
    k16.poison();
    v16.poison();
    gpu::rope_heads_forward_bf16(q16.ptr, k16.ptr, v16.ptr, d_q.ptr, d_kv.ptr, d_kv_a.ptr, cpu_cos.ptr, cpu_sin.ptr, N,
                                 T, H, dn, dr, dv, kr, 0);
    check("rope_heads_forward_bf16 q_heads " + shape, widened(q16.get()),
          bf16_rounded(host_copy(a.q_heads, N * H * dqk)), 8e-3);
    check("rope_heads_forward_bf16 k_heads " + shape, widened(k16.get()),
          bf16_rounded(host_copy(a.k_heads, N * H * dqk)), 8e-3);
    check("rope_heads_forward_bf16 v_heads " + shape, widened(v16.get()),
          bf16_rounded(columns(host_copy(a.kv, N * H * (dn + dv)), dn + dv, dn, dn + dv)), 0);

    // backward against model/mla.cpp's heads_backward
    const std::vector<float> dq_heads = randn(N * H * dqk, rng), dk_heads = randn(N * H * dqk, rng);
    const std::vector<float> dkv0 = poisoned_columns(N * H, dn + dv, 0, dn, rng);
    const std::vector<float> dkv_a0 = poisoned_columns(N, kr + dr, kr, kr + dr, rng);
    std::vector<float> dq(N * H * dqk), dkv = dkv0, dkv_a = dkv_a0;
    heads_backward(c, a, dq_heads.data(), dk_heads.data(), dq.data(), dkv.data(), dkv_a.data(), m.B, m.T);
    DeviceArray<float> d_dq_heads(dq_heads), d_dk_heads(dk_heads), d_dq(dq.size()), d_dkv(dkv0), d_dkv_a(dkv_a0);
    d_dq.poison();
    gpu::rope_heads_backward(d_dq.ptr, d_dkv.ptr, d_dkv_a.ptr, d_dq_heads.ptr, d_dk_heads.ptr, cpu_cos.ptr, cpu_sin.ptr,
                             N, T, H, dn, dr, dv, kr, 0);
    const std::vector<float> got_dkv = d_dkv.get(), got_dkv_a = d_dkv_a.get();
    check("rope_heads_backward dq " + shape, d_dq.get(), dq, 1e-6);
    check("rope_heads_backward dkv k_nope part " + shape, columns(got_dkv, dn + dv, 0, dn),
          columns(dkv, dn + dv, 0, dn), 0);
    check("rope_heads_backward dkv v part untouched " + shape, columns(got_dkv, dn + dv, dn, dn + dv),
          columns(dkv, dn + dv, dn, dn + dv), 0);
    check("rope_heads_backward dkv_a rope part " + shape, columns(got_dkv_a, kr + dr, kr, kr + dr),
          columns(dkv_a, kr + dr, kr, kr + dr), 1e-6);
    check("rope_heads_backward dkv_a c_kv part untouched " + shape, columns(got_dkv_a, kr + dr, 0, kr),
          columns(dkv_a, kr + dr, 0, kr), 0);
}

// The attention kernels on q, k (N*H, dqk), kv (N*H, dn + dv: v at column dn) and dO: the forward, then the backward
// from its o and lse; dv lands in dkv at column dn. Outputs poisoned first; dkv starts as dkv0, whose k_nope columns
// must come back untouched. FP32: v read inside kv, as the trainer does. BF16: q, k, v and dO cast to BF16 on the
// device; v either contiguous (N*H, dv), as the trainer stores it, or read inside the cast of kv (v_in_kv); blocks
// of 4 warps (the model's) or 8 (wide).
struct GpuAttention {
    std::vector<float> o, lse, dq, dk, dkv;
};
static GpuAttention gpu_attention(Precision precision, const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& kv, const std::vector<float>& d_out,
                                  const std::vector<float>& dkv0, int B, int T, int H, int dn, int dqk, int dv,
                                  float scale, bool v_in_kv = false, bool wide = false) {
    const int64_t N = (int64_t)B * T, ld = dn + dv;
    DeviceArray<float> d_q(q), d_k(k), d_kv(kv), d_v(columns(kv, ld, dn, ld)), d_o(N * H * dv), d_lse((int64_t)B * H * T);
    DeviceArray<float> d_dout(d_out), d_dq(N * H * dqk), d_dk(N * H * dqk), d_dkv(dkv0);
    DeviceArray<float> scratch(gpu::attention_backward_scratch_floats(B, T, H));
    d_o.poison();
    d_lse.poison();
    d_dq.poison();
    d_dk.poison();
    scratch.poison();
    if (precision == Precision::FP32) {
        gpu::attention_forward(d_o.ptr, d_lse.ptr, d_q.ptr, d_k.ptr, d_kv.ptr + dn, ld, B, T, H, dqk, dv, scale, 0);
        gpu::attention_backward(d_dq.ptr, d_dk.ptr, d_dkv.ptr + dn, scratch.ptr, d_dout.ptr, d_q.ptr, d_k.ptr,
                                d_kv.ptr + dn, ld, d_o.ptr, d_lse.ptr, B, T, H, dqk, dv, scale, 0);
        return {d_o.get(), d_lse.get(), d_dq.get(), d_dk.get(), d_dkv.get()};
    }
    DeviceArray<__nv_bfloat16> q16(q.size()), k16(k.size()), kv16(kv.size()), v16(N * H * dv), dout16(d_out.size());
    for (auto [to, from] : {std::pair{&q16, &d_q}, std::pair{&k16, &d_k}, std::pair{&kv16, &d_kv},
                            std::pair{&v16, &d_v}, std::pair{&dout16, &d_dout}})
        gpu::cast_to_bf16(to->ptr, from->ptr, (int64_t)from->n, 0);
    const __nv_bfloat16* v = v_in_kv ? kv16.ptr + dn : v16.ptr;
    const int64_t v_ld = v_in_kv ? ld : dv;
    auto forward = wide ? gpu::attention_forward_bf16<8> : gpu::attention_forward_bf16<4>;
    auto backward = wide ? gpu::attention_backward_bf16<8> : gpu::attention_backward_bf16<4>;
    forward(d_o.ptr, d_lse.ptr, q16.ptr, k16.ptr, v, v_ld, B, T, H, dqk, dv, scale, 0);
    backward(d_dq.ptr, d_dk.ptr, d_dkv.ptr + dn, ld, scratch.ptr, d_dout.ptr, dout16.ptr, q16.ptr, k16.ptr, v, v_ld,
             d_o.ptr, d_lse.ptr, B, T, H, dqk, dv, scale, 0);
    return {d_o.get(), d_lse.get(), d_dq.get(), d_dk.get(), d_dkv.get()};
}

// The core on the CPU's q_heads, k_heads and kv (v inside kv at offset dn, as in the trainer). Tolerance 1e-5 for
// o and the gradients (expected errors ~1e-6, up to ~3e-6 for the sharp case): the scores are dot products over dqk
// terms with another FMA association; P = exp(s - L) carries their rounding, ~u |s| relative for |s| up to ~30;
// the sums over up to T keys (or queries) run in the CPU's order, but the forward rescales by a running max and
// divides at the end, and the backward uses D = dO.o instead of sum_j P dP. The log-sum-exp against a double
// computation, 1e-5 (the float scores' rounding, relative to max |L|).
// deterministic: a second run gives the same bits (no atomics; every sum in a fixed order). For BF16 the second run
// reads v inside kv (another stride, the same values): the same bits too; and so do blocks of 8 warps, whose rows
// see the same streamed tiles in the same order (plus, for four warps, one that is all masked: it adds exact zeros).
static void check_rerun(const GpuAttention& first, const GpuAttention& second, const std::string& what,
                        const std::string& shape) {
    for (auto [name, a, b] : {std::tuple{"o", &first.o, &second.o}, std::tuple{"lse", &first.lse, &second.lse},
                              std::tuple{"dq", &first.dq, &second.dq},
                              std::tuple{"dk", &first.dk, &second.dk}, std::tuple{"dkv", &first.dkv, &second.dkv}})
        check("attention rerun bit-identical " + what + name + " " + shape, *b, *a, 0);
}

static void test_attention_core(const CpuMLA& m, Rng& rng, const std::string& shape) {
    const Config& c = m.c;
    const int64_t B = m.B, T = m.T, N = B * T, H = c.num_attention_heads, dn = c.qk_nope_head_dim;
    const int64_t dqk = c.qk_head_dim(), dv = c.v_head_dim, ld = dn + dv;
    const float scale = attention_softmax_scale(c);
    const MLAActs& a = m.a;
    std::vector<float> lse(B * H * T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                std::vector<double> s(i + 1);
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    double dot = 0.0;
                    const float* q = a.q_heads + ((b * T + i) * H + h) * dqk;
                    const float* k = a.k_heads + ((b * T + j) * H + h) * dqk;
                    for (int64_t e = 0; e < dqk; e++) dot += (double)q[e] * k[e];
                    s[j] = dot * scale;
                    mx = std::max(mx, s[j]);
                }
                for (int64_t j = 0; j <= i; j++) sum += std::exp(s[j] - mx);
                lse[(b * H + h) * T + i] = (float)(mx + std::log(sum));
            }
    const std::vector<float> d_out = randn(N * H * dv, rng);
    std::vector<float> dq(N * H * dqk), dk(N * H * dqk), dkv_cpu(N * H * ld);
    attention_backward(c, a, d_out.data(), dq.data(), dk.data(), dkv_cpu.data(), (int)B, (int)T);
    const std::vector<float> dkv0 = poisoned_columns(N * H, ld, dn, ld, rng);

    auto run = [&] {
        return gpu_attention(Precision::FP32, host_copy(a.q_heads, N * H * dqk), host_copy(a.k_heads, N * H * dqk),
                             host_copy(a.kv, N * H * ld), d_out, dkv0, (int)B, (int)T, (int)H, (int)dn, (int)dqk,
                             (int)dv, scale);
    };
    const GpuAttention got = run();
    check("attention_forward o " + shape, got.o, host_copy(a.o, N * H * dv), 1e-5);
    check("attention_forward lse " + shape, got.lse, lse, 1e-5);
    check("attention_backward dq_heads " + shape, got.dq, dq, 1e-5);
    check("attention_backward dk_heads " + shape, got.dk, dk, 1e-5);
    check("attention_backward dv (in dkv) " + shape, columns(got.dkv, ld, dn, ld), columns(dkv_cpu, ld, dn, ld), 1e-5);
    check("attention_backward dkv k_nope part untouched " + shape, columns(got.dkv, ld, 0, dn),
          columns(dkv0, ld, 0, dn), 0);
    check_rerun(got, run(), "", shape);
}

// The tensor-core kernels (kernels/attention_bf16.cuh) against a double-precision computation on the BF16-rounded
// q, k, v and dO (what the kernels are given), so what is measured is the kernels' own rounding: P and dS are
// rounded to BF16 before their products (2^-9 relative each), and the scores' and products' FP32 sums.
// With random signs these errors add up like the values themselves, so relative to each output's largest entry they
// stay near 2^-9 = 2e-3; tolerance 1e-2. D is dO . o in FP32 on unrounded dO, as in the kernels.
static void test_attention_bf16(const CpuMLA& m, Rng& rng, const std::string& shape) {
    const Config& c = m.c;
    const int64_t B = m.B, T = m.T, N = B * T, H = c.num_attention_heads, dn = c.qk_nope_head_dim;
    const int64_t dqk = c.qk_head_dim(), dv = c.v_head_dim, ld = dn + dv;
    if (!gpu::attention_on_tensor_cores(Precision::BF16, (int)dqk, (int)dv)) return;
    const double scale = attention_softmax_scale(c);
    auto bf16 = [](const std::vector<float>& x) {
        std::vector<double> r(x.size());
        for (size_t i = 0; i < x.size(); i++) r[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
        return r;
    };
    const std::vector<float> q = host_copy(m.a.q_heads, N * H * dqk), k = host_copy(m.a.k_heads, N * H * dqk);
    const std::vector<float> kv = host_copy(m.a.kv, N * H * ld), d_out = randn(N * H * dv, rng);
    const std::vector<double> qr = bf16(q), kr = bf16(k), kvr = bf16(kv), dor = bf16(d_out);
    std::vector<float> o(N * H * dv), lse(B * H * T), dq(N * H * dqk), dk(N * H * dqk), dv_heads(N * H * dv);
    std::vector<double> dq_acc(N * H * dqk, 0.0), dk_acc(N * H * dqk, 0.0), dv_acc(N * H * dv, 0.0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const int64_t ni = (b * T + i) * H + h;
                std::vector<double> p(i + 1), dp(i + 1);
                double mx = -INFINITY, sum = 0.0, D = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    const int64_t nj = (b * T + j) * H + h;
                    double dot = 0.0, dpd = 0.0;
                    for (int64_t e = 0; e < dqk; e++) dot += qr[ni * dqk + e] * kr[nj * dqk + e];
                    for (int64_t e = 0; e < dv; e++) dpd += dor[ni * dv + e] * kvr[nj * ld + dn + e];
                    p[j] = dot * scale;
                    dp[j] = dpd;
                    mx = std::max(mx, p[j]);
                }
                for (int64_t j = 0; j <= i; j++) sum += std::exp(p[j] - mx);
                lse[(b * H + h) * T + i] = (float)(mx + std::log(sum));
                for (int64_t e = 0; e < dv; e++) {
                    double oe = 0.0;
                    for (int64_t j = 0; j <= i; j++) oe += std::exp(p[j] - mx) / sum * kvr[((b * T + j) * H + h) * ld + dn + e];
                    o[ni * dv + e] = (float)oe;
                    D += (double)d_out[ni * dv + e] * oe;
                }
                for (int64_t j = 0; j <= i; j++) {
                    const int64_t nj = (b * T + j) * H + h;
                    const double pj = std::exp(p[j] - mx) / sum, ds = pj * (dp[j] - D) * scale;
                    for (int64_t e = 0; e < dqk; e++) {
                        dq_acc[ni * dqk + e] += ds * kr[nj * dqk + e];
                        dk_acc[nj * dqk + e] += ds * qr[ni * dqk + e];
                    }
                    for (int64_t e = 0; e < dv; e++) dv_acc[nj * dv + e] += pj * dor[ni * dv + e];
                }
            }
    for (size_t i = 0; i < dq.size(); i++) dq[i] = (float)dq_acc[i], dk[i] = (float)dk_acc[i];
    for (size_t i = 0; i < dv_heads.size(); i++) dv_heads[i] = (float)dv_acc[i];

    const std::vector<float> dkv0 = poisoned_columns(N * H, ld, dn, ld, rng);
    auto run = [&](bool v_in_kv, bool wide) {
        return gpu_attention(Precision::BF16, q, k, kv, d_out, dkv0, (int)B, (int)T, (int)H, (int)dn, (int)dqk,
                             (int)dv, (float)scale, v_in_kv, wide);
    };
    const GpuAttention got = run(false, false);
    check("attention_forward bf16 o " + shape, got.o, o, 1e-2);
    check("attention_forward bf16 lse " + shape, got.lse, lse, 1e-2);
    check("attention_backward bf16 dq_heads " + shape, got.dq, dq, 1e-2);
    check("attention_backward bf16 dk_heads " + shape, got.dk, dk, 1e-2);
    check("attention_backward bf16 dv (in dkv) " + shape, columns(got.dkv, ld, dn, ld), dv_heads, 1e-2);
    check("attention_backward bf16 dkv k_nope part untouched " + shape, columns(got.dkv, ld, 0, dn),
          columns(dkv0, ld, 0, dn), 0);
    check_rerun(got, run(true, false), "bf16 (v inside kv) ", shape);
    // every value 1: o, the mean of the values weighted by P rounded to BF16, is 1 to FP32 roundoff when the kernel
    // divides by the sum of those rounded weights (against the sum before rounding it is off by up to 2^-9 on rows
    // of few keys, which the 1e-2 above cannot see); FP32 sums of up to T = 256 terms: 1e-4
    std::vector<float> kv_ones = kv;
    for (int64_t r = 0; r < N * H; r++) std::fill(kv_ones.begin() + r * ld + dn, kv_ones.begin() + (r + 1) * ld, 1.0f);
    check("attention_forward bf16 o of values all 1 " + shape,
          gpu_attention(Precision::BF16, q, k, kv_ones, d_out, dkv0, (int)B, (int)T, (int)H, (int)dn, (int)dqk,
                        (int)dv, (float)scale).o,
          std::vector<float>(N * H * dv, 1.0f), 1e-4);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (gpu::attn_bf16_backward_bytes((int)dqk, (int)dv, 8) <= (int64_t)prop.sharedMemPerBlockOptin)
        check_rerun(got, run(false, true), "bf16 (8 warps) ", shape);
    else  // the model runs 4 warps; 8 are only timed where they fit
        printf("attention bf16 (8 warps) %s: not run, %lld bytes of shared memory per block, the GPU has %zu\n",
               shape.c_str(), (long long)gpu::attn_bf16_backward_bytes((int)dqk, (int)dv, 8),
               (size_t)prop.sharedMemPerBlockOptin);
}

// One mma.sync with its fragments built from row-major A (16 x 16), B (16 x 8, k x n) and C (16 x 8) by the layout
// kernels/mma_sync.cuh states, and D written back by it: the layout the BF16 attention kernels rely on, checked
// against the tensor cores themselves (on the emulator, against its reading of the PTX ISA).
static __global__ void mma_layout_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b) {
    const int g = threadIdx.x / 4, t = threadIdx.x % 4;
    const uint32_t fa[4] = {gpu::attn_bf16_pack(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
                            gpu::attn_bf16_pack(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                            gpu::attn_bf16_pack(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
                            gpu::attn_bf16_pack(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
    const uint32_t fb[2] = {gpu::attn_bf16_pack(b[2 * t * 8 + g], b[(2 * t + 1) * 8 + g]),
                            gpu::attn_bf16_pack(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g])};
    float* at[4] = {d + g * 8 + 2 * t, d + g * 8 + 2 * t + 1, d + (g + 8) * 8 + 2 * t, d + (g + 8) * 8 + 2 * t + 1};
    float acc[4];
    for (int e = 0; e < 4; e++) acc[e] = *at[e];
    gpu::mma_bf16_16816(acc, fa, fb);
    for (int e = 0; e < 4; e++) *at[e] = acc[e];
}

// D = C + A B against the host in double. Products of BF16 values are exact in FP32; a sum of 16 of them and C
// differs by FP32 roundoff (the tensor cores may truncate: ~17 u of the largest term, ~1e-6 of D's scale);
// tolerance 1e-5. A wrong element in the layout is an error of order 1.
static void test_mma_layout(Rng& rng) {
    std::vector<__nv_bfloat16> a(16 * 16), b(16 * 8);
    std::vector<double> a_val(a.size()), b_val(b.size());
    for (size_t i = 0; i < a.size(); i++) a[i] = __float2bfloat16_rn(rng.normal()), a_val[i] = __bfloat162float(a[i]);
    for (size_t i = 0; i < b.size(); i++) b[i] = __float2bfloat16_rn(rng.normal()), b_val[i] = __bfloat162float(b[i]);
    const std::vector<float> c = randn(16 * 8, rng);
    std::vector<float> want(16 * 8);
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double sum = c[r * 8 + n];
            for (int k = 0; k < 16; k++) sum += a_val[r * 16 + k] * b_val[k * 8 + n];
            want[r * 8 + n] = (float)sum;
        }
    DeviceArray<__nv_bfloat16> d_a(a), d_b(b);
    DeviceArray<float> d_d(c);
    gpu::launch_kernel(mma_layout_kernel, 1, 32, 0, 0, d_d.ptr, d_a.ptr, d_b.ptr);
    check("mma.sync m16n8k16 bf16 fragment layout: D = C + A B", d_d.get(), want, 1e-5);
}

// ldmatrix (.x4, and .x4.trans) against the layout kernels/mma_sync.cuh states: the four 8 x 8 matrices are the
// rows of a 32 x 8 BF16 tile in shared memory (matrix i = rows 8i..8i+7), so lane l gives row l.
static __global__ void ldmatrix_layout_kernel(uint32_t* plain, uint32_t* transposed, const __nv_bfloat16* x) {
    __shared__ uint4 rows[32];  // 32 rows of 8 BF16, each 16 bytes and 16-byte aligned
    __nv_bfloat16* tile = reinterpret_cast<__nv_bfloat16*>(rows);
    for (int i = threadIdx.x; i < 32 * 8; i += 32) tile[i] = x[i];
    __syncwarp();
    uint32_t r[4];
    gpu::ldmatrix_x4(r, tile + threadIdx.x * 8);
    for (int i = 0; i < 4; i++) plain[threadIdx.x * 4 + i] = r[i];
    gpu::ldmatrix_x4_trans(r, tile + threadIdx.x * 8);
    for (int i = 0; i < 4; i++) transposed[threadIdx.x * 4 + i] = r[i];
}

// Exact: ldmatrix moves bits. A wrong element in the layout is a wrong register.
static void test_ldmatrix_layout(Rng& rng) {
    std::vector<__nv_bfloat16> x(32 * 8);
    for (__nv_bfloat16& v : x) v = __float2bfloat16_rn(rng.normal());
    auto bits = [&](int row, int col) {
        uint16_t b;
        memcpy(&b, &x[row * 8 + col], sizeof b);
        return (uint32_t)b;
    };
    std::vector<uint32_t> plain(32 * 4), transposed(32 * 4);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const int g = lane / 4, t = lane % 4;
            plain[lane * 4 + i] = bits(8 * i + g, 2 * t) | bits(8 * i + g, 2 * t + 1) << 16;
            transposed[lane * 4 + i] = bits(8 * i + 2 * t, g) | bits(8 * i + 2 * t + 1, g) << 16;
        }
    DeviceArray<__nv_bfloat16> d_x(x);
    DeviceArray<uint32_t> d_plain(32 * 4), d_transposed(32 * 4);
    gpu::launch_kernel(ldmatrix_layout_kernel, 1, 32, 0, 0, d_plain.ptr, d_transposed.ptr, d_x.ptr);
    check("ldmatrix x4 fragment layout", d_plain.get(), plain, 0);
    check("ldmatrix x4 trans fragment layout", d_transposed.get(), transposed, 0);
}

// Tiny dims; T around the 64-row tile (63, 64, 65, 130); YaRN; a sharp softmax (scores of std ~6: few keys per row);
// head dims over 256 (two column slabs per block; FP32 only); DeepSeek-V3's head dims (dqk 192 = 128 + 64, dv 128);
// and head dims that take each of the BF16 kernels' accumulator counts (8, 16, 24, 32 tiles: up to 64, 128, 192,
// 256 wide).
static void test_attention(Rng& rng) {
    test_mma_layout(rng);
    test_ldmatrix_layout(rng);
    for (AttnCase tc : {AttnCase{2, 17, 3, 8, 4, 8, 1.5f, false}, AttnCase{1, 63, 2, 16, 8, 16, 1.5f, false},
                        AttnCase{2, 64, 1, 8, 4, 8, 1.5f, true}, AttnCase{1, 65, 2, 12, 6, 20, 1.5f, false},
                        AttnCase{2, 130, 2, 16, 8, 16, 2.5f, true}, AttnCase{1, 70, 1, 256, 64, 300, 1.5f, false},
                        AttnCase{1, 256, 2, 128, 64, 128, 1.5f, false}, AttnCase{1, 70, 1, 192, 64, 256, 1.5f, false},
                        AttnCase{2, 80, 1, 96, 32, 192, 1.5f, false}, AttnCase{1, 100, 2, 96, 32, 64, 1.5f, false}}) {
        const std::string shape = fmt("(B=%d T=%d H=%d dqk=%d dv=%d%s%s)", tc.B, tc.T, tc.H, tc.dn + tc.dr, tc.dv,
                                      tc.yarn ? " yarn" : "", tc.weight_scale > 2 ? " sharp" : "");
        const CpuMLA m(tc, rng);
        test_rope(m, rng, shape);
        test_attention_core(m, rng, shape);
        test_attention_bf16(m, rng, shape);
    }
}

// Every kernel check above, in order (test_gpu, and the kernel emulator's test_gpu_emulated)
void test_kernels(Rng& rng) {
    test_embedding(rng);
    test_copy_columns(rng);
    test_put_rows(rng);
    test_add(rng);
    test_rmsnorm(rng);
    test_swiglu(rng);
    test_cross_entropy(rng);
    test_adamw(rng);
    test_router(rng);
    test_permute(rng);
    test_fp8(rng);
    test_attention(rng);
}
