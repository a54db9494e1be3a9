// The whole model on one GPU (docs/design.md §1, §6): model/model.h's functions step for step, with the kernels of
// kernels/ and cuBLASLt GEMMs (kernels/matmul.cuh) in place of the CPU loops; read each file beside its model/ twin.
// The weights, the gradients and this rank's shard of each AdamW moment (model/optimizer.h) in one device buffer
// each. The precision, FP32, BF16 or FP8 (design.md §6), is chosen at run time. In FP32 mode the weights are FP32 and
// their own master copy. In BF16 and FP8 modes (the distributed optimizer, design.md §8) a rank keeps the tensors it
// reads in FP32 (embedding, norms, routers) in FP32, the GEMM weights as a BF16 working copy alone, and the FP32
// master weights of its optimizer shard beside the moments; the `16` buffers are the BF16 copies of GEMM inputs.
// Activations are carved from one allocation (gpu/memory.cu); with recompute the blocks of a kind share one set and
// the backward runs each block's forward again. Every kernel and GEMM is deterministic, so the same bits come back.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "comm/comm.h"
#include "gpu/ffn.h"
#include "gpu/mla.h"
#include "gpu/moe.h"
#include "kernels/matmul.cuh"
#include "kernels/shard_ranges.h"
#include "kernels/token_rows.h"
#include "model/arena.h"
#include "model/model.h"
#include "model/optimizer.h"

// Times named regions of the step on the stream, for make bench's table: mark(name) starts a region that lasts until
// the next mark. Off unless enabled.
struct RegionTimer {
    bool enabled = false;
    const char* label = nullptr;  // while set, every region is named so (the backward's recomputed forwards)
    cudaStream_t stream = nullptr;
    std::vector<std::pair<std::string, cudaEvent_t>> marks;
    void mark(const char* name);
    // Closes the last region, waits for the stream and adds each region's milliseconds to totals[name].
    void finish(std::map<std::string, double>& totals);
    void release();  // destroys the events
};

// One block's activations, as model/model.h's BlockActs, with the BF16 copies of the GEMM inputs.
struct GpuBlockActs {
    float *attn_normed, *attn_rstd;       // (N, d), (N): written by whoever wrote the block's input
    GpuMLAActs mla;
    float *attn_out, *h_mid;              // (N, d) x2
    float *ffn_normed, *ffn_rstd;         // (N, d), (N)
    GpuSwigluActs dense;                  // (N, intermediate_size): dense blocks
    GpuMoEActs moe;                       // MoE blocks
    float* ffn_out;                       // (N, d)
    __nv_bfloat16 *attn_normed16, *ffn_normed16;
};

// FP8 mode: the E4M3 copies of one weight of the blocks' linear layers (a matrix rows x cols, or a stack of `batch`
// experts' matrices): q and q^T with their 128 x 128 scales (kernels/fp8.cuh, fp8_quantize_blocks).
struct Fp8Tensor {
    const __nv_bfloat16* w = nullptr;  // the weight's BF16 working copy (m.params_bf16)
    int64_t batch = 1, rows = 0, cols = 0;
    __nv_fp8_storage_t *q = nullptr, *qt = nullptr;
    float *scales = nullptr, *scales_t = nullptr;
};

// The batch's way in and the losses' way out, in pinned host memory so that the copies queue without a wait:
// tokens (N each), token rows (3N + 1 each, kernels/token_rows.h), the heads' per-token losses (N each).
struct BatchStaging {
    int32_t *inputs, *targets, *mtp_targets, *input_rows, *target_rows;
    float *losses, *mtp_losses;
};
// One forward's pinned host memory: its BatchStaging, and each MoE block's balance loss per sequence (num_blocks,
// max_B) and expert counts (num_blocks, E), queued out. A slot is read, and free again, at gpu_model_losses.
struct HostSlot {
    void* memory = nullptr;
    BatchStaging io;
    double* balance = nullptr;
    int64_t* counts = nullptr;
    int B = 0;              // the forward's batch
    bool training = false;  // its counts go to the step's loads
};

