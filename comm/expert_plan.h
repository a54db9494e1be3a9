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
