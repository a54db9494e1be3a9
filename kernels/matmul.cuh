// The GEMMs of the GPU model, through cuBLASLt (docs/design.md §7 derives the layouts). Every linear layer is
// y = x W^T with row-major activations x (M, K), y (M, N) and weights W (N, K), as model/ops.h:
//   forward:   out  (M, N) (=|+=) inp  (M, K) @ W^T
//   backward:  dinp (M, K) (=|+=) dout (M, N) @ W          (skipped when dinp is nullptr)
//              dW   (N, K) (=|+=) dout^T (N, M) @ inp (M, K)
// (the routed experts' grouped versions: kernels/grouped_matmul.cuh). cuBLASLt is column-major, so each product is
// computed as its transpose on the buffers as they are (§7.2).
// A call's precision is its weight's (GemmWeight): FP32, TF32 (FP32 operands rounded by the tensor cores), BF16
// (inputs cast once by the caller, or here into the Matmul's cast buffers) or FP8 with DeepSeek-V3's scales
// (operands quantized here, §7.3); accumulation and outputs are FP32. The heuristic's choice is cached per problem
// (§7.5).
// Every cuBLASLt call is checked; a failed multiply reports the whole problem (site, shapes, layouts, alignments).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/gemm_operands.cuh"

#ifndef CUBLAS_CHECK
#define CUBLAS_CHECK(call)                                                                                    \
    do {                                                                                                      \
        cublasStatus_t status_ = (call);                                                                      \
        if (status_ != CUBLAS_STATUS_SUCCESS) {                                                               \
            fprintf(stderr, "cuBLAS error %s (%s) at %s:%d in %s\n", cublasLtGetStatusName(status_),         \
                    cublasLtGetStatusString(status_), __FILE__, __LINE__, #call);                             \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)
#endif

namespace gpu {

constexpr size_t MATMUL_CACHE_MAX = 1 << 15;
constexpr int MATMUL_CAST_THREADS = 256;

// One cached choice: the descriptors of one problem and the algorithm the heuristic picked for it.
struct MatmulPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // d also describes C (C == D)
    cublasLtMatmulAlgo_t algo{};
    bool found = false;  // false: no algorithm (kept only for FP8, whose calls then run in BF16)
};
// {operand type and scale modes, transa, transb, m, n, k, lda, ldb, ldd, align A, align B, align C/D}
using MatmulKey = std::array<int64_t, 12>;
// An algorithm the heuristic chose for a problem with the rows rounded up (matmul_plan), or none (found false)
struct MatmulAlgo {
    cublasLtMatmulAlgo_t algo{};
    bool found = false;
};

// An FP8 product's scales: of A and of B, each per 1 x 128 tile (VEC128) or per 128 x 128 block (BLK128x128)
struct Fp8Scales {
    const float *a = nullptr, *b = nullptr;
    bool a_blocks = false, b_blocks = false;
};

inline void set_scale_pointers(cublasLtMatmulDesc_t desc, const Fp8Scales& scales) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.a,
                                                sizeof(scales.a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.b,
                                                sizeof(scales.b)));
}

// E4M3 values and their scales: one of a Matmul's three FP8 scratch buffers, grown on demand
struct Fp8Buffer {
    __nv_fp8_storage_t* values = nullptr;
    float* scales = nullptr;
    int64_t values_capacity = 0, scales_capacity = 0;
};
// fp8[FP8_INPUT]: a GEMM input's rows (forward) or their transpose (weight gradient); fp8[FP8_GRAD_ROWS]: the
// output gradient's rows (input gradient); fp8[FP8_GRAD_T]: its transpose (weight gradient)
enum { FP8_INPUT = 0, FP8_GRAD_ROWS = 1, FP8_GRAD_T = 2 };

struct Matmul {  // one per caller stream
    cublasLtHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;        // the caller's: every call is ordered on it
    void* workspace = nullptr;            // MATMUL_STREAMS slices of workspace_bytes, slice i for stream i
    size_t workspace_bytes = 0;
    std::array<cudaStream_t, MATMUL_STREAMS> streams{};     // streams[0] = stream; the others made by matmul_create
    std::array<cudaEvent_t, MATMUL_STREAMS> stream_events{};  // [0]: the casts are queued (fork); [i]: stream i done (join)
    int group_streams = MATMUL_STREAMS;                         // streams a grouped call uses, 1 to MATMUL_STREAMS
    __nv_bfloat16 *cast_a = nullptr, *cast_b = nullptr;  // BF16 casts of the activation operands
    MatmulCasts cast_capacity;
    std::array<Fp8Buffer, 3> fp8{};                       // FP8_INPUT, FP8_GRAD_ROWS, FP8_GRAD_T
    float* fp8_tails = nullptr;                           // 4 rows a group: the FP8 products' last M % 4 rows
    int64_t fp8_tails_capacity = 0;
    bool fp8_enabled = false;                             // created for FP8 calls: matmul_reserve grows fp8 too
    int64_t fp8_refused = 0;                              // FP8 shapes cuBLASLt refused, run in BF16 instead
    int64_t fp8_in_bf16 = 0;                              // FP8 products run in BF16, every call (the step log's)
    std::map<MatmulKey, MatmulPlan> cache;
    std::map<MatmulKey, MatmulAlgo> algos;  // by the key with the rows rounded up (matmul_plan)
};

// BF16 cast

static __global__ void cast_to_bf16_kernel(__nv_bfloat16* out, const float* in, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(in[i]);
}

// out (n) = in (n) rounded to the nearest BF16, ties to even (Inf stays Inf, NaN stays NaN)
inline void cast_to_bf16(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    launch_kernel(cast_to_bf16_kernel, grid_stride_blocks(n, MATMUL_CAST_THREADS), MATMUL_CAST_THREADS, 0, stream, out,
                  in, n);
}

// Setup

inline void matmul_clear_cache(Matmul& mm) {
    for (auto& entry : mm.cache) {
        MatmulPlan& p = entry.second;
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.a));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.b));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.d));
        CUBLAS_CHECK(cublasLtMatmulDescDestroy(p.desc));
    }
    mm.cache.clear();
    mm.algos.clear();
}