// One micro-batch's activations, as model/model.h's ModelActs with the slot's fields, and its tokens on the device.
// 1F1B keeps several micro-batches in flight: the slot in use is the model's acts, the others parked; with recompute
// the slots share the activation sets (blocks, set_layer, set_slot and their allocation), which stay in acts.
struct GpuActs {
    int B = 0;                     // the batch of the slot's last forward
    void* arena = nullptr;         // everything below but the sets
    void* sets_arena = nullptr;    // the activation sets
    std::vector<float*> residual;  // L+1 of (N, d); a pipeline stage carves its blocks' (the last stage's output too)
    std::vector<GpuBlockActs> blocks;
    std::vector<int> set_layer, set_slot;  // set s holds the forward of block set_layer[s] of slot set_slot[s]
    float *final_normed, *final_rstd, *logits, *losses;                  // (N, d), (N), (N or head_rows, V), (N)
    float *next_embed, *enorm_out, *enorm_rstd, *hnorm_out, *hnorm_rstd; // MTP
    float *mtp_concat, *mtp_in, *mtp_out, *mtp_normed, *mtp_rstd, *mtp_logits;
    __nv_bfloat16 *final_normed16, *mtp_concat16, *mtp_normed16;         // BF16: the heads' and MTP's GEMM inputs
    int32_t *inputs, *targets, *mtp_targets;     // (N) each
    gpu::TokenRows input_rows, target_rows;      // inputs and targets grouped by token: the embedding's backward
};

struct GpuModel {
    Config config;
    Comm* comm = nullptr;  // NCCL: device buffers (host buffers are staged)
    ParamTable table;
    OptimizerShard shard;  // this rank's part of the optimizer: adam_m, adam_v hold it
    Precision precision = Precision::FP32;
    cudaStream_t stream = nullptr;
    gpu::Matmul matmul;
    // The weights, table layout: all of them in FP32 mode; in BF16 and FP8 modes values [0, table.fp32_total), the
    // tensors read in FP32. m.w's pointers past them name the GEMM weights, which live in params_bf16 alone.
    float* params = nullptr;
    float* grads = nullptr;                      // table layout
    float *adam_m = nullptr, *adam_v = nullptr;  // the shard's moments (OptimizerRange::moments), FP32
    __nv_bfloat16 *adam_m16 = nullptr, *adam_v16 = nullptr;  // or, with Moments::BF16, in BF16
    __nv_bfloat16* params_bf16 = nullptr;  // BF16 and FP8: the GEMM weights, table values [fp32_total, total)
    float* master = nullptr;               // BF16 and FP8: the shard's FP32 master weights, laid out as the moments
    void* fp8_alloc = nullptr;                   // FP8: the Fp8Tensors' copies
    std::map<int64_t, Fp8Tensor> fp8_weights;    // by the weight's offset in the parameter buffer
    ModelWeights w, g;                           // device pointers into params and grads
    std::set<const float*> grads_written;        // the gradient tensors written since gpu_model_zero_grads
    int max_B = 0, T = 0;                        // allocated batch
    int first_layer = 0, end_layer = 0;          // this pipeline stage's main blocks: [first_layer, end_layer)
    GpuActs acts;                                // the activations of activation slot `slot` (gpu_model_use_slot)
    int slot = 0;
    std::vector<GpuActs> parked;                 // the other slots, allocated on first use (parked[slot] is empty)
    std::vector<int> block_set;                  // each block's activation set (block_sets), -1: another stage's
    ActivationLayout layout;  // recompute, the heads' chunks
    int64_t head_rows = 0;    // the rows of one chunk of the output heads (head_chunk_rows)
    float *rope_cos = nullptr, *rope_sin = nullptr;  // (T, dr/2)
    void* scratch = nullptr;         // the backward's buffers, shared by the blocks (Scratch)
    void* expert_scratch = nullptr;  // the routed experts' backward buffers, grown with the largest layer
    int64_t expert_scratch_rows = 0;
    std::vector<std::vector<int64_t>> expert_counts;  // host, as Model::expert_counts
    // The router biases (the tensors outside the optimizer), on the host as on the device: (biases) offsets in the
    // parameters, then (biases, E) values, in pinned memory; the device's copy of both in the optimizer tables.
    int64_t biases = 0;
    int64_t* bias_offsets = nullptr;
    float* bias_values = nullptr;
    void* bias_device = nullptr;
    gpu::ShardRanges shard_ranges;     // the shard's ranges on the device (kernels/shard_ranges.h)
    void* optimizer_tables = nullptr;  // the allocation of shard_ranges' table, the two below and bias_device
    double *range_norms_device = nullptr, *norm_partials = nullptr;  // each range's squared norm; chunk partials
    std::vector<HostSlot> host_slots;  // one per forward queued since gpu_model_losses (host_slot grows them)
    int queued = 0;                    // forwards with targets whose losses are not read yet
    double* balance_host = nullptr;    // the running forward's slot's balance and counts
    int64_t* counts_pinned = nullptr;
    cudaEvent_t counts_ready = nullptr;  // recorded after a block's copy: what the dispatch plan waits for (EP > 1)
    RegionTimer timer;
};

