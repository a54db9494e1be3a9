// The GPU model's forward and backward (model/model.cpp step for step), and what it needs of the device. Everything
// runs on m.stream; the grouped GEMMs fork onto the Matmul's streams and join back.
#include "gpu/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/router.cuh"

static GpuBlockActs& block_acts(GpuModel& m, int layer) { return m.acts.blocks[m.block_set[layer]]; }

// The RMSNorm that reads a block's output (the next block's attention norm, or the final norm), fused with the
// block's last residual add: its weight, and where the normalised rows (and their BF16 copy) and their rstd go.
struct NextNorm {
    const float* weight;
    float* out;
    __nv_bfloat16* out16;
    float* rstd;
};

static NextNorm attention_norm(GpuModel& m, int layer) {
    GpuBlockActs& a = block_acts(m, layer);
    return NextNorm{m.w.blocks[layer].attn_norm, a.attn_normed, a.attn_normed16, a.attn_rstd};
}

// h_mid = h_in + Attn(RMSNorm(h_in)); h_out = h_mid + FFN(RMSNorm(h_mid)); next = RMSNorm(h_out). The block's own
// attention norm was computed by whoever wrote h_in. with_loss: a MoE block's balance loss is queued to the host
// (sum_balance_losses reads it). h_out nullptr: only the activations the backward reads (a recomputation).
static void block_forward(GpuModel& m, int layer, const float* h_in, float* h_out, const NextNorm& next,
                          bool with_loss) {
    const Config& c = m.config;
    const BlockWeights& w = m.w.blocks[layer];
    GpuBlockActs& a = block_acts(m, layer);
    m.acts.set_layer[m.block_set[layer]] = layer;
    m.acts.set_slot[m.block_set[layer]] = m.slot;
    const int64_t N = tokens(m), d = c.hidden_size;
    m.timer.mark("attention projections");
    mla_forward(m, w, a.mla, {a.attn_normed, a.attn_normed16}, a.attn_out);
    m.timer.mark("rmsnorm + residual");
    gpu::residual_rmsnorm_forward(a.h_mid, a.ffn_normed, a.ffn_normed16, a.ffn_rstd, h_in, a.attn_out, w.ffn_norm, N,
                                  d, c.rms_norm_eps, m.stream);
    if (c.is_moe_layer(layer)) {
        moe_forward(m, w, a.moe, {a.ffn_normed, a.ffn_normed16}, a.ffn_out,
                    m.counts_pinned + (int64_t)layer * c.n_routed_experts,
                    with_loss ? m.balance_host + (int64_t)layer * m.max_B : nullptr);
    } else {
        m.timer.mark("dense FFN");
        ffn_forward(m, a.ffn_out, a.dense, {a.ffn_normed, a.ffn_normed16}, w.gate, w.up, w.down, N, d,
                    c.intermediate_size);
    }
    if (!h_out) return;
    m.timer.mark("rmsnorm + residual");
    if (next.weight)
        gpu::residual_rmsnorm_forward(h_out, next.out, next.out16, next.rstd, a.h_mid, a.ffn_out, next.weight, N, d,
                                      c.rms_norm_eps, m.stream);
    else  // a pipeline stage's output: the next stage computes the norm
        gpu::add(h_out, a.h_mid, a.ffn_out, N * d, m.stream);
}

// The attention norm of block `layer` on its input h (for the blocks no earlier block feeds: the first, and MTP's).
static void block_input_norm(GpuModel& m, int layer, const float* h) {
    m.timer.mark("rmsnorm + residual");
    const NextNorm norm = attention_norm(m, layer);
    gpu::rmsnorm_forward(norm.out, norm.out16, norm.rstd, h, norm.weight, tokens(m), m.config.hidden_size,
                         m.config.rms_norm_eps, m.stream);
}

// With recompute, block `layer`'s forward again from its input h_in when another block has used its activation set
// since: the same kernels on the same values, so the same bits. The balance loss and the expert counts were taken
// from the first forward.
static void restore_block_acts(GpuModel& m, int layer, const float* h_in) {
    const int set = m.block_set[layer];
    if (m.acts.set_layer[set] == layer && m.acts.set_slot[set] == m.slot) return;
    m.timer.label = "recompute";
    block_input_norm(m, layer, h_in);
    block_forward(m, layer, h_in, nullptr, NextNorm{}, /*with_loss*/ false);
    m.timer.label = nullptr;
}

