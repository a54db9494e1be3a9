// The routed experts' rows, FP32 (the trainer's: kernels/permute.cuh; the CPU's plan: model/expert_plan.cpp).
// Token t's j-th chosen expert is assignment a = t k + j of n = N k.
//   plan:    chosen (n) experts in [0, E) -> counts (E), offsets (E+1), row_of_assignment (n) and its inverse
//            assignment_of_row (n): a stable counting sort by expert (within an expert, rows in assignment order)
//   permute: x (N, d) -> rows (n, d),  rows[r] = x[assignment_of_row[r] / k]
//   combine: rows (n, d), weights (N, k) -> out (N, d),  out[t] = sum_j weights[t][j] rows[row_of_assignment[t k + j]]
// The versions try three ways to build the plan without float atomics (one thread; a thread block per expert
// scanning every assignment; per-chunk counts, a scan, then ranks within the chunk), and for the copies a thread per
// value, a thread block per row, or a warp per row with 16-byte pieces.
#include "common.h"
#include "kernels/permute.cuh"

const std::vector<const char*> VERSIONS = {
    "naive: the plan by one thread; a thread per value to permute and to combine",
    "the trainer's (kernels/permute.cuh): a thread block per expert scans all assignments (ballots), one per row",
    "the plan from per-chunk counts, one scan and ranks within the chunk; a warp per row, 16-byte pieces",
};

// ---- version 1 -----------------------------------------------------------------------------------------------

// One thread: the counts, their prefix sums, then every assignment in order to the next row of its expert (E int64
// of dynamic shared memory: the next rows).
__global__ void plan_one_thread(int64_t* counts, int64_t* offsets, int64_t* row_of_assignment,
                                int64_t* assignment_of_row, const int32_t* chosen, int64_t n, int E) {
    int64_t* next = gpu::dynamic_shared<int64_t>();
    for (int e = 0; e < E; e++) counts[e] = 0;
    for (int64_t a = 0; a < n; a++) counts[chosen[a]]++;
    offsets[0] = 0;
    for (int e = 0; e < E; e++) {
        offsets[e + 1] = offsets[e] + counts[e];
        next[e] = offsets[e];
    }
    for (int64_t a = 0; a < n; a++) {
        const int64_t r = next[chosen[a]]++;
        row_of_assignment[a] = r;
        assignment_of_row[r] = a;
    }
}

__global__ void permute_thread_per_value(float* rows, const float* x, const int64_t* assignment_of_row, int k,
                                        int64_t n, int64_t d) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * d) return;
    const int64_t r = i / d, c = i % d;
    rows[i] = x[assignment_of_row[r] / k * d + c];
}

__global__ void combine_thread_per_value(float* out, const float* rows, const float* weights,
                                         const int64_t* row_of_assignment, int k, int64_t N, int64_t d) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * d) return;
    const int64_t t = i / d, c = i % d;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) acc += weights[t * k + j] * rows[row_of_assignment[t * k + j] * d + c];
    out[i] = acc;
}

// ---- version 3 -----------------------------------------------------------------------------------------------
// A chunk is the blockDim assignments of one block. chunk_counts and chunk_first are (E, chunks), expert-major:
// in that order the exclusive prefix sums of the counts are where each chunk's hits of each expert start.

// Block b: chunk_counts[e][b] = the hits of expert e in chunk b (E ints of dynamic shared memory).
__global__ void plan_chunk_counts(int64_t* chunk_counts, const int32_t* chosen, int64_t n, int E) {
    int* hits = gpu::dynamic_shared<int>();
    for (int e = threadIdx.x; e < E; e += blockDim.x) hits[e] = 0;
    __syncthreads();
    const int64_t a = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (a < n) atomicAdd(&hits[chosen[a]], 1);  // integer atomics: the counts are exact in any order
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_counts[(int64_t)e * gridDim.x + blockIdx.x] = hits[e];
}