// What init allocates, in bytes (the plan printed at start, and the out-of-memory check).
struct GpuMemoryPlan {
    int64_t params = 0, grads = 0, activations = 0, expert_rows = 0, scratch = 0;
    int64_t optimizer = 0;    // the moments, and in BF16 and FP8 modes the master weights
    int64_t fp8_weights = 0;  // FP8: the weights' E4M3 copies, counted in params too
    int64_t total() const { return params + grads + optimizer + activations + expert_rows + scratch; }
};
// A stage of stage_size ranks, ep_size of them in an expert-parallel group (the optimizer's shard:
// model/optimizer.h), holding main blocks [first_layer, end_layer) (-1: to the last), with `slots` activation slots.
GpuMemoryPlan gpu_memory_plan(const Config& c, int ep_size, int stage_size, Precision p, int B, int T,
                              const ActivationLayout& layout = {}, Moments moments = Moments::FP32,
                              int first_layer = 0, int end_layer = -1, int slots = 1);

// Allocates everything for batches of up to B sequences of T tokens on the current device; throws
// std::runtime_error (with the plan and the free memory) when it does not fit, or for a config the kernels do not
// support.
// A pipeline stage holds main blocks [first_layer, end_layer) (-1: to the last), as model_init's.
void gpu_model_init(GpuModel& m, const Config& c, Comm& comm, Precision p, int B, int T,
                    const ActivationLayout& layout = {}, Moments moments = Moments::FP32, int first_layer = 0,
                    int end_layer = -1);
void gpu_model_free(GpuModel& m);
// Host weights and this rank's moments (opt: adamw_state(m.shard)) -> device. The tables must match.
void gpu_model_upload(GpuModel& m, const Model& host, const AdamWState& opt);
// Device weights and this rank's moments -> host. In BF16 and FP8 modes the GEMM weights outside this rank's shard
// come from the working copy, rounded to BF16; the shard's, which a checkpoint writes, are the exact master weights.
void gpu_model_download(const GpuModel& m, Model& host, AdamWState& opt);
// As model_forward: inputs, targets host arrays of B*T tokens (B <= the allocated B). With targets the forward is
// queued, its losses and expert counts read by gpu_model_losses: the micro-steps of a step run without a wait.
// Without targets only the logits, after a wait (with recompute and a chunked head not even those:
// gpu_model_logits_row computes a row's chunk).
// A pipeline stage's, as model_stage_forward: from `in` (device memory; the first stage reads the tokens) to `out`
// (nullptr on the last stage); the queued losses are the stage's own.
void gpu_model_forward(GpuModel& m, const int32_t* inputs, const int32_t* targets, int B, bool training,
                       const float* in = nullptr, float* out = nullptr);
// After one wait, the losses of every forward queued since the last call, in order; the training ones' expert
// counts checked and added to expert_counts.
std::vector<LossParts> gpu_model_losses(GpuModel& m);
// The rest as the model_ functions of the same names (model/model.h); a stage's backward as model_stage_backward.
void gpu_model_backward(GpuModel& m, float loss_scale, const float* dout = nullptr, float* din = nullptr);
// Makes activation slot `slot` the one in use, allocating it on first use (model_use_slot).
void gpu_model_use_slot(GpuModel& m, int slot);
// Zeroes no memory: the first product into each gradient tensor after it overwrites (grad_accumulates), and the
// backward's end zeroes a trainable tensor nothing wrote.
void gpu_model_zero_grads(GpuModel& m);
void gpu_model_reduce_grads(GpuModel& m);
double gpu_model_grad_norm(GpuModel& m);
void gpu_model_adamw(GpuModel& m, AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier);
void gpu_model_update_router_bias(GpuModel& m, const std::vector<std::vector<int64_t>>& counts);
void gpu_model_logits_row(GpuModel& m, int64_t row, float* out);
// Gradients to a host array laid out by the table (the tests compare them with the CPU model's).
std::vector<float> gpu_model_grads(const GpuModel& m);
// The dense BF16 peak of the device in FLOP/s from a table of known GPUs, or 0.
double gpu_peak_flops(const cudaDeviceProp& prop);

// ---- shared by gpu/*.cu ----------------------------------------------------------------------------------------

