// The GPU model's memory: what the kernels need of the device, the layout of every buffer, allocation and release
// (the weights' FP8 copies are gpu/weights.cu's). Each layout is carved with model/arena.h: the same code counts for
// the memory plan and carves for init.
#include "gpu/model.h"

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/attention.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"

void* device_alloc(int64_t bytes, const char* what, bool pinned) {
    void* p = nullptr;
    if (bytes <= 0) return nullptr;
    if ((pinned ? cudaMallocHost(&p, (size_t)bytes) : cudaMalloc(&p, (size_t)bytes)) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the error
        throw std::runtime_error(std::string("out of ") + (pinned ? "pinned host" : "GPU") + " memory allocating " +
                                 std::to_string(bytes >> 20) + " MiB for " + what +
                                 " (lower --batch or --seq, add --recompute, or spread the experts with --ep)");
    }
    return p;
}

// The RoPE tables cos and sin, (T, dr/2) each
static int64_t rope_bytes(const Config& c, int T) { return 2 * (int64_t)T * (c.qk_rope_head_dim / 2) * 4; }

static int64_t bytes_of(const std::function<void(Arena&)>& carve) {
    Arena counting;
    carve(counting);
    return counting.used;
}

// Whether the attention runs on the tensor cores, with its inputs stored in BF16 (attention_bf16.cuh)
static bool bf16_attention(const Config& c, bool bf16) {
    return gpu::attention_on_tensor_cores(bf16 ? Precision::BF16 : Precision::FP32, c.qk_head_dim(), c.v_head_dim);
}

static void carve_swiglu(Arena& ar, int64_t M, int64_t I, bool bf16, GpuSwigluActs& s) {
    s.g = ar.take<float>(M * I);
    s.u = ar.take<float>(M * I);
    s.a = ar.take<float>(bf16 ? 0 : M * I);
    s.a16 = ar.take<__nv_bfloat16>(bf16 ? M * I : 0);
}

static void carve_mla(Arena& ar, const Config& c, bool bf16, int64_t N, GpuMLAActs& a) {
    const int64_t H = c.num_attention_heads, dqk = c.qk_head_dim(), qr = c.q_lora_rank, kr = c.kv_lora_rank;
    const int64_t dr = c.qk_rope_head_dim, dn = c.qk_nope_head_dim, dv = c.v_head_dim, b16 = bf16 ? 1 : 0;
    const int64_t tc = bf16_attention(c, bf16) ? 1 : 0;
    a.q_a = ar.take<float>(N * qr);
    a.q_a_rstd = ar.take<float>(qr > 0 ? N : 0);
    a.q_a_normed = ar.take<float>(N * qr);
    a.q = ar.take<float>(N * H * dqk);
    a.kv_a = ar.take<float>(N * (kr + dr));
    a.c_kv = ar.take<float>(N * kr);
    a.c_kv_rstd = ar.take<float>(N);
    a.c_kv_normed = ar.take<float>(N * kr);
    a.kv = ar.take<float>(N * H * (dn + dv));
    a.q_heads = ar.take<float>((1 - tc) * N * H * dqk);
    a.k_heads = ar.take<float>((1 - tc) * N * H * dqk);
    a.q_heads16 = ar.take<__nv_bfloat16>(tc * N * H * dqk);
    a.k_heads16 = ar.take<__nv_bfloat16>(tc * N * H * dqk);
    a.v_heads16 = ar.take<__nv_bfloat16>(tc * N * H * dv);
    a.o = ar.take<float>(N * H * dv);
    a.lse = ar.take<float>(N * H);
    a.q_a_normed16 = ar.take<__nv_bfloat16>(b16 * N * qr);
    a.c_kv_normed16 = ar.take<__nv_bfloat16>(b16 * N * kr);
    a.o16 = ar.take<__nv_bfloat16>(b16 * N * H * dv);
}

static void carve_moe(Arena& ar, const Config& c, bool bf16, int64_t N, GpuMoEActs& a) {
    const int64_t d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok, b16 = bf16 ? 1 : 0;
    a.scores = ar.take<float>(N * E);
    a.gate_weights = ar.take<float>(N * k);
    a.chosen = ar.take<int32_t>(N * k);
    a.counts = ar.take<int64_t>(E);
    a.offsets = ar.take<int64_t>(E + 1);
    a.row_of_assignment = ar.take<int64_t>(N * k);
    a.assignment_of_row = ar.take<int64_t>(N * k);
    a.rows_in = ar.take<float>((1 - b16) * N * k * d);
    a.rows_in16 = ar.take<__nv_bfloat16>(b16 * N * k * d);
    a.rows_out = ar.take<float>(N * k * d);
    carve_swiglu(ar, N, (int64_t)c.n_shared_experts * c.moe_intermediate_size, bf16, a.shared);
}

