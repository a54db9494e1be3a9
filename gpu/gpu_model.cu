// The GPU model: model/model.cpp, model/mla.cpp, model/moe.cpp and model/ffn.cpp step for step, with kernels/
// launches and cuBLASLt GEMMs in place of the CPU loops. Read it beside the CPU files: the function names, the
// order of the operations and the buffers match, so the CPU reference checks it (test/test_gpu_train.cu).
// Everything runs on one stream, m.stream (the grouped GEMMs fork onto the Matmul's lanes and join back into it).
// The Comm (NCCL) runs on a stream of its own and every call returns when complete, so the stream is synchronised
// before each call that reads what the stream wrote.
#include "gpu/gpu_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/permute.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/router.cuh"
#include "kernels/swiglu.cuh"
#include "model/rope.h"

namespace {

// Carves typed, 256-byte aligned pieces out of one allocation; with base == nullptr it only counts, so each
// layout is written once and serves both the memory plan and the allocation.
struct ByteArena {
    char* base = nullptr;
    int64_t used = 0;
    template <typename T>
    T* take(int64_t n) {
        if (n <= 0) return nullptr;
        used = (used + 255) / 256 * 256;
        T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
        used += n * (int64_t)sizeof(T);
        return p;
    }
};

void* device_alloc(int64_t bytes, const char* what) {
    void* p = nullptr;
    if (bytes <= 0) return nullptr;
    cudaError_t err = cudaMalloc(&p, (size_t)bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();  // clear the error
        throw std::runtime_error("out of GPU memory allocating " + std::to_string(bytes >> 20) + " MiB for " + what +
                                 " (lower --batch or --seq, add --recompute, or spread the experts with --ep)");
    }
    return p;
}

void sync(const GpuModel& m) { CUDA_CHECK(cudaStreamSynchronize(m.stream)); }

int64_t tokens(const GpuModel& m) { return (int64_t)m.B * m.T; }

// FP8 mode's weights: the linear layers inside the blocks (every self_attn.*_proj* and mlp.*_proj weight: the
// attention's projections, kv_a_proj_with_mqa included, the dense FFN's, the shared and routed experts'), as the CPU
// model's LinearPrecision::FP8; not the router (mlp.gate), the embedding, the head or the MTP projection (eh_proj).
bool fp8_linear(const ParamTensor& t) {
    const std::string& n = t.name;
    const bool in_block = n.find(".self_attn.") != std::string::npos || n.find(".mlp.") != std::string::npos;
    return in_block && n.find("_proj") != std::string::npos;
}

// The E4M3 copies of every FP8 weight, carved from ar, by the weights' offsets (params: the device weights, or
// nullptr when only counting)
void carve_fp8_weights(ByteArena& ar, const ParamTable& table, const float* params,
                       std::map<int64_t, Fp8Tensor>& weights) {
    for (const ParamTensor& t : table.tensors) {
        if (!fp8_linear(t)) continue;
        Fp8Tensor f;
        f.w = params ? params + t.offset : nullptr;
        f.batch = t.shape.size() == 3 ? t.shape[0] : 1;
        f.rows = t.shape[t.shape.size() - 2];
        f.cols = t.shape.back();
        f.q = ar.take<__nv_fp8_storage_t>(t.numel);
        f.qt = ar.take<__nv_fp8_storage_t>(t.numel);
        f.scales = ar.take<float>(f.batch * gpu::fp8_blk128_scales(f.rows, f.cols));
        f.scales_t = ar.take<float>(f.batch * gpu::fp8_blk128_scales(f.cols, f.rows));
        weights[t.offset] = f;
    }
}

// FP8 mode: the E4M3 copies from the FP32 weights (after every change to them, with the BF16 copy)
void refresh_fp8_weights(GpuModel& m) {
    for (auto& entry : m.fp8_weights) {
        const Fp8Tensor& f = entry.second;
        gpu::fp8_quantize_blocks(f.q, f.qt, f.scales, f.scales_t, f.w, f.batch, f.rows, f.cols, m.stream);
    }
}

// FP8 GEMMs read their operands with leading dimensions that are multiples of 16 bytes: every width a linear layer
// inside the blocks sums over (or that its weight's transpose has as rows) must be a multiple of 16.
void check_fp8_widths(const Config& c) {
    const int64_t H = c.num_attention_heads, dqk = c.qk_head_dim(), dn = c.qk_nope_head_dim, dv = c.v_head_dim;
    const std::vector<std::pair<const char*, int64_t>> widths{
        {"hidden_size", c.hidden_size},
        {"q_lora_rank", c.q_lora_rank},
        {"kv_lora_rank", c.kv_lora_rank},
        {"kv_lora_rank + qk_rope_head_dim", (int64_t)c.kv_lora_rank + c.qk_rope_head_dim},
        {"num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)", H * dqk},
        {"num_attention_heads x (qk_nope_head_dim + v_head_dim)", H * (dn + dv)},
        {"num_attention_heads x v_head_dim", H * dv},
        {"intermediate_size", c.intermediate_size},
        {"moe_intermediate_size", c.moe_intermediate_size},
        {"n_shared_experts x moe_intermediate_size", (int64_t)c.n_shared_experts * c.moe_intermediate_size}};
    for (const auto& [name, width] : widths)
        if (width % 16 != 0)
            throw std::runtime_error(
                std::string("--dtype fp8 needs the linear layers' widths to be multiples of 16: ") + name + " is " +
                std::to_string(width) + " (use --dtype bf16, or another config)");
}

// Weight w (a pointer into m.params) with the copies its GEMMs read in m's precision: none in FP32 mode, the BF16
// working copy in BF16 mode, and in FP8 mode the E4M3 copies too for the blocks' linear layers
gpu::GemmWeight weight_of(const GpuModel& m, const float* w) {
    const auto f = m.fp8_weights.find(w - m.params);
    const gpu::Fp8Weight w8 = f == m.fp8_weights.end() ? gpu::Fp8Weight{}
                                                       : gpu::Fp8Weight{f->second.q, f->second.qt, f->second.scales,
                                                                        f->second.scales_t};
    return gpu::GemmWeight(w, m.params_bf16 ? m.params_bf16 + (w - m.params) : nullptr, w8);
}

// BF16 mode: copy16 = the BF16 rounding of the n floats at src, the GEMM inputs' copy (see gpu_model.h). FP32 mode
// (copy16 nullptr): nothing.
void keep_bf16(GpuModel& m, __nv_bfloat16* copy16, const float* src, int64_t n) {
    if (copy16) gpu::cast_to_bf16(copy16, src, n, m.stream);
}

// Whether the attention runs on the tensor cores, with its inputs stored in BF16 (attention_bf16.cuh)
bool bf16_attention(const Config& c, bool bf16) {
    return gpu::attention_on_tensor_cores(bf16 ? gpu::Precision::BF16 : gpu::Precision::FP32, c.qk_head_dim(),
                                          c.v_head_dim);
}

// What the kernels need of the GPU: Ampere or newer (BF16 tensor cores, cp.async, ldmatrix: the build's PTX is
// compute_80); for the attention on the tensor cores, its shared memory (99 KiB a block on sm_86 and sm_89, 163 on
// sm_80, 227 on Hopper); for FP8, Hopper (cuBLASLt's 128-block scaled FP8 GEMMs are sm_90's).
void check_device(const Config& c, gpu::Precision p) {
    int device = 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const std::string sm = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
    if (prop.major < 8)
        throw std::runtime_error(std::string(prop.name) + " (" + sm + ") is older than the Ampere GPUs (sm_80) " +
                                 "moe.cu's kernels are built for");
    if (p == gpu::Precision::FP8 && prop.major != 9)
        throw std::runtime_error("--dtype fp8 runs on cuBLASLt's 128-block scaled FP8 GEMMs, which Hopper GPUs " +
                                 std::string("(sm_90) have and this one (") + sm + ") does not: use --dtype bf16");
    if (c.n_routed_experts > gpu::ROUTER_MAX_EXPERTS)
        throw std::runtime_error("n_routed_experts " + std::to_string(c.n_routed_experts) + " is above the " +
                                 std::to_string(gpu::ROUTER_MAX_EXPERTS) +
                                 " the router's kernels count in shared memory (train_cpu takes it)");
    const int64_t attention_bytes =
        bf16_attention(c, p != gpu::Precision::FP32) ? gpu::attn_bf16_backward_bytes(c.qk_head_dim(), c.v_head_dim) : 0;
    if (attention_bytes > (int64_t)prop.sharedMemPerBlockOptin)
        throw std::runtime_error("the attention at head dims " + std::to_string(c.qk_head_dim()) + " / " +
                                 std::to_string(c.v_head_dim) + " needs " + std::to_string(attention_bytes >> 10) +
                                 " KiB of shared memory a block on the tensor cores and " + sm + " has " +
                                 std::to_string(prop.sharedMemPerBlockOptin >> 10) +
                                 " KiB: use --dtype fp32, or smaller head dims");
}

int64_t ffn_width(const Config& c, int layer) {
    return c.is_moe_layer(layer) ? (int64_t)c.n_shared_experts * c.moe_intermediate_size : c.intermediate_size;
}

// ---- layouts --------------------------------------------------------------------------------------------------

// bf16: whether the BF16 copies of the GEMM inputs are carved too (Precision::BF16)
void carve_block(ByteArena& ar, const Config& c, bool bf16, int layer, int B, int T, GpuBlockActs& a) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, H = c.num_attention_heads, dqk = c.qk_head_dim();
    const int64_t qr = c.q_lora_rank, kr = c.kv_lora_rank, dr = c.qk_rope_head_dim, dn = c.qk_nope_head_dim;
    const int64_t dv = c.v_head_dim, width = ffn_width(c, layer), b16 = bf16 ? 1 : 0;
    const int64_t tc = bf16_attention(c, bf16) ? 1 : 0;
    a.attn_normed = ar.take<float>(N * d);
    a.attn_rstd = ar.take<float>(N);
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
    a.attn_out = ar.take<float>(N * d);
    a.h_mid = ar.take<float>(N * d);
    a.ffn_normed = ar.take<float>(N * d);
    a.ffn_rstd = ar.take<float>(N);
    a.ffn_g = ar.take<float>(N * width);
    a.ffn_u = ar.take<float>(N * width);
    a.ffn_a = ar.take<float>((1 - b16) * N * width);
    a.ffn_out = ar.take<float>(N * d);
    a.attn_normed16 = ar.take<__nv_bfloat16>(b16 * N * d);
    a.q_a_normed16 = ar.take<__nv_bfloat16>(b16 * N * qr);
    a.c_kv_normed16 = ar.take<__nv_bfloat16>(b16 * N * kr);
    a.o16 = ar.take<__nv_bfloat16>(b16 * N * H * dv);
    a.ffn_normed16 = ar.take<__nv_bfloat16>(b16 * N * d);
    a.ffn_a16 = ar.take<__nv_bfloat16>(b16 * N * width);
    if (!c.is_moe_layer(layer)) return;
    const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
    a.scores = ar.take<float>(N * E);
    a.gate_weights = ar.take<float>(N * k);
    a.chosen = ar.take<int32_t>(N * k);
    a.counts = ar.take<int64_t>(E);
    a.offsets = ar.take<int64_t>(E + 1);
    a.row_of_slot = ar.take<int64_t>(N * k);
    a.slot_of_row = ar.take<int64_t>(N * k);
    a.rows_sent = ar.take<float>((1 - b16) * N * k * d);
    a.rows_sent16 = ar.take<__nv_bfloat16>(b16 * N * k * d);
    a.rows_back = ar.take<float>(N * k * d);
}