// One block: chunk_first = the exclusive prefix sums of chunk_counts, then counts and offsets. Each thread sums a
// segment of the entries; thread 0 turns the segment sums into their prefix sums; each thread rescans its segment.
__global__ void plan_scan(int64_t* chunk_first, int64_t* counts, int64_t* offsets, const int64_t* chunk_counts,
                          int64_t chunks, int E, int64_t n) {
    __shared__ int64_t segment_first[1024];
    const int64_t total = E * chunks, per = gpu::ceil_div(total, blockDim.x);
    const int64_t begin = threadIdx.x * per, end = begin + per < total ? begin + per : total;
    int64_t sum = 0;
    for (int64_t i = begin; i < end; i++) sum += chunk_counts[i];
    segment_first[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t running = 0;
        for (unsigned i = 0; i < blockDim.x; i++) {
            const int64_t s = segment_first[i];
            segment_first[i] = running;
            running += s;
        }
    }
    __syncthreads();
    int64_t running = segment_first[threadIdx.x];
    for (int64_t i = begin; i < end; i++) {
        chunk_first[i] = running;
        running += chunk_counts[i];
    }
    __syncthreads();  // chunk_first, written by other threads, is read below
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        offsets[e] = chunk_first[e * chunks];
        counts[e] = (e + 1 < E ? chunk_first[(e + 1) * chunks] : n) - offsets[e];
    }
    if (threadIdx.x == 0) offsets[E] = n;
}

// Block b places chunk b: an assignment's row is where its expert's hits in the chunk start plus the hits of the
// same expert before it in the chunk (read from shared memory: blockDim ints of dynamic shared memory).
__global__ void plan_place(int64_t* row_of_assignment, int64_t* assignment_of_row, const int64_t* chunk_first,
                           const int32_t* chosen, int64_t n) {
    int* experts = gpu::dynamic_shared<int>();
    const int64_t a = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    experts[threadIdx.x] = a < n ? chosen[a] : -1;
    __syncthreads();
    if (a >= n) return;
    const int e = experts[threadIdx.x];
    int64_t row = chunk_first[(int64_t)e * gridDim.x + blockIdx.x];
    for (unsigned i = 0; i < threadIdx.x; i++) row += experts[i] == e;
    row_of_assignment[a] = row;
    assignment_of_row[row] = a;
}

// A warp per row; d a multiple of 4.
__global__ void permute_warp_per_row(float* rows, const float* x, const int64_t* assignment_of_row, int k, int64_t n,
                                    int64_t d) {
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (r >= n) return;
    const Float4* src = reinterpret_cast<const Float4*>(x + assignment_of_row[r] / k * d);
    Float4* dst = reinterpret_cast<Float4*>(rows + r * d);
    for (int64_t p = threadIdx.x % 32; p < d / 4; p += 32) dst[p] = src[p];
}

// A warp per token; d a multiple of 4.
__global__ void combine_warp_per_token(float* out, const float* rows, const float* weights,
                                       const int64_t* row_of_assignment, int k, int64_t N, int64_t d) {
    const int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (t >= N) return;
    for (int64_t p = threadIdx.x % 32; p < d / 4; p += 32) {
        Float4 acc = {{0.0f, 0.0f, 0.0f, 0.0f}};
        for (int j = 0; j < k; j++) {
            const float w = weights[t * k + j];
            const Float4 r = reinterpret_cast<const Float4*>(rows + row_of_assignment[t * k + j] * d)[p];
            for (int q = 0; q < 4; q++) acc.v[q] += w * r.v[q];
        }
        reinterpret_cast<Float4*>(out + t * d)[p] = acc;
    }
}

// ---- the problem, the CPU reference, the checks ----------------------------------------------------------------

struct Problem {
    int64_t N, d;
    int k, E;
    std::vector<int32_t> chosen;
    std::vector<float> x, weights;
    std::vector<int64_t> counts, offsets, row_of_assignment, assignment_of_row;
    std::vector<float> rows, out;
};

