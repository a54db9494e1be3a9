// MoE forward and backward on the CPU.
// Gate-weight gradient: with S = sum_j s_j over the chosen experts and w_j = r s_j / S (norm_topk_prob),
//   dL/ds_m = r (dw_m / S - sum_j dw_j s_j / S^2);  without normalisation dL/ds_m = r dw_m.
// Balance loss per sequence: L = alpha sum_i f_i P_i, P_i = (1/T) sum_t s_ti / S_t, S_t = sum_e s_te (all experts),
//   f_i = E/(kT) * #{t : i chosen at t} (constant), so dL/ds_ti = alpha/T (f_i / S_t - sum_e f_e s_te / S_t^2).
// Router: s = sigmoid(z) so dL/dz = dL/ds * s (1 - s).
#include "moe.h"

#include <cstring>
#include <stdexcept>

#include "ops.h"
#include "router.h"

void moe_carve(Arena<float>& arena, const Config& c, int B, int T, MoEActs& a) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const int64_t I = c.moe_intermediate_size, S = (int64_t)c.n_shared_experts * I;
    a.scores = arena.take(N * E);
    a.gate_weights = arena.take(N * k);
    a.rows_sent = arena.take(N * k * d);
    a.rows_back = arena.take(N * k * d);
    swiglu_carve(arena, N, S, a.shared);
    a.shared_out = arena.take(S > 0 ? N * d : 0);
    a.chosen.assign(N * k, 0);
}

// The SwigluActs of local expert j's rows: views into the stacked buffers.
static SwigluActs expert_view(MoEActs& a, int64_t first_row, int64_t I) {
    return SwigluActs{a.expert_g.data() + first_row * I, a.expert_u.data() + first_row * I,
                      a.expert_a.data() + first_row * I};
}

// Rows (R, d) between arrival order and expert-contiguous order: to_expert moves row r to expert_row_of_recv[r].
static void permute_rows(float* dst, const float* src, const DispatchPlan& p, int64_t d, bool to_expert) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < p.received(); r++) {
        int64_t e = p.expert_row_of_recv[r];
        memcpy(dst + (to_expert ? e : r) * d, src + (to_expert ? r : e) * d, d * sizeof(float));
    }
}

// Sends rows (plan order) to the experts' ranks and returns them in expert-contiguous order, or the reverse.
static void dispatch_rows(Comm& comm, const DispatchPlan& p, const float* rows, float* expert_rows, int64_t d) {
    std::vector<float> arrived(p.received() * d);
    comm.all_to_all_v(rows, p.send_rows.data(), arrived.data(), p.recv_rows.data(), d);
    permute_rows(expert_rows, arrived.data(), p, d, true);
}
static void combine_rows(Comm& comm, const DispatchPlan& p, const float* expert_rows, float* rows, int64_t d) {
    std::vector<float> leaving(p.received() * d);
    permute_rows(leaving.data(), expert_rows, p, d, false);
    comm.all_to_all_v(leaving.data(), p.recv_rows.data(), rows, p.send_rows.data(), d);
}

void moe_forward(const Config& c, LinearPrecision precision, const BlockWeights& w, MoEActs& a, const float* x,
                 float* out, int B, int T, Comm& comm) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const int64_t I = c.moe_intermediate_size, S = (int64_t)c.n_shared_experts * I;

    // route: scores (N, E), chosen experts and gate weights (N, k)
    matmul_forward(a.scores, x, w.router, N, d, E);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++) {
        std::vector<float> scratch(E);
        float* s = a.scores + t * E;
        for (int64_t e = 0; e < E; e++) s[e] = sigmoidf_(s[e]);
        router_select(c, s, w.router_bias, scratch.data(), a.chosen.data() + t * k, a.gate_weights + t * k);
    }
    for (int64_t slot = 0; slot < N * k; slot++)
        if (a.chosen[slot] < 0)
            throw std::runtime_error("the router scores are not finite (the weights hold NaN or inf)");
    a.plan = build_expert_plan(a.chosen.data(), N * k, (int)E);
    const int64_t E_local = E / comm.ep_size;
    std::vector<int64_t> recv_counts(E);  // (P, E_local): rows each source sends to each of this rank's experts
    comm.all_to_all(a.plan.counts.data(), recv_counts.data(), E_local);
    a.dispatch = build_dispatch_plan(a.plan, recv_counts, comm.ep_size);
    const int64_t R = a.dispatch.received();

    // dispatch: gather token rows in plan order, send them to the experts' ranks, sort them by local expert
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < N * k; row++)
        memcpy(a.rows_sent + row * d, x + (a.plan.slot_of_row[row] / k) * d, d * sizeof(float));
    a.expert_in.resize(R * d);
    a.expert_out.resize(R * d);
    a.expert_g.resize(R * I);
    a.expert_u.resize(R * I);
    a.expert_a.resize(R * I);
    dispatch_rows(comm, a.dispatch, a.rows_sent, a.expert_in.data(), d);
    // grouped expert GEMMs, one contiguous block of rows per local expert
    for (int64_t j = 0; j < E_local; j++) {
        int64_t first = a.dispatch.expert_offsets[j], rows = a.dispatch.expert_counts[j];
        swiglu_ffn_forward(precision, a.expert_out.data() + first * d, expert_view(a, first, I),
                           a.expert_in.data() + first * d, w.expert_gate + j * I * d, w.expert_up + j * I * d,
                           w.expert_down + j * d * I, rows, d, I);
    }
    combine_rows(comm, a.dispatch, a.expert_out.data(), a.rows_back, d);
    if (S > 0) swiglu_ffn_forward(precision, a.shared_out, a.shared, x, w.gate, w.up, w.down, N, d, S);
    // combine: out_t = sum_j w_tj rows_back[row(t, j)] + shared_t
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++) {
        float* y = out + t * d;
        for (int64_t i = 0; i < d; i++) y[i] = S > 0 ? a.shared_out[t * d + i] : 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float* r = a.rows_back + a.plan.row_of_slot[t * k + j] * d;
            float gw = a.gate_weights[t * k + j];
            for (int64_t i = 0; i < d; i++) y[i] += gw * r[i];
        }
    }

    // sequence-wise balance loss
    a.balance_loss = 0.0;
    if (c.aux_loss_alpha > 0) {
        for (int b = 0; b < B; b++) {
            std::vector<double> f(E, 0.0), P(E, 0.0);
            for (int64_t t = b * (int64_t)T; t < (b + 1) * (int64_t)T; t++) {
                for (int64_t j = 0; j < k; j++) f[a.chosen[t * k + j]] += (double)E / (k * T);
                double total = 0.0;
                for (int64_t e = 0; e < E; e++) total += a.scores[t * E + e];
                for (int64_t e = 0; e < E; e++) P[e] += a.scores[t * E + e] / total / T;
            }
            double sum = 0.0;
            for (int64_t e = 0; e < E; e++) sum += f[e] * P[e];
            a.balance_loss += c.aux_loss_alpha * sum / B;
        }
    }
}