void carve_activations(ByteArena& ar, GpuModel& m, const Config& c, bool bf16, int B, int T,
                       const ActivationLayout& layout) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, V = c.vocab_size, L = c.num_hidden_layers;
    const int64_t mtp = c.num_nextn_predict_layers > 0 ? 1 : 0, b16 = bf16 ? 1 : 0;
    m.residual.assign(L + 1, nullptr);
    m.block_slot = block_slots(c, layout.recompute);
    const int slots = *std::max_element(m.block_slot.begin(), m.block_slot.end()) + 1;
    m.blocks.resize(slots);
    m.slot_layer.assign(slots, -1);
    for (float*& r : m.residual) r = ar.take<float>(N * d);
    for (int l = 0, carved = 0; l < c.num_blocks(); l++)
        if (m.block_slot[l] == carved) carve_block(ar, c, bf16, l, B, T, m.blocks[carved++]);
    const int64_t logit_rows = layout.recompute ? head_chunk_rows(c, N, layout) : N;
    m.final_normed = ar.take<float>(N * d);
    m.final_rstd = ar.take<float>(N);
    m.logits = ar.take<float>(logit_rows * V);
    m.losses = ar.take<float>(N);
    m.next_embed = ar.take<float>(mtp * N * d);
    m.enorm_out = ar.take<float>(mtp * N * d);
    m.enorm_rstd = ar.take<float>(mtp * N);
    m.hnorm_out = ar.take<float>(mtp * N * d);
    m.hnorm_rstd = ar.take<float>(mtp * N);
    m.mtp_concat = ar.take<float>(mtp * 2 * N * d);
    m.mtp_in = ar.take<float>(mtp * N * d);
    m.mtp_out = ar.take<float>(mtp * N * d);
    m.mtp_normed = ar.take<float>(mtp * N * d);
    m.mtp_rstd = ar.take<float>(mtp * N);
    m.mtp_logits = ar.take<float>(mtp * logit_rows * V);
    m.final_normed16 = ar.take<__nv_bfloat16>(b16 * N * d);
    m.mtp_concat16 = ar.take<__nv_bfloat16>(b16 * mtp * 2 * N * d);
    m.mtp_normed16 = ar.take<__nv_bfloat16>(b16 * mtp * N * d);
    m.rope_cos = ar.take<float>((int64_t)T * c.qk_rope_head_dim / 2);
    m.rope_sin = ar.take<float>((int64_t)T * c.qk_rope_head_dim / 2);
    m.inputs = ar.take<int32_t>(N);
    m.targets = ar.take<int32_t>(N);
    m.mtp_targets = ar.take<int32_t>(N);
    m.input_rows.packed = ar.take<int32_t>(3 * N + 1);
    m.target_rows.packed = ar.take<int32_t>(mtp * (3 * N + 1));
}

// The backward's buffers (and the forward's transient ones), carved from m.scratch on every use.
struct Scratch {
    float *dlogits, *dfinal, *dh, *dh_prev;                       // (head_rows, V) (FP32 mode), (N, d) x3
    __nv_bfloat16* dlogits16;                                     // (head_rows, V) (BF16: the head GEMMs' dout)
    float *dmtp, *dmtp_out, *dconcat, *dhalf, *dnext;             // MTP: (N, d), (N, d), (N, 2d), (N, d), (N, d)
    float *dnormed, *dh_mid;                                      // (N, d) per block
    float *d_o, *dq_heads, *dk_heads, *dkv, *dq, *dkv_a;          // MLA
    __nv_bfloat16* d_o16;                                         // (N, H*dv): d_o for the tensor-core attention
    float *dc_kv_normed, *dc_kv, *dq_a_normed, *dq_a, *attn_d;
    float *ffn_da, *ffn_dg, *ffn_du;                              // (N, max width)
    float *drows_back, *drows_sent, *dgate, *drouter;             // (N*k, d) x2, (N, k), (N, E) (drouter: also
                                                                  // router_forward's scratch)
    int* seq_counts;                                              // (B, E) \ the balance loss's, forward and
    double *token_totals, *seq_balance;                           // (N), (B) / backward
    float* rms;                                                   // RMSNorm dw partial sums
};

Scratch carve_scratch(ByteArena& ar, const Config& c, bool bf16, int B, int T, int64_t head_rows) {
    const int64_t N = (int64_t)B * T, d = c.hidden_size, V = c.vocab_size, H = c.num_attention_heads;
    const int64_t dqk = c.qk_head_dim(), dn = c.qk_nope_head_dim, dv = c.v_head_dim, dr = c.qk_rope_head_dim;
    const int64_t qr = c.q_lora_rank, kr = c.kv_lora_rank, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const int64_t mtp = c.num_nextn_predict_layers > 0 ? 1 : 0, b16 = bf16 ? 1 : 0;
    int64_t width = 0;
    for (int l = 0; l < c.num_blocks(); l++) width = std::max(width, ffn_width(c, l));
    const bool moe = c.first_k_dense_replace < c.num_blocks();
    Scratch s;
    s.dlogits = ar.take<float>((1 - b16) * head_rows * V);
    s.dlogits16 = ar.take<__nv_bfloat16>(b16 * head_rows * V);
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
    s.drows_back = ar.take<float>(moe ? N * k * d : 0);
    s.drows_sent = ar.take<float>(moe ? N * k * d : 0);
    s.dgate = ar.take<float>(moe ? N * k : 0);
    s.drouter = ar.take<float>(moe ? N * E : 0);
    s.seq_counts = ar.take<int>(moe ? B * E : 0);
    s.token_totals = ar.take<double>(moe ? N : 0);
    s.seq_balance = ar.take<double>(moe ? B : 0);
    s.rms = ar.take<float>(gpu::rmsnorm_backward_scratch_floats(N, std::max<int64_t>({d, qr, kr})));
    return s;
}

Scratch scratch_of(const GpuModel& m) {
    ByteArena ar{static_cast<char*>(m.scratch), 0};
    return carve_scratch(ar, m.config, m.precision != gpu::Precision::FP32, m.max_B, m.T, m.head_rows);
}

// The routed experts of one layer for R rows: forward buffers per layer (kept for the backward), and one set of
// backward buffers shared by the layers. With one EP rank the rows stay where the plan put them (rows_sent,
// rows_back); with several they arrive in other buffers and need the permutation to expert order.
struct ExpertScratch {
    float *dout, *din;      // (R, d)  EP > 1 only (else drows_back / drows_sent)
    float *da, *dg, *du;    // (R, I)
};

void carve_expert_rows(ByteArena& ar, const Config& c, bool bf16, int ep_size, int64_t R, GpuBlockActs& a) {
    const int64_t d = c.hidden_size, I = c.moe_intermediate_size, ep = ep_size > 1 ? 1 : 0, b16 = bf16 ? 1 : 0;
    a.expert_g = ar.take<float>(R * I);
    a.expert_u = ar.take<float>(R * I);
    a.expert_a = ar.take<float>((1 - b16) * R * I);
    a.expert_in = ar.take<float>((1 - b16) * ep * R * d);
    a.expert_out = ar.take<float>(ep * R * d);
    a.recv_to_expert = ar.take<int64_t>(ep * R);
    a.expert_to_recv = ar.take<int64_t>(ep * R);
    a.expert_in16 = ar.take<__nv_bfloat16>(b16 * ep * R * d);
    a.expert_a16 = ar.take<__nv_bfloat16>(b16 * R * I);
}

