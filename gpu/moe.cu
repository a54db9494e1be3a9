// The MoE layer on the GPU, forward and backward (model/moe.cpp phase for phase). The Comm (NCCL) runs on a stream
// of its own and returns when complete; before an exchange it follows the model's stream on the device.
// In BF16 mode the routed experts' GEMMs read the expert offsets on the device (kernels/grouped_gemm.cuh), and at
// EP 1 nothing waits for the expert counts; otherwise the host waits for them once per layer (the dispatch plan).
#include "gpu/model.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/grouped_gemm.cuh"
#include "kernels/grouped_matmul.cuh"
#include "kernels/permute.cuh"
#include "kernels/router.cuh"
#include "kernels/swiglu.cuh"

// The router's weight: FP32 in FP32 mode; in the BF16 and FP8 modes on the tensor cores, its FP32 operands rounded
// to TF32 and summed in FP32 (docs/design.md §7.4)
static gpu::GemmWeight router_weight(const GpuModel& m, const float* w) {
    return m.precision == Precision::FP32 ? gpu::GemmWeight(w) : gpu::GemmWeight::tf32_inputs(w);
}

// route: scores (N, E), chosen experts and gate weights (N, k), the expert plan; its counts queued to counts_out
static void moe_route(GpuModel& m, const BlockWeights& w, GpuMoEActs& a, const float* x, const Scratch& s,
                      int64_t* counts_out) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    m.timer.mark("router");
    gpu::matmul_forward(m.matmul, a.scores, x, router_weight(m, w.router), N, d, E, false);
    gpu::router_forward(a.scores, a.chosen, a.gate_weights, s.drouter_logits, a.scores, w.router_bias, c, N, m.stream);
    m.timer.mark("permute");
    gpu::build_expert_plan(a.counts, a.offsets, a.row_of_assignment, a.assignment_of_row, a.chosen, N * k, (int)E,
                           m.stream);
    CUDA_CHECK(cudaMemcpyAsync(counts_out, a.counts, E * sizeof(int64_t), cudaMemcpyDeviceToHost, m.stream));
    CUDA_CHECK(cudaEventRecord(m.counts_ready, m.stream));
}

// Whether the routed experts' GEMMs are kernels/grouped_gemm.cuh's on the expert offsets in device memory: in BF16
// mode, the widths multiples of 8. At EP 1 nothing then waits for the counts.
static bool experts_grouped_on_device(const GpuModel& m) {
    return m.precision == Precision::BF16 &&
           gpu::grouped_gemm_takes(m.config.hidden_size, m.config.moe_intermediate_size);
}

// Throws when an MoE block's counts do not add up to its N k assignments: router_select marks non-finite scores
// with expert -1, which no expert counts.
void check_expert_counts(const std::vector<int64_t>& counts, int64_t assignments) {
    int64_t assigned = 0;
    for (int64_t n : counts) assigned += n;
    if (assigned != assignments)
        throw std::runtime_error("the router scores are not finite (the weights hold NaN or inf)");
}

// The wait for the counts (work queued after them keeps the GPU busy through it), then the dispatch plan; then the
// expert buffers hold R rows and, under EP, the permutation and the local experts' offsets are on the device.
static void moe_plan_rows(GpuModel& m, GpuMoEActs& a, const int64_t* counts) {
    const int64_t N = tokens(m), E = m.config.n_routed_experts, k = m.config.num_experts_per_tok;
    m.timer.mark("permute");
    CUDA_CHECK(cudaEventSynchronize(m.counts_ready));
    const std::vector<int64_t> counts_host(counts, counts + E);
    check_expert_counts(counts_host, N * k);
    if (m.comm->ep_size > 1) m.timer.mark("all-to-all");  // the counts exchanged
    a.dispatch = plan_dispatch(*m.comm, counts_host);
    m.timer.mark("permute");
    const int64_t R = a.dispatch.received();
    ensure_expert_rows(m, a, R);
    if (m.comm->ep_size > 1) {  // recv_to_expert, expert_to_recv and local_offsets, as carved for capacity rows
        const std::vector<int64_t>& recv_to_expert = a.dispatch.expert_row_of_recv;
        const std::vector<int64_t>& offsets = a.dispatch.expert_offsets;
        const int64_t capacity = a.expert_rows;
        std::vector<int64_t> tables(2 * capacity + offsets.size());
        std::copy(recv_to_expert.begin(), recv_to_expert.end(), tables.begin());
        for (int64_t r = 0; r < R; r++) tables[capacity + recv_to_expert[r]] = r;
        std::copy(offsets.begin(), offsets.end(), tables.begin() + 2 * capacity);
        copy_sync(m, a.recv_to_expert, tables.data(), (int64_t)tables.size(), cudaMemcpyHostToDevice);
    }
}