// Each token chooses k distinct experts; experts 0-2 are popular and expert E-1 is never chosen (an empty group).
static Problem make_problem() {
    Problem p;
    p.N = EMULATED ? 300 : 8192;
    p.k = EMULATED ? 4 : 6;
    p.E = EMULATED ? 16 : 64;
    p.d = EMULATED ? 36 : 2048;  // 36: a multiple of 4, not of 32 lanes x 4
    const int64_t n = p.N * p.k;
    Rng rng(3);
    p.chosen.resize(n);
    for (int64_t t = 0; t < p.N; t++)
        for (int j = 0; j < p.k; j++) {
            int32_t e;
            bool taken;
            do {
                e = (int32_t)(rng.next_u64() % 3 == 0 ? rng.next_u64() % 3 : rng.next_u64() % (p.E - 1));
                taken = false;
                for (int i = 0; i < j; i++) taken = taken || p.chosen[t * p.k + i] == e;
            } while (taken);
            p.chosen[t * p.k + j] = e;
        }
    p.x = randn(p.N * p.d, rng);
    p.weights = randn(n, rng);
    p.counts.assign(p.E, 0);
    for (int32_t e : p.chosen) p.counts[e]++;
    p.offsets.assign(p.E + 1, 0);
    for (int e = 0; e < p.E; e++) p.offsets[e + 1] = p.offsets[e] + p.counts[e];
    std::vector<int64_t> next(p.offsets.begin(), p.offsets.end() - 1);
    p.row_of_assignment.resize(n);
    p.assignment_of_row.resize(n);
    for (int64_t a = 0; a < n; a++) {
        p.row_of_assignment[a] = next[p.chosen[a]]++;
        p.assignment_of_row[p.row_of_assignment[a]] = a;
    }
    p.rows.resize(n * p.d);
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < p.d; c++) p.rows[r * p.d + c] = p.x[p.assignment_of_row[r] / p.k * p.d + c];
    p.out.resize(p.N * p.d);
    for (int64_t t = 0; t < p.N; t++)
        for (int64_t c = 0; c < p.d; c++) {
            float acc = 0.0f;  // FP32 in j order, as the kernels
            for (int j = 0; j < p.k; j++)
                acc += p.weights[t * p.k + j] * p.rows[p.row_of_assignment[t * p.k + j] * p.d + c];
            p.out[t * p.d + c] = acc;
        }
    return p;
}

static const Problem& problem() {
    static const Problem p = make_problem();
    return p;
}

struct Buffers {
    DeviceArray<int32_t> chosen;
    DeviceArray<float> x, weights, rows, out;
    DeviceArray<int64_t> counts, offsets, row_of_assignment, assignment_of_row, chunk_counts, chunk_first;
    explicit Buffers(const Problem& p)
        : chosen(p.chosen), x(p.x), weights(p.weights), rows(p.N * p.k * p.d), out(p.N * p.d), counts(p.E),
          offsets(p.E + 1), row_of_assignment(p.N * p.k), assignment_of_row(p.N * p.k),
          chunk_counts(p.E * gpu::ceil_div(p.N * p.k, 32)), chunk_first(p.E * gpu::ceil_div(p.N * p.k, 32)) {}
};

enum Stage { PLAN, PERMUTE, COMBINE };

// Stage s of version v with `block` threads per block (at least 32; the trainer's launchers pick their own).
static void run(int v, Stage s, int block, Buffers& b, const Problem& p) {
    const int64_t n = p.N * p.k, d = p.d;
    if (v == 1) {
        if (s == PLAN)
            gpu::launch_kernel(plan_one_thread, 1, 1, p.E * sizeof(int64_t), nullptr, b.counts.ptr, b.offsets.ptr,
                               b.row_of_assignment.ptr, b.assignment_of_row.ptr, b.chosen.ptr, n, p.E);
        if (s == PERMUTE)
            gpu::launch_kernel(permute_thread_per_value, (unsigned)gpu::ceil_div(n * d, block), block, 0, nullptr,
                               b.rows.ptr, b.x.ptr, b.assignment_of_row.ptr, p.k, n, d);
        if (s == COMBINE)
            gpu::launch_kernel(combine_thread_per_value, (unsigned)gpu::ceil_div(p.N * d, block), block, 0, nullptr,
                               b.out.ptr, b.rows.ptr, b.weights.ptr, b.row_of_assignment.ptr, p.k, p.N, d);
    } else if (v == 2) {
        if (s == PLAN)
            gpu::build_expert_plan(b.counts.ptr, b.offsets.ptr, b.row_of_assignment.ptr, b.assignment_of_row.ptr,
                                   b.chosen.ptr, n, p.E, nullptr);
        if (s == PERMUTE) gpu::permute_forward(b.rows.ptr, b.x.ptr, b.assignment_of_row.ptr, p.N, p.k, d, nullptr);
        if (s == COMBINE)
            gpu::combine_forward(b.out.ptr, b.rows.ptr, b.weights.ptr, b.row_of_assignment.ptr, p.N, p.k, d, false,
                                 nullptr);
    } else {
        if (d % 4 != 0) {
            fprintf(stderr, "version 3 takes d a multiple of 4 (d = %lld)\n", (long long)d);
            exit(1);
        }
        const int64_t chunks = gpu::ceil_div(n, block);
        if (s == PLAN) {
            gpu::launch_kernel(plan_chunk_counts, (unsigned)chunks, block, p.E * sizeof(int), nullptr,
                               b.chunk_counts.ptr, b.chosen.ptr, n, p.E);
            gpu::launch_kernel(plan_scan, 1, 1024, 0, nullptr, b.chunk_first.ptr, b.counts.ptr, b.offsets.ptr,
                               b.chunk_counts.ptr, chunks, p.E, n);
            gpu::launch_kernel(plan_place, (unsigned)chunks, block, block * sizeof(int), nullptr,
                               b.row_of_assignment.ptr, b.assignment_of_row.ptr, b.chunk_first.ptr, b.chosen.ptr, n);
        }
        if (s == PERMUTE)
            gpu::launch_kernel(permute_warp_per_row, (unsigned)gpu::ceil_div(n * 32, block), block, 0, nullptr,
                               b.rows.ptr, b.x.ptr, b.assignment_of_row.ptr, p.k, n, d);
        if (s == COMBINE)
            gpu::launch_kernel(combine_warp_per_token, (unsigned)gpu::ceil_div(p.N * 32, block), block, 0, nullptr,
                               b.out.ptr, b.rows.ptr, b.weights.ptr, b.row_of_assignment.ptr, p.k, p.N, d);
    }
}