// dh_out (N, d) -> dh_in (N, d) overwritten.
static void block_backward(GpuModel& m, int layer, const float* h_in, const float* dh_out, float* dh_in,
                           float loss_scale, const Scratch& s) {
    const Config& c = m.config;
    const BlockWeights& w = m.w.blocks[layer];
    BlockWeights& g = m.g.blocks[layer];
    restore_block_acts(m, layer, h_in);
    GpuBlockActs& a = block_acts(m, layer);
    const int64_t N = tokens(m), d = c.hidden_size;
    if (c.is_moe_layer(layer)) {
        moe_backward(m, w, g, a.moe, {a.ffn_normed, a.ffn_normed16}, dh_out, s.dnormed, loss_scale, s);
    } else {
        m.timer.mark("dense FFN");
        ffn_backward(m, s.dnormed, g.gate, g.up, g.down, dh_out, a.dense, {a.ffn_normed, a.ffn_normed16}, w.gate, w.up,
                     w.down, N, d, c.intermediate_size, false, s.ffn_da, s.ffn_dg, s.ffn_du);
    }
    m.timer.mark("rmsnorm + residual");  // the residual's gradient flows past each norm: dh_mid = dh_out + ...
    gpu::rmsnorm_backward(s.dh_mid, g.ffn_norm, s.dnormed, a.h_mid, w.ffn_norm, a.ffn_rstd, N, d, dh_out, s.rms,
                          m.stream, grad_accumulates(m, g.ffn_norm));
    m.timer.mark("attention projections");
    mla_backward(m, w, g, a.mla, {a.attn_normed, a.attn_normed16}, s.dh_mid, s.dnormed, s);
    m.timer.mark("rmsnorm + residual");
    gpu::rmsnorm_backward(dh_in, g.attn_norm, s.dnormed, h_in, w.attn_norm, a.attn_rstd, N, d, s.dh_mid, s.rms,
                          m.stream, grad_accumulates(m, g.attn_norm));
}

// x's rows from `first` on, x holding rows of `width` values (either copy may be absent)
static gpu::GemmInput rows_from(const gpu::GemmInput& x, int64_t first, int64_t width) {
    return {x.fp32 ? x.fp32 + first * width : nullptr, x.bf16 ? x.bf16 + first * width : nullptr};
}

// An output head (the main one, or MTP's): its logits (N x V, or with recompute one chunk's), the normalised rows it
// reads (N, d) and their targets (nullptr: none)
struct Head {
    float* logits;
    gpu::GemmInput normed;
    const int32_t* targets;
};
static Head main_head(GpuModel& m, bool with_targets) {
    return {m.acts.logits, {m.acts.final_normed, m.acts.final_normed16}, with_targets ? m.acts.targets : nullptr};
}
static Head mtp_head(GpuModel& m) {
    return {m.acts.mtp_logits, {m.acts.mtp_normed, m.acts.mtp_normed16}, m.acts.mtp_targets};
}

// Whether the forward keeps every chunk's logits: without recompute, and with it when one chunk holds all the rows
static bool keeps_logits(const GpuModel& m) { return !m.layout.recompute || m.head_rows >= (int64_t)m.max_B * m.T; }

// The logits of head h's rows [r0, r0 + rows) (one chunk): where the forward keeps them, computed there when
// `compute` (the forward; when it does not keep them, the backward and gpu_model_logits_row too)
static const float* head_logits(GpuModel& m, const Head& h, int64_t r0, int64_t rows, bool compute) {
    const int64_t d = m.config.hidden_size, V = m.config.vocab_size;
    float* logits = keeps_logits(m) ? h.logits + r0 * V : h.logits;
    if (compute) {
        m.timer.mark("head");
        gpu::matmul_forward(m.matmul, logits, rows_from(h.normed, r0, d), weight_of(m, m.w.head), rows, d, V, false);
    }
    return logits;
}

