// The MoE layer on the GPU, as model/moe.h, in the same phases: route, permute, dispatch, experts, return, combine,
// balance loss (docs/design.md §1.2, §2). At EP 1 dispatch and return move nothing: the experts read rows_in and
// write rows_out. The counts of the expert plan reach the host once per layer and forward (one copy and a stream
// synchronisation): the grouped GEMMs take each expert's rows from the host, and under EP so do NCCL's send sizes.
#pragma once
#include <cstdint>
#include <vector>

#include "gpu/ffn.h"
#include "model/expert_plan.h"
#include "model/params.h"

struct GpuModel;
struct Scratch;

struct GpuMoEActs {
    float *scores, *gate_weights;    // (N, E), (N, k)
    int32_t* chosen;                 // (N, k)
    int64_t *counts, *offsets;                       // the expert plan: (E), (E+1)
    int64_t *row_of_assignment, *assignment_of_row;  // (N*k) each
    float* rows_in;                  // (N*k, d) the token rows in plan order (FP32 mode)
    __nv_bfloat16* rows_in16;        // (N*k, d) the same in BF16 (BF16 mode)
    float* rows_out;                 // (N*k, d) the experts' outputs for them, in plan order
    GpuSwigluActs shared;            // (N, n_shared * I)
    DispatchPlan dispatch;             // what this rank sends, receives and computes
    // The local experts' rows, R = dispatch.received() of them in expert order, in an allocation of their own that
    // grows when a step needs more (capacity expert_rows). EP > 1 only: expert_in, expert_in16, expert_out, the
    // permutation from arrival order to expert order and back, and the local experts' offsets (one upload).
    float *expert_in, *expert_out;                          // (R, d) (expert_in: FP32 mode)
    __nv_bfloat16* expert_in16;                             // (R, d) BF16 mode
    float *expert_g, *expert_u, *expert_a;                  // (R, I) (expert_a: FP32 mode)
    __nv_bfloat16* expert_a16;                              // (R, I) BF16 mode
    int64_t *recv_to_expert, *expert_to_recv;               // (R) each
    int64_t* local_offsets;                                 // (E / EP + 1) the local experts' rows in R
    int64_t expert_rows = 0;
    void* expert_alloc = nullptr;
};

// x (N, d) the normalised input -> out (N, d). counts_out: this rank's tokens routed to each expert (E) are queued
// there (pinned host memory); balance_out: the B sequences' balance loss terms, or nullptr.
void moe_forward(GpuModel& m, const BlockWeights& w, GpuMoEActs& a, gpu::GemmInput x, float* out, int64_t* counts_out,
                 double* balance_out);
// Throws when an MoE block's expert counts do not add up to its assignments (non-finite router scores).
void check_expert_counts(const std::vector<int64_t>& counts, int64_t assignments);
// dout (N, d) -> dx (N, d) overwritten. balance_scale as model/moe.h's.
void moe_backward(GpuModel& m, const BlockWeights& w, BlockWeights& g, GpuMoEActs& a, gpu::GemmInput x,
                  const float* dout, float* dx, float balance_scale, const Scratch& s);
