// The expert plan (docs/design.md §10): a stable counting sort of the rank's assignments a = t*k + j by expert, so
// plan order is by expert, then by assignment. Expert e's rows are [offsets[e], offsets[e+1]). The GPU builds the
// same plan (kernels/permute.cuh). The dispatch plan (§2): EP rank p owns experts [p E/P, (p+1) E/P), so plan order
// is owner order and the first send_rows[0] rows go to rank 0. Rows arrive by source rank, then by expert;
// expert_row_of_recv puts them in local expert order.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.h"

struct ExpertPlan {
    std::vector<int64_t> counts;             // (E)   rows per expert
    std::vector<int64_t> offsets;            // (E+1) exclusive prefix sum of counts
    std::vector<int64_t> row_of_assignment;  // (N*k) the row of assignment a in plan order
    std::vector<int64_t> assignment_of_row;  // (N*k) its inverse
};

struct DispatchPlan {
    std::vector<int64_t> send_rows;           // (P) rows sent to each EP rank
    std::vector<int64_t> recv_rows;           // (P) rows received from each EP rank
    std::vector<int64_t> expert_counts;       // (E/P) rows of each local expert, from all sources
    std::vector<int64_t> expert_offsets;      // (E/P + 1)
    std::vector<int64_t> expert_row_of_recv;  // (R) the local expert order's row of each received row
    int64_t received() const { return expert_offsets.back(); }
};

// expert_of_assignment (N*k): the chosen expert of each assignment, each in [0, E).
ExpertPlan build_expert_plan(const int32_t* expert_of_assignment, int64_t assignments, int num_experts);

// counts (E): this rank's rows per expert. recv_counts (P, E/P): [s, j] is source rank s's rows for local expert j.
DispatchPlan build_dispatch_plan(const std::vector<int64_t>& counts, const std::vector<int64_t>& recv_counts,
                                 int ep_size);
// Exchanges the counts (E) over the EP group (an all-to-all, none at EP 1), then build_dispatch_plan.
DispatchPlan plan_dispatch(Comm& comm, const std::vector<int64_t>& counts);