// Head h's forward, chunk by chunk: the logits, and with targets each row's loss into m.acts.losses
static void head_forward(GpuModel& m, const Head& h) {
    const int64_t N = tokens(m), V = m.config.vocab_size;
    for (int64_t r0 = 0; r0 < N; r0 += m.head_rows) {
        const int64_t rows = std::min(m.head_rows, N - r0);
        const float* logits = head_logits(m, h, r0, rows, /*compute*/ true);
        if (!h.targets) continue;
        m.timer.mark("cross-entropy");
        gpu::cross_entropy_forward_backward(m.acts.losses + r0, nullptr, logits, h.targets + r0, rows, V, 0.0f,
                                            m.stream);
    }
}

// Head h's backward: dlogits = scale (softmax(logits) - onehot(targets)) chunk by chunk, then for all N rows at once
// dnormed = dlogits W_head and dW_head (=|+=) dlogits^T normed, so the head's gradient is read and written once.
// In BF16 mode the cross-entropy writes dlogits in BF16 only, for the head's GEMMs.
static void head_backward(GpuModel& m, const Scratch& s, float* dnormed, const Head& h, float scale) {
    const int64_t N = tokens(m), d = m.config.hidden_size, V = m.config.vocab_size;
    for (int64_t r0 = 0; r0 < N; r0 += m.head_rows) {
        const int64_t rows = std::min(m.head_rows, N - r0);
        if (!keeps_logits(m)) m.timer.label = "recompute";
        const float* logits = head_logits(m, h, r0, rows, /*compute*/ !keeps_logits(m));
        m.timer.label = nullptr;
        m.timer.mark("cross-entropy");
        if (s.dlogits16)
            gpu::cross_entropy_forward_backward_bf16(m.acts.losses + r0, s.dlogits16 + r0 * V, logits,
                                                     h.targets + r0, rows, V, scale, m.stream);
        else
            gpu::cross_entropy_forward_backward(m.acts.losses + r0, s.dlogits + r0 * V, logits, h.targets + r0, rows, V,
                                                scale, m.stream);
    }
    m.timer.mark("head");
    gpu::matmul_backward(m.matmul, dnormed, m.g.head, {s.dlogits, s.dlogits16}, h.normed, weight_of(m, m.w.head), N, d,
                         V, false, grad_accumulates(m, m.g.head));
}

// Sum of n per-row losses, in double, in row order (the CPU's order).
static double sum_losses(const float* losses, int64_t n) {
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) total += losses[i];
    return total;
}

// n values from the host's pinned copy to the device, queued: the batch's way in (no wait)
template <typename T>
static void upload(GpuModel& m, T* device, const T* pinned, int64_t n) {
    CUDA_CHECK(cudaMemcpyAsync(device, pinned, n * sizeof(T), cudaMemcpyHostToDevice, m.stream));
}

// The n tokens at src grouped by token into rows (on the device) for the embedding's backward, through `pinned`
static void upload_token_rows(GpuModel& m, gpu::TokenRows& rows, const int32_t* src, int64_t n, int32_t* pinned) {
    rows.rows = n;
    rows.distinct = gpu::token_rows_pack(src, n, pinned);
    upload(m, rows.packed, pinned, 3 * n + 1);
}

// The balance losses a forward queued, block by block in the CPU's order, once the stream is waited for
static double sum_balance_losses(const GpuModel& m, const HostSlot& slot) {
    const Config& c = m.config;
    double total = 0.0;
    if (c.aux_loss_alpha <= 0) return total;
    for (int l = 0; l < c.num_blocks(); l++) {
        if (!c.is_moe_layer(l) || m.block_set[l] < 0) continue;  // dense, or another stage's
        double block = 0.0;  // alpha sum_i f_i P_i, averaged over the B sequences
        for (int b = 0; b < slot.B; b++) block += c.aux_loss_alpha * slot.balance[(int64_t)l * m.max_B + b] / slot.B;
        total += block;
    }
    return total;
}