// The block sizes version v is checked and timed at (the trainer's launchers pick their own).
static std::vector<int> block_sizes(int v) {
    if (v == 2) return {gpu::ROW_THREADS};
    return {64, 128, 256, 512, 1024};
}

static const char* STAGE_NAMES[] = {"plan", "permute", "combine"};

// The plan and the permuted rows: tol 0 (integers; copies). out: tol 1e-6: k products added in j order in FP32 as
// the reference does, so only the fused multiply-adds nvcc may form round differently (one ulp each).
static bool check_version(int v) {
    const Problem& p = problem();
    bool ok = true;
    for (int block : block_sizes(v)) {
        Buffers b(p);
        for (Stage s : {PLAN, PERMUTE, COMBINE}) run(v, s, block, b, p);
        ok = check(fmt("plan counts, block %d", block), b.counts.get(), p.counts, 0) && ok;
        ok = check(fmt("plan offsets, block %d", block), b.offsets.get(), p.offsets, 0) && ok;
        ok = check(fmt("plan row_of_assignment, block %d", block), b.row_of_assignment.get(), p.row_of_assignment,
                   0) && ok;
        ok = check(fmt("plan assignment_of_row, block %d", block), b.assignment_of_row.get(), p.assignment_of_row,
                   0) && ok;
        ok = check(fmt("permuted rows, block %d", block), b.rows.get(), p.rows, 0) && ok;
        ok = check(fmt("combine out, block %d", block), b.out.get(), p.out, 1e-6) && ok;
    }
    return ok;
}

static void time_version(int v) {
    const Problem& p = problem();
    Buffers b(p);
    const int64_t n = p.N * p.k;
    const double bytes[] = {
        4.0 * n + 16.0 * n + 16.0 * p.E,   // read chosen; write the two maps, counts and offsets
        8.0 * n * p.d + 8.0 * n,           // read and write the rows; read the map
        4.0 * (n + p.N) * p.d + 12.0 * n,  // read the rows, write out; read weights and the map
    };
    for (Stage s : {PLAN, PERMUTE, COMBINE})
        for (int block : block_sizes(v)) {
            const bool one_thread = v == 1 && s == PLAN;
            if (one_thread && block != 64) continue;
            const std::string what = one_thread ? fmt("plan, one thread")
                                     : v == 2   ? fmt("%s, the trainer's launcher", STAGE_NAMES[s])
                                                : fmt("%s, block %d", STAGE_NAMES[s], block);
            for (Stage before : {PLAN, PERMUTE}) run(v, before, block, b, p);  // the plan and rows the stage reads
            print_time(what, time_ms([&] { run(v, s, block, b, p); }), bytes[s], 0);
        }
}

int main(int argc, char** argv) { return lab_main(argc, argv, "permute", VERSIONS, check_version, time_version); }
