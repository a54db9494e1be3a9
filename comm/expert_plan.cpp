// Counting sort of assignments by expert: counts, offsets, and the permutation with its inverse.
#include "expert_plan.h"

ExpertPlan build_expert_plan(const int32_t* expert_of_slot, int64_t num_slots, int num_experts) {
    ExpertPlan p;
    p.num_experts = num_experts;
    p.counts.assign(num_experts, 0);
    p.offsets.assign(num_experts + 1, 0);
    p.row_of_slot.resize(num_slots);
    p.slot_of_row.resize(num_slots);
    for (int64_t a = 0; a < num_slots; a++) p.counts[expert_of_slot[a]]++;
    for (int e = 0; e < num_experts; e++) p.offsets[e + 1] = p.offsets[e] + p.counts[e];
    std::vector<int64_t> next(p.offsets.begin(), p.offsets.end() - 1);
    for (int64_t a = 0; a < num_slots; a++) {
        int64_t row = next[expert_of_slot[a]]++;
        p.row_of_slot[a] = row;
        p.slot_of_row[row] = a;
    }
    return p;
}

DispatchPlan build_dispatch_plan(const ExpertPlan& local, const std::vector<int64_t>& recv_counts, int ep_size) {
    DispatchPlan d;
    const int per_rank = local.num_experts / ep_size;
    d.send_rows.assign(ep_size, 0);
    d.recv_rows.assign(ep_size, 0);
    d.expert_counts.assign(per_rank, 0);
    d.expert_offsets.assign(per_rank + 1, 0);
    for (int e = 0; e < local.num_experts; e++) d.send_rows[e / per_rank] += local.counts[e];
    for (int s = 0; s < ep_size; s++)
        for (int j = 0; j < per_rank; j++) {
            d.recv_rows[s] += recv_counts[s * per_rank + j];
            d.expert_counts[j] += recv_counts[s * per_rank + j];
        }
    for (int j = 0; j < per_rank; j++) d.expert_offsets[j + 1] = d.expert_offsets[j] + d.expert_counts[j];
    // walk the received rows in arrival order (source, then expert) and place each after its expert's earlier rows
    d.expert_row_of_recv.resize(d.expert_offsets[per_rank]);
    std::vector<int64_t> next(d.expert_offsets.begin(), d.expert_offsets.end() - 1);
    int64_t recv_row = 0;
    for (int s = 0; s < ep_size; s++)
        for (int j = 0; j < per_rank; j++)
            for (int64_t r = 0; r < recv_counts[s * per_rank + j]; r++) d.expert_row_of_recv[recv_row++] = next[j]++;
    return d;
}
