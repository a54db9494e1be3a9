// The expert plan of one MoE layer: a stable counting sort of the rank's assignments by expert (docs/design.md §2).
// Assignment a = t*k + j is token t's j-th chosen expert. Rows are ordered by expert, and by assignment within an
// expert ("plan order"), so the order is deterministic; the experts' GEMMs run over rows [offsets[e], offsets[e+1]).
// The GPU builds the same plan on the device (kernels/permute.cuh, build_expert_plan).
// Under expert parallelism the dispatch plan adds what each EP rank sends and receives: rank p owns experts
// [p E/P, (p+1) E/P), so plan order is also owner order and the first send_rows[0] rows go to rank 0. Rows arrive
// grouped by source rank, each source's rows by expert; expert_row_of_recv puts them in local expert order.
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

// counts (E): this rank's rows per expert. recv_counts (P * E/P): rows from source rank s for local expert j at
// [s * E/P + j], what every rank's counts for this rank's experts were.
DispatchPlan build_dispatch_plan(const std::vector<int64_t>& counts, const std::vector<int64_t>& recv_counts,
                                 int ep_size);
// The dispatch plan of this rank's counts (E): the counts exchanged over the EP group (an all-to-all; at EP 1 there
// is nothing to exchange), then build_dispatch_plan.
DispatchPlan plan_dispatch(Comm& comm, const std::vector<int64_t>& counts);