// After a wait: the expert counts a forward queued for its first `blocks` blocks, checked, and when it trained added
// to the step's loads.
static void take_expert_counts(GpuModel& m, const HostSlot& slot, int blocks) {
    const Config& c = m.config;
    const int64_t E = c.n_routed_experts;
    for (int l = 0; l < blocks; l++) {
        if (!c.is_moe_layer(l) || m.block_set[l] < 0) continue;  // dense, or another stage's
        const int64_t* counts = slot.counts + l * E;
        check_expert_counts({counts, counts + E}, (int64_t)slot.B * m.T * c.num_experts_per_tok);
        if (slot.training)
            for (int64_t e = 0; e < E; e++) m.expert_counts[l][e] += counts[e];
    }
}

// n floats from one device buffer to another, queued
static void copy_on_device(GpuModel& m, float* dst, const float* src, int64_t n) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, m.stream));
}

void gpu_model_forward(GpuModel& m, const int32_t* inputs, const int32_t* targets, int B, bool training,
                       const float* in, float* out) {
    if (B < 1 || B > m.max_B)
        throw std::runtime_error("internal error: a batch of " + std::to_string(B) + " sequences, allocated for " +
                                 std::to_string(m.max_B));
    const Config& c = m.config;
    GpuActs& a = m.acts;
    a.B = B;
    const int T = m.T, first = m.first_layer, end = m.end_layer;
    const int64_t N = (int64_t)B * T, d = c.hidden_size, L = c.num_hidden_layers;
    const bool first_stage = first == 0, last = end == L, mtp = c.num_nextn_predict_layers > 0;
    // the batch's tokens and token rows, the losses and the counts pass through this forward's own pinned memory,
    // so the forward needs no wait
    HostSlot& slot = host_slot(m, m.queued);
    slot.B = B;
    slot.training = training;
    m.balance_host = slot.balance;
    m.counts_pinned = slot.counts;
    const BatchStaging& io = slot.io;
    std::copy(inputs, inputs + N, io.inputs);
    upload(m, a.inputs, io.inputs, N);
    m.timer.mark("embedding");
    if (first_stage) gpu::embedding_forward(a.residual[first], a.inputs, m.w.embed, N, d, m.stream);
    else copy_on_device(m, a.residual[first], in, N * d);
    const NextNorm final_norm{m.w.final_norm, a.final_normed, a.final_normed16, a.final_rstd};
    block_input_norm(m, first, a.residual[first]);
    for (int l = first; l < end; l++) {
        const bool stage_end = l + 1 == end;
        const NextNorm next = !stage_end ? attention_norm(m, l + 1) : last ? final_norm : NextNorm{};
        block_forward(m, l, a.residual[l], stage_end && !last ? out : a.residual[l + 1], next, targets != nullptr);
    }
    if (!targets) {  // the logits only, for gpu_model_logits_row
        if (last && keeps_logits(m)) head_forward(m, main_head(m, false));
        sync(m);
        take_expert_counts(m, slot, (int)L);
        return;
    }
    if (first_stage)  // for a backward, sorted while the GPU runs
        upload_token_rows(m, a.input_rows, inputs, N, io.input_rows);
    std::copy(targets, targets + N, io.targets);
    upload(m, a.targets, io.targets, N);
    if (!last) {  // Emb(targets) for the last stage's MTP block, passed along
        if (mtp && first_stage) {
            upload_token_rows(m, a.target_rows, targets, N, io.target_rows);
            m.timer.mark("embedding");
            gpu::embedding_forward(out + N * d, a.targets, m.w.embed, N, d, m.stream);
        } else if (mtp) {
            copy_on_device(m, out + N * d, in + N * d, N * d);
        }
        m.queued++;
        return;
    }
    head_forward(m, main_head(m, true));
    CUDA_CHECK(cudaMemcpyAsync(io.losses, a.losses, N * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
    if (mtp) {
        if (first_stage) upload_token_rows(m, a.target_rows, targets, N, io.target_rows);  // while the head runs
        for (int64_t t = 0; t < N; t++) io.mtp_targets[t] = (t % T == T - 1) ? -1 : targets[t + 1];
        upload(m, a.mtp_targets, io.mtp_targets, N);
        m.timer.mark("embedding");
        if (first_stage) gpu::embedding_forward(a.next_embed, a.targets, m.w.embed, N, d, m.stream);
        else copy_on_device(m, a.next_embed, in + N * d, N * d);
        m.timer.mark("rmsnorm + residual");
        gpu::rmsnorm_forward(a.enorm_out, nullptr, a.enorm_rstd, a.next_embed, m.w.mtp_enorm, N, d, c.rms_norm_eps,
                             m.stream);
        gpu::rmsnorm_forward(a.hnorm_out, nullptr, a.hnorm_rstd, a.final_normed, m.w.mtp_hnorm, N, d, c.rms_norm_eps,
                             m.stream);
        gpu::copy_columns(a.mtp_concat, 2 * d, a.enorm_out, d, N, d, m.stream);
        gpu::copy_columns(a.mtp_concat + d, 2 * d, a.hnorm_out, d, N, d, m.stream);
        m.timer.mark("head");
        if (a.mtp_concat16) gpu::cast_to_bf16(a.mtp_concat16, a.mtp_concat, N * 2 * d, m.stream);
        gpu::matmul_forward(m.matmul, a.mtp_in, {a.mtp_concat, a.mtp_concat16}, weight_of(m, m.w.mtp_eh_proj), N,
                            2 * d, d, false);
        block_input_norm(m, (int)L, a.mtp_in);
        const NextNorm mtp_norm{m.w.mtp_norm, a.mtp_normed, a.mtp_normed16, a.mtp_rstd};
        block_forward(m, (int)L, a.mtp_in, a.mtp_out, mtp_norm, true);
        head_forward(m, mtp_head(m));
        CUDA_CHECK(cudaMemcpyAsync(io.mtp_losses, a.losses, N * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
    }
    m.queued++;
}

std::vector<LossParts> gpu_model_losses(GpuModel& m) {
    const Config& c = m.config;
    sync(m);
    std::vector<LossParts> losses(m.queued);
    for (int k = 0; k < m.queued; k++) {
        const HostSlot& slot = m.host_slots[k];
        const int64_t N = (int64_t)slot.B * m.T;
        take_expert_counts(m, slot, c.num_blocks());
        LossParts& loss = losses[k];  // a pipeline stage's own: the heads' on the last
        const bool last = m.end_layer == c.num_hidden_layers;
        if (last) loss.main = sum_losses(slot.io.losses, N) / N;
        if (last && c.num_nextn_predict_layers > 0)
            loss.mtp = sum_losses(slot.io.mtp_losses, N) / ((double)slot.B * (m.T - 1));
        loss.balance = sum_balance_losses(m, slot);
        loss.total = loss.main + c.mtp_loss_weight * loss.mtp + loss.balance;
    }
    m.queued = 0;
    return losses;
}

// dembed += dout at the rows' tokens. The step's first call zeroes the whole gradient first: the tokens the batch
// lacks get nothing.
static void embedding_backward(GpuModel& m, const float* dout, const gpu::TokenRows& rows) {
    const int64_t d = m.config.hidden_size;
    if (!grad_accumulates(m, m.g.embed))
        CUDA_CHECK(cudaMemsetAsync(m.g.embed, 0, m.config.vocab_size * d * sizeof(float), m.stream));
    gpu::embedding_backward(m.g.embed, dout, rows, d, m.stream);
}

void gpu_model_backward(GpuModel& m, float loss_scale, const float* dout, float* din) {
    const Config& c = m.config;
    const GpuActs& a = m.acts;
    const int B = a.B, T = m.T;
    const int64_t N = (int64_t)B * T, d = c.hidden_size, L = c.num_hidden_layers;
    const bool first_stage = m.first_layer == 0, last = m.end_layer == L, mtp = c.num_nextn_predict_layers > 0;
    const Scratch s = scratch_of(m);
    float* dh = s.dh;
    float* dh_prev = s.dh_prev;
    if (!last) {  // the next stage's gradients: of this stage's output, then of Emb(targets)
        copy_on_device(m, dh, dout, N * d);
        m.timer.mark("embedding");
        if (mtp && first_stage) embedding_backward(m, dout + N * d, a.target_rows);
        else if (mtp) copy_on_device(m, din + N * d, dout + N * d, N * d);
    } else {
        head_backward(m, s, s.dfinal, main_head(m, true), loss_scale / N);
    }
    if (last && mtp) {
        const float mtp_scale = loss_scale * c.mtp_loss_weight / ((float)B * (T - 1));
        head_backward(m, s, s.dmtp, mtp_head(m), mtp_scale);
        m.timer.mark("rmsnorm + residual");
        gpu::rmsnorm_backward(s.dmtp_out, m.g.mtp_norm, s.dmtp, a.mtp_out, m.w.mtp_norm, a.mtp_rstd, N, d, nullptr,
                              s.rms, m.stream, grad_accumulates(m, m.g.mtp_norm));
        block_backward(m, (int)L, a.mtp_in, s.dmtp_out, s.dmtp, loss_scale, s);
        m.timer.mark("head");
        gpu::matmul_backward(m.matmul, s.dconcat, m.g.mtp_eh_proj, s.dmtp, {a.mtp_concat, a.mtp_concat16},
                             weight_of(m, m.w.mtp_eh_proj), N, 2 * d, d, false, grad_accumulates(m, m.g.mtp_eh_proj));
        // split [d enorm_out | d hnorm_out]; the h half flows into the main model's final state
        m.timer.mark("rmsnorm + residual");
        gpu::copy_columns(s.dhalf, d, s.dconcat + d, 2 * d, N, d, m.stream);
        gpu::rmsnorm_backward(s.dfinal, m.g.mtp_hnorm, s.dhalf, a.final_normed, m.w.mtp_hnorm, a.hnorm_rstd, N, d,
                              s.dfinal, s.rms, m.stream, grad_accumulates(m, m.g.mtp_hnorm));
        gpu::copy_columns(s.dhalf, d, s.dconcat, 2 * d, N, d, m.stream);
        gpu::rmsnorm_backward(s.dnext, m.g.mtp_enorm, s.dhalf, a.next_embed, m.w.mtp_enorm, a.enorm_rstd, N, d,
                              nullptr, s.rms, m.stream, grad_accumulates(m, m.g.mtp_enorm));
        m.timer.mark("embedding");
        if (first_stage) embedding_backward(m, s.dnext, a.target_rows);
        else copy_on_device(m, din + N * d, s.dnext, N * d);  // for the first stage's embedding
    }
    if (last) {
        m.timer.mark("rmsnorm + residual");
        gpu::rmsnorm_backward(dh, m.g.final_norm, s.dfinal, a.residual[L], m.w.final_norm, a.final_rstd, N, d,
                              nullptr, s.rms, m.stream, grad_accumulates(m, m.g.final_norm));
    }
    for (int l = m.end_layer - 1; l >= m.first_layer; l--) {
        block_backward(m, l, a.residual[l], dh, dh_prev, loss_scale, s);
        std::swap(dh, dh_prev);
    }
    m.timer.mark("embedding");
    if (first_stage) embedding_backward(m, dh, a.input_rows);
    else copy_on_device(m, din, dh, N * d);
    for (const ParamTensor& t : m.table.tensors)  // a trainable tensor nothing wrote has a zero gradient
        if (t.trainable && !grad_accumulates(m, m.grads + t.offset))
            CUDA_CHECK(cudaMemsetAsync(m.grads + t.offset, 0, t.numel * sizeof(float), m.stream));
}

void gpu_model_logits_row(GpuModel& m, int64_t row, float* out) {
    const int64_t V = m.config.vocab_size, r0 = row / m.head_rows * m.head_rows;  // the row's chunk
    const float* logits =
        head_logits(m, main_head(m, false), r0, std::min(m.head_rows, tokens(m) - r0), !keeps_logits(m));
    sync(m);
    CUDA_CHECK(cudaMemcpy(out, logits + (row - r0) * V, V * sizeof(float), cudaMemcpyDeviceToHost));
}

bool grad_accumulates(GpuModel& m, const float* grad) { return !m.grads_written.insert(grad).second; }

void gpu_model_zero_grads(GpuModel& m) { m.grads_written.clear(); }

void RegionTimer::mark(const char* name) {
    if (!enabled) return;
    if (label) name = label;
    if (!marks.empty() && marks.back().first == name) return;  // the region goes on
    cudaEvent_t event;
    CUDA_CHECK(cudaEventCreate(&event));
    CUDA_CHECK(cudaEventRecord(event, stream));
    marks.emplace_back(name, event);
}

void RegionTimer::finish(std::map<std::string, double>& totals) {
    if (!enabled || marks.empty()) return;
    mark("end");
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i + 1 < marks.size(); i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i].second, marks[i + 1].second));
        totals[marks[i].first] += ms;
    }
    release();
}

