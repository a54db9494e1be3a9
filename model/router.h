// DeepSeek-V3's router selection for one token (docs/design.md §1.2), for the CPU reference and the kernels alike.
//   s = sigmoid(logits);  c = s + b (b = e_score_correction_bias: selection only)
//   group score = sum of the group's top-2 c (top-1 for a group of one); keep the topk_group best groups
//   idx = top-k of c over their experts;  w_j = r s[idx_j] / sum_j s[idx_j] (norm_topk_prob), else r s[idx_j]
// Ties go to the lower group and expert index, so selection is the same everywhere.
#pragma once
#include "config.h"
#include "host_device.h"

// scores (E) = sigmoid(logits), bias (E); scratch (E) floats. Writes idx (k) in order of decreasing c, weights (k).
// Non-finite scores (NaN weights) leave too few experts to choose: then every idx is -1.
MOE_HD inline void router_select(const Config& c, const float* scores, const float* bias, float* scratch, int* idx,
                                 float* weights) {
    const int E = c.n_routed_experts, G = c.n_group, per_group = E / G, k = c.num_experts_per_tok;
    const float masked = -1e30f;  // below any sigmoid score plus any bias the balancing rule can reach
    float* choice = scratch;      // c, then masked to the kept groups and, pick by pick, the chosen experts
    for (int e = 0; e < E; e++) choice[e] = scores[e] + bias[e];
    if (G > 1) {
        // group scores are recomputed on the fly to keep the scratch at E floats
        unsigned long long kept_groups = 0;  // bit set (G <= 64 is checked by validate_config)
        for (int round = 0; round < c.topk_group; round++) {
            int best_group = -1;
            float best_score = 0.0f;
            for (int grp = 0; grp < G; grp++) {
                if (kept_groups >> grp & 1ull) continue;
                float top1 = masked, top2 = masked;
                for (int e = grp * per_group; e < (grp + 1) * per_group; e++) {
                    float v = choice[e];
                    if (v > top1) { top2 = top1; top1 = v; }
                    else if (v > top2) top2 = v;
                }
                float group_score = per_group >= 2 ? top1 + top2 : top1;
                if (best_group < 0 || group_score > best_score) { best_group = grp; best_score = group_score; }
            }
            kept_groups |= 1ull << best_group;
        }
        for (int e = 0; e < E; e++)
            if (!(kept_groups >> (e / per_group) & 1ull)) choice[e] = masked;
    }
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {  // each pick is masked out of choice, so the next one skips it
        int best = -1;
        for (int e = 0; e < E; e++)
            if (choice[e] > masked && (best < 0 || choice[e] > choice[best])) best = e;
        if (best < 0) {  // only non-finite scores are never chosen: report it through idx, read nothing
            for (int m = 0; m < k; m++) { idx[m] = -1; weights[m] = 0.0f; }
            return;
        }
        idx[j] = best;
        choice[best] = masked;
        sum += scores[best];
    }
    for (int j = 0; j < k; j++) {
        float w = c.norm_topk_prob ? scores[idx[j]] / sum : scores[idx[j]];
        weights[j] = w * c.routed_scaling_factor;
    }
}
