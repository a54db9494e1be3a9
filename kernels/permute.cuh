// The routed-expert permutation of one MoE layer, FP32 rows (the gather also BF16) (DESIGN §1.2, §2; the CPU
// reference is comm/expert_plan.cpp and the dispatch/combine loops of model/moe.cpp). Assignment a = t*k + j is
// token t's j-th chosen expert; n = N*k assignments.
//   plan:     counts (E) rows per expert, offsets (E+1) their exclusive prefix sum, row_of_slot (n) the
//             expert-contiguous row of each assignment and slot_of_row (n) its inverse. Within an expert the rows
//             are in assignment order: exactly build_expert_plan's stable counting sort.
//   gather:   rows (n, d): rows[r] = x[slot_of_row[r] / k];  backward dx[t] (=|+=) sum_j drows[row_of_slot[t*k+j]]
//   combine:  out[t] (=|+=) sum_j w_tj rows[row_of_slot[t*k+j]];
//             backward drows[row_of_slot[a]] = w_a dout[t] (overwritten), dw_a = dout[t] . rows[row_of_slot[a]]
// Everything is deterministic without float atomics: the plan is built by one block per expert that walks the
// assignments in order (a stable compaction with warp ballots), and the backward sums run in j order per token.
// The plan costs O(n E / threads) steps: fine for E <= 256 and n of a few 100K; a segmented sort would scale further.
//
// Group sizes on the host: the grouped expert GEMMs (and, under expert parallelism, the NCCL send/recv sizes of the
// all-to-all-v) need the counts on the host, so after expert_plan_build the trainer copies the E int64 counts to a
// host vector and synchronises the stream (gpu/gpu_model.cu's moe_route) once per MoE layer per forward; the
// backward reuses the plan. That costs one synchronisation (~10-20 us plus the drain of the queued kernels) per MoE layer and step,
// small next to the layer's GEMMs. It is inherent in dropless routing with host-launched GEMMs and dynamic
// all-to-all sizes. Avoiding it needs device-side problem sizes: a grouped GEMM that reads the offsets from
// device memory (CUTLASS-style grouped GEMM) and a fixed-capacity exchange, i.e. padding or dropping tokens.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"

namespace gpu {

constexpr int PLAN_THREADS = 512, ROW_THREADS = 256;

// one block per expert e: counts[e] = #{a : chosen[a] == e}
static __global__ void expert_count_kernel(int64_t* counts, const int32_t* chosen, int64_t n) {
    const int e = blockIdx.x;
    int64_t count = 0;
    for (int64_t base = 0; base < n; base += blockDim.x) {
        const int64_t a = base + threadIdx.x;
        count += __syncthreads_count(a < n && chosen[a] == e);
    }
    if (threadIdx.x == 0) counts[e] = count;
}

// One block per expert e: its first row is the sum of the earlier experts' counts; then it walks the assignments
// in chunks of blockDim and gives its hits consecutive rows in assignment order. Within a chunk a hit's rank is the
// hits of the earlier warps (from shared memory) plus those of the earlier lanes of its own warp (ballot).
static __global__ void expert_place_kernel(int64_t* row_of_slot, int64_t* slot_of_row, int64_t* offsets,
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
            row_of_slot[a] = next_row + before;
            slot_of_row[next_row + before] = a;
        }
        next_row += chunk_hits;
        __syncthreads();  // warp_hits is rewritten by the next chunk
    }
}

// one block per row r: rows[r] = x[slot_of_row[r] / k] (FP32 or BF16 values: a copy). wide: 16 bytes a thread
// (the rows' bytes a multiple of 16 and both buffers 16-byte aligned: a 2-byte value a thread would move 64 bytes
// a warp, well short of the memory's rate), else one value a thread.
template <typename T>
static __global__ void gather_forward_kernel(T* rows, const T* x, const int64_t* slot_of_row, int k, int64_t d,
                                             bool wide) {
    const int64_t r = blockIdx.x, t = slot_of_row[r] / k;
    if (wide) {
        uint4* dst = reinterpret_cast<uint4*>(rows + r * d);
        const uint4* src = reinterpret_cast<const uint4*>(x + t * d);
        for (int64_t i = threadIdx.x; i < d * (int64_t)sizeof(T) / 16; i += blockDim.x) dst[i] = src[i];
    } else {
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) rows[r * d + i] = x[t * d + i];
    }
}