ExpertScratch carve_expert_scratch(ByteArena& ar, const Config& c, int ep_size, int64_t R) {
    const int64_t d = c.hidden_size, I = c.moe_intermediate_size, ep = ep_size > 1 ? 1 : 0;
    ExpertScratch s;
    s.da = ar.take<float>(R * I);
    s.dg = ar.take<float>(R * I);
    s.du = ar.take<float>(R * I);
    s.dout = ar.take<float>(ep * R * d);
    s.din = ar.take<float>(ep * R * d);
    return s;
}

ExpertScratch expert_scratch_of(const GpuModel& m) {
    ByteArena ar{static_cast<char*>(m.expert_scratch), 0};
    return carve_expert_scratch(ar, m.config, m.comm->ep_size, m.expert_scratch_rows);
}

// The largest operands the BF16 GEMM calls cast, for N tokens and the routed experts' R rows, and those the FP8
// calls quantize: output gradients (rows x N), except the logits' (by far the largest with a big vocabulary), which
// the cross-entropy writes in BF16; no BF16 inputs: the model passes every GEMM input's BF16 copy (a call that did not
// would stop with an internal error); FP8 inputs (rows x K) of the blocks' linear layers. The experts' rows count
// the weight gradient's padding of each expert's rows to 16 (kernels/matmul.cuh, fp8_padded_rows).
gpu::MatmulCasts cast_elements(const Config& c, int64_t N, int64_t R) {
    const int64_t d = c.hidden_size, H = c.num_attention_heads, width = std::max<int64_t>(
        c.intermediate_size, (int64_t)c.n_shared_experts * c.moe_intermediate_size);
    const int64_t pad = gpu::fp8_padded_rows(1) - 1;  // the most rows the padding adds to a group
    const int64_t expert_rows = (R + pad * c.n_routed_experts) * std::max<int64_t>(d, c.moe_intermediate_size);
    const int64_t grad_cols = std::max<int64_t>({d, H * c.qk_head_dim(),
                                                 H * (c.qk_nope_head_dim + c.v_head_dim), width,
                                                 (int64_t)c.kv_lora_rank + c.qk_rope_head_dim, c.q_lora_rank});
    const int64_t input_cols = std::max<int64_t>({d, c.q_lora_rank, c.kv_lora_rank, H * c.v_head_dim, width});
    return {0, std::max((N + pad) * grad_cols, expert_rows), std::max((N + pad) * input_cols, expert_rows)};
}

int64_t bytes_of(const std::function<void(ByteArena&)>& carve) {
    ByteArena counting;
    carve(counting);
    return counting.used;
}

// Grows layer a's expert buffers (and the shared backward ones) to hold R rows. Called before the rows are written.
void ensure_expert_rows(GpuModel& m, GpuBlockActs& a, int64_t R) {
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
        const bool bf16 = m.precision != gpu::Precision::FP32;
        regrow(a.expert_alloc, a.expert_rows,
               bytes_of([&](ByteArena& ar) { carve_expert_rows(ar, c, bf16, ep, R, a); }), "the routed experts' rows");
        ByteArena ar{static_cast<char*>(a.expert_alloc), 0};
        carve_expert_rows(ar, c, bf16, ep, R, a);
    }
    if (R > m.expert_scratch_rows)
        regrow(m.expert_scratch, m.expert_scratch_rows,
               bytes_of([&](ByteArena& ar) { carve_expert_scratch(ar, c, ep, R); }), "the routed experts' gradients");
    gpu::matmul_reserve(m.matmul, cast_elements(c, (int64_t)m.max_B * m.T, R));
}

// ---- feed-forward ---------------------------------------------------------------------------------------------

// a = silu(g) * u, into a (FP32 mode) or a16 (BF16 mode: a is only the down projection's input)
void swiglu(GpuModel& m, float* a, __nv_bfloat16* a16, const float* g, const float* u, int64_t n) {
    if (a16)
        gpu::swiglu_forward_bf16(a16, g, u, n, m.stream);
    else
        gpu::swiglu_forward(a, g, u, n, m.stream);
}

// out (M, d) = W_down (silu(W_gate x) * (W_up x)), as swiglu_ffn_forward (model/ffn.cpp); a or a16 as swiglu
void ffn_forward(GpuModel& m, float* out, float* g, float* u, float* a, __nv_bfloat16* a16, gpu::GemmInput x,
                 const float* w_gate, const float* w_up, const float* w_down, int64_t M, int64_t d, int64_t I) {
    if (M == 0) return;
    gpu::matmul_forward(m.matmul, g, x, weight_of(m, w_gate), M, d, I, false);
    gpu::matmul_forward(m.matmul, u, x, weight_of(m, w_up), M, d, I, false);
    swiglu(m, a, a16, g, u, M * I);
    gpu::matmul_forward(m.matmul, out, {a, a16}, weight_of(m, w_down), M, I, d, false);
}

// as swiglu_ffn_backward; da, dg, du (M, I) scratch
void ffn_backward(GpuModel& m, float* dx, float* dw_gate, float* dw_up, float* dw_down, const float* dout,
                  const float* g, const float* u, gpu::GemmInput a, gpu::GemmInput x, const float* w_gate,
                  const float* w_up, const float* w_down, int64_t M, int64_t d, int64_t I, bool accumulate_dx,
                  float* da, float* dg, float* du) {
    if (M == 0) return;
    gpu::matmul_backward(m.matmul, da, dw_down, dout, a, weight_of(m, w_down), M, I, d, false);
    gpu::swiglu_backward(dg, du, da, g, u, M * I, m.stream);
    gpu::matmul_backward(m.matmul, dx, dw_gate, dg, x, weight_of(m, w_gate), M, d, I, accumulate_dx);
    gpu::matmul_backward(m.matmul, dx, dw_up, du, x, weight_of(m, w_up), M, d, I, true);
}

// ---- MLA (model/mla.cpp) --------------------------------------------------------------------------------------

void mla_forward(GpuModel& m, const BlockWeights& w, GpuBlockActs& a, gpu::GemmInput x, float* out) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, H = c.num_attention_heads, dn = c.qk_nope_head_dim;
    const int64_t dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr, qr = c.q_lora_rank, kr = c.kv_lora_rank;
    const float eps = c.rms_norm_eps;
    if (qr > 0) {
        gpu::matmul_forward(m.matmul, a.q_a, x, weight_of(m, w.q_a), N, d, qr, false);
        gpu::rmsnorm_forward(a.q_a_normed, a.q_a_normed16, a.q_a_rstd, a.q_a, w.q_a_norm, N, qr, eps, m.stream);
        gpu::matmul_forward(m.matmul, a.q, {a.q_a_normed, a.q_a_normed16}, weight_of(m, w.q_b), N, qr, H * dqk,
                            false);
    } else {
        gpu::matmul_forward(m.matmul, a.q, x, weight_of(m, w.q), N, d, H * dqk, false);
    }
    gpu::matmul_forward(m.matmul, a.kv_a, x, weight_of(m, w.kv_a), N, d, kr + dr, false);
    gpu::copy_columns(a.c_kv, kr, a.kv_a, kr + dr, N, kr, m.stream);
    gpu::rmsnorm_forward(a.c_kv_normed, a.c_kv_normed16, a.c_kv_rstd, a.c_kv, w.kv_a_norm, N, kr, eps, m.stream);
    gpu::matmul_forward(m.matmul, a.kv, {a.c_kv_normed, a.c_kv_normed16}, weight_of(m, w.kv_b), N, kr,
                        H * (dn + dv), false);
    m.timer.mark("rope");
    const float scale = attention_softmax_scale(c);
    if (a.q_heads16) {  // the tensor-core attention (bf16_attention): its inputs were carved in BF16
        gpu::rope_heads_forward_bf16(a.q_heads16, a.k_heads16, a.v_heads16, a.q, a.kv, a.kv_a, m.rope_cos, m.rope_sin,
                                     N, m.T, H, dn, dr, dv, kr, m.stream);
        m.timer.mark("attention forward");
        gpu::attention_forward_bf16(a.o, a.lse, a.q_heads16, a.k_heads16, a.v_heads16, dv, m.B, m.T, (int)H, (int)dqk,
                                    (int)dv, scale, m.stream);
    } else {
        gpu::rope_heads_forward(a.q_heads, a.k_heads, a.q, a.kv, a.kv_a, m.rope_cos, m.rope_sin, N, m.T, H, dn, dr, dv,
                                kr, m.stream);
        m.timer.mark("attention forward");
        gpu::attention_forward(a.o, a.lse, a.q_heads, a.k_heads, a.kv + dn, dn + dv, m.B, m.T, (int)H, (int)dqk,
                               (int)dv, scale, m.stream);
    }
    m.timer.mark("attention projections");
    keep_bf16(m, a.o16, a.o, N * H * dv);
    gpu::matmul_forward(m.matmul, out, {a.o, a.o16}, weight_of(m, w.o), N, H * dv, d, false);
}

