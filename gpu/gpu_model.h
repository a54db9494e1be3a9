// The whole model on one GPU (DESIGN §1, §3): the same forward and backward as model/model.cpp, made of the
// hand-written kernels of kernels/ and cuBLASLt GEMMs (kernels/matmul.cuh). One device buffer each for the FP32 master
// weights and the gradients, laid out by the same ParamTable as the CPU model, and for this rank's shard of each AdamW
// moment (model/optimizer.h); with Precision::BF16 the GEMMs read a BF16 working copy of the weights (refreshed after
// every update) and BF16 casts of their activation operands, and accumulate in FP32: each GEMM input is cast once, in
// the forward, into a BF16 copy kept beside it (the `16` buffers below; the RMSNorms write theirs in the same pass as
// the FP32 rows) that every GEMM reading it uses, forward and backward (the SwiGLU outputs and the routed experts'
// input rows, read by nothing else, are BF16 only: the rows are gathered from the BF16 copy of x and, under expert
// parallelism, exchanged in BF16); the output gradients are cast by the GEMM calls, except the logits', which the
// cross-entropy writes in BF16 only. The attention, on the tensor cores, reads q, k, v and dO stored in BF16 and
// accumulates in FP32.
// Everything else (norms, router, softmax, the optimizer) is FP32.
// Precision::FP8 is BF16 mode with the linear layers inside the blocks (attention projections, dense, shared and
// routed experts' matrices) in DeepSeek-V3's FP8 recipe, as the CPU model's LinearPrecision::FP8 (model/fp8.h): their
// weights have E4M3 copies (Fp8Tensor, refreshed with the BF16 copy), and the GEMM calls quantize the activations and
// gradients themselves (kernels/matmul.cuh), from the FP32 rows where they exist, else from the BF16 copies. Their
// widths must be multiples of 16 (FP8 leading dimensions), which gpu_model_init checks.
// Activations for B x T tokens are carved from one allocation at init; the routed experts' rows (whose number
// depends on the routing under expert parallelism) have per-layer buffers that grow when a step needs more. With
// recompute (ActivationLayout) the blocks of a kind share one set of both, and the residual stream alone is kept per
// block: the backward runs each block's forward again from its input before its backward. Every kernel and GEMM is
// deterministic, so the recomputed activations, and the gradients, are the same bits.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "comm/comm.h"
#include "comm/expert_plan.h"
#include "kernels/matmul.cuh"
#include "kernels/shard_ranges.h"
#include "kernels/token_rows.h"
#include "model/model.h"
#include "model/optimizer.h"

// Times named regions of the step on the stream, for the benchmark's per-kernel table: mark(name) starts a region
// that lasts until the next mark (or finish). Off by default: then mark() does nothing.
struct RegionTimer {
    bool enabled = false;
    const char* label = nullptr;  // while set, every region is named so (the backward's recomputed forwards)
    cudaStream_t stream = nullptr;
    std::vector<std::pair<std::string, cudaEvent_t>> marks;
    std::vector<cudaEvent_t> pool;
    void mark(const char* name);
    // Closes the last region, waits for the stream and adds each region's milliseconds to totals[name].
    void finish(std::map<std::string, double>& totals);
    void release();  // destroys the events
};