// bf16: whether the BF16 copies of the GEMM inputs are carved too (the BF16 and FP8 modes)
static void carve_block(Arena& ar, const Config& c, bool bf16, int layer, int64_t N, GpuBlockActs& a) {
    const int64_t d = c.hidden_size, b16 = bf16 ? 1 : 0;
    a.attn_normed = ar.take<float>(N * d);
    a.attn_rstd = ar.take<float>(N);
    carve_mla(ar, c, bf16, N, a.mla);
    a.attn_out = ar.take<float>(N * d);
    a.h_mid = ar.take<float>(N * d);
    a.ffn_normed = ar.take<float>(N * d);
    a.ffn_rstd = ar.take<float>(N);
    if (c.is_moe_layer(layer))
        carve_moe(ar, c, bf16, N, a.moe);
    else
        carve_swiglu(ar, N, c.intermediate_size, bf16, a.dense);
    a.ffn_out = ar.take<float>(N * d);
    a.attn_normed16 = ar.take<__nv_bfloat16>(b16 * N * d);
    a.ffn_normed16 = ar.take<__nv_bfloat16>(b16 * N * d);
}

// One activation slot's sets: one per block, or with recompute one per kind (block_set, block_sets)
static void carve_sets(Arena& ar, const Config& c, bool bf16, int64_t N, const std::vector<int>& block_set,
                       GpuActs& a) {
    const int sets = *std::max_element(block_set.begin(), block_set.end()) + 1;
    a.blocks.resize(sets);
    a.set_layer.assign(sets, -1);
    a.set_slot.assign(sets, -1);
    for (int l = 0, carved = 0; l < c.num_blocks(); l++)
        if (block_set[l] == carved) carve_block(ar, c, bf16, l, N, a.blocks[carved++]);
}

// The rest of one slot's activations, for a pipeline stage of main blocks [first, end)
static void carve_activations(Arena& ar, const Config& c, bool bf16, int B, int T, const ActivationLayout& layout,
                              int first, int end, GpuActs& a) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, V = c.vocab_size, L = c.num_hidden_layers;
    const int64_t last = end == L ? 1 : 0, mtp = c.num_nextn_predict_layers > 0 ? 1 : 0, b16 = bf16 ? 1 : 0;
    const int64_t heads_mtp = last * mtp;  // what the last stage's MTP block keeps
    a.residual.assign(L + 1, nullptr);
    for (int l = first; l < end; l++) a.residual[l] = ar.take<float>(N * d);
    if (last) a.residual[L] = ar.take<float>(N * d);
    const int64_t logit_rows = !last ? 0 : layout.recompute ? head_chunk_rows(c, N, layout) : N;
    a.final_normed = ar.take<float>(last * N * d);
    a.final_rstd = ar.take<float>(last * N);
    a.logits = ar.take<float>(logit_rows * V);
    a.losses = ar.take<float>(last * N);
    a.next_embed = ar.take<float>(heads_mtp * N * d);
    a.enorm_out = ar.take<float>(heads_mtp * N * d);
    a.enorm_rstd = ar.take<float>(heads_mtp * N);
    a.hnorm_out = ar.take<float>(heads_mtp * N * d);
    a.hnorm_rstd = ar.take<float>(heads_mtp * N);
    a.mtp_concat = ar.take<float>(heads_mtp * 2 * N * d);
    a.mtp_in = ar.take<float>(heads_mtp * N * d);
    a.mtp_out = ar.take<float>(heads_mtp * N * d);
    a.mtp_normed = ar.take<float>(heads_mtp * N * d);
    a.mtp_rstd = ar.take<float>(heads_mtp * N);
    a.mtp_logits = ar.take<float>(heads_mtp * logit_rows * V);
    a.final_normed16 = ar.take<__nv_bfloat16>(last * b16 * N * d);
    a.mtp_concat16 = ar.take<__nv_bfloat16>(heads_mtp * b16 * 2 * N * d);
    a.mtp_normed16 = ar.take<__nv_bfloat16>(heads_mtp * b16 * N * d);
    a.inputs = ar.take<int32_t>(N);
    a.targets = ar.take<int32_t>(N);  // the first stage's MTP embedding reads them too
    a.mtp_targets = ar.take<int32_t>(heads_mtp * N);
    a.input_rows.packed = ar.take<int32_t>(3 * N + 1);
    a.target_rows.packed = ar.take<int32_t>(mtp * (3 * N + 1));
}

