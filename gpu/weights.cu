// The weights as the GEMMs read them (docs/design.md §6, §7.3): weight_of hands a GEMM its FP32 weight (FP32 mode)
// or its BF16 working copy (written by AdamW and at upload) and, in FP8 mode, the E4M3 copies of the blocks' linear
// layers, W and W^T with their 128 x 128 block scales, made from the working copy, which this file lays out and
// makes again after every change. And the weights, the master shard and the AdamW moments to and from the host's
// model (gpu_model_upload, gpu_model_download).
#include "gpu/model.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8.cuh"

// FP8 mode's weights: the linear layers inside the blocks, as the CPU's Precision::FP8 (not the router mlp.gate).
static bool fp8_linear(const ParamTensor& t) {
    const std::string& n = t.name;
    const bool in_block = n.find(".self_attn.") != std::string::npos || n.find(".mlp.") != std::string::npos;
    return in_block && n.find("_proj") != std::string::npos;
}

void carve_fp8_weights(Arena& ar, const ParamTable& table, const __nv_bfloat16* params_bf16,
                       std::map<int64_t, Fp8Tensor>& weights) {
    for (const ParamTensor& t : table.tensors) {
        if (!fp8_linear(t)) continue;
        Fp8Tensor f;
        f.w = params_bf16 ? params_bf16 + t.offset - table.fp32_total : nullptr;
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

void refresh_fp8_weights(GpuModel& m) {
    for (auto& entry : m.fp8_weights) {
        const Fp8Tensor& f = entry.second;
        gpu::fp8_quantize_blocks(f.q, f.qt, f.scales, f.scales_t, f.w, f.batch, f.rows, f.cols, m.stream);
    }
}

gpu::GemmWeight weight_of(const GpuModel& m, const float* w) {
    const int64_t offset = w - m.params;
    if (!m.params_bf16) return gpu::GemmWeight(w);  // FP32 mode
    if (offset < m.table.fp32_total) throw std::runtime_error("internal error: weight_of on a tensor read in FP32");
    const auto f = m.fp8_weights.find(offset);
    const gpu::Fp8Weight w8 = f == m.fp8_weights.end() ? gpu::Fp8Weight{}
                                                       : gpu::Fp8Weight{f->second.q, f->second.qt, f->second.scales,
                                                                        f->second.scales_t};
    return gpu::GemmWeight(nullptr, m.params_bf16 + offset - m.table.fp32_total, w8);
}

// FP8 GEMMs read their operands with leading dimensions that are multiples of 16 bytes: every width a linear layer
// inside the blocks sums over (or that its weight's transpose has as rows).
void check_fp8_widths(const Config& c) {
    const int64_t H = c.num_attention_heads, dqk = c.qk_head_dim(), dn = c.qk_nope_head_dim, dv = c.v_head_dim;
    const std::vector<std::pair<const char*, int64_t>> widths{
        {"hidden_size", c.hidden_size}, {"q_lora_rank", c.q_lora_rank}, {"kv_lora_rank", c.kv_lora_rank},
        {"kv_lora_rank + qk_rope_head_dim", (int64_t)c.kv_lora_rank + c.qk_rope_head_dim},
        {"num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)", H * dqk},
        {"num_attention_heads x (qk_nope_head_dim + v_head_dim)", H * (dn + dv)},
        {"num_attention_heads x v_head_dim", H * dv}, {"intermediate_size", c.intermediate_size},
        {"moe_intermediate_size", c.moe_intermediate_size},
        {"n_shared_experts x moe_intermediate_size", (int64_t)c.n_shared_experts * c.moe_intermediate_size}};
    for (const auto& [name, width] : widths)
        if (width % 16 != 0)
            throw std::runtime_error(
                std::string("--dtype fp8 needs the linear layers' widths to be multiples of 16: ") + name + " is " +
                std::to_string(width) + " (use --dtype bf16, or another config)");
}

// One moment to the device, FP32 or rounded to BF16 (the CPU's update reads it so rounded too), and back.
static void upload_moments(float* fp32, __nv_bfloat16* bf16, const std::vector<float>& host) {
    if (fp32) {
        CUDA_CHECK(cudaMemcpy(fp32, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
        return;
    }
    std::vector<__nv_bfloat16> rounded(host.size());
    for (size_t i = 0; i < host.size(); i++) rounded[i] = __float2bfloat16_rn(host[i]);
    CUDA_CHECK(cudaMemcpy(bf16, rounded.data(), rounded.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
}
static void download_moments(const GpuModel& m, const float* fp32, const __nv_bfloat16* bf16,
                             std::vector<float>& host) {
    host.resize(m.shard.moments);
    if (fp32) {
        CUDA_CHECK(cudaMemcpy(host.data(), fp32, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return;
    }
    std::vector<__nv_bfloat16> stored(host.size());
    CUDA_CHECK(cudaMemcpy(stored.data(), bf16, stored.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < host.size(); i++) host[i] = __bfloat162float(stored[i]);
}

void gpu_model_upload(GpuModel& m, const Model& host, const AdamWState& opt) {
    if (host.table.total != m.table.total || host.table.fp32_total != m.table.fp32_total ||
        (int64_t)opt.m.size() != m.shard.moments || (int64_t)opt.v.size() != m.shard.moments)
        throw std::runtime_error("internal error: the host's and the GPU's tables or optimizer shards differ");
    const int64_t f = m.table.fp32_total, n = m.params_bf16 ? f : m.table.total;  // the FP32 values
    CUDA_CHECK(cudaMemcpy(m.params, host.params.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    if (m.params_bf16) {
        const std::vector<float> master = shard_pack(m.shard, host.params.data());
        CUDA_CHECK(cudaMemcpy(m.master, master.data(), master.size() * sizeof(float), cudaMemcpyHostToDevice));
        std::vector<__nv_bfloat16> working(m.table.total - f);
        for (size_t i = 0; i < working.size(); i++) working[i] = __float2bfloat16_rn(host.params[f + i]);
        CUDA_CHECK(cudaMemcpy(m.params_bf16, working.data(), working.size() * 2, cudaMemcpyHostToDevice));
    }
    upload_moments(m.adam_m, m.adam_m16, opt.m);
    upload_moments(m.adam_v, m.adam_v16, opt.v);
    refresh_fp8_weights(m);
    for (int l = 0, bias = 0; l < m.config.num_blocks(); l++)
        if (m.config.is_moe_layer(l) && host.w.blocks[l].router_bias) {  // this stage's MoE blocks
            const float* values = host.w.blocks[l].router_bias;
            std::copy(values, values + m.config.n_routed_experts, m.bias_values + bias++ * m.config.n_routed_experts);
        }
    sync(m);
}

void gpu_model_download(const GpuModel& m, Model& host, AdamWState& opt) {
    sync(m);
    const int64_t f = m.table.fp32_total, n = m.params_bf16 ? f : m.table.total;
    CUDA_CHECK(cudaMemcpy(host.params.data(), m.params, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (m.params_bf16) {
        std::vector<__nv_bfloat16> working(m.table.total - f);
        CUDA_CHECK(cudaMemcpy(working.data(), m.params_bf16, working.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < working.size(); i++) host.params[f + i] = __bfloat162float(working[i]);
        std::vector<float> master(m.shard.moments);
        CUDA_CHECK(cudaMemcpy(master.data(), m.master, master.size() * sizeof(float), cudaMemcpyDeviceToHost));
        shard_unpack(m.shard, master, host.params.data());
    }
    download_moments(m, m.adam_m, m.adam_m16, opt.m);
    download_moments(m, m.adam_v, m.adam_v16, opt.v);
}

std::vector<float> gpu_model_grads(const GpuModel& m) {
    std::vector<float> host(m.table.total);
    sync(m);
    CUDA_CHECK(cudaMemcpy(host.data(), m.grads, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}
