// Model forward and backward on the CPU: the blocks, the head, the losses and MTP glued together.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <malloc.h>
#include <numeric>

#include "ops.h"
#include "optimizer.h"
#include "rng.h"

void model_init(Model& m, const Config& c, Comm* comm, int first_layer, int end_layer) {
    m.config = c;
    m.comm = comm ? comm : &local_comm();
    m.first_layer = first_layer;
    m.end_layer = end_layer < 0 ? c.num_hidden_layers : end_layer;
    m.table = build_param_table(c, m.comm->ep_size, m.first_layer, m.end_layer);
    m.shard = optimizer_shard(m.table, *m.comm);
    m.params.assign(m.table.total, 0.0f);
    m.grads.assign(m.table.total, 0.0f);
    m.w = map_weights(c, m.table, m.params.data());
    m.g = map_weights(c, m.table, m.grads.data());
    m.expert_counts.assign(c.num_blocks(), {});
    for (int l = 0; l < c.num_blocks(); l++)
        if (c.is_moe_layer(l)) m.expert_counts[l].assign(c.n_routed_experts, 0);
    m.B = m.T = 0;
}

void model_release_grads(Model& m) {
    std::vector<float>().swap(m.grads);
    m.g = ModelWeights{};
}

// Each tensor, and each expert of a stacked one, draws from its own stream (docs/design.md §1.4). So the weights do
// not depend on the EP layout, and the streams fill in parallel with the same values for any thread count.
void model_init_weights(Model& m, uint64_t seed) {
    struct Slice {
        const ParamTensor* t;
        int64_t index;  // expert index within the stacked tensor, 0 otherwise
    };
    std::vector<Slice> slices;
    for (const ParamTensor& t : m.table.tensors)
        for (int64_t s = 0; s < (t.expert_shard ? t.shape[0] : 1); s++) slices.push_back({&t, s});
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < slices.size(); i++) {
        const ParamTensor& t = *slices[i].t;
        const int64_t s = slices[i].index, per_slice = t.expert_shard ? t.numel / t.shape[0] : t.numel;
        const int64_t first_expert = t.expert_shard ? (int64_t)m.comm->ep_rank * t.shape[0] : 0;
        const bool is_norm = t.shape.size() == 1 && t.trainable;
        Rng rng(fnv1a(t.name, seed * 0x9E3779B97F4A7C15ull + (uint64_t)(first_expert + s)));
        float* p = m.params.data() + t.offset + s * per_slice;
        for (int64_t j = 0; j < per_slice; j++)
            p[j] = !t.trainable ? 0.0f : is_norm ? 1.0f : m.config.initializer_range * rng.normal();
    }
}

void model_zero_grads(Model& m) { std::fill(m.grads.begin(), m.grads.end(), 0.0f); }

static void block_carve(Arena& arena, const Config& c, int layer, int B, int T, BlockActs& a) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size;
    a.attn_normed = arena.take<float>(N * d);
    a.attn_rstd = arena.take<float>(N);
    mla_carve(arena, c, B, T, a.mla);
    a.attn_out = arena.take<float>(N * d);
    a.h_mid = arena.take<float>(N * d);
    a.ffn_normed = arena.take<float>(N * d);
    a.ffn_rstd = arena.take<float>(N);
    if (c.is_moe_layer(layer))
        moe_carve(arena, c, B, T, a.moe);
    else
        swiglu_carve(arena, N, c.intermediate_size, a.dense);
    a.ffn_out = arena.take<float>(N * d);
}

int64_t head_chunk_rows(const Config& c, int64_t N, const ActivationLayout& layout) {
    const int64_t V = c.vocab_size, aligned = 64 / std::gcd<int64_t>(V, 64);  // rows x V a multiple of 64
    return std::min(N, std::max(aligned, layout.head_chunk_values / V / aligned * aligned));
}

std::vector<int> block_sets(const Config& c, bool recompute, int first_layer, int end_layer) {
    const int L = c.num_hidden_layers;
    if (end_layer < 0) end_layer = L;
    std::vector<int> set(c.num_blocks(), -1);
    int dense = -1, moe = -1, sets = 0;
    for (int l = 0; l < c.num_blocks(); l++) {
        if ((l < first_layer || l >= end_layer) && !(l >= L && end_layer == L)) continue;  // another stage's
        int& kind = c.is_moe_layer(l) ? moe : dense;
        if (kind < 0 || !recompute) kind = sets++;
        set[l] = kind;
    }
    return set;
}

