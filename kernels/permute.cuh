// The routed experts' rows of one MoE layer (docs/design.md §1.2); the CPU's are model/expert_plan.cpp, model/moe.cpp.
// Assignment a = t*k + j, n = N*k of them.
//   plan:     the expert plan: counts (E), offsets (E+1), row_of_assignment (n), its inverse assignment_of_row (n)
//   permute:  out[r] = in[source[r] / k], source = assignment_of_row: the token rows into plan order. With k = 1,
//             any gather of rows, as the dispatch's sort into local expert order.
//             backward dx[t] (=|+=) sum_j drows[row_of_assignment[t*k+j]]
//   combine:  out[t] (=|+=) sum_j w_tj rows[row_of_assignment[t*k+j]];
//             backward drows[row_of_assignment[a]] = w_a dout[t], dw_a = dout[t] . rows[row_of_assignment[a]]
// No float atomics: a thread block per expert walks the assignments in order (a stable compaction with warp
// ballots), and the backward sums run in j order per token. The plan takes O(n E / threads) steps: fine for E <= 256
// and n of a few 100K.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int PLAN_THREADS = 512, ROW_THREADS = 256;

// a thread block per expert e: counts[e] = #{a : chosen[a] == e}
static __global__ void expert_count_kernel(int64_t* counts, const int32_t* chosen, int64_t n) {
    const int e = blockIdx.x;
    int64_t count = 0;
    for (int64_t base = 0; base < n; base += blockDim.x) {
        const int64_t a = base + threadIdx.x;
        count += __syncthreads_count(a < n && chosen[a] == e);
    }
    if (threadIdx.x == 0) counts[e] = count;
}

// A thread block per expert e. Its first row is the sum of the earlier experts' counts. It walks the assignments in
// chunks of blockDim and gives its hits consecutive rows in assignment order. A hit's rank in a chunk is the hits of
// the earlier warps (shared memory) plus those of the earlier threads of its warp (ballot).
static __global__ void expert_place_kernel(int64_t* row_of_assignment, int64_t* assignment_of_row, int64_t* offsets,
                                    const int64_t* counts, const int32_t* chosen, int64_t n, int E) {
    __shared__ int warp_hits[32];  // hits of each warp in the current chunk
    const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int64_t next_row = 0;
    for (int i = 0; i < e; i++) next_row += counts[i];
    if (threadIdx.x == 0) {
        offsets[e] = next_row;
        if (e == E - 1) offsets[E] = next_row + counts[e];
    }
    for (int64_t base = 0; base < n; base += blockDim.x) {
        const int64_t a = base + threadIdx.x;
        const bool hit = a < n && chosen[a] == e;
        const unsigned ballot = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_hits[warp] = __popc(ballot);
        __syncthreads();
        int before = __popc(ballot & ((1u << lane) - 1u)), chunk_hits = 0;
        for (int w = 0; w < (int)blockDim.x / 32; w++) {
            if (w < warp) before += warp_hits[w];
            chunk_hits += warp_hits[w];
        }
        if (hit) {
            row_of_assignment[a] = next_row + before;
            assignment_of_row[next_row + before] = a;
        }
        next_row += chunk_hits;
        __syncthreads();  // warp_hits is rewritten by the next chunk
    }
}

// a thread block per row r: rows[r] = x[source[r] / k], FP32 or BF16 copied as is. wide: 16 bytes a thread, for
// rows of a multiple of 16 bytes and both buffers 16-byte aligned; else one value a thread.
template <typename T>
static __global__ void permute_forward_kernel(T* rows, const T* x, const int64_t* source, int k, int64_t d,
                                              bool wide) {
    const int64_t r = blockIdx.x, t = source[r] / k;
    if (wide) {
        uint4* dst = reinterpret_cast<uint4*>(rows + r * d);
        const uint4* src = reinterpret_cast<const uint4*>(x + t * d);
        for (int64_t i = threadIdx.x; i < d * (int64_t)sizeof(T) / 16; i += blockDim.x) dst[i] = src[i];
    } else {
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) rows[r * d + i] = x[t * d + i];
    }
}