static Scratch carve_scratch(Arena& ar, const Config& c, bool bf16, int B, int T) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, V = c.vocab_size, H = c.num_attention_heads;
    const int64_t dqk = c.qk_head_dim(), dn = c.qk_nope_head_dim, dv = c.v_head_dim, dr = c.qk_rope_head_dim;
    const int64_t qr = c.q_lora_rank, kr = c.kv_lora_rank, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const int64_t mtp = c.num_nextn_predict_layers > 0 ? 1 : 0, b16 = bf16 ? 1 : 0;
    const bool moe = c.first_k_dense_replace < c.num_blocks();
    const int64_t width = std::max<int64_t>(moe ? (int64_t)c.n_shared_experts * c.moe_intermediate_size : 0,
                                            c.first_k_dense_replace > 0 ? c.intermediate_size : 0);  // the widest FFN
    Scratch s;
    s.dlogits = ar.take<float>((1 - b16) * N * V);
    s.dlogits16 = ar.take<__nv_bfloat16>(b16 * N * V);
    s.dfinal = ar.take<float>(N * d);
    s.dh = ar.take<float>(N * d);
    s.dh_prev = ar.take<float>(N * d);
    s.dmtp = ar.take<float>(mtp * N * d);
    s.dmtp_out = ar.take<float>(mtp * N * d);
    s.dconcat = ar.take<float>(mtp * 2 * N * d);
    s.dhalf = ar.take<float>(mtp * N * d);
    s.dnext = ar.take<float>(mtp * N * d);
    s.dnormed = ar.take<float>(N * d);
    s.dh_mid = ar.take<float>(N * d);
    s.d_o = ar.take<float>(N * H * dv);
    s.d_o16 = ar.take<__nv_bfloat16>(bf16_attention(c, bf16) ? N * H * dv : 0);
    s.dq_heads = ar.take<float>(N * H * dqk);
    s.dk_heads = ar.take<float>(N * H * dqk);
    s.dkv = ar.take<float>(N * H * (dn + dv));
    s.dq = ar.take<float>(N * H * dqk);
    s.dkv_a = ar.take<float>(N * (kr + dr));
    s.dc_kv_normed = ar.take<float>(N * kr);
    s.dc_kv = ar.take<float>(N * kr);
    s.dq_a_normed = ar.take<float>(N * qr);
    s.dq_a = ar.take<float>(N * qr);
    s.attn_d = ar.take<float>(gpu::attention_backward_scratch_floats(B, T, (int)H));
    s.ffn_da = ar.take<float>(N * width);
    s.ffn_dg = ar.take<float>(N * width);
    s.ffn_du = ar.take<float>(N * width);
    s.drows_out = ar.take<float>(moe ? N * k * d : 0);
    s.drows_in = ar.take<float>(moe ? N * k * d : 0);
    s.dgate_weights = ar.take<float>(moe ? N * k : 0);
    s.drouter_logits = ar.take<float>(moe ? N * E : 0);
    s.seq_counts = ar.take<int>(moe ? B * E : 0);
    s.token_totals = ar.take<double>(moe ? N : 0);
    s.seq_balance = ar.take<double>(moe ? B : 0);
    s.rms = ar.take<float>(gpu::rmsnorm_backward_scratch_floats(N, std::max<int64_t>({d, qr, kr})));
    return s;
}

Scratch scratch_of(const GpuModel& m) {
    Arena ar{static_cast<char*>(m.scratch), 0};
    return carve_scratch(ar, m.config, m.precision != Precision::FP32, m.max_B, m.T);
}