// Frees what matmul_create allocated (also after a partial create); the Matmul is empty afterwards.
inline void matmul_destroy(Matmul& mm) {
    matmul_clear_cache(mm);
    CUDA_CHECK(cudaFree(mm.workspace));
    CUDA_CHECK(cudaFree(mm.cast_a));
    CUDA_CHECK(cudaFree(mm.cast_b));
    for (Fp8Buffer& b : mm.fp8) {
        CUDA_CHECK(cudaFree(b.values));
        CUDA_CHECK(cudaFree(b.scales));
    }
    CUDA_CHECK(cudaFree(mm.fp8_tails));
    for (int i = 1; i < MATMUL_STREAMS; i++)
        if (mm.streams[i]) CUDA_CHECK(cudaStreamDestroy(mm.streams[i]));
    for (cudaEvent_t e : mm.stream_events)
        if (e) CUDA_CHECK(cudaEventDestroy(e));
    if (mm.handle) CUBLAS_CHECK(cublasLtDestroy(mm.handle));
    mm = Matmul{};
}

// cudaMalloc that throws on failure (clearing the error), after freeing what mm already holds; 0 bytes: nullptr
inline void matmul_alloc(Matmul& mm, void** ptr, size_t bytes, const char* what) {
    *ptr = nullptr;
    if (bytes > 0 && cudaMalloc(ptr, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        *ptr = nullptr;
        matmul_destroy(mm);
        throw std::runtime_error(std::string("out of GPU memory for ") + what + " (" +
                                 std::to_string(bytes >> 20) + " MiB)");
    }
}

// The two cast buffers; a Matmul without them (casts {0, 0}) serves FP32 GEMMs only
inline void matmul_alloc_casts(Matmul& mm, MatmulCasts casts) {
    matmul_alloc(mm, (void**)&mm.cast_a, (size_t)casts.inputs * sizeof(__nv_bfloat16), "the BF16 GEMM input casts");
    matmul_alloc(mm, (void**)&mm.cast_b, (size_t)casts.output_grads * sizeof(__nv_bfloat16),
                 "the BF16 GEMM output-gradient casts");
    mm.cast_capacity = casts;
}

// fp8[which] with room for `values` values and `scales` scales, grown when smaller. Growing first waits for mm's
// stream, whose queued work may read the old buffers; the other streams are joined into it. Throws as matmul_create.
inline Fp8Buffer& matmul_fp8_buffer(Matmul& mm, int which, int64_t values, int64_t scales) {
    Fp8Buffer& b = mm.fp8[which];
    if (values <= b.values_capacity && scales <= b.scales_capacity) return b;
    CUDA_CHECK(cudaStreamSynchronize(mm.stream));
    CUDA_CHECK(cudaFree(b.values));
    CUDA_CHECK(cudaFree(b.scales));
    const int64_t value_room = std::max(values, b.values_capacity), scale_room = std::max(scales, b.scales_capacity);
    b = Fp8Buffer{};
    matmul_alloc(mm, (void**)&b.values, (size_t)value_room, "the FP8 GEMM operands");
    matmul_alloc(mm, (void**)&b.scales, (size_t)scale_room * sizeof(float), "the FP8 GEMM scales");
    b.values_capacity = value_room;
    b.scales_capacity = scale_room;
    return b;
}

// mm.fp8_tails with room for `floats`, grown as matmul_fp8_buffer grows the others
inline float* matmul_fp8_tails(Matmul& mm, int64_t floats) {
    if (floats <= mm.fp8_tails_capacity) return mm.fp8_tails;
    CUDA_CHECK(cudaStreamSynchronize(mm.stream));
    CUDA_CHECK(cudaFree(mm.fp8_tails));
    mm.fp8_tails_capacity = 0;
    matmul_alloc(mm, (void**)&mm.fp8_tails, (size_t)floats * sizeof(float), "the FP8 GEMM tail rows");
    mm.fp8_tails_capacity = floats;
    return mm.fp8_tails;
}

// The three FP8 buffers grown to their sizes for GEMMs of up to `casts` elements (matmul_fp8_sizes)
inline void matmul_fp8_reserve(Matmul& mm, MatmulCasts casts) {
    const auto sizes = matmul_fp8_sizes(casts);
    for (int i = 0; i < 3; i++) matmul_fp8_buffer(mm, i, sizes[i][0], sizes[i][1]);
    matmul_fp8_tails(mm, casts.fp8_tails);
}

// casts: the largest input and output gradient any BF16 call will cast; {0, 0} for FP32-only use. With fp8 the FP8
// buffers are allocated too, for casts.fp8_inputs and casts.output_grads; matmul_reserve grows them.
inline void matmul_create(Matmul& mm, cudaStream_t stream, MatmulCasts casts, bool fp8 = false) {
    if (mm.handle || mm.workspace) matmul_destroy(mm);
    mm = Matmul{};
    mm.stream = mm.streams[0] = stream;
    for (int i = 1; i < MATMUL_STREAMS; i++) CUDA_CHECK(cudaStreamCreateWithFlags(&mm.streams[i], cudaStreamNonBlocking));
    for (cudaEvent_t& e : mm.stream_events) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUBLAS_CHECK(cublasLtCreate(&mm.handle));
    matmul_alloc(mm, &mm.workspace, MATMUL_STREAMS * MATMUL_WORKSPACE_BYTES, "the cuBLASLt workspaces");
    mm.workspace_bytes = MATMUL_WORKSPACE_BYTES;
    if (casts.inputs > 0 || casts.output_grads > 0) matmul_alloc_casts(mm, casts);
    mm.fp8_enabled = fp8;
    if (fp8) matmul_fp8_reserve(mm, casts);
}

// Grows the buffers to at least casts: the routed experts' rows grow with the routing. An FP32-only Matmul keeps
// none. Waits for mm's stream first: queued casts and GEMMs may still read the old buffers. Throws as matmul_create.
inline void matmul_reserve(Matmul& mm, MatmulCasts casts) {
    if (mm.fp8_enabled) matmul_fp8_reserve(mm, casts);
    const MatmulCasts have = mm.cast_capacity;
    const bool fp32_only = have.inputs + have.output_grads == 0;
    if (fp32_only || (casts.inputs <= have.inputs && casts.output_grads <= have.output_grads)) return;
    CUDA_CHECK(cudaStreamSynchronize(mm.stream));
    CUDA_CHECK(cudaFree(mm.cast_a));
    CUDA_CHECK(cudaFree(mm.cast_b));
    mm.cast_a = mm.cast_b = nullptr;
    mm.cast_capacity = MatmulCasts{};
    matmul_alloc_casts(mm, {std::max(casts.inputs, have.inputs), std::max(casts.output_grads, have.output_grads)});
}

// The one cuBLASLt call everything goes through, in column-major terms (docs/design.md §7.2)

// The largest power of two (at most 256) that divides the address.
inline uint32_t matmul_pointer_alignment(const void* p) {
    const uintptr_t a = (uintptr_t)p, low = a & (~a + 1);
    return low == 0 || low >= 256 ? 256u : (uint32_t)low;
}

// Names the row-major call in error messages.
struct MatmulSite {
    const char* name;
    int64_t M, K, N;
};

// One GEMM in column-major terms: D (m, n, ld ldd, FP32) (=|+=) op(A) (m, k) op(B) (k, n), A and B of `type`, stored
// A: ta ? (k, m) : (m, k), B: tb ? (n, k) : (k, n), column-major with the given ld; FP8 with their scales. The
// activations' rows (the M of the row-major call, which changes with the routing) are n, or k in a weight gradient.
struct MatmulProblem {
    GemmType type;
    bool ta, tb;
    int64_t m, n, k;
    const void* A;
    int64_t lda;
    const void* B;
    int64_t ldb;
    float* D;
    int64_t ldd;
    Fp8Scales scales;
    bool rows_in_k = false;
};

// The problem's key with its rows rounded up to a power of two (at least 16), and any leading dimension that must
// hold them: the problem the heuristic is asked for, so that one algorithm serves every row count of a size class.
inline MatmulKey matmul_rows_class(MatmulKey key, const MatmulProblem& q) {
    const int64_t rows = q.rows_in_k ? q.k : q.n;
    int64_t rounded = 16;
    while (rounded < rows) rounded *= 2;
    key[q.rows_in_k ? 5 : 4] = rounded;
    if (q.rows_in_k && q.ta) key[6] = std::max(key[6], rounded);  // A stored (k, m): lda holds the rows
    if (q.rows_in_k != q.tb) key[7] = std::max(key[7], rounded);  // B stored (k, n) or (n, k): ldb holds them
    return key;
}

// The column-major layouts of A, B and D for a problem's key (matmul_plan)
inline void matmul_layouts(cudaDataType_t in_type, const MatmulKey& key, cublasLtMatrixLayout_t* a,
                           cublasLtMatrixLayout_t* b, cublasLtMatrixLayout_t* d) {
    const bool ta = key[1], tb = key[2];
    const int64_t m = key[3], n = key[4], k = key[5];
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(a, in_type, ta ? k : m, ta ? m : k, key[6]));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(b, in_type, tb ? n : k, tb ? k : n, key[7]));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(d, CUDA_R_32F, m, n, key[8]));
}