void mla_backward(GpuModel& m, const BlockWeights& w, BlockWeights& g, const GpuBlockActs& a, gpu::GemmInput x,
                  const float* dout, float* dx, const Scratch& s) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, H = c.num_attention_heads, dn = c.qk_nope_head_dim;
    const int64_t dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr, qr = c.q_lora_rank, kr = c.kv_lora_rank;
    gpu::matmul_backward(m.matmul, s.d_o, g.o, dout, {a.o, a.o16}, weight_of(m, w.o), N, H * dv, d, false);
    m.timer.mark("attention backward");
    const float scale = attention_softmax_scale(c);
    if (a.q_heads16) {  // the tensor-core attention (bf16_attention): its inputs were carved in BF16
        gpu::cast_to_bf16(s.d_o16, s.d_o, N * H * dv, m.stream);
        gpu::attention_backward_bf16(s.dq_heads, s.dk_heads, s.dkv + dn, dn + dv, s.attn_d, s.d_o, s.d_o16,
                                     a.q_heads16, a.k_heads16, a.v_heads16, dv, a.o, a.lse, m.B, m.T, (int)H, (int)dqk,
                                     (int)dv, scale, m.stream);
    } else {
        gpu::attention_backward(s.dq_heads, s.dk_heads, s.dkv + dn, s.attn_d, s.d_o, a.q_heads, a.k_heads, a.kv + dn,
                                dn + dv, a.o, a.lse, m.B, m.T, (int)H, (int)dqk, (int)dv, scale, m.stream);
    }
    m.timer.mark("rope");
    gpu::rope_heads_backward(s.dq, s.dkv, s.dkv_a, s.dq_heads, s.dk_heads, m.rope_cos, m.rope_sin, N, m.T, H, dn, dr,
                             dv, kr, m.stream);
    m.timer.mark("attention projections");
    gpu::matmul_backward(m.matmul, s.dc_kv_normed, g.kv_b, s.dkv, {a.c_kv_normed, a.c_kv_normed16},
                         weight_of(m, w.kv_b), N, kr, H * (dn + dv), false);
    gpu::rmsnorm_backward(s.dc_kv, g.kv_a_norm, s.dc_kv_normed, a.c_kv, w.kv_a_norm, a.c_kv_rstd, N, kr, false,
                          s.rms, m.stream);
    gpu::copy_columns(s.dkv_a, kr + dr, s.dc_kv, kr, N, kr, m.stream);
    gpu::matmul_backward(m.matmul, dx, g.kv_a, s.dkv_a, x, weight_of(m, w.kv_a), N, d, kr + dr, false);
    if (qr > 0) {
        gpu::matmul_backward(m.matmul, s.dq_a_normed, g.q_b, s.dq, {a.q_a_normed, a.q_a_normed16}, weight_of(m, w.q_b),
                             N, qr, H * dqk, false);
        gpu::rmsnorm_backward(s.dq_a, g.q_a_norm, s.dq_a_normed, a.q_a, w.q_a_norm, a.q_a_rstd, N, qr, false, s.rms,
                              m.stream);
        gpu::matmul_backward(m.matmul, dx, g.q_a, s.dq_a, x, weight_of(m, w.q_a), N, d, qr, true);
    } else {
        gpu::matmul_backward(m.matmul, dx, g.q, s.dq, x, weight_of(m, w.q), N, d, H * dqk, true);
    }
}

// ---- MoE (model/moe.cpp) --------------------------------------------------------------------------------------

// Rows in plan order on this rank <-> rows in expert order on the experts' ranks (DESIGN §2). With one EP rank
// the plan order is the expert order and nothing moves. `arrived` is a buffer of R rows for the exchange. T: float,
// or __nv_bfloat16 for the forward's rows in BF16 mode, which travel as d/2 floats a row (the Comm moves floats;
// the bytes are the same; gpu_model_init requires an even hidden size for this).
template <typename T>
void dispatch_rows(GpuModel& m, const GpuBlockActs& a, const T* rows, T* expert_rows, T* arrived) {
    const int64_t d = m.config.hidden_size, R = a.dispatch.received();
    sync(m);
    m.comm->all_to_all_v(reinterpret_cast<const float*>(rows), a.dispatch.send_rows.data(),
                         reinterpret_cast<float*>(arrived), a.dispatch.recv_rows.data(),
                         d * (int64_t)sizeof(T) / (int64_t)sizeof(float));
    gpu::gather_forward(expert_rows, arrived, a.expert_to_recv, R, 1, d, m.stream);
}
void combine_rows(GpuModel& m, const GpuBlockActs& a, const float* expert_rows, float* rows, float* leaving) {
    const int64_t d = m.config.hidden_size, R = a.dispatch.received();
    gpu::gather_forward(leaving, expert_rows, a.recv_to_expert, R, 1, d, m.stream);
    sync(m);
    m.comm->all_to_all_v(leaving, a.dispatch.recv_rows.data(), rows, a.dispatch.send_rows.data(), d);
}

// Routes, plans and exchanges: after it, a.counts_host, a.dispatch and (EP > 1) the permutations are set and the
// expert buffers hold R rows. The group sizes reach the host here: one copy of E counts and a stream
// synchronisation per MoE layer per forward (kernels/permute.cuh says why and what it costs).
void moe_route(GpuModel& m, const BlockWeights& w, GpuBlockActs& a, const float* x, const Scratch& s) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    Comm& comm = *m.comm;
    m.timer.mark("router");
    gpu::matmul_forward(m.matmul, a.scores, x, w.router, N, d, E, false);  // the router stays FP32
    gpu::router_forward(a.scores, a.chosen, a.gate_weights, s.drouter, a.scores, w.router_bias, c, N, m.stream);
    m.timer.mark("permute");
    gpu::expert_plan_build(a.counts, a.offsets, a.row_of_slot, a.slot_of_row, a.chosen, N * k, (int)E, m.stream);
    a.counts_host.resize(E);
    CUDA_CHECK(cudaMemcpyAsync(a.counts_host.data(), a.counts, E * sizeof(int64_t), cudaMemcpyDeviceToHost, m.stream));
    sync(m);
    int64_t assigned = 0;
    for (int64_t n : a.counts_host) assigned += n;
    if (assigned != N * k)  // router_select marks non-finite scores with expert -1, which no expert counts
        throw std::runtime_error("the router scores are not finite (the weights hold NaN or inf)");
    const int64_t E_local = E / comm.ep_size;
    std::vector<int64_t> recv_counts(a.counts_host);
    if (comm.ep_size > 1) comm.all_to_all(a.counts_host.data(), recv_counts.data(), E_local);
    ExpertPlan local;
    local.num_experts = (int)E;
    local.counts = a.counts_host;
    a.dispatch = build_dispatch_plan(local, recv_counts, comm.ep_size);
    const int64_t R = a.dispatch.received();
    ensure_expert_rows(m, a, R);
    if (comm.ep_size > 1) {
        std::vector<int64_t> expert_to_recv(R);
        for (int64_t r = 0; r < R; r++) expert_to_recv[a.dispatch.expert_row_of_recv[r]] = r;
        CUDA_CHECK(cudaMemcpyAsync(a.recv_to_expert, a.dispatch.expert_row_of_recv.data(), R * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, m.stream));
        CUDA_CHECK(cudaMemcpyAsync(a.expert_to_recv, expert_to_recv.data(), R * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, m.stream));
        sync(m);  // the host vector goes out of scope
    }
}

// The routed experts' input rows in expert order: FP32 or BF16, with one EP rank the rows as gathered
gpu::GemmInput expert_input(const GpuBlockActs& a, bool ep) {
    return {ep ? a.expert_in : a.rows_sent, ep ? a.expert_in16 : a.rows_sent16};
}

double moe_forward(GpuModel& m, const BlockWeights& w, GpuBlockActs& a, gpu::GemmInput x, float* out,
                   bool with_loss) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, k = c.num_experts_per_tok, I = c.moe_intermediate_size;
    const int64_t S = (int64_t)c.n_shared_experts * I;
    const bool ep = m.comm->ep_size > 1;
    const Scratch s = scratch_of(m);
    moe_route(m, w, a, x.fp32, s);
    float* expert_out = ep ? a.expert_out : a.rows_back;
    const gpu::GemmInput expert_in = expert_input(a, ep);
    if (x.bf16) {  // BF16 mode: the rows gathered (and exchanged) in BF16; expert_out is free to receive them
        gpu::gather_forward(a.rows_sent16, x.bf16, a.slot_of_row, N, (int)k, d, m.stream);
        if (ep) dispatch_rows(m, a, a.rows_sent16, a.expert_in16, reinterpret_cast<__nv_bfloat16*>(expert_out));
    } else {
        gpu::gather_forward(a.rows_sent, x.fp32, a.slot_of_row, N, (int)k, d, m.stream);
        if (ep) dispatch_rows(m, a, a.rows_sent, a.expert_in, expert_out);
    }
    m.timer.mark("expert GEMMs");
    const int64_t* offsets = a.dispatch.expert_offsets.data();
    const int64_t E_local = (int64_t)a.dispatch.expert_counts.size(), R = a.dispatch.received();
    gpu::grouped_matmul_forward(m.matmul, a.expert_g, expert_in, weight_of(m, w.expert_gate), offsets,
                                E_local, d, I);
    gpu::grouped_matmul_forward(m.matmul, a.expert_u, expert_in, weight_of(m, w.expert_up), offsets,
                                E_local, d, I);
    swiglu(m, a.expert_a, a.expert_a16, a.expert_g, a.expert_u, R * I);
    gpu::grouped_matmul_forward(m.matmul, expert_out, {a.expert_a, a.expert_a16}, weight_of(m, w.expert_down), offsets,
                                E_local, I, d);
    m.timer.mark("permute");
    if (ep) combine_rows(m, a, expert_out, a.rows_back, expert_scratch_of(m).din);
    m.timer.mark("shared experts");
    if (S > 0) ffn_forward(m, out, a.ffn_g, a.ffn_u, a.ffn_a, a.ffn_a16, x, w.gate, w.up, w.down, N, d, S);
    m.timer.mark("permute");
    gpu::combine_forward(out, a.rows_back, a.gate_weights, a.row_of_slot, N, (int)k, d, S > 0, m.stream);
    if (!with_loss || c.aux_loss_alpha <= 0) return 0.0;
    m.timer.mark("router");
    gpu::balance_loss(s.seq_balance, s.token_totals, s.seq_counts, a.scores, a.chosen, c, m.B, m.T, m.stream);
    std::vector<double> per_sequence(m.B);
    CUDA_CHECK(cudaMemcpyAsync(per_sequence.data(), s.seq_balance, m.B * sizeof(double), cudaMemcpyDeviceToHost,
                               m.stream));
    sync(m);
    double balance_loss = 0.0;
    for (double v : per_sequence) balance_loss += c.aux_loss_alpha * v / m.B;
    return balance_loss;
}