// The routed experts' rows of one layer (R of them; EP > 1 only: the exchanged rows and the permutation)
static void carve_expert_rows(Arena& ar, const Config& c, bool bf16, int ep_size, int64_t R, GpuMoEActs& a) {
    const int64_t d = c.hidden_size, I = c.moe_intermediate_size, ep = ep_size > 1 ? 1 : 0, b16 = bf16 ? 1 : 0;
    a.expert_g = ar.take<float>(R * I);
    a.expert_u = ar.take<float>(R * I);
    a.expert_a = ar.take<float>((1 - b16) * R * I);
    a.expert_in = ar.take<float>((1 - b16) * ep * R * d);
    a.expert_out = ar.take<float>(ep * R * d);
    a.recv_to_expert = ar.take<int64_t>(ep * (2 * R + c.n_routed_experts / ep_size + 1));  // with the two below
    a.expert_to_recv = a.recv_to_expert + ep * R;
    a.local_offsets = a.expert_to_recv + ep * R;
    a.expert_in16 = ar.take<__nv_bfloat16>(b16 * ep * R * d);
    a.expert_a16 = ar.take<__nv_bfloat16>(b16 * R * I);
}

static ExpertScratch carve_expert_scratch(Arena& ar, const Config& c, int ep_size, int64_t R) {
    const int64_t d = c.hidden_size, I = c.moe_intermediate_size, ep = ep_size > 1 ? 1 : 0;
    ExpertScratch s;
    s.da = ar.take<float>(R * I);
    s.dg = ar.take<float>(R * I);
    s.du = ar.take<float>(R * I);
    s.dexpert_out = ar.take<float>(ep * R * d);
    s.dexpert_in = ar.take<float>(ep * R * d);
    return s;
}

static BatchStaging carve_staging(Arena& ar, int64_t N) {
    BatchStaging io;
    io.inputs = ar.take<int32_t>(N);
    io.targets = ar.take<int32_t>(N);
    io.mtp_targets = ar.take<int32_t>(N);
    io.input_rows = ar.take<int32_t>(3 * N + 1);
    io.target_rows = ar.take<int32_t>(3 * N + 1);
    io.losses = ar.take<float>(N);
    io.mtp_losses = ar.take<float>(N);
    return io;
}

static void carve_host_slot(Arena& ar, const Config& c, int B, int T, HostSlot& slot) {
    slot.io = carve_staging(ar, (int64_t)B * T);
    slot.balance = ar.take<double>((int64_t)c.num_blocks() * B);
    slot.counts = ar.take<int64_t>((int64_t)c.num_blocks() * c.n_routed_experts);
}

HostSlot& host_slot(GpuModel& m, int k) {
    if (k < (int)m.host_slots.size()) return m.host_slots[k];
    HostSlot slot;
    const auto carve = [&](Arena& ar) { carve_host_slot(ar, m.config, m.max_B, m.T, slot); };
    slot.memory = device_alloc(bytes_of(carve), "the batch's and the losses' copies", /*pinned*/ true);
    Arena ar{static_cast<char*>(slot.memory), 0};
    carve(ar);
    m.host_slots.push_back(slot);
    return m.host_slots.back();
}

ExpertScratch expert_scratch_of(const GpuModel& m) {
    Arena ar{static_cast<char*>(m.expert_scratch), 0};
    return carve_expert_scratch(ar, m.config, m.comm->ep_size, m.expert_scratch_rows);
}

// The largest operands the GEMM calls cast to BF16 or quantize to FP8, for N tokens and R expert rows: output
// gradients (not the logits', which come in BF16) and FP8 inputs. No BF16 inputs: the model keeps their copies.
// The experts' rows count the padding of each expert's rows to 16, and each expert has 4 rows of FP8 tails
// (kernels/matmul.cuh).
static gpu::MatmulCasts cast_elements(const Config& c, int64_t N, int64_t R) {
    const int64_t d = c.hidden_size, H = c.num_attention_heads, width = std::max<int64_t>(
        c.intermediate_size, (int64_t)c.n_shared_experts * c.moe_intermediate_size);
    const int64_t pad = gpu::fp8_padded_rows(1) - 1;  // the most rows the padding adds to a group
    const int64_t expert_rows = (R + pad * c.n_routed_experts) * std::max<int64_t>(d, c.moe_intermediate_size);
    const int64_t grad_cols = std::max<int64_t>({d, H * c.qk_head_dim(), H * (c.qk_nope_head_dim + c.v_head_dim),
                                                 width, (int64_t)c.kv_lora_rank + c.qk_rope_head_dim, c.q_lora_rank});
    const int64_t input_cols = std::max<int64_t>({d, c.q_lora_rank, c.kv_lora_rank, H * c.v_head_dim, width});
    const int64_t tail_cols = std::max({grad_cols, input_cols, (int64_t)c.moe_intermediate_size});
    const int64_t tails = 4 * std::max<int64_t>(c.n_routed_experts, 1) * tail_cols;  // 4 rows a group
    return {0, std::max((N + pad) * grad_cols, expert_rows), std::max((N + pad) * input_cols, expert_rows), tails};
}