// The heuristic's one choice for the layouts a, b, d with p's descriptor, the workspace and the alignments of the
// key's pointers. Not SUCCESS: the library's refusal (NOT_SUPPORTED: no algorithm).
inline cublasStatus_t matmul_heuristic(Matmul& mm, const MatmulPlan& p, cublasLtMatrixLayout_t a,
                                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, const MatmulKey& key,
                                       cublasLtMatmulHeuristicResult_t* result) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t workspace = mm.workspace_bytes;
    const uint32_t align_a = (uint32_t)key[9], align_b = (uint32_t)key[10], align_d = (uint32_t)key[11];
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof(workspace)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                      sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                      sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                      sizeof(align_d)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                      sizeof(align_d)));
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(mm.handle, p.desc, a, b, d, d, pref, 1, result, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (status == CUBLAS_STATUS_SUCCESS && (found == 0 || result->state != CUBLAS_STATUS_SUCCESS))
        status = found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : result->state;
    return status;
}

// The cached plan of a problem, made on first sight. No algorithm, or a failing heuristic, ends the program with the
// problem reported. With fp8_optional an FP8 refusal instead returns found == false: cached, said once, run in BF16.
inline const MatmulPlan& matmul_plan(Matmul& mm, const MatmulSite& site, const MatmulProblem& q,
                                     bool fp8_optional = false) {
    const bool fp8 = q.type == GemmType::FP8;
    const uint32_t align_a = matmul_pointer_alignment(q.A), align_b = matmul_pointer_alignment(q.B),
                   align_d = matmul_pointer_alignment(q.D);
    const int64_t kind = (int64_t)q.type * 4 + (fp8 && q.scales.a_blocks) * 2 + (fp8 && q.scales.b_blocks);
    const MatmulKey key{kind, q.ta, q.tb, q.m, q.n, q.k, q.lda, q.ldb, q.ldd, align_a, align_b, align_d};
    auto it = mm.cache.find(key);
    if (it != mm.cache.end()) return it->second;
    const char* type_name = fp8                         ? "FP8"
                            : q.type == GemmType::BF16 ? "BF16"
                            : q.type == GemmType::TF32 ? "TF32"
                                                       : "FP32";
    auto report = [&](const char* what, cublasStatus_t status, const char* consequence) {  // the whole problem
        fprintf(stderr,
                "cuBLASLt: %s (%s) for %s (M=%ld K=%ld N=%ld, %s inputs): column-major m=%ld n=%ld k=%ld op(A)=%c "
                "op(B)=%c ld %ld/%ld/%ld, alignment A %u B %u D %u bytes; CUBLASLT_LOG_LEVEL=2 says more; %s\n",
                what, cublasLtGetStatusName(status), site.name, (long)site.M, (long)site.K, (long)site.N, type_name,
                (long)q.m, (long)q.n, (long)q.k, q.ta ? 'T' : 'N', q.tb ? 'T' : 'N', (long)q.lda, (long)q.ldb,
                (long)q.ldd, align_a, align_b, align_d, consequence);
    };
    if (mm.cache.size() >= MATMUL_CACHE_MAX) matmul_clear_cache(mm);
    const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : q.type == GemmType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasOperation_t op_a = q.ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = q.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    MatmulPlan p;
    const cublasComputeType_t compute = q.type == GemmType::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (fp8) {  // per-tile scales; FAST_ACCUM stays off (its default): the sums are promoted to FP32 as they go
        const int32_t mode_a = q.scales.a_blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        const int32_t mode_b = q.scales.b_blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
        // the heuristic sees this problem's scales (null would mean "no scaling"); each call sets its own again
        set_scale_pointers(p.desc, q.scales);
    }
    matmul_layouts(in_type, key, &p.a, &p.b, &p.d);
    // The algorithm of the problem's size class (its rows rounded up: matmul_rows_class), if cuBLASLt takes it for
    // this problem; else the heuristic's choice for this problem itself. Either is a function of the problem alone.
    const MatmulKey rows_class = matmul_rows_class(key, q);
    auto known = mm.algos.find(rows_class);
    if (known == mm.algos.end()) {
        cublasLtMatrixLayout_t a, b, d;
        matmul_layouts(in_type, rows_class, &a, &b, &d);
        cublasLtMatmulHeuristicResult_t result{};
        const bool found = matmul_heuristic(mm, p, a, b, d, key, &result) == CUBLAS_STATUS_SUCCESS;
        for (cublasLtMatrixLayout_t l : {a, b, d}) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(l));
        known = mm.algos.emplace(rows_class, MatmulAlgo{result.algo, found}).first;
    }
    cublasLtMatmulHeuristicResult_t check{};
    if (known->second.found &&
        cublasLtMatmulAlgoCheck(mm.handle, p.desc, p.a, p.b, p.d, p.d, &known->second.algo, &check) ==
            CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= mm.workspace_bytes) {
        p.algo = known->second.algo;
        p.found = true;
        return mm.cache.emplace(key, p).first->second;
    }
    cublasLtMatmulHeuristicResult_t result{};
    const cublasStatus_t status = matmul_heuristic(mm, p, p.a, p.b, p.d, key, &result);
    const bool none = status == CUBLAS_STATUS_NOT_SUPPORTED;
    // a refusal: no algorithm, or INVALID_VALUE, which the library may answer for an FP8 shape it does not take
    const bool refused = none || status == CUBLAS_STATUS_INVALID_VALUE;
    if (refused && fp8 && fp8_optional) {
        mm.fp8_refused++;
        report("no FP8 algorithm", status, "this product runs in BF16 (said once per shape)");
        return mm.cache.emplace(key, p).first->second;
    }
    if (status != CUBLAS_STATUS_SUCCESS) {
        report(none ? "no algorithm" : "the heuristic failed", status, "exiting");
        exit(1);
    }
    p.algo = result.algo;
    p.found = true;
    return mm.cache.emplace(key, p).first->second;
}