// Lays out every activation of a B x T batch in two allocations, the activation sets and the rest (re-done only
// when B or T change).
void model_reserve(Model& m, int B, int T) {
    if (m.B == B && m.T == T) return;
    const Config& c = m.config;
    const int64_t N = (int64_t)B * T, d = c.hidden_size, V = c.vocab_size;
    ModelActs& a = m.acts;
    a.residual.assign(c.num_hidden_layers + 1, nullptr);
    a.block_set = block_sets(c, m.layout.recompute, m.first_layer, m.end_layer);
    const int sets = *std::max_element(a.block_set.begin(), a.block_set.end()) + 1;
    a.blocks.assign(sets, BlockActs{});
    a.set_layer.assign(sets, -1);
    a.set_slot.assign(sets, -1);
    carve_arena(m.set_storage, [&](Arena& arena) {
        for (int l = 0, carved = 0; l < c.num_blocks(); l++)
            if (a.block_set[l] == carved) block_carve(arena, c, l, B, T, a.blocks[carved++]);
    });
    const bool last = m.last_stage(), mtp = last && c.num_nextn_predict_layers > 0;
    const int64_t logit_rows = !last ? 0 : m.layout.recompute ? head_chunk_rows(c, N, m.layout) : N;
    carve_arena(m.act_storage, [&](Arena& arena) {
        for (int l = m.first_layer; l < m.end_layer; l++) a.residual[l] = arena.take<float>(N * d);
        if (last) a.residual[c.num_hidden_layers] = arena.take<float>(N * d);
        a.final_normed = arena.take<float>(last ? N * d : 0);
        a.final_rstd = arena.take<float>(last ? N : 0);
        a.logits = arena.take<float>(logit_rows * V);
        a.next_embed = arena.take<float>(mtp ? N * d : 0);
        a.enorm_out = arena.take<float>(mtp ? N * d : 0);
        a.enorm_rstd = arena.take<float>(mtp ? N : 0);
        a.hnorm_out = arena.take<float>(mtp ? N * d : 0);
        a.hnorm_rstd = arena.take<float>(mtp ? N : 0);
        a.mtp_concat = arena.take<float>(mtp ? 2 * N * d : 0);
        a.mtp_in = arena.take<float>(mtp ? N * d : 0);
        a.mtp_out = arena.take<float>(mtp ? N * d : 0);
        a.mtp_normed = arena.take<float>(mtp ? N * d : 0);
        a.mtp_rstd = arena.take<float>(mtp ? N : 0);
        a.mtp_logits = arena.take<float>(mtp ? logit_rows * V : 0);
    });
    m.B = B;
    m.T = T;
}

// A setting glibc refuses (mallopt returns 0) only costs speed: not an error.
void keep_freed_memory() {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);  // blocks up to 1 GiB come from the heap (also ends the dynamic threshold)
    mallopt(M_TRIM_THRESHOLD, 1 << 30);  // and the heap keeps up to 1 GiB of free memory at its top
}

static BlockActs& block_acts(Model& m, int layer) { return m.acts.blocks[m.acts.block_set[layer]]; }

// The RMSNorm that reads a block's output, fused with the block's last residual add: its weight and its outputs.
struct NextNorm {
    const float* weight;
    float* out;
    float* rstd;
};

static NextNorm attention_norm(Model& m, int layer) {
    BlockActs& a = block_acts(m, layer);
    return NextNorm{m.w.blocks[layer].attn_norm, a.attn_normed, a.attn_rstd};
}

