// The MoE layer's phases on the CPU (see moe.h). The router backward (docs/design.md §1.2), S = sum of the chosen s:
//   gates:    dL/ds_m = r (dw_m / S - sum_j dw_j s_j / S^2) (norm_topk_prob), else r dw_m
//   balance:  dL/ds_te += alpha/(B T) (f_e / S_t - sum_e' f_e' s_te' / S_t^2),  S_t = sum_e s_te
//   sigmoid:  dL/dz = dL/ds s (1 - s)
#include "moe.h"

#include <cstring>
#include <stdexcept>

#include "ops.h"
#include "router.h"

void moe_carve(Arena& arena, const Config& c, int B, int T, MoEActs& a) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    a.scores = arena.take<float>(N * E);
    a.gate_weights = arena.take<float>(N * k);
    a.rows_in = arena.take<float>(N * k * d);
    a.rows_out = arena.take<float>(N * k * d);
    swiglu_carve(arena, N, (int64_t)c.n_shared_experts * c.moe_intermediate_size, a.shared);
    a.chosen.assign(N * k, 0);
}

// route: scores (N, E), chosen experts and gate weights (N, k), the expert plan and the dispatch plan
static void moe_route(const Config& c, const BlockWeights& w, MoEActs& a, const float* x, int64_t N, Comm& comm) {
    const int64_t d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    matmul_forward(a.scores, x, w.router, N, d, E);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++) {
        std::vector<float> scratch(E);
        float* s = a.scores + t * E;
        for (int64_t e = 0; e < E; e++) s[e] = sigmoidf_(s[e]);
        router_select(c, s, w.router_bias, scratch.data(), a.chosen.data() + t * k, a.gate_weights + t * k);
    }
    for (int64_t i = 0; i < N * k; i++)
        if (a.chosen[i] < 0) throw std::runtime_error("the router scores are not finite (the weights hold NaN or inf)");
    a.plan = build_expert_plan(a.chosen.data(), N * k, (int)E);
    a.dispatch = plan_dispatch(comm, a.plan.counts);
}

// permute: rows (N*k, d) in plan order, rows[r] = x[token of row r]
static void permute_forward(float* rows, const float* x, const ExpertPlan& plan, int64_t N, int64_t k, int64_t d) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * k; r++) memcpy(rows + r * d, x + plan.assignment_of_row[r] / k * d, d * sizeof(float));
}

// dx_t (=|+=) sum_j drows[row of t*k+j], in j order
static void permute_backward(float* dx, const float* drows, const ExpertPlan& plan, int64_t N, int64_t k, int64_t d,
                             bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++) {
        float* dxt = dx + t * d;
        if (!accumulate) memset(dxt, 0, d * sizeof(float));
        for (int64_t j = 0; j < k; j++) {
            const float* dr = drows + plan.row_of_assignment[t * k + j] * d;
            for (int64_t i = 0; i < d; i++) dxt[i] += dr[i];
        }
    }
}

// Rows (R, d) between arrival order and local expert order: to_experts moves row r to expert_row_of_recv[r].
static void sort_rows(float* dst, const float* src, const DispatchPlan& p, int64_t d, bool to_experts) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < p.received(); r++) {
        const int64_t e = p.expert_row_of_recv[r];
        memcpy(dst + (to_experts ? e : r) * d, src + (to_experts ? r : e) * d, d * sizeof(float));
    }
}

// dispatch: rows in plan order to the experts' ranks, into local expert order (EP > 1)
static void dispatch_rows(Comm& comm, const DispatchPlan& p, const float* rows, float* expert_rows, int64_t d) {
    std::vector<float> arrived(p.received() * d);
    comm.all_to_all_v(rows, p.send_rows.data(), arrived.data(), p.recv_rows.data(), d);
    sort_rows(expert_rows, arrived.data(), p, d, true);
}

// return: rows in local expert order back to their tokens' ranks, in plan order (EP > 1)
static void return_rows(Comm& comm, const DispatchPlan& p, const float* expert_rows, float* rows, int64_t d) {
    std::vector<float> leaving(p.received() * d);
    sort_rows(leaving.data(), expert_rows, p, d, false);
    comm.all_to_all_v(leaving.data(), p.recv_rows.data(), rows, p.send_rows.data(), d);
}