void ensure_expert_rows(GpuModel& m, GpuMoEActs& a, int64_t R) {
    const Config& c = m.config;
    const int ep = m.comm->ep_size;
    // frees buf (once the stream is done with it) and allocates it anew for R rows; never left dangling
    auto regrow = [&](void*& buf, int64_t& rows, int64_t bytes, const char* what) {
        sync(m);
        CUDA_CHECK(cudaFree(buf));
        buf = nullptr;
        rows = 0;
        buf = device_alloc(bytes, what);
        rows = R;
    };
    if (R > a.expert_rows) {
        const bool bf16 = m.precision != Precision::FP32;
        regrow(a.expert_alloc, a.expert_rows,
               bytes_of([&](Arena& ar) { carve_expert_rows(ar, c, bf16, ep, R, a); }), "the routed experts' rows");
        Arena ar{static_cast<char*>(a.expert_alloc), 0};
        carve_expert_rows(ar, c, bf16, ep, R, a);
    }
    if (R > m.expert_scratch_rows)
        regrow(m.expert_scratch, m.expert_scratch_rows,
               bytes_of([&](Arena& ar) { carve_expert_scratch(ar, c, ep, R); }), "the routed experts' gradients");
    gpu::matmul_reserve(m.matmul, cast_elements(c, (int64_t)m.max_B * m.T, R));
}

GpuMemoryPlan gpu_memory_plan(const Config& c, int ep_size, int stage_size, Precision p, int B, int T,
                              const ActivationLayout& layout, Moments moments, int first_layer, int end_layer,
                              int slots) {
    if (end_layer < 0) end_layer = c.num_hidden_layers;
    const ParamTable table = build_param_table(c, ep_size, first_layer, end_layer);
    const int64_t total = table.total, N = (int64_t)B * T;
    const int64_t R = N * c.num_experts_per_tok;  // the expected rows per rank: the buffers grow beyond it
    const std::vector<int> set = block_sets(c, layout.recompute, first_layer, end_layer);
    std::set<int> moe_sets;  // the activation sets of MoE blocks, each with its expert rows
    for (int l = 0; l < c.num_blocks(); l++)
        if (c.is_moe_layer(l) && set[l] >= 0) moe_sets.insert(set[l]);
    const int set_copies = layout.recompute ? 1 : slots;  // with recompute the slots share the sets
    GpuMemoryPlan plan;
    const bool bf16 = p != Precision::FP32;
    std::map<int64_t, Fp8Tensor> counted;
    if (p == Precision::FP8)
        plan.fp8_weights = bytes_of([&](Arena& ar) { carve_fp8_weights(ar, table, nullptr, counted); });
    // FP32: 4 bytes a value; BF16 and FP8: 4 for the tensors read in FP32, 2 for the GEMM weights' working copy
    plan.params = (bf16 ? table.fp32_total * 4 + (total - table.fp32_total) * 2 : total * 4) + plan.fp8_weights;
    plan.grads = total * 4;
    const int64_t shard = optimizer_shard(table, stage_size, 0, stage_size / ep_size, 0).moments;
    plan.optimizer = shard * (2 * moment_bytes(moments) + (bf16 ? 4 : 0));  // the moments, the master weights
    GpuActs counting;
    plan.activations =
        slots * bytes_of([&](Arena& ar) {
            carve_activations(ar, c, bf16, B, T, layout, first_layer, end_layer, counting);
        }) + set_copies * bytes_of([&](Arena& ar) { carve_sets(ar, c, bf16, N, set, counting); });
    GpuMoEActs layer;
    if (!moe_sets.empty())
        plan.expert_rows = set_copies * (int64_t)moe_sets.size() *
                               bytes_of([&](Arena& ar) { carve_expert_rows(ar, c, bf16, ep_size, R, layer); }) +
                           bytes_of([&](Arena& ar) { carve_expert_scratch(ar, c, ep_size, R); });
    plan.scratch = bytes_of([&](Arena& ar) { carve_scratch(ar, c, bf16, B, T); }) +
                   optimizer_table_bytes(table) + rope_bytes(c, T) +
                   gpu::matmul_memory_bytes(bf16 ? cast_elements(c, N, R) : gpu::MatmulCasts{}, p == Precision::FP8);
    return plan;
}