// h_mid = h_in + Attn(RMSNorm(h_in)); h_out = h_mid + FFN(RMSNorm(h_mid)); next = RMSNorm(h_out). Whoever wrote
// h_in computed the attention norm. Returns the balance loss. h_out nullptr: only what the backward reads.
static double block_forward(Model& m, int layer, const float* h_in, float* h_out, const NextNorm& next, bool training,
                            bool with_loss) {
    const Config& c = m.config;
    const BlockWeights& w = m.w.blocks[layer];
    BlockActs& a = block_acts(m, layer);
    m.acts.set_layer[m.acts.block_set[layer]] = layer;
    m.acts.set_slot[m.acts.block_set[layer]] = m.slot;
    const int64_t N = (int64_t)m.B * m.T, d = c.hidden_size;
    mla_forward(c, m.precision, w, a.mla, a.attn_normed, a.attn_out, m.B, m.T);
    residual_rmsnorm_forward(a.h_mid, a.ffn_normed, a.ffn_rstd, h_in, a.attn_out, w.ffn_norm, N, d, c.rms_norm_eps);
    double balance = 0.0;
    if (c.is_moe_layer(layer)) {
        moe_forward(c, m.precision, w, a.moe, a.ffn_normed, a.ffn_out, m.B, m.T, *m.comm, with_loss);
        if (training)
            for (int e = 0; e < c.n_routed_experts; e++) m.expert_counts[layer][e] += a.moe.plan.counts[e];
        balance = a.moe.balance_loss;
    } else {
        ffn_forward(m.precision, a.ffn_out, a.dense, a.ffn_normed, w.gate, w.up, w.down, N, d, c.intermediate_size);
    }
    if (h_out && next.weight)
        residual_rmsnorm_forward(h_out, next.out, next.rstd, a.h_mid, a.ffn_out, next.weight, N, d, c.rms_norm_eps);
    else if (h_out)  // the stage's output: the next stage computes the norm
        for (int64_t i = 0; i < N * d; i++) h_out[i] = a.h_mid[i] + a.ffn_out[i];
    return balance;
}

// The attention norm of block `layer` on its input h (for the blocks no earlier block feeds: the first, and MTP's).
static void block_input_norm(Model& m, int layer, const float* h) {
    const NextNorm norm = attention_norm(m, layer);
    rmsnorm_forward(norm.out, norm.rstd, h, norm.weight, (int64_t)m.B * m.T, m.config.hidden_size,
                    m.config.rms_norm_eps);
}

// With recompute: block `layer`'s forward again from h_in, if another block has used its activation set since.
// Not training: the first forward counted the expert loads and the balance loss.
static void restore_block_acts(Model& m, int layer, const float* h_in) {
    const int set = m.acts.block_set[layer];
    if (m.acts.set_layer[set] == layer && m.acts.set_slot[set] == m.slot) return;
    block_input_norm(m, layer, h_in);
    block_forward(m, layer, h_in, nullptr, NextNorm{}, /*training*/ false, /*with_loss*/ false);
}

// dh_out (N, d) -> dh_in (N, d) overwritten.
static void block_backward(Model& m, int layer, const float* h_in, const float* dh_out, float* dh_in,
                           float loss_scale) {
    const Config& c = m.config;
    const BlockWeights& w = m.w.blocks[layer];
    BlockWeights& g = m.g.blocks[layer];
    restore_block_acts(m, layer, h_in);
    BlockActs& a = block_acts(m, layer);
    const int64_t N = (int64_t)m.B * m.T, d = c.hidden_size;
    std::vector<float> dnormed(N * d), dh_mid(dh_out, dh_out + N * d);
    if (c.is_moe_layer(layer))
        moe_backward(c, m.precision, w, g, a.moe, a.ffn_normed, dh_out, dnormed.data(), m.B, m.T, loss_scale,
                     *m.comm);
    else
        ffn_backward(m.precision, dnormed.data(), g.gate, g.up, g.down, dh_out, a.dense, a.ffn_normed, w.gate, w.up,
                     w.down, N, d, c.intermediate_size, false);
    rmsnorm_backward(dh_mid.data(), g.ffn_norm, dnormed.data(), a.h_mid, w.ffn_norm, a.ffn_rstd, N, d, true);
    memcpy(dh_in, dh_mid.data(), N * d * sizeof(float));
    mla_backward(c, m.precision, w, g, a.mla, a.attn_normed, dh_mid.data(), dnormed.data(), m.B, m.T);
    rmsnorm_backward(dh_in, g.attn_norm, dnormed.data(), h_in, w.attn_norm, a.attn_rstd, N, d, true);
}

// An output head, main or MTP's: its logits (N, V) or one head chunk's, the normalised rows (N, d) it reads, and
// their targets (nullptr: none).
struct Head {
    float* logits;
    const float* normed;
    const int32_t* targets;
};
static Head main_head(Model& m, bool with_targets) {
    return {m.acts.logits, m.acts.final_normed, with_targets ? m.targets.data() : nullptr};
}
static Head mtp_head(Model& m) { return {m.acts.mtp_logits, m.acts.mtp_normed, m.mtp_targets.data()}; }

// Whether the forward keeps every chunk's logits: without recompute, or when one chunk holds all the rows.
static bool keeps_logits(const Model& m) {
    const int64_t N = (int64_t)m.B * m.T;
    return !m.layout.recompute || head_chunk_rows(m.config, N, m.layout) >= N;
}