// dispatch (EP > 1): rows in plan order to the experts' ranks, into local expert order, through `arrived` (R rows).
// T: float, or __nv_bfloat16 for the BF16 mode's input rows, which travel as d/2 floats a row (the Comm moves floats;
// gpu_model_init requires an even hidden size for this).
template <typename T>
static void dispatch_rows(GpuModel& m, const GpuMoEActs& a, const T* rows, T* expert_rows, T* arrived) {
    const int64_t d = m.config.hidden_size, R = a.dispatch.received();
    m.timer.mark("all-to-all");
    comm_follows(m);
    m.comm->all_to_all_v(reinterpret_cast<const float*>(rows), a.dispatch.send_rows.data(),
                         reinterpret_cast<float*>(arrived), a.dispatch.recv_rows.data(),
                         d * (int64_t)sizeof(T) / (int64_t)sizeof(float));
    m.timer.mark("permute");
    gpu::permute_forward(expert_rows, arrived, a.expert_to_recv, R, 1, d, m.stream);
}

// return (EP > 1): rows in local expert order back to their tokens' ranks, in plan order, through `leaving`
static void return_rows(GpuModel& m, const GpuMoEActs& a, const float* expert_rows, float* rows, float* leaving) {
    const int64_t d = m.config.hidden_size, R = a.dispatch.received();
    gpu::permute_forward(leaving, expert_rows, a.recv_to_expert, R, 1, d, m.stream);
    m.timer.mark("all-to-all");
    comm_follows(m);
    m.comm->all_to_all_v(leaving, a.dispatch.recv_rows.data(), rows, a.dispatch.send_rows.data(), d);
}

// The local experts' rows as G groups of R rows, their offsets on the device (experts_grouped_on_device: the expert
// plan's at EP 1, the dispatch plan's uploaded under EP) or on the host (the dispatch plan's)
struct ExpertGroups {
    const int64_t *host, *device;  // (G + 1), one of them
    int64_t G, R;
};
static ExpertGroups expert_groups(const GpuModel& m, const GpuMoEActs& a) {
    const Config& c = m.config;
    if (m.comm->ep_size == 1 && experts_grouped_on_device(m))
        return {nullptr, a.offsets, c.n_routed_experts, tokens(m) * c.num_experts_per_tok};
    const int64_t G = (int64_t)a.dispatch.expert_counts.size(), R = a.dispatch.received();
    if (experts_grouped_on_device(m)) return {nullptr, a.local_offsets, G, R};
    return {a.dispatch.expert_offsets.data(), nullptr, G, R};
}

// out (R, N) = inp (R, K) @ W_e^T on each expert e's rows: one BF16 grouped kernel, or one cuBLASLt call per expert
static void experts_matmul_forward(GpuModel& m, const ExpertGroups& e, float* out, gpu::GemmInput inp,
                                   const gpu::GemmWeight& W, int64_t K, int64_t N) {
    if (e.host) {
        gpu::grouped_matmul_forward(m.matmul, out, inp, W, e.host, e.G, K, N);
        return;
    }
    gpu::grouped_gemm_forward(out, inp.bf16, W.bf16, e.device, (int)e.G, e.R, K, N, m.stream);
}