void moe_backward(GpuModel& m, const BlockWeights& w, BlockWeights& g, GpuBlockActs& a, gpu::GemmInput x,
                  const float* dout, float* dx, float balance_scale, const Scratch& s) {
    const Config& c = m.config;
    const int64_t N = tokens(m), d = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
    const int64_t I = c.moe_intermediate_size, S = (int64_t)c.n_shared_experts * I;
    const bool ep = m.comm->ep_size > 1;
    const ExpertScratch es = expert_scratch_of(m);
    m.timer.mark("permute");
    gpu::combine_backward(s.drows_back, s.dgate, dout, a.rows_back, a.gate_weights, a.row_of_slot, N, (int)k, d,
                          m.stream);
    float* dexpert_out = ep ? es.dout : s.drows_back;
    float* dexpert_in = ep ? es.din : s.drows_sent;
    if (ep) dispatch_rows(m, a, s.drows_back, dexpert_out, es.din);
    m.timer.mark("expert GEMMs");
    const int64_t* offsets = a.dispatch.expert_offsets.data();
    const int64_t E_local = (int64_t)a.dispatch.expert_counts.size(), R = a.dispatch.received();
    const gpu::GemmInput expert_in = expert_input(a, ep);
    gpu::grouped_matmul_backward(m.matmul, es.da, g.expert_down, dexpert_out, {a.expert_a, a.expert_a16},
                                 weight_of(m, w.expert_down), offsets, E_local, I, d);
    gpu::swiglu_backward(es.dg, es.du, es.da, a.expert_g, a.expert_u, R * I, m.stream);
    gpu::grouped_matmul_backward(m.matmul, dexpert_in, g.expert_gate, es.dg, expert_in, weight_of(m, w.expert_gate),
                                 offsets, E_local, d, I);
    // dx_in += du W_up: the grouped backward overwrites, so W_up's input gradient goes through dexpert_out's
    // buffer (free now) and is added
    gpu::grouped_matmul_backward(m.matmul, dexpert_out, g.expert_up, es.du, expert_in, weight_of(m, w.expert_up),
                                 offsets, E_local, d, I);
    gpu::add(dexpert_in, dexpert_in, dexpert_out, R * d, m.stream);
    m.timer.mark("permute");
    if (ep) combine_rows(m, a, dexpert_in, s.drows_sent, es.dout);
    m.timer.mark("shared experts");
    if (S > 0)
        ffn_backward(m, dx, g.gate, g.up, g.down, dout, a.ffn_g, a.ffn_u, {a.ffn_a, a.ffn_a16}, x, w.gate, w.up,
                     w.down, N, d, S, false, s.ffn_da, s.ffn_dg, s.ffn_du);
    m.timer.mark("permute");
    gpu::gather_backward(dx, s.drows_sent, a.row_of_slot, N, (int)k, d, S > 0, m.stream);
    m.timer.mark("router");
    gpu::router_backward(s.drouter, s.dgate, a.scores, a.chosen, c, m.B, m.T, balance_scale, s.seq_counts, m.stream);
    gpu::matmul_backward(m.matmul, dx, g.router, s.drouter, x.fp32, w.router, N, d, E, true);
}

// ---- blocks and the model (model/model.cpp) -------------------------------------------------------------------

// The RMSNorm that reads a block's output (the next block's attention norm, or the final norm), fused with the
// block's last residual add: its weight and where the normalised rows (FP32, and their BF16 copy in BF16 mode) and
// their rstd go.
struct NextNorm {
    const float* weight;
    float* out;
    __nv_bfloat16* out16;
    float* rstd;
};
GpuBlockActs& block_acts(GpuModel& m, int layer) { return m.blocks[m.block_slot[layer]]; }

// block `layer`'s attention norm as such
NextNorm attention_norm(GpuModel& m, int layer) {
    GpuBlockActs& a = block_acts(m, layer);
    return NextNorm{m.w.blocks[layer].attn_norm, a.attn_normed, a.attn_normed16, a.attn_rstd};
}

// h_out = h_in + Attn(RMSNorm(h_in)); h_out += FFN(RMSNorm(.)); next = RMSNorm(h_out). The block's own attention
// norm (a.attn_normed, a.attn_rstd) was computed by whoever wrote h_in (the previous block, or the caller).
// Returns the block's balance loss. h_out nullptr: only the activations the backward reads (a recomputation).
double block_forward(GpuModel& m, int layer, const float* h_in, float* h_out, const NextNorm& next, bool training,
                     bool with_loss) {
    const Config& c = m.config;
    const BlockWeights& w = m.w.blocks[layer];
    GpuBlockActs& a = block_acts(m, layer);
    m.slot_layer[m.block_slot[layer]] = layer;
    const int64_t N = tokens(m), d = c.hidden_size;
    m.timer.mark("attention projections");
    mla_forward(m, w, a, {a.attn_normed, a.attn_normed16}, a.attn_out);
    m.timer.mark("rmsnorm + residual");
    gpu::residual_rmsnorm_forward(a.h_mid, a.ffn_normed, a.ffn_normed16, a.ffn_rstd, h_in, a.attn_out, w.ffn_norm, N,
                                  d, c.rms_norm_eps, m.stream);
    double balance = 0.0;
    if (c.is_moe_layer(layer)) {
        balance = moe_forward(m, w, a, {a.ffn_normed, a.ffn_normed16}, a.ffn_out, with_loss);
        if (training)
            for (int e = 0; e < c.n_routed_experts; e++) m.expert_counts[layer][e] += a.counts_host[e];
    } else {
        m.timer.mark("dense FFN");
        ffn_forward(m, a.ffn_out, a.ffn_g, a.ffn_u, a.ffn_a, a.ffn_a16, {a.ffn_normed, a.ffn_normed16}, w.gate, w.up,
                    w.down, N, d, c.intermediate_size);
    }
    if (!h_out) return balance;
    m.timer.mark("rmsnorm + residual");
    gpu::residual_rmsnorm_forward(h_out, next.out, next.out16, next.rstd, a.h_mid, a.ffn_out, next.weight, N, d,
                                  c.rms_norm_eps, m.stream);
    return balance;
}

// The attention norm of block `layer` on its input h (for the blocks no earlier block feeds: the first, and MTP's).
void block_input_norm(GpuModel& m, int layer, const float* h) {
    m.timer.mark("rmsnorm + residual");
    const NextNorm norm = attention_norm(m, layer);
    gpu::rmsnorm_forward(norm.out, norm.out16, norm.rstd, h, norm.weight, tokens(m), m.config.hidden_size,
                         m.config.rms_norm_eps, m.stream);
}

// With recompute, block `layer`'s forward again from its input h_in when another block has used its activation set
// since: the same kernels on the same values, so the same bits. Not training: the expert counts and the balance loss
// were taken by the first forward (router_backward recounts what its gradient needs).
void restore_block_acts(GpuModel& m, int layer, const float* h_in) {
    if (m.slot_layer[m.block_slot[layer]] == layer) return;
    m.timer.label = "recompute";
    block_input_norm(m, layer, h_in);
    block_forward(m, layer, h_in, nullptr, NextNorm{}, /*training*/ false, /*with_loss*/ false);
    m.timer.label = nullptr;
}