// one block per token t: dx[t] (=|+=) sum_j drows[row_of_slot[t*k+j]], in j order
static __global__ void gather_backward_kernel(float* dx, const float* drows, const int64_t* row_of_slot, int k, int64_t d,
                                       bool accumulate) {
    const int64_t t = blockIdx.x;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = accumulate ? dx[t * d + i] : 0.0f;
        for (int j = 0; j < k; j++) acc += drows[row_of_slot[t * k + j] * d + i];
        dx[t * d + i] = acc;
    }
}

// one block per token t: out[t] (=|+=) sum_j w_tj rows[row_of_slot[t*k+j]], in j order
static __global__ void combine_forward_kernel(float* out, const float* rows, const float* weights,
                                       const int64_t* row_of_slot, int k, int64_t d, bool accumulate) {
    const int64_t t = blockIdx.x;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = accumulate ? out[t * d + i] : 0.0f;
        for (int j = 0; j < k; j++) acc += weights[t * k + j] * rows[row_of_slot[t * k + j] * d + i];
        out[t * d + i] = acc;
    }
}

// one block per assignment a = t*k + j: drows[row] = w_a dout[t];  dweights[a] = dout[t] . rows[row]
static __global__ void combine_backward_kernel(float* drows, float* dweights, const float* dout, const float* rows,
                                        const float* weights, const int64_t* row_of_slot, int k, int64_t d) {
    const int64_t a = blockIdx.x, t = a / k, row = row_of_slot[a];
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

// chosen (n) experts in [0, E) -> counts (E), offsets (E+1), row_of_slot (n), slot_of_row (n), all int64
inline void expert_plan_build(int64_t* counts, int64_t* offsets, int64_t* row_of_slot, int64_t* slot_of_row,
                              const int32_t* chosen, int64_t n, int E, cudaStream_t stream) {
    launch_kernel(expert_count_kernel, E, PLAN_THREADS, 0, stream, counts, chosen, n);
    launch_kernel(expert_place_kernel, E, PLAN_THREADS, 0, stream, row_of_slot, slot_of_row, offsets, counts, chosen, n,
                  E);
}

// x (N, d) -> rows (N*k, d) in plan order; T: float, or __nv_bfloat16 (the BF16 copies of the experts' inputs)
template <typename T>
inline void gather_forward(T* rows, const T* x, const int64_t* slot_of_row, int64_t N, int k, int64_t d,
                           cudaStream_t stream) {
    if (N == 0) return;
    const bool wide = d * (int64_t)sizeof(T) % 16 == 0 && (uintptr_t)rows % 16 == 0 && (uintptr_t)x % 16 == 0;
    launch_kernel(gather_forward_kernel<T>, (unsigned)(N * k), ROW_THREADS, 0, stream, rows, x, slot_of_row, k, d,
                  wide);
}

// drows (N*k, d) -> dx (N, d) (=|+=)
inline void gather_backward(float* dx, const float* drows, const int64_t* row_of_slot, int64_t N, int k, int64_t d,
                            bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
    launch_kernel(gather_backward_kernel, (unsigned)N, ROW_THREADS, 0, stream, dx, drows, row_of_slot, k, d,
                  accumulate);
}

// rows (N*k, d) in plan order, weights (N, k) -> out (N, d) (=|+=: accumulate onto the shared experts' output)
inline void combine_forward(float* out, const float* rows, const float* weights, const int64_t* row_of_slot,
                            int64_t N, int k, int64_t d, bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
    launch_kernel(combine_forward_kernel, (unsigned)N, ROW_THREADS, 0, stream, out, rows, weights, row_of_slot, k, d,
                  accumulate);
}

// dout (N, d) -> drows (N*k, d) overwritten, dweights (N, k) overwritten
inline void combine_backward(float* drows, float* dweights, const float* dout, const float* rows,
                             const float* weights, const int64_t* row_of_slot, int64_t N, int k, int64_t d,
                             cudaStream_t stream) {
    if (N == 0) return;
    launch_kernel(combine_backward_kernel, (unsigned)(N * k), ROW_THREADS, 0, stream, drows, dweights, dout, rows,
                  weights, row_of_slot, k, d);
}

}  // namespace gpu