// Queues the problem on stream `on` of mm.streams. k = 0 is an empty sum: D = 0, or D unchanged when accumulating.
inline void matmul_lt(Matmul& mm, int on, const MatmulSite& site, const MatmulProblem& q, bool accumulate) {
    if (q.m == 0 || q.n == 0) return;
    const cudaStream_t stream = mm.streams[on];
    if (q.k == 0) {
        if (!accumulate)
            CUDA_CHECK(cudaMemset2DAsync(q.D, (size_t)q.ldd * sizeof(float), 0, (size_t)q.m * sizeof(float),
                                         (size_t)q.n, stream));
        return;
    }
    const MatmulPlan& p = matmul_plan(mm, site, q);
    if (q.type == GemmType::FP8) set_scale_pointers(p.desc, q.scales);  // the only per-call attributes
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    void* workspace = (char*)mm.workspace + (size_t)on * mm.workspace_bytes;
    const cublasStatus_t status = cublasLtMatmul(mm.handle, p.desc, &alpha, q.A, p.a, q.B, p.b, &beta, q.D, p.d, q.D,
                                                 p.d, &p.algo, workspace, mm.workspace_bytes, stream);
    if (status != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr,
                "cuBLASLt: cublasLtMatmul failed (%s) for %s (M=%ld K=%ld N=%ld): column-major m=%ld n=%ld k=%ld\n",
                cublasLtGetStatusName(status), site.name, (long)site.M, (long)site.K, (long)site.N, (long)q.m,
                (long)q.n, (long)q.k);
        exit(1);
    }
}