// Activations of one block (pointers into the arena; unused ones nullptr). Shapes as model/mla.h, model/moe.h.
struct GpuBlockActs {
    float *attn_normed, *attn_rstd;                        // (N, d), (N)
    float *q_a, *q_a_rstd, *q_a_normed, *q;                // (N, q_lora), (N), (N, q_lora), (N, H*dqk)
    float *kv_a, *c_kv, *c_kv_rstd, *c_kv_normed, *kv;     // (N, kv_lora+dr), (N, kv_lora), (N), .., (N, H*(dn+dv))
    float *q_heads, *k_heads, *o, *lse;                    // (N, H, dqk) x2 (FP32 attention), (N, H*dv), (B, H, T)
    __nv_bfloat16 *q_heads16, *k_heads16, *v_heads16;      // (N, H, dqk) x2, (N, H, dv): BF16 attention's q, k, v
    float *attn_out, *h_mid, *ffn_normed, *ffn_rstd;       // (N, d) x3, (N)
    float *ffn_g, *ffn_u, *ffn_a;                          // (N, width): the dense FFN or the shared experts (ffn_a:
                                                           // FP32 mode; BF16 writes only ffn_a16)
    float* ffn_out;                                        // (N, d)
    // BF16: the copies of the GEMM inputs attn_normed, q_a_normed, c_kv_normed, o, ffn_normed, ffn_a
    __nv_bfloat16 *attn_normed16, *q_a_normed16, *c_kv_normed16, *o16, *ffn_normed16, *ffn_a16;
    // MoE
    float *scores, *gate_weights;                          // (N, E), (N, k)
    int32_t* chosen;                                       // (N, k)
    int64_t *counts, *offsets, *row_of_slot, *slot_of_row; // (E), (E+1), (N*k), (N*k)
    float *rows_sent, *rows_back;                          // (N*k, d) in plan order (rows_sent: FP32 mode)
    __nv_bfloat16* rows_sent16;                            // (N*k, d) BF16 mode: the experts' input rows
    // routed-expert rows in expert-contiguous order, R = dispatch.received() of them (capacity expert_rows); with EP 1
    // the GEMMs read rows_sent and write rows_back in place of expert_in, expert_out and the permutations
    float *expert_in = nullptr, *expert_out = nullptr;     // (R, d) (expert_in: FP32 mode)
    float *expert_g = nullptr, *expert_u = nullptr, *expert_a = nullptr;  // (R, I) (expert_a: FP32 mode only)
    int64_t *recv_to_expert = nullptr, *expert_to_recv = nullptr;          // (R) the EP permutation and its inverse
    __nv_bfloat16 *expert_in16 = nullptr, *expert_a16 = nullptr;          // BF16: (R, d) (EP > 1), (R, I)
    int64_t expert_rows = 0;                               // capacity
    void* expert_alloc = nullptr;                          // the allocation the pointers above live in
    std::vector<int64_t> counts_host;                      // (E) this rank's rows per expert, last forward
    DispatchPlan dispatch;                                 // host plan: what this rank sends, receives, computes
};

// FP8 mode: the E4M3 copies of one weight tensor of the blocks' linear layers (a matrix rows x cols, or a stack of
// `batch` experts' matrices): q and q^T with their 128 x 128 scales, as kernels/fp8.cuh's fp8_quantize_blocks writes
// them, refreshed from the FP32 weights with the BF16 copy.
struct Fp8Tensor {
    const float* w = nullptr;  // the FP32 weight (m.params)
    int64_t batch = 1, rows = 0, cols = 0;
    __nv_fp8_storage_t *q = nullptr, *qt = nullptr;
    float *scales = nullptr, *scales_t = nullptr;
};

struct GpuModel {
    Config config;
    Comm* comm = nullptr;            // NCCL: device buffers (host buffers are staged)
    ParamTable table;
    OptimizerShard shard;            // this rank's part of the optimizer (model/optimizer.h): adam_m, adam_v hold it
    gpu::Precision precision = gpu::Precision::FP32;
    cudaStream_t stream = nullptr;
    gpu::Matmul matmul;
    float *params = nullptr, *grads = nullptr;        // table layout
    float *adam_m = nullptr, *adam_v = nullptr;       // the shard's moments (OptimizerRange::moments)
    __nv_bfloat16* params_bf16 = nullptr;  // BF16 and FP8 modes: the working copy the GEMMs read
    void* fp8_alloc = nullptr;             // FP8 mode: the Fp8Tensors' copies
    std::map<int64_t, Fp8Tensor> fp8_weights;  // by the weight's offset in the parameter buffer
    ModelWeights w, g;                     // device pointers into params and grads
    int max_B = 0, T = 0, B = 0;           // allocated batch; the last forward's B
    // activations
    void* arena = nullptr;
    std::vector<float*> residual;          // L+1 of (N, d)
    // The blocks' activation sets: one per block, or with recompute one per kind of block (dense, MoE), shared by
    // the blocks of that kind; block_slot[l] is block l's set, slot_layer[s] the block whose forward set s holds
    // (-1: none yet). The backward of a block whose set another block has overwritten runs its forward again first.
    std::vector<GpuBlockActs> blocks;
    std::vector<int> block_slot, slot_layer;
    ActivationLayout layout;  // model/model.h: recompute, the heads' chunks
    int64_t head_rows = 0;    // the rows of one chunk of the output heads (head_chunk_rows)
    float *final_normed, *final_rstd, *logits, *losses;                  // (N, d), (N), (N or head_rows, V), (N)
    float *next_embed, *enorm_out, *enorm_rstd, *hnorm_out, *hnorm_rstd; // MTP
    float *mtp_concat, *mtp_in, *mtp_out, *mtp_normed, *mtp_rstd, *mtp_logits;
    __nv_bfloat16 *final_normed16, *mtp_concat16, *mtp_normed16;         // BF16: the head's and MTP's GEMM inputs
    float *rope_cos, *rope_sin;            // (T, dr/2)
    int32_t *inputs, *targets, *mtp_targets;  // (N) each, device
    gpu::TokenRows input_rows, target_rows;   // inputs and targets grouped by token: the embedding's backward
    // backward scratch, shared by the blocks (one block runs at a time)
    void* scratch = nullptr;
    void* expert_scratch = nullptr;  // the routed experts' backward buffers, grown with the largest layer
    int64_t expert_scratch_rows = 0;
    std::vector<std::vector<int64_t>> expert_counts;  // host, as Model::expert_counts
    gpu::ShardRanges shard_ranges;                    // the shard's ranges on the device (kernels/shard_ranges.h)
    void* optimizer_tables = nullptr;                 // device: shard_ranges' table, norm_slots, norm_partials
    double *norm_slots = nullptr, *norm_partials = nullptr;  // each range's squared norm; the norm's chunk partials
    std::vector<double> range_norms;                  // host copy of norm_slots
    RegionTimer timer;
};