void moe_backward(const Config& c, LinearPrecision precision, const BlockWeights& w, BlockWeights& g, MoEActs& a,
                  const float* x, const float* dout, float* dx, int B, int T, float balance_scale, Comm& comm) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const int64_t I = c.moe_intermediate_size, S = (int64_t)c.n_shared_experts * I;

    // combine backward: d rows_back[row(t,j)] = w_tj dout_t;  dw_tj = dout_t . rows_back[row(t,j)]
    std::vector<float> drows_back(N * k * d), dgate_weights(N * k), drows_sent(N * k * d);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t row = a.plan.row_of_slot[t * k + j];
            const float* r = a.rows_back + row * d;
            float gw = a.gate_weights[t * k + j], dot = 0.0f;
            for (int64_t i = 0; i < d; i++) {
                drows_back[row * d + i] = gw * dout[t * d + i];
                dot += dout[t * d + i] * r[i];
            }
            dgate_weights[t * k + j] = dot;
        }
    // the mirror of the forward exchange: output gradients travel to the experts, input gradients come back
    const int64_t E_local = E / comm.ep_size, R = a.dispatch.received();
    std::vector<float> dexpert_out(R * d), dexpert_in(R * d);
    dispatch_rows(comm, a.dispatch, drows_back.data(), dexpert_out.data(), d);
    for (int64_t j = 0; j < E_local; j++) {
        int64_t first = a.dispatch.expert_offsets[j], rows = a.dispatch.expert_counts[j];
        swiglu_ffn_backward(precision, dexpert_in.data() + first * d, g.expert_gate + j * I * d,
                            g.expert_up + j * I * d, g.expert_down + j * d * I, dexpert_out.data() + first * d,
                            expert_view(a, first, I), a.expert_in.data() + first * d, w.expert_gate + j * I * d,
                            w.expert_up + j * I * d, w.expert_down + j * d * I, rows, d, I, false);
    }
    combine_rows(comm, a.dispatch, dexpert_in.data(), drows_sent.data(), d);
    // scatter the expert-row gradients back to their tokens (and the shared experts' gradient)
    if (S > 0)
        swiglu_ffn_backward(precision, dx, g.gate, g.up, g.down, dout, a.shared, x, w.gate, w.up, w.down, N, d, S,
                            false);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++) {
        float* dxt = dx + t * d;
        if (S == 0) memset(dxt, 0, d * sizeof(float));
        for (int64_t j = 0; j < k; j++) {
            const float* dr = drows_sent.data() + a.plan.row_of_slot[t * k + j] * d;
            for (int64_t i = 0; i < d; i++) dxt[i] += dr[i];
        }
    }

    // router: gate weights and balance loss -> scores -> logits
    std::vector<float> dlogits(N * E);
    router_backward(c, a.scores, a.chosen.data(), dgate_weights.data(), dlogits.data(), B, T, balance_scale);
    matmul_backward(dx, g.router, dlogits.data(), x, w.router, N, d, E, true);
}

void router_backward(const Config& c, const float* scores, const int32_t* chosen, const float* dgate_weights,
                     float* dlogits, int B, int T, float balance_scale) {
    const int64_t N = (int64_t)B * T, E = c.n_routed_experts, k = c.num_experts_per_tok;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; t++) {
        const float* s = scores + t * E;
        float* dz = dlogits + t * E;
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
                    dlogits[t * E + e] += (float)(coef * (f[e] / total - fs / (total * total)));
            }
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * E; i++) dlogits[i] *= scores[i] * (1.0f - scores[i]);
}