// The logits of head h's chunk of rows [r0, r0 + rows), where the forward keeps them. Computed there if `compute`:
// in the forward, and later when the forward does not keep them.
static float* head_logits(Model& m, const Head& h, int64_t r0, int64_t rows, bool compute) {
    const int64_t d = m.config.hidden_size, V = m.config.vocab_size;
    float* logits = keeps_logits(m) ? h.logits + r0 * V : h.logits;
    if (compute) matmul_forward(logits, h.normed + r0 * d, m.w.head, rows, d, V);
    return logits;
}

// Head h's forward, chunk by chunk: the logits, and with targets returns the rows' summed loss.
static double head_forward(Model& m, const Head& h) {
    const int64_t N = (int64_t)m.B * m.T, V = m.config.vocab_size, chunk = head_chunk_rows(m.config, N, m.layout);
    double total = 0.0;
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t rows = std::min(chunk, N - r0);
        const float* logits = head_logits(m, h, r0, rows, /*compute*/ true);
        if (h.targets) total += cross_entropy_forward_backward(nullptr, logits, h.targets + r0, rows, V, 0.0f);
    }
    return total;
}

// Head h's backward: dlogits = scale (softmax(logits) - onehot(targets)) chunk by chunk, then for all N rows at once
// dnormed (N, d) = dlogits W_head, overwritten, and dW_head += dlogits^T normed.
static void head_backward(Model& m, const Head& h, float* dnormed, float scale) {
    const int64_t N = (int64_t)m.B * m.T, d = m.config.hidden_size, V = m.config.vocab_size;
    const int64_t chunk = head_chunk_rows(m.config, N, m.layout);
    std::vector<float> dlogits(N * V);
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t rows = std::min(chunk, N - r0);
        const float* logits = head_logits(m, h, r0, rows, /*compute*/ !keeps_logits(m));
        cross_entropy_forward_backward(dlogits.data() + r0 * V, logits, h.targets + r0, rows, V, scale);
    }
    matmul_backward(dnormed, m.g.head, dlogits.data(), h.normed, m.w.head, N, d, V, false);
}

void model_logits_row(Model& m, int64_t row, float* out) {
    const int64_t N = (int64_t)m.B * m.T, V = m.config.vocab_size, chunk = head_chunk_rows(m.config, N, m.layout);
    const int64_t r0 = row / chunk * chunk;  // the row's chunk
    const float* logits = head_logits(m, main_head(m, false), r0, std::min(chunk, N - r0), !keeps_logits(m));
    std::copy_n(logits + (row - r0) * V, V, out);
}

int64_t stage_message_floats(const Config& c, int B, int T) {
    return (int64_t)B * T * c.hidden_size * (c.num_nextn_predict_layers > 0 ? 2 : 1);
}

LossParts model_forward(Model& m, const int32_t* inputs, const int32_t* targets, int B, int T, bool training) {
    return model_stage_forward(m, inputs, targets, B, T, training, nullptr, nullptr);
}