// The backward's buffers and the forward's transient ones, carved from m.scratch on every use (gpu/memory.cu).
// Names as the CPU's locals in model/*.cpp.
struct Scratch {
    float *dlogits, *dfinal, *dh, *dh_prev;                // (N, V) (FP32 mode), (N, d) x3
    __nv_bfloat16* dlogits16;                              // (N, V) BF16: the head GEMMs' output gradient
    float *dmtp, *dmtp_out, *dconcat, *dhalf, *dnext;      // MTP: (N, d), (N, d), (N, 2d), (N, d), (N, d)
    float *dnormed, *dh_mid;                               // (N, d) per block
    float *d_o, *dq_heads, *dk_heads, *dkv, *dq, *dkv_a;   // MLA
    __nv_bfloat16* d_o16;                                  // (N, H*dv) for the tensor-core attention
    float *dc_kv_normed, *dc_kv, *dq_a_normed, *dq_a, *attn_d;
    float *ffn_da, *ffn_dg, *ffn_du;                       // (N, the widest FFN)
    float *drows_out, *drows_in, *dgate_weights;           // (N*k, d) x2, (N, k)
    float* drouter_logits;                                 // (N, E), also router_forward's scratch
    int* seq_counts;                                       // (B, E) \  the balance loss's,
    double *token_totals, *seq_balance;                    // (N), (B) / forward and backward
    float* rms;                                            // RMSNorm dw partial sums
};
// The routed experts' backward buffers for R rows, shared by the layers (EP > 1: dexpert_out, dexpert_in).
struct ExpertScratch {
    float *dexpert_out, *dexpert_in;  // (R, d)
    float *da, *dg, *du;              // (R, I)
};
Scratch scratch_of(const GpuModel& m);
ExpertScratch expert_scratch_of(const GpuModel& m);
// Device memory of `bytes` (nullptr for none), or pinned host memory (cudaMallocHost), which copies queue from and to
// without a wait; out of memory throws a line naming `what` and what to change.
void* device_alloc(int64_t bytes, const char* what, bool pinned = false);
// Throws a line saying what the device lacks to run c in precision p.
void check_device(const Config& c, Precision p);
// gpu/optimizer.cu: the bytes of the optimizer's tables (its ranges, their norms, the router biases' copy), and the
// optimizer's memory allocated for m's shard.
int64_t optimizer_table_bytes(const ParamTable& table);
void allocate_optimizer(GpuModel& m, Moments moments);
// Slot k of the forwards' pinned host memory, allocated when first asked for.
HostSlot& host_slot(GpuModel& m, int k);
// Grows layer a's expert buffers (and the shared backward ones) to hold R rows.
void ensure_expert_rows(GpuModel& m, GpuMoEActs& a, int64_t R);
// Weight w (a field of m.w) with the copies its GEMMs read in m's precision.
gpu::GemmWeight weight_of(const GpuModel& m, const float* w);
// Whether a product into the gradient tensor grad (a pointer into m.grads) adds to it: false for the first since
// gpu_model_zero_grads, which overwrites it.
bool grad_accumulates(GpuModel& m, const float* grad);
// FP8 mode: the E4M3 copies made again from the BF16 working copy (after every change to it).
void refresh_fp8_weights(GpuModel& m);
// The E4M3 copies of every FP8 weight, by the weights' offsets, carved (params_bf16: the device's working copy, or
// nullptr to count); the check that every width the FP8 layers sum over is a multiple of 16 (throws a line saying
// which).
void carve_fp8_weights(Arena& ar, const ParamTable& table, const __nv_bfloat16* params_bf16,
                       std::map<int64_t, Fp8Tensor>& weights);
void check_fp8_widths(const Config& c);
inline int64_t tokens(const GpuModel& m) { return (int64_t)m.acts.B * m.T; }
inline void sync(const GpuModel& m) { CUDA_CHECK(cudaStreamSynchronize(m.stream)); }
// Before a collective on the model's device buffers: the Comm's stream follows the model's on the device (NCCL), or
// the host waits for it (a Comm that reads the memory itself, as the tests' MPI Comm on the emulator)
inline void comm_follows(const GpuModel& m) {
    if (m.comm->world > 1 && !m.comm->follow_stream(m.stream)) sync(m);
}
// n values from src to dst on m.stream (kind: cudaMemcpyHostToDevice or DeviceToHost), waited for
template <typename T>
void copy_sync(const GpuModel& m, T* dst, const T* src, int64_t n, cudaMemcpyKind kind) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), kind, m.stream));
    sync(m);
}