void RegionTimer::release() {
    for (auto& mk : marks) CUDA_CHECK(cudaEventDestroy(mk.second));
    marks.clear();
}

// Ampere or newer (the build's PTX is compute_80); the tensor-core attention's shared memory (99 KiB a block on
// sm_86 and sm_89); for FP8, Hopper and a cuBLASLt from 12.9 on (its block-scaled FP8 GEMMs are sm_90's and came in
// 12.9).
void check_device(const Config& c, Precision p) {
    int device = 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const std::string sm = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
    if (prop.major < 8)
        throw std::runtime_error(std::string(prop.name) + " (" + sm + ") is older than the Ampere GPUs (sm_80) " +
                                 "moe.cu's kernels are built for");
    if (p == Precision::FP8 && prop.major != 9)
        throw std::runtime_error("--dtype fp8 runs on cuBLASLt's 128-block scaled FP8 GEMMs, which Hopper GPUs " +
                                 std::string("(sm_90) have and this one (") + sm + ") does not: use --dtype bf16");
    const size_t lt = cublasLtGetVersion();
    if (p == Precision::FP8 && lt < 120900)
        throw std::runtime_error("--dtype fp8 needs cuBLASLt 12.9 or newer (its 128-block scaled FP8 GEMMs) and " +
                                 std::string("this process loaded ") + std::to_string(lt / 10000) + "." +
                                 std::to_string(lt / 100 % 100) + ": use a newer CUDA toolkit, or --dtype bf16");
    if (c.n_routed_experts > gpu::ROUTER_MAX_EXPERTS)
        throw std::runtime_error("n_routed_experts " + std::to_string(c.n_routed_experts) + " is above the " +
                                 std::to_string(gpu::ROUTER_MAX_EXPERTS) +
                                 " the router's kernels count in shared memory (train_cpu takes it)");
    const bool tensor_cores = gpu::attention_on_tensor_cores(p == Precision::FP32 ? p : Precision::BF16,
                                                             c.qk_head_dim(), c.v_head_dim);
    const int64_t attention_bytes = tensor_cores ? gpu::attn_bf16_backward_bytes(c.qk_head_dim(), c.v_head_dim) : 0;
    if (attention_bytes > (int64_t)prop.sharedMemPerBlockOptin)
        throw std::runtime_error("the attention at head dims " + std::to_string(c.qk_head_dim()) + " / " +
                                 std::to_string(c.v_head_dim) + " needs " + std::to_string(attention_bytes >> 10) +
                                 " KiB of shared memory a block on the tensor cores and " + sm + " has " +
                                 std::to_string(prop.sharedMemPerBlockOptin >> 10) +
                                 " KiB: use --dtype fp32, or smaller head dims");
}

double gpu_peak_flops(const cudaDeviceProp& prop) {
    // dense BF16 tensor-core peaks from NVIDIA's datasheets (FLOP/s, without sparsity)
    const std::string name = prop.name;
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    if (has("GB200")) return 2500e12;  // before B200, which its name contains
    if (has("B200")) return 2250e12;
    if (has("H200") && has("NVL")) return 835.5e12;
    if (has("H200")) return 989.4e12;
    if (has("H100") && has("PCIe")) return 756.5e12;
    if (has("H100") && has("NVL")) return 835.5e12;
    if (has("H100")) return 989.4e12;
    if (has("A100")) return 312e12;  // SXM and PCIe, 40 and 80 GB
    return 0.0;
}