// Casts n floats into mm's BF16 buffer of inputs or of output gradients; more than the caller sized is an error.
inline const __nv_bfloat16* matmul_cast(Matmul& mm, bool output_grad, const float* src, int64_t n,
                                        const MatmulSite& site, const char* operand) {
    __nv_bfloat16* buffer = output_grad ? mm.cast_b : mm.cast_a;
    const int64_t capacity = output_grad ? mm.cast_capacity.output_grads : mm.cast_capacity.inputs;
    if (n > capacity || buffer == nullptr) {
        fprintf(stderr,
                "internal error: %s (M=%ld K=%ld N=%ld): the BF16 cast of %s needs %ld elements, the Matmul holds "
                "%ld\n",
                site.name, (long)site.M, (long)site.K, (long)site.N, operand, (long)n, (long)capacity);
        exit(1);
    }
    cast_to_bf16(buffer, src, n, mm.stream);
    return buffer;
}

// The three products as problems (docs/design.md §7.2): A and B are FP32 or BF16 as `type` says; D is FP32.
inline MatmulProblem gemm_forward_problem(GemmType type, float* out, const void* inp, const void* W, int64_t M,
                                          int64_t K, int64_t N) {
    return {type, /*ta*/ true, /*tb*/ false, N, M, K, W, K, inp, K, out, N, {}};
}
inline MatmulProblem gemm_dinp_problem(GemmType type, float* dinp, const void* dout, const void* W, int64_t M,
                                       int64_t K, int64_t N) {
    return {type, false, false, K, M, N, W, K, dout, N, dinp, K, {}};
}
inline MatmulProblem gemm_dW_problem(GemmType type, float* dW, const void* dout, const void* inp, int64_t M, int64_t K,
                                     int64_t N) {
    return {type, false, true, K, N, M, inp, K, dout, N, dW, K, {}, /*rows_in_k*/ true};
}

