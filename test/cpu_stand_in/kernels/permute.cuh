// CPU stand-in (see test/cpu_stand_in/stand_in.h) for kernels/permute.cuh: the plan by comm/expert_plan.h's
// build_expert_plan (the contract: "exactly build_expert_plan's stable counting sort"), the rest as plain loops.
// Assignment a = t*k + j; n = N*k assignments.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/expert_plan.h"
#include "kernels/common.cuh"

namespace gpu {

// chosen (n) experts in [0, E) -> counts (E), offsets (E+1), row_of_slot (n), slot_of_row (n). An expert outside
// [0, E) (router_select's -1 for non-finite scores) is counted by no expert, as by the kernel's per-expert count;
// then only the counts are meaningful.
inline void expert_plan_build(int64_t* counts, int64_t* offsets, int64_t* row_of_slot, int64_t* slot_of_row,
                              const int32_t* chosen, int64_t n, int E, cudaStream_t stream) {
    dev(counts, E, "expert_plan_build counts");
    dev(offsets, E + 1, "expert_plan_build offsets");
    dev(row_of_slot, n, "expert_plan_build row_of_slot");
    dev(slot_of_row, n, "expert_plan_build slot_of_row");
    dev(chosen, n, "expert_plan_build chosen");
    apart("expert_plan_build",
          {span(counts, E, "counts"), span(offsets, E + 1, "offsets"), span(row_of_slot, n, "row_of_slot"),
           span(slot_of_row, n, "slot_of_row")},
          {span(chosen, n, "chosen")});
    launch(stream, [=] {
        bool valid = true;
        for (int64_t a = 0; a < n; a++) valid = valid && chosen[a] >= 0 && chosen[a] < E;
        if (!valid) {
            for (int e = 0; e < E; e++) {
                counts[e] = 0;
                for (int64_t a = 0; a < n; a++) counts[e] += chosen[a] == e;
            }
            return;
        }
        const ExpertPlan p = build_expert_plan(chosen, n, E);
        memcpy(counts, p.counts.data(), E * sizeof(int64_t));
        memcpy(offsets, p.offsets.data(), (E + 1) * sizeof(int64_t));
        memcpy(row_of_slot, p.row_of_slot.data(), n * sizeof(int64_t));
        memcpy(slot_of_row, p.slot_of_row.data(), n * sizeof(int64_t));
    });
}

// x (N, d) -> rows (N*k, d): rows[r] = x[slot_of_row[r] / k]
template <typename T>
inline void gather_forward(T* rows, const T* x, const int64_t* slot_of_row, int64_t N, int k, int64_t d,
                           cudaStream_t stream) {
    if (N == 0) return;
    dev(rows, N * k * d, "gather_forward rows");
    dev(x, N * d, "gather_forward x");
    dev(slot_of_row, N * k, "gather_forward slot_of_row");
    apart("gather_forward", {span(rows, N * k * d, "rows")}, {span(x, N * d, "x"), span(slot_of_row, N * k, "slot_of_row")});
    launch(stream, [=] {
        for (int64_t r = 0; r < N * k; r++) {
            const int64_t t = slot_of_row[r] / k;
            if (t < 0 || t >= N) stand_in::violation("gather_forward: slot_of_row[" + std::to_string(r) + "] out of range");
            for (int64_t i = 0; i < d; i++) rows[r * d + i] = x[t * d + i];
        }
    });
}

// drows (N*k, d) -> dx[t] (=|+=) sum_j drows[row_of_slot[t*k+j]], in j order
inline void gather_backward(float* dx, const float* drows, const int64_t* row_of_slot, int64_t N, int k, int64_t d,
                            bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
    dev(dx, N * d, "gather_backward dx");
    dev(drows, N * k * d, "gather_backward drows");
    dev(row_of_slot, N * k, "gather_backward row_of_slot");
    apart("gather_backward", {span(dx, N * d, "dx")}, {span(drows, N * k * d, "drows"), span(row_of_slot, N * k, "row_of_slot")});
    launch(stream, [=] {
        for (int64_t t = 0; t < N; t++)
            for (int64_t i = 0; i < d; i++) {
                float acc = accumulate ? dx[t * d + i] : 0.0f;
                for (int j = 0; j < k; j++) acc += drows[row_of_slot[t * k + j] * d + i];
                dx[t * d + i] = acc;
            }
    });
}

// rows (N*k, d), weights (N, k) -> out[t] (=|+=) sum_j w_tj rows[row_of_slot[t*k+j]], in j order
inline void combine_forward(float* out, const float* rows, const float* weights, const int64_t* row_of_slot,
                            int64_t N, int k, int64_t d, bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
    dev(out, N * d, "combine_forward out");
    dev(rows, N * k * d, "combine_forward rows");
    dev(weights, N * k, "combine_forward weights");
    dev(row_of_slot, N * k, "combine_forward row_of_slot");
    apart("combine_forward", {span(out, N * d, "out")},
          {span(rows, N * k * d, "rows"), span(weights, N * k, "weights"), span(row_of_slot, N * k, "row_of_slot")});
    launch(stream, [=] {
        for (int64_t t = 0; t < N; t++)
            for (int64_t i = 0; i < d; i++) {
                float acc = accumulate ? out[t * d + i] : 0.0f;
                for (int j = 0; j < k; j++) acc += weights[t * k + j] * rows[row_of_slot[t * k + j] * d + i];
                out[t * d + i] = acc;
            }
    });
}

// dout (N, d) -> drows[row_of_slot[a]] = w_a dout[t] (overwritten), dweights[a] = dout[t] . rows[row_of_slot[a]]
inline void combine_backward(float* drows, float* dweights, const float* dout, const float* rows,
                             const float* weights, const int64_t* row_of_slot, int64_t N, int k, int64_t d,
                             cudaStream_t stream) {
    if (N == 0) return;
    dev(drows, N * k * d, "combine_backward drows");
    dev(dweights, N * k, "combine_backward dweights");
    dev(dout, N * d, "combine_backward dout");
    dev(rows, N * k * d, "combine_backward rows");
    dev(weights, N * k, "combine_backward weights");
    dev(row_of_slot, N * k, "combine_backward row_of_slot");
    apart("combine_backward", {span(drows, N * k * d, "drows"), span(dweights, N * k, "dweights")},
          {span(dout, N * d, "dout"), span(rows, N * k * d, "rows"), span(weights, N * k, "weights"),
           span(row_of_slot, N * k, "row_of_slot")});
    launch(stream, [=] {
        for (int64_t a = 0; a < N * k; a++) {
            const int64_t t = a / k, row = row_of_slot[a];
            float dot = 0.0f;
            for (int64_t i = 0; i < d; i++) {
                drows[row * d + i] = weights[a] * dout[t * d + i];
                dot += dout[t * d + i] * rows[row * d + i];
            }
            dweights[a] = dot;
        }
    });
}

}  // namespace gpu
