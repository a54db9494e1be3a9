// The optimizer on the GPU, model/optimizer.cpp's step (docs/design.md §8): the gradients reduced over the ranks
// that share each tensor, the norm of this rank's owned ranges summed over the world, AdamW on its ranges in one
// launch, the weights gathered, and the router biases' rule. And the optimizer's device memory: the shard's moments,
// in BF16 and FP8 modes its FP32 master weights (the distributed optimizer), the packed ranges and the biases' copy.
#include "gpu/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/adamw.cuh"
#include "kernels/elementwise.cuh"

// The router biases (the tensors outside the optimizer): an offset and the values of each, in bytes
static int64_t bias_table_bytes(const ParamTable& table) {
    int64_t bytes = 0;
    for (const ParamTensor& t : table.tensors)
        if (!t.trainable) bytes += 8 + 4 * t.numel;
    return bytes;
}

// The device tables of the shard's AdamW and norm: its packed ranges (6 R + 2 int64), each range's squared norm and
// the norm's chunk partials. Bounded alike on every rank: at most two ranges per tensor (a piece's and a tail's).
// Then the router biases' table.
int64_t optimizer_table_bytes(const ParamTable& table) {
    const int64_t ranges = 2 * (int64_t)table.tensors.size();
    const int64_t chunks = (table.total + GRAD_NORM_CHUNK - 1) / GRAD_NORM_CHUNK + ranges;
    return (6 * ranges + 2) * 8 + (ranges + chunks) * 8 + bias_table_bytes(table);
}

void allocate_optimizer(GpuModel& m, Moments moments) {
    const int64_t n = m.shard.moments;
    if (moments == Moments::BF16) {
        m.adam_m16 = static_cast<__nv_bfloat16*>(device_alloc(n * 2, "the AdamW moments"));
        m.adam_v16 = static_cast<__nv_bfloat16*>(device_alloc(n * 2, "the AdamW moments"));
    } else {
        m.adam_m = static_cast<float*>(device_alloc(n * 4, "the AdamW moments"));
        m.adam_v = static_cast<float*>(device_alloc(n * 4, "the AdamW moments"));
    }
    if (m.precision != Precision::FP32) m.master = static_cast<float*>(device_alloc(n * 4, "the master weights"));
    const std::vector<int64_t> packed_ranges = gpu::shard_ranges_pack(m.shard);
    const int64_t table_bytes = optimizer_table_bytes(m.table);
    m.optimizer_tables = device_alloc(table_bytes, "the optimizer's tables");
    int64_t* ranges = static_cast<int64_t*>(m.optimizer_tables);
    m.shard_ranges = gpu::shard_ranges_of(packed_ranges, ranges);
    if ((int64_t)packed_ranges.size() * 8 + (m.shard_ranges.ranges + m.shard_ranges.chunks) * 8 > table_bytes)
        throw std::runtime_error("internal error: the optimizer shard's ranges exceed their bound");
    CUDA_CHECK(cudaMemcpy(ranges, packed_ranges.data(), packed_ranges.size() * 8, cudaMemcpyHostToDevice));
    m.range_norms_device = reinterpret_cast<double*>(ranges + packed_ranges.size());
    m.norm_partials = m.range_norms_device + m.shard_ranges.ranges;
    m.bias_device = static_cast<char*>(m.optimizer_tables) + table_bytes - bias_table_bytes(m.table);
    m.biases = std::count_if(m.table.tensors.begin(), m.table.tensors.end(), [](const ParamTensor& t) {
        return !t.trainable;  // the router biases
    });
    m.bias_offsets = static_cast<int64_t*>(device_alloc(bias_table_bytes(m.table), "the router biases' copy",
                                                        /*pinned*/ true));
    m.bias_values = reinterpret_cast<float*>(m.bias_offsets + m.biases);
}

void gpu_model_reduce_grads(GpuModel& m) {
    comm_follows(m);
    shard_reduce_grads(m.shard, m.grads, *m.comm);
}

double gpu_model_grad_norm(GpuModel& m) {
    const std::vector<OptimizerRange>& ranges = m.shard.ranges;
    gpu::range_norms_squared(m.range_norms_device, m.shard_ranges, m.grads, m.norm_partials, m.stream);
    std::vector<double> norms(ranges.size());
    copy_sync(m, norms.data(), m.range_norms_device, (int64_t)ranges.size(), cudaMemcpyDeviceToHost);
    double sum = 0.0;  // as model_grad_norm
    for (size_t i = 0; i < ranges.size(); i++)
        if (ranges[i].owned) sum += norms[i];
    m.comm->all_reduce_sum(&sum, 1, Group::World);
    return sqrt(sum);
}

// The update writes the working copy of this rank's ranges; the gather brings every rank's pieces: FP32 weights in
// FP32 mode; in BF16 and FP8 modes the tensors read in FP32 in FP32 and the GEMM weights' BF16 working copy, 2 bytes
// a value (the master weights stay sharded).
void gpu_model_adamw(GpuModel& m, AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier) {
    if ((oc.moments == Moments::BF16) != (m.adam_m16 != nullptr))
        throw std::runtime_error("internal error: AdamW's moments are not allocated in the precision asked for");
    opt.step++;
    m.timer.mark("AdamW");
    const int64_t f = m.table.fp32_total;
    if (m.adam_m16)
        gpu::adamw_update(m.shard_ranges, m.params, m.params_bf16, m.master, f, m.grads, m.adam_m16, m.adam_v16, oc,
                          lr, opt.step, grad_multiplier, m.stream);
    else
        gpu::adamw_update(m.shard_ranges, m.params, m.params_bf16, m.master, f, m.grads, m.adam_m, m.adam_v, oc, lr,
                          opt.step, grad_multiplier, m.stream);
    comm_follows(m);
    if (!m.master) {
        shard_gather(m.shard, m.params, *m.comm);
        return;
    }
    for (const OptimizerBucket& b : m.shard.buckets) {
        if (b.ranks == 1) continue;
        if (b.first < f)
            m.comm->all_gather(m.params + b.first, b.piece, b.group);
        else
            m.comm->all_gather(reinterpret_cast<uint16_t*>(m.params_bf16 + b.first - f), b.piece, b.group);
    }
    refresh_fp8_weights(m);
}

// Each bias stepped on the host as the CPU's, then all go up in one copy and one kernel puts them in place. The
// copy has ended before the next step writes bias_values again: gpu_model_losses waits for the device first.
void gpu_model_update_router_bias(GpuModel& m, const std::vector<std::vector<int64_t>>& counts) {
    const Config& c = m.config;
    const int64_t E = c.n_routed_experts;
    for (int l = 0, bias = 0; l < c.num_blocks(); l++) {
        if (!c.is_moe_layer(l)) continue;
        if (m.w.blocks[l].router_bias) {  // this stage's block
            m.bias_offsets[bias] = m.w.blocks[l].router_bias - m.params;
            router_bias_step(c, counts[l], m.bias_values + bias++ * E);
        }
        std::fill(m.expert_counts[l].begin(), m.expert_counts[l].end(), 0);
    }
    if (m.biases == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(m.bias_device, m.bias_offsets, m.biases * (8 + 4 * E), cudaMemcpyHostToDevice,
                               m.stream));
    const int64_t* offsets = static_cast<const int64_t*>(m.bias_device);
    gpu::put_rows(m.params, offsets, reinterpret_cast<const float*>(offsets + m.biases), m.biases, E, m.stream);
}