// The same three in FP8, "TN" on the copies stored with the summed dimension contiguous (docs/design.md §7.3).
// Every summed dimension (K, N, Mp) must be a multiple of 16; gpu_model_init checks the model's widths.
inline MatmulProblem fp8_forward_problem(float* out, const __nv_fp8_storage_t* inp, const float* inp_scales,
                                         const Fp8Weight& W, int64_t M, int64_t K, int64_t N) {
    return {GemmType::FP8, true, false, N, M, K, W.q, K, inp, K, out, N, {W.scales, inp_scales, true, false}};
}
inline MatmulProblem fp8_dinp_problem(float* dinp, const __nv_fp8_storage_t* dout, const float* dout_scales,
                                      const Fp8Weight& W, int64_t M, int64_t K, int64_t N) {
    return {GemmType::FP8, true, false, K, M, N, W.qt, N, dout, N, dinp, K, {W.scales_t, dout_scales, true, false}};
}
inline MatmulProblem fp8_dW_problem(float* dW, const __nv_fp8_storage_t* dout_t, const float* dout_t_scales,
                                    const __nv_fp8_storage_t* inp_t, const float* inp_t_scales, int64_t Mp, int64_t K,
                                    int64_t N) {
    const Fp8Scales scales{inp_t_scales, dout_t_scales, false, false};
    return {GemmType::FP8, true, false, K, N, Mp, inp_t, Mp, dout_t, Mp, dW, K, scales, /*rows_in_k*/ true};
}
// Whether cuBLASLt takes an FP8 problem (an empty one trivially)
inline bool fp8_takes(Matmul& mm, const MatmulSite& s, const MatmulProblem& q) {
    return q.m == 0 || q.n == 0 || q.k == 0 || matmul_plan(mm, s, q, /*fp8_optional*/ true).found;
}

// Block-scaled FP8 GEMMs take row counts (the forward's and input gradient's n) that are multiples of 4. So M rows
// are quantized as the first M4 = M rounded down to 4 and then the last M % 4 padded with zero rows to 4
// (fp8_split_rows_of); rows [0, M4) go straight into the output, the padded block's product into 4 rows of
// mm.fp8_tails, from where its M % 4 real rows are copied (or added) into place.
struct Fp8RowProducts {
    MatmulProblem head, tail;  // tail.n == 0 when M is a multiple of 4
    float* tail_to;            // where the tail's rows go in the output
    int64_t tail_values;       // (M % 4) x the output's width
};
// product(out, q, scales, rows): the problem for `rows` quantized rows; q and scales as fp8_split_rows_of left them
template <typename Product>
inline Fp8RowProducts fp8_row_products(Product&& product, float* out, float* tail, int64_t M, int64_t cols,
                                       int64_t width, const __nv_fp8_storage_t* q, const float* scales) {
    const int64_t head = M / 4 * 4;
    return {product(out, q, scales, head),
            product(tail, q + head * cols, scales + fp8_vec128_scales(head, cols), M > head ? 4 : 0),
            out + head * width, (M - head) * width};
}
inline bool fp8_takes(Matmul& mm, const MatmulSite& s, const Fp8RowProducts& p) {
    return fp8_takes(mm, s, p.head) && fp8_takes(mm, s, p.tail);
}

