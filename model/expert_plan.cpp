// Counting sort of assignments by expert, and the dispatch plan over the EP ranks.
#include "model/expert_plan.h"

ExpertPlan build_expert_plan(const int32_t* expert_of_assignment, int64_t assignments, int num_experts) {
    ExpertPlan p;
    p.counts.assign(num_experts, 0);
    p.offsets.assign(num_experts + 1, 0);
    p.row_of_assignment.resize(assignments);
    p.assignment_of_row.resize(assignments);
    for (int64_t a = 0; a < assignments; a++) p.counts[expert_of_assignment[a]]++;
    for (int e = 0; e < num_experts; e++) p.offsets[e + 1] = p.offsets[e] + p.counts[e];
    std::vector<int64_t> next(p.offsets.begin(), p.offsets.end() - 1);
    for (int64_t a = 0; a < assignments; a++) {
        const int64_t row = next[expert_of_assignment[a]]++;
        p.row_of_assignment[a] = row;
        p.assignment_of_row[row] = a;
    }
    return p;
}

DispatchPlan build_dispatch_plan(const std::vector<int64_t>& counts, const std::vector<int64_t>& recv_counts,
                                 int ep_size) {
    DispatchPlan d;
    const int num_experts = (int)counts.size(), per_rank = num_experts / ep_size;
    d.send_rows.assign(ep_size, 0);
    d.recv_rows.assign(ep_size, 0);
    d.expert_counts.assign(per_rank, 0);
    d.expert_offsets.assign(per_rank + 1, 0);
    for (int e = 0; e < num_experts; e++) d.send_rows[e / per_rank] += counts[e];
    for (int s = 0; s < ep_size; s++)
        for (int j = 0; j < per_rank; j++) {
            d.recv_rows[s] += recv_counts[s * per_rank + j];
            d.expert_counts[j] += recv_counts[s * per_rank + j];
        }
    for (int j = 0; j < per_rank; j++) d.expert_offsets[j + 1] = d.expert_offsets[j] + d.expert_counts[j];
    // Each received row, in arrival order, goes after its local expert's earlier rows.
    d.expert_row_of_recv.resize(d.expert_offsets[per_rank]);
    std::vector<int64_t> next(d.expert_offsets.begin(), d.expert_offsets.end() - 1);
    int64_t recv_row = 0;
    for (int s = 0; s < ep_size; s++)
        for (int j = 0; j < per_rank; j++)
            for (int64_t r = 0; r < recv_counts[s * per_rank + j]; r++) d.expert_row_of_recv[recv_row++] = next[j]++;
    return d;
}

DispatchPlan plan_dispatch(Comm& comm, const std::vector<int64_t>& counts) {
    std::vector<int64_t> recv_counts(counts);
    if (comm.ep_size > 1) comm.all_to_all(counts.data(), recv_counts.data(), (int64_t)counts.size() / comm.ep_size);
    return build_dispatch_plan(counts, recv_counts, comm.ep_size);
}