void block_backward(GpuModel& m, int layer, const float* h_in, const float* dh_out, float* dh_in, float loss_scale,
                    const Scratch& s) {
    const Config& c = m.config;
    const BlockWeights& w = m.w.blocks[layer];
    BlockWeights& g = m.g.blocks[layer];
    restore_block_acts(m, layer, h_in);
    GpuBlockActs& a = block_acts(m, layer);
    const int64_t N = tokens(m), d = c.hidden_size;
    if (c.is_moe_layer(layer)) {
        moe_backward(m, w, g, a, {a.ffn_normed, a.ffn_normed16}, dh_out, s.dnormed, loss_scale, s);
    } else {
        m.timer.mark("dense FFN");
        ffn_backward(m, s.dnormed, g.gate, g.up, g.down, dh_out, a.ffn_g, a.ffn_u, {a.ffn_a, a.ffn_a16},
                     {a.ffn_normed, a.ffn_normed16}, w.gate, w.up, w.down, N, d, c.intermediate_size, false, s.ffn_da,
                     s.ffn_dg, s.ffn_du);
    }
    m.timer.mark("rmsnorm + residual");
    CUDA_CHECK(cudaMemcpyAsync(s.dh_mid, dh_out, N * d * sizeof(float), cudaMemcpyDeviceToDevice, m.stream));
    gpu::rmsnorm_backward(s.dh_mid, g.ffn_norm, s.dnormed, a.h_mid, w.ffn_norm, a.ffn_rstd, N, d, true, s.rms,
                          m.stream);
    CUDA_CHECK(cudaMemcpyAsync(dh_in, s.dh_mid, N * d * sizeof(float), cudaMemcpyDeviceToDevice, m.stream));
    m.timer.mark("attention projections");
    mla_backward(m, w, g, a, {a.attn_normed, a.attn_normed16}, s.dh_mid, s.dnormed, s);
    m.timer.mark("rmsnorm + residual");
    gpu::rmsnorm_backward(dh_in, g.attn_norm, s.dnormed, h_in, w.attn_norm, a.attn_rstd, N, d, true, s.rms, m.stream);
}

// x's rows from `first` on, x holding rows of `width` values (either copy may be absent)
gpu::GemmInput rows_from(const gpu::GemmInput& x, int64_t first, int64_t width) {
    return {x.fp32 ? x.fp32 + first * width : nullptr, x.bf16 ? x.bf16 + first * width : nullptr};
}

// An output head (the main one, or MTP's): its logits buffer (N x V, or with recompute one chunk's), the normalised
// rows it reads (N, d) and their targets (nullptr: none)
struct Head {
    float* logits;
    gpu::GemmInput normed;
    const int32_t* targets;
};
Head main_head(GpuModel& m, bool with_targets) {
    return {m.logits, {m.final_normed, m.final_normed16}, with_targets ? m.targets : nullptr};
}
Head mtp_head(GpuModel& m) { return {m.mtp_logits, {m.mtp_normed, m.mtp_normed16}, m.mtp_targets}; }

// Whether the forward keeps every chunk's logits: without recompute, and with it when one chunk holds all the rows
bool keeps_logits(const GpuModel& m) { return !m.layout.recompute || m.head_rows >= (int64_t)m.max_B * m.T; }

// The logits of head h's rows [r0, r0 + rows) (one chunk): where the forward keeps them, computed there when
// `compute` (the forward; when it does not keep them, the backward and gpu_model_logits_row too: the same GEMM on
// the same rows)
const float* head_logits(GpuModel& m, const Head& h, int64_t r0, int64_t rows, bool compute) {
    const int64_t d = m.config.hidden_size, V = m.config.vocab_size;
    float* logits = keeps_logits(m) ? h.logits + r0 * V : h.logits;
    if (compute) {
        m.timer.mark("head");
        gpu::matmul_forward(m.matmul, logits, rows_from(h.normed, r0, d), weight_of(m, m.w.head), rows, d, V, false);
    }
    return logits;
}

// Head h's forward, chunk by chunk: the logits, and with targets each row's loss into m.losses
void head_forward(GpuModel& m, const Head& h) {
    const int64_t N = tokens(m), V = m.config.vocab_size;
    for (int64_t r0 = 0; r0 < N; r0 += m.head_rows) {
        const int64_t rows = std::min(m.head_rows, N - r0);
        const float* logits = head_logits(m, h, r0, rows, /*compute*/ true);
        if (!h.targets) continue;
        m.timer.mark("cross-entropy");
        gpu::cross_entropy_forward_backward(m.losses + r0, nullptr, logits, h.targets + r0, rows, V, 0.0f, m.stream);
    }
}

// One output head's backward, chunk by chunk (head_rows): dlogits = scale (softmax(logits) - onehot(targets)), then
// dnormed = dlogits W_head and dW_head += dlogits^T normed. In BF16 mode the cross-entropy writes dlogits in BF16
// only: the head's two GEMMs are its only readers.
void head_backward(GpuModel& m, const Scratch& s, float* dnormed, const Head& h, float scale) {
    const int64_t N = tokens(m), d = m.config.hidden_size, V = m.config.vocab_size;
    for (int64_t r0 = 0; r0 < N; r0 += m.head_rows) {
        const int64_t rows = std::min(m.head_rows, N - r0);
        if (!keeps_logits(m)) m.timer.label = "recompute";
        const float* logits = head_logits(m, h, r0, rows, /*compute*/ !keeps_logits(m));
        m.timer.label = nullptr;
        m.timer.mark("cross-entropy");
        if (s.dlogits16)
            gpu::cross_entropy_forward_backward_bf16(m.losses + r0, s.dlogits16, logits, h.targets + r0, rows, V,
                                                     scale, m.stream);
        else
            gpu::cross_entropy_forward_backward(m.losses + r0, s.dlogits, logits, h.targets + r0, rows, V, scale,
                                                m.stream);
        m.timer.mark("head");
        gpu::matmul_backward(m.matmul, dnormed + r0 * d, m.g.head, {s.dlogits, s.dlogits16}, rows_from(h.normed, r0, d),
                             weight_of(m, m.w.head), rows, d, V, false);
    }
}

// Sum of the first n per-row losses, in double, in row order (the CPU's order).
double sum_losses(GpuModel& m, int64_t n) {
    std::vector<float> losses(n);
    CUDA_CHECK(cudaMemcpyAsync(losses.data(), m.losses, n * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
    sync(m);
    double total = 0.0;
    for (float l : losses) total += l;
    return total;
}

void upload_tokens(GpuModel& m, int32_t* dst, const int32_t* src, int64_t n) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
    sync(m);  // src may be a temporary of the caller
}

// The n tokens at src grouped by token into rows (on the device) for the embedding's backward
void upload_token_rows(GpuModel& m, gpu::TokenRows& rows, const int32_t* src, int64_t n) {
    std::vector<int32_t> packed(3 * n + 1);
    rows.rows = n;
    rows.distinct = gpu::token_rows_pack(src, n, packed.data());
    upload_tokens(m, rows.packed, packed.data(), (int64_t)packed.size());
}

// The device tables of the shard's AdamW update and gradient norm: its packed ranges (6 R + 2 int64), the ranges'
// squared norms (R doubles) and the norm's chunk partials, carved in that order. Bounded the same for every rank
// (so is the plan): a shard has at most two ranges per tensor (one in the rank's piece of the tensor's bucket, one
// in its tail), and the norm at most one chunk per range more than the whole table's.
int64_t optimizer_table_bytes(const ParamTable& table) {
    const int64_t ranges = 2 * (int64_t)table.tensors.size();
    const int64_t chunks = (table.total + GRAD_NORM_CHUNK - 1) / GRAD_NORM_CHUNK + ranges;
    return (6 * ranges + 2) * 8 + (ranges + chunks) * 8;
}

// Everything gpu_model_init allocates, in the order of the memory plan.
void allocate(GpuModel& m, const Config& c, Comm& comm, gpu::Precision p, int B, int T,
              const ActivationLayout& layout, const GpuMemoryPlan& plan) {
    m.config = c;
    m.layout = layout;
    m.head_rows = head_chunk_rows(c, (int64_t)B * T, layout);
    m.comm = &comm;
    m.precision = p;
    m.table = build_param_table(c, comm.ep_size);
    m.shard = optimizer_shard(m.table, comm);
    m.max_B = B;
    m.B = B;
    m.T = T;
    CUDA_CHECK(cudaStreamCreate(&m.stream));
    m.timer.stream = m.stream;
    const int64_t total = m.table.total, N = (int64_t)B * T;
    const bool bf16 = p != gpu::Precision::FP32;
    m.params = static_cast<float*>(device_alloc(total * 4, "the parameters"));
    m.grads = static_cast<float*>(device_alloc(total * 4, "the gradients"));
    m.adam_m = static_cast<float*>(device_alloc(m.shard.moments * 4, "the AdamW moments"));
    m.adam_v = static_cast<float*>(device_alloc(m.shard.moments * 4, "the AdamW moments"));
    if (bf16) m.params_bf16 = static_cast<__nv_bfloat16*>(device_alloc(total * 2, "the BF16 weights"));
    if (p == gpu::Precision::FP8) {
        m.fp8_alloc = device_alloc(plan.fp8_weights, "the FP8 weights");
        ByteArena fp8{static_cast<char*>(m.fp8_alloc), 0};
        carve_fp8_weights(fp8, m.table, m.params, m.fp8_weights);
    }
    m.w = map_weights(c, m.table, m.params);
    m.g = map_weights(c, m.table, m.grads);
    m.arena = device_alloc(plan.activations, "the activations");
    ByteArena ar{static_cast<char*>(m.arena), 0};
    carve_activations(ar, m, c, bf16, B, T, layout);
    m.scratch = device_alloc(
        bytes_of([&](ByteArena& counting) { carve_scratch(counting, c, bf16, B, T, m.head_rows); }),
        "the backward's buffers");
    const std::vector<int64_t> packed_ranges = gpu::shard_ranges_pack(m.shard);
    const int64_t table_bytes = optimizer_table_bytes(m.table);
    m.optimizer_tables = device_alloc(table_bytes, "the optimizer's tables");
    int64_t* ranges = static_cast<int64_t*>(m.optimizer_tables);
    m.shard_ranges = gpu::shard_ranges_of(packed_ranges, ranges);
    if ((int64_t)packed_ranges.size() * 8 + (m.shard_ranges.ranges + m.shard_ranges.chunks) * 8 > table_bytes)
        throw std::runtime_error("internal error: the optimizer shard's ranges exceed their bound");
    CUDA_CHECK(cudaMemcpy(ranges, packed_ranges.data(), packed_ranges.size() * 8, cudaMemcpyHostToDevice));
    m.norm_slots = reinterpret_cast<double*>(ranges + packed_ranges.size());
    m.norm_partials = m.norm_slots + m.shard_ranges.ranges;
    gpu::matmul_create(m.matmul, m.stream, bf16 ? cast_elements(c, N, 0) : gpu::MatmulCasts{},
                       p == gpu::Precision::FP8);
    m.expert_counts.assign(c.num_blocks(), {});
    for (int l = 0; l < c.num_blocks(); l++)
        if (c.is_moe_layer(l)) {
            m.expert_counts[l].assign(c.n_routed_experts, 0);
            ensure_expert_rows(m, block_acts(m, l), N * c.num_experts_per_tok);
        }
    gpu::rope_table(m.rope_cos, m.rope_sin, c, T, m.stream);
    CUDA_CHECK(cudaMemsetAsync(m.grads, 0, total * 4, m.stream));
    sync(m);
}

}  // namespace