// dinp (R, K) (=|+=) dout @ W_e and dW_e (=|+=) dout_e^T inp_e, as experts_matmul_forward
static void experts_matmul_backward(GpuModel& m, const ExpertGroups& e, float* dinp, float* dW, gpu::GemmInput dout,
                                    gpu::GemmInput inp, const gpu::GemmWeight& W, int64_t K, int64_t N,
                                    bool accumulate_dinp) {
    const bool accumulate_dW = grad_accumulates(m, dW);
    if (e.host) {
        gpu::grouped_matmul_backward(m.matmul, dinp, dW, dout, inp, W, e.host, e.G, K, N, accumulate_dinp,
                                     accumulate_dW);
        return;
    }
    const gpu::MatmulSite site{"experts_matmul_backward", e.R, K, N};
    const __nv_bfloat16* dout16 = gpu::matmul_bf16_rows(m.matmul, dout, 0, N, e.R * N, site, /*output_grad*/ true);
    gpu::grouped_gemm_dinp(dinp, dout16, W.bf16, e.device, (int)e.G, e.R, K, N, accumulate_dinp, m.stream);
    gpu::grouped_gemm_dW(dW, dout16, inp.bf16, e.device, (int)e.G, K, N, accumulate_dW, m.stream);
}

// experts: expert_out = W_down_e (silu(W_gate_e x) * (W_up_e x)) on each local expert e's rows of expert_in
static void experts_forward(GpuModel& m, const BlockWeights& w, GpuMoEActs& a, gpu::GemmInput expert_in,
                            float* expert_out) {
    const int64_t d = m.config.hidden_size, I = m.config.moe_intermediate_size;
    const ExpertGroups e = expert_groups(m, a);
    m.timer.mark("expert GEMMs");
    experts_matmul_forward(m, e, a.expert_g, expert_in, weight_of(m, w.expert_gate), d, I);
    experts_matmul_forward(m, e, a.expert_u, expert_in, weight_of(m, w.expert_up), d, I);
    swiglu(m, {a.expert_g, a.expert_u, a.expert_a, a.expert_a16}, e.R * I);
    experts_matmul_forward(m, e, expert_out, {a.expert_a, a.expert_a16}, weight_of(m, w.expert_down), I, d);
}

static void experts_backward(GpuModel& m, const BlockWeights& w, BlockWeights& g, const GpuMoEActs& a,
                             gpu::GemmInput expert_in, float* dexpert_out, float* dexpert_in, const ExpertScratch& es) {
    const int64_t d = m.config.hidden_size, I = m.config.moe_intermediate_size;
    const ExpertGroups e = expert_groups(m, a);
    m.timer.mark("expert GEMMs");
    experts_matmul_backward(m, e, es.da, g.expert_down, dexpert_out, {a.expert_a, a.expert_a16},
                            weight_of(m, w.expert_down), I, d, false);
    const SwigluGrads grads = swiglu_backward(m, {a.expert_g, a.expert_u, a.expert_a, a.expert_a16}, es.da, es.dg,
                                              es.du, e.R * I);
    experts_matmul_backward(m, e, dexpert_in, g.expert_gate, grads.dg, expert_in, weight_of(m, w.expert_gate), d, I,
                            false);
    experts_matmul_backward(m, e, dexpert_in, g.expert_up, grads.du, expert_in, weight_of(m, w.expert_up), d, I,
                            /*accumulate_dinp*/ true);
}

// The experts' input rows: at EP 1 the permuted rows themselves
static gpu::GemmInput expert_input(const GpuMoEActs& a, bool ep) {
    return {ep ? a.expert_in : a.rows_in, ep ? a.expert_in16 : a.rows_in16};
}

// Each sequence's sum_i f_i P_i (B values), queued to the host's `out` (gpu_model_losses sums them after its wait)
static void balance_loss(GpuModel& m, const GpuMoEActs& a, const Scratch& s, double* out) {
    m.timer.mark("router");
    gpu::balance_loss(s.seq_balance, s.token_totals, s.seq_counts, a.scores, a.chosen, m.config, m.acts.B, m.T,
                      m.stream);
    CUDA_CHECK(cudaMemcpyAsync(out, s.seq_balance, m.acts.B * sizeof(double), cudaMemcpyDeviceToHost, m.stream));
}