// experts: expert_out = W_down_e (silu(W_gate_e x) * (W_up_e x)) on each local expert e's rows of expert_in
static void experts_forward(Precision p, const BlockWeights& w, MoEActs& a, const float* expert_in, float* expert_out,
                            int64_t d, int64_t I) {
    const int64_t* offsets = a.dispatch.expert_offsets.data();
    const int64_t E_local = (int64_t)a.dispatch.expert_counts.size(), R = a.dispatch.received();
    a.expert_g.resize(R * I);
    a.expert_u.resize(R * I);
    a.expert_a.resize(R * I);
    grouped_linear_forward(p, a.expert_g.data(), expert_in, w.expert_gate, offsets, E_local, d, I);
    grouped_linear_forward(p, a.expert_u.data(), expert_in, w.expert_up, offsets, E_local, d, I);
    swiglu_forward(a.expert_a.data(), a.expert_g.data(), a.expert_u.data(), R * I);
    grouped_linear_forward(p, expert_out, a.expert_a.data(), w.expert_down, offsets, E_local, I, d);
}

static void experts_backward(Precision p, const BlockWeights& w, BlockWeights& g, const MoEActs& a,
                             const float* expert_in, const float* dexpert_out, float* dexpert_in, int64_t d,
                             int64_t I) {
    const int64_t* offsets = a.dispatch.expert_offsets.data();
    const int64_t E_local = (int64_t)a.dispatch.expert_counts.size(), R = a.dispatch.received();
    std::vector<float> da(R * I), dg(R * I), du(R * I);
    grouped_linear_backward(p, da.data(), g.expert_down, dexpert_out, a.expert_a.data(), w.expert_down, offsets,
                            E_local, I, d, false);
    swiglu_backward(dg.data(), du.data(), da.data(), a.expert_g.data(), a.expert_u.data(), R * I);
    grouped_linear_backward(p, dexpert_in, g.expert_gate, dg.data(), expert_in, w.expert_gate, offsets, E_local, d, I,
                            false);
    grouped_linear_backward(p, dexpert_in, g.expert_up, du.data(), expert_in, w.expert_up, offsets, E_local, d, I,
                            true);
}

// combine: out_t (=|+=) sum_j w_tj rows[row of t*k+j]; += adds onto the shared experts' output
static void combine_forward(float* out, const float* rows, const float* gate_weights, const ExpertPlan& plan,
                            int64_t N, int64_t k, int64_t d, bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++) {
        float* y = out + t * d;
        if (!accumulate) memset(y, 0, d * sizeof(float));
        for (int64_t j = 0; j < k; j++) {
            const float* r = rows + plan.row_of_assignment[t * k + j] * d;
            const float gw = gate_weights[t * k + j];
            for (int64_t i = 0; i < d; i++) y[i] += gw * r[i];
        }
    }
}

// drows[row of t*k+j] = w_tj dout_t;  dgate_weights[t*k+j] = dout_t . rows[row of t*k+j]
static void combine_backward(float* drows, float* dgate_weights, const float* dout, const float* rows,
                             const float* gate_weights, const ExpertPlan& plan, int64_t N, int64_t k, int64_t d) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t row = plan.row_of_assignment[t * k + j];
            const float* r = rows + row * d;
            const float gw = gate_weights[t * k + j];
            float dot = 0.0f;
            for (int64_t i = 0; i < d; i++) {
                drows[row * d + i] = gw * dout[t * d + i];
                dot += dout[t * d + i] * r[i];
            }
            dgate_weights[t * k + j] = dot;
        }
}

// alpha sum_i f_i P_i, averaged over the B sequences
static double balance_loss(const Config& c, const float* scores, const int32_t* chosen, int B, int T) {
    const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        std::vector<double> f(E, 0.0), P(E, 0.0);
        for (int64_t t = b * (int64_t)T; t < (b + 1) * (int64_t)T; t++) {
            for (int64_t j = 0; j < k; j++) f[chosen[t * k + j]] += (double)E / (k * T);
            double total = 0.0;
            for (int64_t e = 0; e < E; e++) total += scores[t * E + e];
            for (int64_t e = 0; e < E; e++) P[e] += scores[t * E + e] / total / T;
        }
        double sum = 0.0;
        for (int64_t e = 0; e < E; e++) sum += f[e] * P[e];
        loss += c.aux_loss_alpha * sum / B;
    }
    return loss;
}

void moe_forward(const Config& c, Precision p, const BlockWeights& w, MoEActs& a, const float* x, float* out, int B,
                 int T, Comm& comm, bool with_loss) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, k = c.num_experts_per_tok, I = c.moe_intermediate_size;
    const int64_t S = (int64_t)c.n_shared_experts * I;
    const bool ep = comm.ep_size > 1;
    moe_route(c, w, a, x, N, comm);
    if (S > 0) ffn_forward(p, out, a.shared, x, w.gate, w.up, w.down, N, d, S);  // first, as the GPU queues them
    permute_forward(a.rows_in, x, a.plan, N, k, d);
    a.expert_in.resize(ep ? a.dispatch.received() * d : 0);
    a.expert_out.resize(a.expert_in.size());
    float* expert_in = ep ? a.expert_in.data() : a.rows_in;
    float* expert_out = ep ? a.expert_out.data() : a.rows_out;
    if (ep) dispatch_rows(comm, a.dispatch, a.rows_in, expert_in, d);
    experts_forward(p, w, a, expert_in, expert_out, d, I);
    if (ep) return_rows(comm, a.dispatch, expert_out, a.rows_out, d);
    combine_forward(out, a.rows_out, a.gate_weights, a.plan, N, k, d, S > 0);
    a.balance_loss = with_loss && c.aux_loss_alpha > 0 ? balance_loss(c, a.scores, a.chosen.data(), B, T) : 0.0;
}

