// The dispatch plan of one MoE layer: where each (token, slot) assignment goes in the expert-contiguous order.
// Assignment a = t*k + j (token t, its j-th expert). Rows are ordered by expert, and by a within an expert, so
// the order is deterministic. The grouped expert GEMMs run over rows [offsets[e], offsets[e+1]).
// Expert parallelism (DESIGN §2) extends this plan with per-rank counts; the local permutation stays this one.
#pragma once
#include <cstdint>
#include <vector>

struct ExpertPlan {
    int num_experts = 0;
    std::vector<int64_t> counts;       // (E)   rows per expert
    std::vector<int64_t> offsets;      // (E+1) exclusive prefix sum of counts
    std::vector<int64_t> row_of_slot;  // (N*k) expert-contiguous row of assignment a
    std::vector<int64_t> slot_of_row;  // (N*k) inverse permutation
};

// expert_of_slot (N*k): the chosen expert of each assignment, each in [0, E).
ExpertPlan build_expert_plan(const int32_t* expert_of_slot, int64_t num_slots, int num_experts);

// Expert parallelism over an EP group of P ranks, each owning E/P consecutive experts (rank p: experts
// [p*E/P, (p+1)*E/P)). A rank's ExpertPlan already orders its rows by expert, hence by owner: the first
// send_rows[0] rows go to rank 0, and so on. Received rows arrive grouped by source rank, each source's rows
// ordered by expert; the expert GEMMs want them grouped by expert, so expert_row_of_recv maps one order to the other.
struct DispatchPlan {
    std::vector<int64_t> send_rows;           // (P) rows sent to each EP rank
    std::vector<int64_t> recv_rows;           // (P) rows received from each EP rank
    std::vector<int64_t> expert_counts;       // (E/P) rows of each local expert, from all sources
    std::vector<int64_t> expert_offsets;      // (E/P + 1)
    std::vector<int64_t> expert_row_of_recv;  // (R) row in expert-contiguous order of each received row
    int64_t received() const { return expert_offsets.back(); }
};

// local: this rank's plan over all E experts. recv_counts (P * E/P): rows from source rank s for local expert j at
// [s * E/P + j] (what every rank's local.counts for this rank's experts were, exchanged by an all-to-all).
DispatchPlan build_dispatch_plan(const ExpertPlan& local, const std::vector<int64_t>& recv_counts, int ep_size);