LossParts model_stage_forward(Model& m, const int32_t* inputs, const int32_t* targets, int B, int T, bool training,
                              const float* in, float* out) {
    model_reserve(m, B, T);
    const Config& c = m.config;
    ModelActs& a = m.acts;
    const int64_t N = (int64_t)B * T, d = c.hidden_size;
    const int first = m.first_layer, end = m.end_layer;
    const bool last = m.last_stage(), mtp = c.num_nextn_predict_layers > 0 && targets;
    m.inputs.assign(inputs, inputs + N);
    if (targets) m.targets.assign(targets, targets + N);
    else m.targets.clear();
    LossParts loss;
    if (m.first_stage()) embedding_forward(a.residual[first], inputs, m.w.embed, N, d);
    else std::copy_n(in, N * d, a.residual[first]);
    block_input_norm(m, first, a.residual[first]);
    const NextNorm final_norm{m.w.final_norm, a.final_normed, a.final_rstd};
    for (int l = first; l < end; l++) {
        const bool stage_end = l + 1 == end;
        const NextNorm next = !stage_end ? attention_norm(m, l + 1) : last ? final_norm : NextNorm{};
        float* h_out = stage_end && !last ? out : a.residual[l + 1];
        loss.balance += block_forward(m, l, a.residual[l], h_out, next, training, targets != nullptr);
    }
    if (!last) {  // Emb(targets) for the last stage's MTP block, passed along
        if (mtp && m.first_stage()) embedding_forward(out + N * d, targets, m.w.embed, N, d);
        else if (mtp) std::copy_n(in + N * d, N * d, out + N * d);
        loss.total = loss.balance;
        return loss;
    }
    if (!targets) {  // the logits only, for model_logits_row
        if (keeps_logits(m)) head_forward(m, main_head(m, false));
        return loss;
    }
    loss.main = head_forward(m, main_head(m, true)) / N;
    if (mtp) {
        m.mtp_targets.resize(N);
        for (int64_t t = 0; t < N; t++) m.mtp_targets[t] = (t % T == T - 1) ? -1 : targets[t + 1];
        if (m.first_stage()) embedding_forward(a.next_embed, targets, m.w.embed, N, d);
        else std::copy_n(in + N * d, N * d, a.next_embed);
        rmsnorm_forward(a.enorm_out, a.enorm_rstd, a.next_embed, m.w.mtp_enorm, N, d, c.rms_norm_eps);
        rmsnorm_forward(a.hnorm_out, a.hnorm_rstd, a.final_normed, m.w.mtp_hnorm, N, d, c.rms_norm_eps);
        copy_columns(a.mtp_concat, 2 * d, a.enorm_out, d, N, d);
        copy_columns(a.mtp_concat + d, 2 * d, a.hnorm_out, d, N, d);
        matmul_forward(a.mtp_in, a.mtp_concat, m.w.mtp_eh_proj, N, 2 * d, d);
        const int L = c.num_hidden_layers;
        block_input_norm(m, L, a.mtp_in);
        const NextNorm mtp_norm{m.w.mtp_norm, a.mtp_normed, a.mtp_rstd};
        loss.balance += block_forward(m, L, a.mtp_in, a.mtp_out, mtp_norm, training, true);
        loss.mtp = head_forward(m, mtp_head(m)) / ((double)B * (T - 1));
    }
    loss.total = loss.main + c.mtp_loss_weight * loss.mtp + loss.balance;
    return loss;
}

void model_backward(Model& m, float loss_scale) { model_stage_backward(m, loss_scale, nullptr, nullptr); }

// The last stage's heads, MTP block and final norm: dh (N, d) at the output of the main blocks, overwritten. dnext:
// the gradient of Emb(targets), for the embedding (the first stage's, passed back when it is another).
static void heads_backward(Model& m, float loss_scale, float* dh, float* dnext) {
    const Config& c = m.config;
    ModelActs& a = m.acts;
    const int B = m.B, T = m.T;
    const int64_t N = (int64_t)B * T, d = c.hidden_size, L = c.num_hidden_layers;
    std::vector<float> dfinal(N * d);
    head_backward(m, main_head(m, true), dfinal.data(), loss_scale / N);
    if (c.num_nextn_predict_layers > 0) {
        const float mtp_scale = loss_scale * c.mtp_loss_weight / ((float)B * (T - 1));
        std::vector<float> dmtp(N * d), dmtp_out(N * d), dconcat(N * 2 * d), dhalf(N * d);
        head_backward(m, mtp_head(m), dmtp.data(), mtp_scale);
        rmsnorm_backward(dmtp_out.data(), m.g.mtp_norm, dmtp.data(), a.mtp_out, m.w.mtp_norm, a.mtp_rstd, N, d,
                         false);
        block_backward(m, (int)L, a.mtp_in, dmtp_out.data(), dmtp.data(), loss_scale);
        matmul_backward(dconcat.data(), m.g.mtp_eh_proj, dmtp.data(), a.mtp_concat, m.w.mtp_eh_proj, N, 2 * d, d,
                        false);
        // split [d enorm_out | d hnorm_out]; the h half flows into the main model's final state
        copy_columns(dhalf.data(), d, dconcat.data() + d, 2 * d, N, d);
        rmsnorm_backward(dfinal.data(), m.g.mtp_hnorm, dhalf.data(), a.final_normed, m.w.mtp_hnorm, a.hnorm_rstd, N,
                         d, true);
        copy_columns(dhalf.data(), d, dconcat.data(), 2 * d, N, d);
        rmsnorm_backward(dnext, m.g.mtp_enorm, dhalf.data(), a.next_embed, m.w.mtp_enorm, a.enorm_rstd, N, d, false);
    }
    rmsnorm_backward(dh, m.g.final_norm, dfinal.data(), a.residual[L], m.w.final_norm, a.final_rstd, N, d, false);
}