// One activation slot's memory (with_sets: its own activation sets too, and their expert rows)
static void allocate_slot(GpuModel& m, GpuActs& a, bool with_sets) {
    const Config& c = m.config;
    const bool bf16 = m.precision != Precision::FP32;
    const int64_t N = (int64_t)m.max_B * m.T;
    const auto rest = [&](Arena& ar) {
        carve_activations(ar, c, bf16, m.max_B, m.T, m.layout, m.first_layer, m.end_layer, a);
    };
    a.arena = device_alloc(bytes_of(rest), "the activations");
    Arena ar{static_cast<char*>(a.arena), 0};
    rest(ar);
    if (!with_sets) return;
    const auto sets = [&](Arena& arena) { carve_sets(arena, c, bf16, N, m.block_set, a); };
    a.sets_arena = device_alloc(bytes_of(sets), "the activations");
    Arena sr{static_cast<char*>(a.sets_arena), 0};
    sets(sr);
    for (int l = 0; l < c.num_blocks(); l++)
        if (c.is_moe_layer(l) && m.block_set[l] >= 0)
            ensure_expert_rows(m, a.blocks[m.block_set[l]].moe, N * c.num_experts_per_tok);
}

// Swaps the model's activations with parked slot p's; with recompute the activation sets stay.
static void swap_slot(GpuModel& m, GpuActs& p) {
    std::swap(m.acts, p);
    if (!m.layout.recompute) return;
    std::swap(m.acts.blocks, p.blocks);
    std::swap(m.acts.set_layer, p.set_layer);
    std::swap(m.acts.set_slot, p.set_slot);
    std::swap(m.acts.sets_arena, p.sets_arena);
}

void gpu_model_use_slot(GpuModel& m, int slot) {
    if (slot == m.slot) return;
    const int most = std::max(slot, m.slot);
    if ((int)m.parked.size() <= most) m.parked.resize(most + 1);
    swap_slot(m, m.parked[m.slot]);  // park the one in use
    swap_slot(m, m.parked[slot]);
    m.slot = slot;
    if (!m.acts.arena) allocate_slot(m, m.acts, !m.layout.recompute);  // its first use
}

// Everything gpu_model_init allocates, in the order of the memory plan.
static void allocate(GpuModel& m, const Config& c, Comm& comm, Precision p, int B, int T,
                     const ActivationLayout& layout, Moments moments, const GpuMemoryPlan& plan, int first_layer,
                     int end_layer) {
    m.config = c;
    m.first_layer = first_layer;
    m.end_layer = end_layer;
    m.layout = layout;
    m.head_rows = head_chunk_rows(c, (int64_t)B * T, layout);
    m.comm = &comm;
    m.precision = p;
    m.table = build_param_table(c, comm.ep_size, first_layer, end_layer);
    m.shard = optimizer_shard(m.table, comm);
    m.max_B = m.acts.B = B;
    m.T = T;
    CUDA_CHECK(cudaStreamCreate(&m.stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&m.counts_ready, cudaEventDisableTiming));
    m.timer.stream = m.stream;
    const int64_t total = m.table.total, N = (int64_t)B * T;
    const bool bf16 = p != Precision::FP32;
    m.params = static_cast<float*>(device_alloc((bf16 ? m.table.fp32_total : total) * 4, "the parameters"));
    m.grads = static_cast<float*>(device_alloc(total * 4, "the gradients"));
    if (bf16)
        m.params_bf16 = static_cast<__nv_bfloat16*>(
            device_alloc((total - m.table.fp32_total) * 2, "the BF16 weights"));
    allocate_optimizer(m, moments);
    if (p == Precision::FP8) {
        m.fp8_alloc = device_alloc(plan.fp8_weights, "the FP8 weights");
        Arena fp8{static_cast<char*>(m.fp8_alloc), 0};
        carve_fp8_weights(fp8, m.table, m.params_bf16, m.fp8_weights);
    }
    m.w = map_weights(c, m.table, m.params);
    m.g = map_weights(c, m.table, m.grads);
    m.block_set = block_sets(c, layout.recompute, first_layer, end_layer);
    m.scratch = device_alloc(bytes_of([&](Arena& counting) { carve_scratch(counting, c, bf16, B, T); }),
                             "the backward's buffers");
    gpu::matmul_create(m.matmul, m.stream, bf16 ? cast_elements(c, N, 0) : gpu::MatmulCasts{}, p == Precision::FP8);
    host_slot(m, 0);
    allocate_slot(m, m.acts, /*with_sets*/ true);
    m.rope_cos = static_cast<float*>(device_alloc(rope_bytes(c, T), "the RoPE tables"));
    m.rope_sin = m.rope_cos + (int64_t)T * c.qk_rope_head_dim / 2;
    m.expert_counts.assign(c.num_blocks(), {});  // every block's: the ranks sum them, each stage its own
    for (int l = 0; l < c.num_blocks(); l++)
        if (c.is_moe_layer(l)) m.expert_counts[l].assign(c.n_routed_experts, 0);
    gpu::rope_table(m.rope_cos, m.rope_sin, c, T, m.stream);
    CUDA_CHECK(cudaMemsetAsync(m.grads, 0, total * 4, m.stream));
    sync(m);
}