void moe_forward(GpuModel& m, const BlockWeights& w, GpuMoEActs& a, gpu::GemmInput x, float* out, int64_t* counts_out,
                 double* balance_out) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, k = c.num_experts_per_tok, I = c.moe_intermediate_size;
    const int64_t S = (int64_t)c.n_shared_experts * I;
    const bool ep = m.comm->ep_size > 1;
    const Scratch s = scratch_of(m);
    moe_route(m, w, a, x.fp32, s, counts_out);
    m.timer.mark("shared experts");  // queued before the wait for the counts: DeepSeek's overlap
    if (S > 0) ffn_forward(m, out, a.shared, x, w.gate, w.up, w.down, N, d, S);
    if (m.comm->ep_size > 1 || !experts_grouped_on_device(m)) moe_plan_rows(m, a, counts_out);
    m.timer.mark("permute");
    float* expert_out = ep ? a.expert_out : a.rows_out;
    if (x.bf16) {  // the rows permuted and dispatched in BF16; expert_out is free to receive them
        gpu::permute_forward(a.rows_in16, x.bf16, a.assignment_of_row, N, (int)k, d, m.stream);
        if (ep) dispatch_rows(m, a, a.rows_in16, a.expert_in16, reinterpret_cast<__nv_bfloat16*>(expert_out));
    } else {
        gpu::permute_forward(a.rows_in, x.fp32, a.assignment_of_row, N, (int)k, d, m.stream);
        if (ep) dispatch_rows(m, a, a.rows_in, a.expert_in, expert_out);
    }
    experts_forward(m, w, a, expert_input(a, ep), expert_out);
    m.timer.mark("permute");
    if (ep) return_rows(m, a, expert_out, a.rows_out, expert_scratch_of(m).dexpert_in);
    m.timer.mark("permute");
    gpu::combine_forward(out, a.rows_out, a.gate_weights, a.row_of_assignment, N, (int)k, d, S > 0, m.stream);
    if (balance_out && c.aux_loss_alpha > 0) balance_loss(m, a, s, balance_out);
}

void moe_backward(GpuModel& m, const BlockWeights& w, BlockWeights& g, GpuMoEActs& a, gpu::GemmInput x,
                  const float* dout, float* dx, float balance_scale, const Scratch& s) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const int64_t S = (int64_t)c.n_shared_experts * c.moe_intermediate_size;
    const bool ep = m.comm->ep_size > 1;
    const ExpertScratch es = expert_scratch_of(m);
    m.timer.mark("permute");
    gpu::combine_backward(s.drows_out, s.dgate_weights, dout, a.rows_out, a.gate_weights, a.row_of_assignment, N,
                          (int)k, d, m.stream);
    // the output gradients travel the dispatch's way, the input gradients the return's
    float* dexpert_out = ep ? es.dexpert_out : s.drows_out;
    float* dexpert_in = ep ? es.dexpert_in : s.drows_in;
    if (ep) dispatch_rows(m, a, s.drows_out, dexpert_out, es.dexpert_in);
    experts_backward(m, w, g, a, expert_input(a, ep), dexpert_out, dexpert_in, es);
    m.timer.mark("permute");
    if (ep) return_rows(m, a, dexpert_in, s.drows_in, es.dexpert_out);
    m.timer.mark("shared experts");
    if (S > 0)
        ffn_backward(m, dx, g.gate, g.up, g.down, dout, a.shared, x, w.gate, w.up, w.down, N, d, S, false, s.ffn_da,
                     s.ffn_dg, s.ffn_du);
    m.timer.mark("permute");
    gpu::permute_backward(dx, s.drows_in, a.row_of_assignment, N, (int)k, d, S > 0, m.stream);
    m.timer.mark("router");
    gpu::router_backward(s.drouter_logits, s.dgate_weights, a.scores, a.chosen, c, m.acts.B, m.T, balance_scale,
                         s.seq_counts, m.stream);
    gpu::matmul_backward(m.matmul, dx, g.router, s.drouter_logits, x.fp32, router_weight(m, w.router), N, d, E, true,
                         grad_accumulates(m, g.router));
}