static __global__ void fp8_tail_rows_kernel(float* out, const float* tail, int64_t n, bool accumulate) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = accumulate ? out[i] + tail[i] : tail[i];
}
// Queues both products on stream `on`, then the tail's rows into place
inline void fp8_row_matmul(Matmul& mm, int on, const MatmulSite& s, const Fp8RowProducts& p, bool accumulate) {
    matmul_lt(mm, on, s, p.head, accumulate);
    if (p.tail_values == 0) return;
    matmul_lt(mm, on, s, p.tail, false);
    launch_kernel(fp8_tail_rows_kernel, (unsigned)ceil_div(p.tail_values, MATMUL_CAST_THREADS), MATMUL_CAST_THREADS,
                  0, mm.streams[on], p.tail_to, p.tail.D, p.tail_values, accumulate);
}

// Rows [first, first + rows) of a GEMM input or output gradient, `cols` wide, quantized from its FP32 rows when it
// has them (what the CPU quantizes), else from its BF16 copy.
inline void fp8_rows_of(const GemmInput& x, int64_t first, int64_t rows, int64_t cols, __nv_fp8_storage_t* q,
                        float* scales, cudaStream_t stream) {
    if (x.fp32)
        fp8_quantize_rows(q, scales, x.fp32 + first * cols, rows, cols, stream);
    else
        fp8_quantize_rows(q, scales, x.bf16 + first * cols, rows, cols, stream);
}
// Rows [first, first + M) of x quantized for fp8_row_products: round_up(M, 4) rows of q, fp8_vec128_scales(M, cols)
inline void fp8_split_rows_of(const GemmInput& x, int64_t first, int64_t M, int64_t cols, __nv_fp8_storage_t* q,
                              float* scales, cudaStream_t stream) {
    const int64_t head = M / 4 * 4;
    fp8_rows_of(x, first, head, cols, q, scales, stream);
    if (M > head)
        fp8_rows_of(x, first + head, M - head, cols, q + head * cols, scales + fp8_vec128_scales(head, cols), stream);
}
inline void fp8_cols_of(const GemmInput& x, int64_t first, int64_t rows, int64_t cols, __nv_fp8_storage_t* qt,
                        float* scales, cudaStream_t stream) {
    if (x.fp32)
        fp8_quantize_cols(qt, scales, x.fp32 + first * cols, rows, cols, fp8_padded_rows(rows), stream);
    else
        fp8_quantize_cols(qt, scales, x.bf16 + first * cols, rows, cols, fp8_padded_rows(rows), stream);
}

// The API

// The BF16 rows of x (width wide) from row `first` on (n elements): the caller's copy, or a cast into the buffer of
// inputs or, for an output gradient, of output gradients.
inline const __nv_bfloat16* matmul_bf16_rows(Matmul& mm, const GemmInput& x, int64_t first, int64_t width, int64_t n,
                                             const MatmulSite& site, bool output_grad = false) {
    return x.bf16 ? x.bf16 + first * width
                  : matmul_cast(mm, output_grad, x.fp32 + first * width, n, site, output_grad ? "dout" : "inp");
}
// The FP32 rows of inp, for an FP32 GEMM: they must be there.
inline const float* matmul_input_fp32(const GemmInput& inp, const MatmulSite& site) {
    if (!inp.fp32) {
        fprintf(stderr, "internal error: %s (M=%ld K=%ld N=%ld): an FP32 GEMM given an operand only in BF16\n",
                site.name, (long)site.M, (long)site.K, (long)site.N);
        exit(1);
    }
    return inp.fp32;
}

