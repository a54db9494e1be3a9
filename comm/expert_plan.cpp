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