// a thread block per token t: out[t] (=|+=) sum_j w_tj rows[row_of_assignment[t*k+j]], in j order; w = 1 without
// weights (the permute's backward)
static __global__ void combine_forward_kernel(float* out, const float* rows, const float* weights,
                                              const int64_t* row_of_assignment, int k, int64_t d, bool accumulate) {
    const int64_t t = blockIdx.x;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = accumulate ? out[t * d + i] : 0.0f;
        for (int j = 0; j < k; j++)
            acc += (weights ? weights[t * k + j] : 1.0f) * rows[row_of_assignment[t * k + j] * d + i];
        out[t * d + i] = acc;
    }
}

// a thread block per assignment a = t*k + j: drows[row] = w_a dout[t];  dweights[a] = dout[t] . rows[row]
static __global__ void combine_backward_kernel(float* drows, float* dweights, const float* dout, const float* rows,
                                               const float* weights, const int64_t* row_of_assignment, int k,
                                               int64_t d) {
    const int64_t a = blockIdx.x, t = a / k, row = row_of_assignment[a];
    const float w = weights[a];
    float dot = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        const float dy = dout[t * d + i];
        drows[row * d + i] = w * dy;
        dot += dy * rows[row * d + i];
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dweights[a] = dot;
}

// chosen (n) experts in [0, E) -> counts (E), offsets (E+1), row_of_assignment (n), assignment_of_row (n), all int64
inline void build_expert_plan(int64_t* counts, int64_t* offsets, int64_t* row_of_assignment,
                              int64_t* assignment_of_row, const int32_t* chosen, int64_t n, int E,
                              cudaStream_t stream) {
    launch_kernel(expert_count_kernel, E, PLAN_THREADS, 0, stream, counts, chosen, n);
    launch_kernel(expert_place_kernel, E, PLAN_THREADS, 0, stream, row_of_assignment, assignment_of_row, offsets,
                  counts, chosen, n, E);
}

// x (N, d) -> rows (N*k, d), rows[r] = x[source[r] / k]; T: float or __nv_bfloat16
template <typename T>
inline void permute_forward(T* rows, const T* x, const int64_t* source, int64_t N, int k, int64_t d,
                            cudaStream_t stream) {
    if (N == 0) return;
    const bool wide = d * (int64_t)sizeof(T) % 16 == 0 && (uintptr_t)rows % 16 == 0 && (uintptr_t)x % 16 == 0;
    launch_kernel(permute_forward_kernel<T>, (unsigned)(N * k), ROW_THREADS, 0, stream, rows, x, source, k, d, wide);
}

// drows (N*k, d) -> dx (N, d) (=|+=)
inline void permute_backward(float* dx, const float* drows, const int64_t* row_of_assignment, int64_t N, int k,
                             int64_t d, bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
    launch_kernel(combine_forward_kernel, (unsigned)N, ROW_THREADS, 0, stream, dx, drows, (const float*)nullptr,
                  row_of_assignment, k, d, accumulate);
}

// rows (N*k, d) in plan order, weights (N, k) -> out (N, d) (=|+=: accumulate onto the shared experts' output)
inline void combine_forward(float* out, const float* rows, const float* weights, const int64_t* row_of_assignment,
                            int64_t N, int k, int64_t d, bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
    launch_kernel(combine_forward_kernel, (unsigned)N, ROW_THREADS, 0, stream, out, rows, weights, row_of_assignment, k,
                  d, accumulate);
}

// dout (N, d) -> drows (N*k, d) overwritten, dweights (N, k) overwritten
inline void combine_backward(float* drows, float* dweights, const float* dout, const float* rows,
                             const float* weights, const int64_t* row_of_assignment, int64_t N, int k, int64_t d,
                             cudaStream_t stream) {
    if (N == 0) return;
    launch_kernel(combine_backward_kernel, (unsigned)(N * k), ROW_THREADS, 0, stream, drows, dweights, dout, rows,
                  weights, row_of_assignment, k, d);
}

}  // namespace gpu