void model_stage_backward(Model& m, float loss_scale, const float* dout, float* din) {
    const Config& c = m.config;
    const int64_t N = (int64_t)m.B * m.T, d = c.hidden_size;
    const bool mtp = c.num_nextn_predict_layers > 0;
    std::vector<float> dh(N * d), dh_prev(N * d), dnext(mtp ? N * d : 0);
    if (m.last_stage()) {
        heads_backward(m, loss_scale, dh.data(), dnext.data());
    } else {
        std::copy_n(dout, N * d, dh.data());
        if (mtp) std::copy_n(dout + N * d, N * d, dnext.data());
    }
    if (mtp && m.first_stage()) embedding_backward(m.g.embed, dnext.data(), m.targets.data(), N, d);
    else if (mtp) std::copy_n(dnext.data(), N * d, din + N * d);
    for (int l = m.end_layer - 1; l >= m.first_layer; l--) {
        block_backward(m, l, m.acts.residual[l], dh.data(), dh_prev.data(), loss_scale);
        std::swap(dh, dh_prev);
    }
    if (m.first_stage()) embedding_backward(m.g.embed, dh.data(), m.inputs.data(), N, d);
    else std::copy_n(dh.data(), N * d, din);
}

// Swaps the Model's activation fields with slot s's; with recompute the activation sets stay.
static void swap_slot(Model& m, ActivationSlot& s) {
    std::swap(m.B, s.B);
    std::swap(m.T, s.T);
    m.act_storage.swap(s.act_storage);
    std::swap(m.acts, s.acts);
    if (m.layout.recompute) {
        std::swap(m.acts.blocks, s.acts.blocks);
        std::swap(m.acts.set_layer, s.acts.set_layer);
        std::swap(m.acts.set_slot, s.acts.set_slot);
    } else {
        m.set_storage.swap(s.set_storage);
    }
    m.inputs.swap(s.inputs);
    m.targets.swap(s.targets);
    m.mtp_targets.swap(s.mtp_targets);
}

void model_use_slot(Model& m, int slot) {
    if (slot == m.slot) return;
    if ((int)m.parked.size() <= std::max(slot, m.slot)) m.parked.resize(std::max(slot, m.slot) + 1);
    swap_slot(m, m.parked[m.slot]);  // park the one in use
    swap_slot(m, m.parked[slot]);
    m.slot = slot;
}

void router_bias_step(const Config& c, const std::vector<int64_t>& counts, float* bias) {
    // E count_i against the total, in integers: no rounding moves an expert that sits at the mean.
    int64_t total = 0;
    for (int64_t n : counts) total += n;
    for (int e = 0; e < c.n_routed_experts; e++) {
        const int64_t gap = total - (int64_t)c.n_routed_experts * counts[e];
        bias[e] += c.bias_update_speed * (float)((gap > 0) - (gap < 0));
    }
}

void model_update_router_bias(Model& m, const std::vector<std::vector<int64_t>>& counts) {
    const Config& c = m.config;
    for (int l = 0; l < c.num_blocks(); l++) {
        if (!c.is_moe_layer(l)) continue;
        if (m.w.blocks[l].router_bias) router_bias_step(c, counts[l], m.w.blocks[l].router_bias);  // this stage's
        std::fill(m.expert_counts[l].begin(), m.expert_counts[l].end(), 0);
    }
}

std::vector<double> load_imbalance(const Config& c, const std::vector<std::vector<int64_t>>& counts) {
    std::vector<double> imbalance;
    for (int l = 0; l < c.num_blocks(); l++) {
        if (!c.is_moe_layer(l)) continue;
        int64_t max = 0, total = 0;
        for (int64_t n : counts[l]) {
            max = std::max(max, n);
            total += n;
        }
        imbalance.push_back(total > 0 ? (double)max * c.n_routed_experts / (double)total : 0.0);
    }
    return imbalance;
}

void model_reduce_grads(Model& m) { shard_reduce_grads(m.shard, m.grads.data(), *m.comm); }

double model_grad_norm(const Model& m) {
    double sum = 0.0;
    for (const OptimizerRange& r : m.shard.ranges)
        if (r.owned) sum += grad_sum_squares(m.grads.data() + r.first, r.count);
    m.comm->all_reduce_sum(&sum, 1, Group::World);
    return sqrt(sum);
}

void model_adamw(Model& m, AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier) {
    adamw_update(m.shard, m.params.data(), m.grads.data(), opt, oc, lr, grad_multiplier);
    shard_gather(m.shard, m.params.data(), *m.comm);
}