// out (M, N) (=|+=) inp (M, K) @ W^T, W (N, K), in W's precision (GemmWeight).
inline void matmul_forward(Matmul& mm, float* out, GemmInput inp, const GemmWeight& W, int64_t M, int64_t K, int64_t N,
                           bool accumulate) {
    if (M == 0) return;
    const MatmulSite s{"matmul_forward", M, K, N};
    GemmType type = W.type();
    if (type == GemmType::FP8) {
        const Fp8Buffer& q = matmul_fp8_buffer(mm, FP8_INPUT, round_up(M, 4) * K, fp8_vec128_scales(M, K));
        const Fp8RowProducts fp8 = fp8_row_products(
            [&](float* o, const __nv_fp8_storage_t* x, const float* x_scales, int64_t rows) {
                return fp8_forward_problem(o, x, x_scales, W.fp8, rows, K, N);
            },
            out, M % 4 ? matmul_fp8_tails(mm, 4 * N) : nullptr, M, K, N, q.values, q.scales);
        if (fp8_takes(mm, s, fp8)) {
            fp8_split_rows_of(inp, 0, M, K, q.values, q.scales, mm.stream);
            fp8_row_matmul(mm, 0, s, fp8, accumulate);
            return;
        }
        type = GemmType::BF16;
        mm.fp8_in_bf16++;
    }
    const void* x = type == GemmType::BF16 ? (const void*)matmul_bf16_rows(mm, inp, 0, K, M * K, s)
                                           : (const void*)matmul_input_fp32(inp, s);
    const void* w = type == GemmType::BF16 ? (const void*)W.bf16 : (const void*)W.fp32;
    matmul_lt(mm, 0, s, gemm_forward_problem(type, out, x, w, M, K, N), accumulate);
}

// dinp (M, K) (=|+=) dout (M, N) @ W (skipped when dinp is nullptr); dW (N, K) (=|+=) dout^T @ inp (with M = 0,
// = sets dW to zero).
inline void matmul_backward(Matmul& mm, float* dinp, float* dW, GemmInput dout, GemmInput inp, const GemmWeight& W,
                            int64_t M, int64_t K, int64_t N, bool accumulate_dinp, bool accumulate_dW = true) {
    if (M == 0) {
        if (!accumulate_dW) CUDA_CHECK(cudaMemsetAsync(dW, 0, N * K * sizeof(float), mm.stream));
        return;
    }
    const MatmulSite s{"matmul_backward", M, K, N};
    GemmType type = W.type();
    bool dinp_left = dinp != nullptr, dW_left = true;  // the products still to run
    if (type == GemmType::FP8) {
        if (dinp) {
            const Fp8Buffer& g = matmul_fp8_buffer(mm, FP8_GRAD_ROWS, round_up(M, 4) * N, fp8_vec128_scales(M, N));
            const Fp8RowProducts fp8 = fp8_row_products(
                [&](float* o, const __nv_fp8_storage_t* grad, const float* grad_scales, int64_t rows) {
                    return fp8_dinp_problem(o, grad, grad_scales, W.fp8, rows, K, N);
                },
                dinp, M % 4 ? matmul_fp8_tails(mm, 4 * K) : nullptr, M, N, K, g.values, g.scales);
            if (fp8_takes(mm, s, fp8)) {
                fp8_split_rows_of(dout, 0, M, N, g.values, g.scales, mm.stream);
                fp8_row_matmul(mm, 0, s, fp8, accumulate_dinp);
                dinp_left = false;
            }
        }
        const int64_t Mp = fp8_padded_rows(M);
        const Fp8Buffer& gt = matmul_fp8_buffer(mm, FP8_GRAD_T, N * Mp, fp8_vec128_scales(N, Mp));
        const Fp8Buffer& xt = matmul_fp8_buffer(mm, FP8_INPUT, K * Mp, fp8_vec128_scales(K, Mp));
        const MatmulProblem fp8 = fp8_dW_problem(dW, gt.values, gt.scales, xt.values, xt.scales, Mp, K, N);
        if (fp8_takes(mm, s, fp8)) {
            fp8_cols_of(dout, 0, M, N, gt.values, gt.scales, mm.stream);
            fp8_cols_of(inp, 0, M, K, xt.values, xt.scales, mm.stream);
            matmul_lt(mm, 0, s, fp8, accumulate_dW);
            dW_left = false;
        }
        type = GemmType::BF16;  // what is left, cuBLASLt refused in FP8
        mm.fp8_in_bf16 += dinp_left + dW_left;
    }
    if (!dinp_left && !dW_left) return;
    const bool bf16 = type == GemmType::BF16;
    const void* g = bf16 ? (const void*)matmul_bf16_rows(mm, dout, 0, N, M * N, s, /*output_grad*/ true)
                         : (const void*)matmul_input_fp32(dout, s);
    if (dinp_left)
        matmul_lt(mm, 0, s, gemm_dinp_problem(type, dinp, g, bf16 ? (const void*)W.bf16 : W.fp32, M, K, N),
                  accumulate_dinp);
    if (dW_left) {
        const void* x =
            bf16 ? (const void*)matmul_bf16_rows(mm, inp, 0, K, M * K, s) : (const void*)matmul_input_fp32(inp, s);
        matmul_lt(mm, 0, s, gemm_dW_problem(type, dW, g, x, M, K, N), accumulate_dW);
    }
}

}  // namespace gpu