// ---- region timer ---------------------------------------------------------------------------------------------

void RegionTimer::mark(const char* name) {
    if (!enabled) return;
    if (label) name = label;
    if (!marks.empty() && marks.back().first == name) return;  // the region goes on
    cudaEvent_t event;
    if (pool.empty()) {
        CUDA_CHECK(cudaEventCreate(&event));
    } else {
        event = pool.back();
        pool.pop_back();
    }
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
    for (auto& mk : marks) pool.push_back(mk.second);
    marks.clear();
}

void RegionTimer::release() {
    for (auto& mk : marks) pool.push_back(mk.second);
    for (cudaEvent_t e : pool) CUDA_CHECK(cudaEventDestroy(e));
    marks.clear();
    pool.clear();
}

// ---- public API -----------------------------------------------------------------------------------------------

GpuMemoryPlan gpu_memory_plan(const Config& c, int ep_size, int world, gpu::Precision p, int B, int T,
                              const ActivationLayout& layout) {
    const ParamTable table = build_param_table(c, ep_size);
    const int64_t total = table.total, N = (int64_t)B * T;
    const int64_t R = N * c.num_experts_per_tok;  // the expected rows per rank: the buffers grow beyond it
    const std::vector<int> slot = block_slots(c, layout.recompute);
    std::set<int> moe_slots;  // the activation sets of MoE blocks, each with its expert rows
    for (int l = 0; l < c.num_blocks(); l++)
        if (c.is_moe_layer(l)) moe_slots.insert(slot[l]);
    const int64_t moe_sets = (int64_t)moe_slots.size();
    GpuMemoryPlan plan;
    const bool bf16 = p != gpu::Precision::FP32;
    std::map<int64_t, Fp8Tensor> counted;
    if (p == gpu::Precision::FP8)
        plan.fp8_weights = bytes_of([&](ByteArena& ar) { carve_fp8_weights(ar, table, nullptr, counted); });
    plan.params = total * 4 + (bf16 ? total * 2 : 0) + plan.fp8_weights;
    plan.grads = total * 4;
    const OptimizerShard shard = optimizer_shard(table, world, 0, world / ep_size, 0);
    plan.optimizer = shard.moments * 8;
    GpuModel counting;
    plan.activations = bytes_of([&](ByteArena& ar) { carve_activations(ar, counting, c, bf16, B, T, layout); });
    GpuBlockActs layer;
    plan.expert_rows = moe_sets > 0 ? moe_sets * bytes_of([&](ByteArena& ar) {
                                            carve_expert_rows(ar, c, bf16, ep_size, R, layer);
                                        }) + bytes_of([&](ByteArena& ar) { carve_expert_scratch(ar, c, ep_size, R); })
                                      : 0;
    plan.scratch =
        bytes_of([&](ByteArena& ar) { carve_scratch(ar, c, bf16, B, T, head_chunk_rows(c, N, layout)); }) +
        optimizer_table_bytes(table) +
        gpu::matmul_memory_bytes(bf16 ? cast_elements(c, N, R) : gpu::MatmulCasts{}, p == gpu::Precision::FP8);
    return plan;
}

void gpu_model_init(GpuModel& m, const Config& c, Comm& comm, gpu::Precision p, int B, int T,
                    const ActivationLayout& layout) {
    if (c.qk_rope_head_dim % 2 != 0)
        throw std::runtime_error("qk_rope_head_dim " + std::to_string(c.qk_rope_head_dim) +
                                 " is odd: RoPE rotates pairs");
    if (p == gpu::Precision::FP8) check_fp8_widths(c);
    check_device(c, p);
    if (p != gpu::Precision::FP32 && comm.ep_size > 1 && c.hidden_size % 2 != 0)
        throw std::runtime_error("hidden_size " + std::to_string(c.hidden_size) +
                                 " is odd: with --dtype bf16 and --ep > 1 the expert rows travel as pairs of BF16 "
                                 "values (use an even hidden size, or --dtype fp32)");
    const GpuMemoryPlan plan = gpu_memory_plan(c, comm.ep_size, comm.world, p, B, T, layout);
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const int64_t reserve = 1ll << 30;  // the CUDA context, NCCL's and cuBLASLt's own buffers: not in the plan
    if (plan.total() + reserve > (int64_t)free_bytes) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "the model and a batch of %d x %d tokens need %.2f GiB of GPU memory (+1 GiB for CUDA and NCCL), "
                 "%.2f GiB are free (lower --batch or --seq,%s or spread the experts with --ep)",
                 B, T, plan.total() / 1073741824.0, free_bytes / 1073741824.0,
                 layout.recompute ? "" : " add --recompute,");
        throw std::runtime_error(msg);
    }
    try {
        allocate(m, c, comm, p, B, T, layout, plan);
    } catch (...) {
        gpu_model_free(m);  // what was allocated before the failure
        throw;
    }
}


void gpu_model_free(GpuModel& m) {
    m.timer.release();
    for (GpuBlockActs& a : m.blocks) CUDA_CHECK(cudaFree(a.expert_alloc));
    for (void* p : {(void*)m.params, (void*)m.grads, (void*)m.adam_m, (void*)m.adam_v, (void*)m.params_bf16,
                    m.fp8_alloc, m.arena, m.scratch, m.expert_scratch, m.optimizer_tables})
        CUDA_CHECK(cudaFree(p));
    gpu::matmul_destroy(m.matmul);
    if (m.stream) CUDA_CHECK(cudaStreamDestroy(m.stream));
    m = GpuModel();
}