void moe_backward(const Config& c, Precision p, const BlockWeights& w, BlockWeights& g, MoEActs& a, const float* x,
                  const float* dout, float* dx, int B, int T, float balance_scale, Comm& comm) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const int64_t I = c.moe_intermediate_size, S = (int64_t)c.n_shared_experts * I, R = a.dispatch.received();
    const bool ep = comm.ep_size > 1;
    std::vector<float> drows_out(N * k * d), dgate_weights(N * k), drows_in(N * k * d);
    combine_backward(drows_out.data(), dgate_weights.data(), dout, a.rows_out, a.gate_weights, a.plan, N, k, d);
    // the output gradients travel the dispatch's way, the input gradients the return's
    std::vector<float> exchanged_out(ep ? R * d : 0), exchanged_in(ep ? R * d : 0);  // EP > 1: the experts' rows
    float* dexpert_out = ep ? exchanged_out.data() : drows_out.data();
    float* dexpert_in = ep ? exchanged_in.data() : drows_in.data();
    if (ep) dispatch_rows(comm, a.dispatch, drows_out.data(), dexpert_out, d);
    experts_backward(p, w, g, a, ep ? a.expert_in.data() : a.rows_in, dexpert_out, dexpert_in, d, I);
    if (ep) return_rows(comm, a.dispatch, dexpert_in, drows_in.data(), d);
    if (S > 0) ffn_backward(p, dx, g.gate, g.up, g.down, dout, a.shared, x, w.gate, w.up, w.down, N, d, S, false);
    permute_backward(dx, drows_in.data(), a.plan, N, k, d, S > 0);
    std::vector<float> drouter_logits(N * E);
    router_backward(c, a.scores, a.chosen.data(), dgate_weights.data(), drouter_logits.data(), B, T, balance_scale);
    matmul_backward(dx, g.router, drouter_logits.data(), x, w.router, N, d, E, true);
}

void router_backward(const Config& c, const float* scores, const int32_t* chosen, const float* dgate_weights,
                     float* drouter_logits, int B, int T, float balance_scale) {
    const int64_t N = (int64_t)B * T, E = c.n_routed_experts, k = c.num_experts_per_tok;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++) {
        const float* s = scores + t * E;
        float* dz = drouter_logits + t * E;
        for (int64_t e = 0; e < E; e++) dz[e] = 0.0f;  // holds dL/ds until the sigmoid step below
        const int32_t* ch = chosen + t * k;
        const float* dgw = dgate_weights + t * k;
        if (c.norm_topk_prob) {
            float sum = 0.0f, weighted = 0.0f;
            for (int64_t j = 0; j < k; j++) sum += s[ch[j]];
            for (int64_t j = 0; j < k; j++) weighted += dgw[j] * s[ch[j]];
            for (int64_t j = 0; j < k; j++)
                dz[ch[j]] += c.routed_scaling_factor * (dgw[j] / sum - weighted / (sum * sum));
        } else {
            for (int64_t j = 0; j < k; j++) dz[ch[j]] += c.routed_scaling_factor * dgw[j];
        }
    }
    if (c.aux_loss_alpha > 0) {
#pragma omp parallel for schedule(static)
        for (int b = 0; b < B; b++) {
            std::vector<double> f(E, 0.0);
            for (int64_t t = b * (int64_t)T; t < (b + 1) * (int64_t)T; t++)
                for (int64_t j = 0; j < k; j++) f[chosen[t * k + j]] += (double)E / (k * T);
            const double coef = balance_scale * c.aux_loss_alpha / ((double)B * T);
            for (int64_t t = b * (int64_t)T; t < (b + 1) * (int64_t)T; t++) {
                const float* s = scores + t * E;
                double total = 0.0, fs = 0.0;
                for (int64_t e = 0; e < E; e++) total += s[e];
                for (int64_t e = 0; e < E; e++) fs += f[e] * s[e];
                for (int64_t e = 0; e < E; e++)
                    drouter_logits[t * E + e] += (float)(coef * (f[e] / total - fs / (total * total)));
            }
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * E; i++) drouter_logits[i] *= scores[i] * (1.0f - scores[i]);
}