void gpu_model_init(GpuModel& m, const Config& c, Comm& comm, Precision p, int B, int T,
                    const ActivationLayout& layout, Moments moments, int first_layer, int end_layer) {
    if (end_layer < 0) end_layer = c.num_hidden_layers;
    if (c.qk_rope_head_dim % 2 != 0)
        throw std::runtime_error("qk_rope_head_dim " + std::to_string(c.qk_rope_head_dim) +
                                 " is odd: RoPE rotates pairs");
    if (p == Precision::FP8) check_fp8_widths(c);
    check_device(c, p);
    if (p != Precision::FP32 && comm.ep_size > 1 && c.hidden_size % 2 != 0)
        throw std::runtime_error("hidden_size " + std::to_string(c.hidden_size) +
                                 " is odd: with --dtype bf16 and --ep > 1 the expert rows travel as pairs of BF16 "
                                 "values (use an even hidden size, or --dtype fp32)");
    const GpuMemoryPlan plan = gpu_memory_plan(c, comm.ep_size, comm.stage_size(), p, B, T, layout, moments,
                                               first_layer, end_layer);
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const int64_t reserve = 1ll << 30;  // the CUDA context, NCCL's and cuBLASLt's own buffers: not in the plan
    if (plan.total() + reserve > (int64_t)free_bytes) {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "the model and a batch of %d x %d tokens need %.2f GiB of GPU memory (+1 GiB for CUDA and NCCL), "
                 "%.2f GiB are free (lower --batch or --seq,%s%s or spread the experts with --ep)",
                 B, T, plan.total() / 1073741824.0, free_bytes / 1073741824.0,
                 layout.recompute ? "" : " add --recompute,", moments == Moments::BF16 ? "" : " use --moments bf16,");
        throw std::runtime_error(msg);
    }
    try {
        allocate(m, c, comm, p, B, T, layout, moments, plan, first_layer, end_layer);
    } catch (...) {
        gpu_model_free(m);  // what was allocated before the failure
        throw;
    }
}

void gpu_model_free(GpuModel& m) {
    m.timer.release();
    m.parked.push_back(m.acts);
    for (const GpuActs& slot : m.parked) {
        for (const GpuBlockActs& a : slot.blocks) CUDA_CHECK(cudaFree(a.moe.expert_alloc));
        CUDA_CHECK(cudaFree(slot.arena));
        CUDA_CHECK(cudaFree(slot.sets_arena));
    }
    for (void* p : {(void*)m.params, (void*)m.grads, (void*)m.adam_m, (void*)m.adam_v, (void*)m.adam_m16,
                    (void*)m.adam_v16, (void*)m.params_bf16, (void*)m.master, m.fp8_alloc, m.scratch, m.expert_scratch,
                    m.optimizer_tables, (void*)m.rope_cos})
        CUDA_CHECK(cudaFree(p));
    gpu::matmul_destroy(m.matmul);
    for (const HostSlot& slot : m.host_slots) CUDA_CHECK(cudaFreeHost(slot.memory));
    if (m.bias_offsets) CUDA_CHECK(cudaFreeHost(m.bias_offsets));
    if (m.counts_ready) CUDA_CHECK(cudaEventDestroy(m.counts_ready));
    if (m.stream) CUDA_CHECK(cudaStreamDestroy(m.stream));
    m = GpuModel();
}