void gpu_model_upload(GpuModel& m, const Model& host, const AdamWState& opt) {
    if (host.table.total != m.table.total || (int64_t)opt.m.size() != m.shard.moments ||
        (int64_t)opt.v.size() != m.shard.moments)
        throw std::runtime_error("internal error: the host's and the GPU's tables or optimizer shards differ");
    CUDA_CHECK(cudaMemcpy(m.params, host.params.data(), m.table.total * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(m.adam_m, opt.m.data(), m.shard.moments * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(m.adam_v, opt.v.data(), m.shard.moments * sizeof(float), cudaMemcpyHostToDevice));
    if (m.params_bf16) gpu::cast_to_bf16(m.params_bf16, m.params, m.table.total, m.stream);
    refresh_fp8_weights(m);
    sync(m);
}

void gpu_model_download(const GpuModel& m, Model& host, AdamWState& opt) {
    sync(m);
    CUDA_CHECK(cudaMemcpy(host.params.data(), m.params, m.table.total * sizeof(float), cudaMemcpyDeviceToHost));
    opt.m.resize(m.shard.moments);
    opt.v.resize(m.shard.moments);
    CUDA_CHECK(cudaMemcpy(opt.m.data(), m.adam_m, m.shard.moments * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(opt.v.data(), m.adam_v, m.shard.moments * sizeof(float), cudaMemcpyDeviceToHost));
}

LossParts gpu_model_forward(GpuModel& m, const int32_t* inputs, const int32_t* targets, int B, bool training) {
    if (B < 1 || B > m.max_B)
        throw std::runtime_error("internal error: a batch of " + std::to_string(B) + " sequences, allocated for " +
                                 std::to_string(m.max_B));
    const Config& c = m.config;
    m.B = B;
    const int T = m.T;
    const int64_t N = (int64_t)B * T, d = c.hidden_size, L = c.num_hidden_layers;
    LossParts loss;
    upload_tokens(m, m.inputs, inputs, N);
    m.timer.mark("embedding");
    gpu::embedding_forward(m.residual[0], m.inputs, m.w.embed, N, d, m.stream);
    const NextNorm final_norm{m.w.final_norm, m.final_normed, m.final_normed16, m.final_rstd};
    block_input_norm(m, 0, m.residual[0]);  // num_hidden_layers >= 1 (validate_config)
    for (int l = 0; l < L; l++) {
        const NextNorm next = l + 1 < L ? attention_norm(m, l + 1) : final_norm;
        loss.balance += block_forward(m, l, m.residual[l], m.residual[l + 1], next, training, targets != nullptr);
    }
    if (!targets) {  // the logits only, for gpu_model_logits_row
        if (keeps_logits(m)) head_forward(m, main_head(m, false));
        sync(m);
        return loss;
    }
    upload_token_rows(m, m.input_rows, inputs, N);  // for a backward (which needs the targets), sorted on the host
    upload_tokens(m, m.targets, targets, N);          // while the GPU runs the last blocks
    head_forward(m, main_head(m, true));
    if (c.num_nextn_predict_layers > 0) upload_token_rows(m, m.target_rows, targets, N);  // while the head runs
    loss.main = sum_losses(m, N) / N;
    if (c.num_nextn_predict_layers > 0) {
        std::vector<int32_t> mtp_targets(N);
        for (int64_t t = 0; t < N; t++) mtp_targets[t] = (t % T == T - 1) ? -1 : targets[t + 1];
        upload_tokens(m, m.mtp_targets, mtp_targets.data(), N);
        m.timer.mark("embedding");
        gpu::embedding_forward(m.next_embed, m.targets, m.w.embed, N, d, m.stream);
        m.timer.mark("rmsnorm + residual");
        gpu::rmsnorm_forward(m.enorm_out, nullptr, m.enorm_rstd, m.next_embed, m.w.mtp_enorm, N, d, c.rms_norm_eps,
                             m.stream);
        gpu::rmsnorm_forward(m.hnorm_out, nullptr, m.hnorm_rstd, m.final_normed, m.w.mtp_hnorm, N, d, c.rms_norm_eps,
                             m.stream);
        gpu::copy_columns(m.mtp_concat, 2 * d, m.enorm_out, d, N, d, m.stream);
        gpu::copy_columns(m.mtp_concat + d, 2 * d, m.hnorm_out, d, N, d, m.stream);
        m.timer.mark("head");
        keep_bf16(m, m.mtp_concat16, m.mtp_concat, N * 2 * d);
        gpu::matmul_forward(m.matmul, m.mtp_in, {m.mtp_concat, m.mtp_concat16}, weight_of(m, m.w.mtp_eh_proj), N, 2 * d,
                            d, false);
        block_input_norm(m, (int)L, m.mtp_in);
        const NextNorm mtp_norm{m.w.mtp_norm, m.mtp_normed, m.mtp_normed16, m.mtp_rstd};
        loss.balance += block_forward(m, (int)L, m.mtp_in, m.mtp_out, mtp_norm, training, true);
        head_forward(m, mtp_head(m));
        loss.mtp = sum_losses(m, N) / ((double)B * (T - 1));
    }
    loss.total = loss.main + c.mtp_loss_weight * loss.mtp + loss.balance;
    return loss;
}

void gpu_model_backward(GpuModel& m, float loss_scale) {
    const Config& c = m.config;
    const int B = m.B, T = m.T;
    const int64_t N = (int64_t)B * T, d = c.hidden_size, L = c.num_hidden_layers;
    const Scratch s = scratch_of(m);
    head_backward(m, s, s.dfinal, main_head(m, true), loss_scale / N);
    float* dh = s.dh;
    float* dh_prev = s.dh_prev;
    if (c.num_nextn_predict_layers > 0) {
        const float mtp_scale = loss_scale * c.mtp_loss_weight / ((float)B * (T - 1));
        head_backward(m, s, s.dmtp, mtp_head(m), mtp_scale);
        m.timer.mark("rmsnorm + residual");
        gpu::rmsnorm_backward(s.dmtp_out, m.g.mtp_norm, s.dmtp, m.mtp_out, m.w.mtp_norm, m.mtp_rstd, N, d, false,
                              s.rms, m.stream);
        block_backward(m, (int)L, m.mtp_in, s.dmtp_out, s.dmtp, loss_scale, s);
        m.timer.mark("head");
        gpu::matmul_backward(m.matmul, s.dconcat, m.g.mtp_eh_proj, s.dmtp, {m.mtp_concat, m.mtp_concat16},
                             weight_of(m, m.w.mtp_eh_proj), N, 2 * d, d, false);
        m.timer.mark("rmsnorm + residual");
        gpu::copy_columns(s.dhalf, d, s.dconcat + d, 2 * d, N, d, m.stream);
        gpu::rmsnorm_backward(s.dfinal, m.g.mtp_hnorm, s.dhalf, m.final_normed, m.w.mtp_hnorm, m.hnorm_rstd, N, d,
                              true, s.rms, m.stream);
        gpu::copy_columns(s.dhalf, d, s.dconcat, 2 * d, N, d, m.stream);
        gpu::rmsnorm_backward(s.dnext, m.g.mtp_enorm, s.dhalf, m.next_embed, m.w.mtp_enorm, m.enorm_rstd, N, d, false,
                              s.rms, m.stream);
        m.timer.mark("embedding");
        gpu::embedding_backward(m.g.embed, s.dnext, m.target_rows, d, m.stream);
    }
    m.timer.mark("rmsnorm + residual");
    gpu::rmsnorm_backward(dh, m.g.final_norm, s.dfinal, m.residual[L], m.w.final_norm, m.final_rstd, N, d, false,
                          s.rms, m.stream);
    for (int64_t l = L - 1; l >= 0; l--) {
        block_backward(m, (int)l, m.residual[l], dh, dh_prev, loss_scale, s);
        std::swap(dh, dh_prev);
    }
    m.timer.mark("embedding");
    gpu::embedding_backward(m.g.embed, dh, m.input_rows, d, m.stream);
    sync(m);
}

void gpu_model_zero_grads(GpuModel& m) {
    CUDA_CHECK(cudaMemsetAsync(m.grads, 0, m.table.total * sizeof(float), m.stream));
}

void gpu_model_reduce_grads(GpuModel& m) {
    sync(m);  // the Comm runs on a stream of its own
    shard_reduce_grads(m.shard, m.grads, *m.comm);
}

double gpu_model_grad_norm(GpuModel& m) {
    const std::vector<OptimizerRange>& ranges = m.shard.ranges;
    gpu::range_norms_squared(m.norm_slots, m.shard_ranges, m.grads, m.norm_partials, m.stream);
    m.range_norms.resize(ranges.size());
    CUDA_CHECK(cudaMemcpyAsync(m.range_norms.data(), m.norm_slots, ranges.size() * sizeof(double),
                               cudaMemcpyDeviceToHost, m.stream));
    sync(m);
    double sum = 0.0;  // as model_grad_norm
    for (size_t i = 0; i < ranges.size(); i++)
        if (ranges[i].owned) sum += m.range_norms[i];
    m.comm->all_reduce_sum(&sum, 1, Group::World);
    return sqrt(sum);
}

// The update writes the BF16 copy of this rank's ranges; after the gather, the buckets that other ranks updated
// too are cast again whole.
void gpu_model_adamw(GpuModel& m, AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier) {
    opt.step++;
    m.timer.mark("AdamW");
    gpu::adamw_update(m.shard_ranges, m.params, m.params_bf16, m.grads, m.adam_m, m.adam_v, oc, lr, opt.step,
                      grad_multiplier, m.stream);  // the frozen router bias needs no BF16 refresh
    sync(m);
    shard_gather(m.shard, m.params, *m.comm);
    if (m.params_bf16)
        for (const OptimizerBucket& b : m.shard.buckets)
            if (b.ranks > 1) gpu::cast_to_bf16(m.params_bf16 + b.first, m.params + b.first, b.count, m.stream);
    refresh_fp8_weights(m);
}

void gpu_model_update_router_bias(GpuModel& m, const std::vector<std::vector<int64_t>>& counts) {
    const Config& c = m.config;
    std::vector<float> bias(c.n_routed_experts);
    for (int l = 0; l < c.num_blocks(); l++) {
        if (!c.is_moe_layer(l)) continue;
        float* device_bias = m.w.blocks[l].router_bias;
        CUDA_CHECK(cudaMemcpyAsync(bias.data(), device_bias, bias.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                   m.stream));
        sync(m);
        router_bias_step(c, counts[l], bias.data());
        CUDA_CHECK(cudaMemcpyAsync(device_bias, bias.data(), bias.size() * sizeof(float), cudaMemcpyHostToDevice,
                                   m.stream));
        sync(m);
        std::fill(m.expert_counts[l].begin(), m.expert_counts[l].end(), 0);
    }
    // the bias is selection only: the BF16 copy never feeds a GEMM with it, so it needs no refresh
}

void gpu_model_logits_row(GpuModel& m, int64_t row, float* out) {
    const int64_t V = m.config.vocab_size, r0 = row / m.head_rows * m.head_rows;  // the row's chunk
    const float* logits =
        head_logits(m, main_head(m, false), r0, std::min(m.head_rows, tokens(m) - r0), !keeps_logits(m));
    sync(m);
    CUDA_CHECK(cudaMemcpy(out, logits + (row - r0) * V, V * sizeof(float), cudaMemcpyDeviceToHost));
}

std::vector<float> gpu_model_grads(const GpuModel& m) {
    std::vector<float> host(m.table.total);
    sync(m);
    CUDA_CHECK(cudaMemcpy(host.data(), m.grads, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
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