// What init will allocate, in bytes (for the plan printed at start and the out-of-memory check).
struct GpuMemoryPlan {
    int64_t params = 0, grads = 0, optimizer = 0, activations = 0, expert_rows = 0, scratch = 0;
    int64_t fp8_weights = 0;  // FP8 mode: the weights' E4M3 copies, counted in params too
    int64_t total() const { return params + grads + optimizer + activations + expert_rows + scratch; }
};
// world ranks, ep_size of them in an expert-parallel group (the optimizer's shard: model/optimizer.h).
GpuMemoryPlan gpu_memory_plan(const Config& c, int ep_size, int world, gpu::Precision p, int B, int T,
                              const ActivationLayout& layout = {});

// Allocates everything for batches of up to B sequences of T tokens on the current device; throws
// std::runtime_error (with the plan and the free memory) when it does not fit, or when the config is one the
// kernels do not support.
void gpu_model_init(GpuModel& m, const Config& c, Comm& comm, gpu::Precision p, int B, int T,
                    const ActivationLayout& layout = {});
void gpu_model_free(GpuModel& m);
// Host model (weights) and this rank's optimizer moments (opt: adamw_state(m.shard)) -> device. Tables must match
// (same config and EP size).
void gpu_model_upload(GpuModel& m, const Model& host, const AdamWState& opt);
// Device weights and this rank's moments -> host.
void gpu_model_download(const GpuModel& m, Model& host, AdamWState& opt);
// As model_forward: inputs, targets host arrays of B*T tokens (B <= the allocated B, T the allocated T). Without
// targets only the logits are computed (no losses: the balance loss too stays 0), and under --recompute with a
// chunked head not even those: gpu_model_logits_row computes a row's chunk when asked.
LossParts gpu_model_forward(GpuModel& m, const int32_t* inputs, const int32_t* targets, int B, bool training);
void gpu_model_backward(GpuModel& m, float loss_scale);
void gpu_model_zero_grads(GpuModel& m);
void gpu_model_reduce_grads(GpuModel& m);
double gpu_model_grad_norm(GpuModel& m);
void gpu_model_adamw(GpuModel& m, AdamWState& opt, const OptimizerConfig& oc, float lr, float grad_multiplier);
void gpu_model_update_router_bias(GpuModel& m, const std::vector<std::vector<int64_t>>& counts);
void gpu_model_logits_row(GpuModel& m, int64_t row, float* out);
// Gradients to a host array laid out by the table (the tests compare them with the CPU model's). After
// gpu_model_reduce_grads only the values of this rank's optimizer shard are sums over the ranks.
std::vector<float> gpu_model_grads(const GpuModel& m);

// The dense BF16 peak of the device in FLOP/s from a table of known GPUs (A100, H100 SXM/PCIe/NVL, H200 SXM/NVL,
// B200, GB200), or 0.
double gpu_peak_flops(const cudaDeviceProp& prop);
