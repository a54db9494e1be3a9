// Kernel emulator (see emulator.h): a CPU model of the part of cuBLASLt that kernels/matmul.cuh calls, written from
// cuBLASLt's documented semantics, so that the emulated builds run the real kernels/matmul.cuh (its row-major to
// column-major mapping, BF16 casts, grouped calls and lanes) against the CPU reference. Not fast, and it says
// nothing about which algorithm the library picks or how fast it runs.
//
// cublasLtMatmul: D = alpha op(A) op(B) + beta C, every matrix column-major (element (i, j) of a layout with
// leading dimension ld at i + j ld), op = identity or transpose as the descriptor's TRANSA / TRANSB say; m and n are
// D's rows and columns, k the columns of op(A). When beta is 0, C is not read (a NaN there does not propagate).
// Products in double, rounded once to FP32 (the library's FP32 accumulation differs only by roundoff). It is queued
// on the stream like a kernel and runs when the stream does.
// Supported, as matmul.cuh uses them: A and B both CUDA_R_32F or both CUDA_R_16BF, C and D CUDA_R_32F, compute
// CUBLAS_COMPUTE_32F with CUDA_R_32F scales; anything else is CUBLAS_STATUS_NOT_SUPPORTED in the heuristic.
// CUBLAS_STATUS_INVALID_VALUE, as from the library: layouts that disagree with each other and the ops, ld below the
// rows, C's layout not D's, an unknown attribute or an attribute of the wrong size. A contract violation (thrown, as
// the stand-ins do; on the GPU a fault or garbage): an operand or the workspace outside device memory, D overlapping
// A or B, a pointer less aligned than the minimum the heuristic was told, a workspace smaller than that maximum.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasLtMatmulDescAttributes_t { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 };
enum cublasLtMatmulPreferenceAttributes_t {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

struct cublasLtContext {
    int live_descriptors = 0;
};
typedef cublasLtContext* cublasLtHandle_t;
struct cublasLtMatmulDescOpaque_t {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
};
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
struct cublasLtMatmulPreferenceOpaque_t {
    uint64_t max_workspace = 0;
    uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's default assumption
};
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;
// What the heuristic promised for: data[0..3] the minimum alignments of A, B, C, D, data[4] the maximum workspace.
struct cublasLtMatmulAlgo_t {
    uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
};

inline const char* cublasLtGetStatusName(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}
inline const char* cublasLtGetStatusString(cublasStatus_t s) { return cublasLtGetStatusName(s); }

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    *handle = new cublasLtContext;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
    *desc = new cublasLtMatmulDescOpaque_t{compute, scale};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}
// The operation attributes are int32_t (cublasOperation_t).
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                     const void* buf, size_t size) {
    int32_t op;
    if (size != sizeof(op)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&op, buf, sizeof(op));
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA) desc->op_a = (cublasOperation_t)op;
    else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) desc->op_b = (cublasOperation_t)op;
    else return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    *pref = new cublasLtMatmulPreferenceOpaque_t;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}
// MAX_WORKSPACE_BYTES is a uint64_t, the alignments uint32_t.
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                           size_t size) {
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&pref->max_workspace, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    const int index = (int)attr - (int)CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
    if (index < 0 || index > 3 || size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&pref->min_alignment[index], buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

namespace emulated_cublaslt {

// The problem a descriptor and four layouts describe, or INVALID_VALUE / NOT_SUPPORTED.
struct Problem {
    uint64_t m, n, k;
    bool bf16;
};
inline cublasStatus_t problem(const cublasLtMatmulDescOpaque_t& desc, const cublasLtMatrixLayoutOpaque_t& a,
                              const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
                              const cublasLtMatrixLayoutOpaque_t& d, Problem* p) {
    if (desc.compute != CUBLAS_COMPUTE_32F || desc.scale != CUDA_R_32F || a.type != b.type ||
        (a.type != CUDA_R_32F && a.type != CUDA_R_16BF) || c.type != CUDA_R_32F || d.type != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool ta = desc.op_a == CUBLAS_OP_T, tb = desc.op_b == CUBLAS_OP_T;
    const uint64_t m = d.rows, n = d.cols, k = ta ? a.rows : a.cols;
    const bool shapes_agree = (ta ? a.cols : a.rows) == m && (tb ? b.cols : b.rows) == k &&
                              (tb ? b.rows : b.cols) == n && c.rows == m && c.cols == n && c.ld == d.ld;
    const bool lds_fit = a.ld >= (int64_t)a.rows && b.ld >= (int64_t)b.rows && d.ld >= (int64_t)d.rows;
    if (!shapes_agree || !lds_fit) return CUBLAS_STATUS_INVALID_VALUE;
    *p = Problem{m, n, k, a.type == CUDA_R_16BF};
    return CUBLAS_STATUS_SUCCESS;
}

// Bytes from the first to the last element of a layout.
inline int64_t extent_bytes(const cublasLtMatrixLayoutOpaque_t& l) {
    if (l.rows == 0 || l.cols == 0) return 0;
    const int64_t elements = (int64_t)(l.cols - 1) * l.ld + (int64_t)l.rows;
    return elements * (l.type == CUDA_R_16BF ? 2 : 4);
}

inline void check_alignment(const void* p, uint64_t promised, const char* operand) {
    if ((uintptr_t)p % promised != 0)
        stand_in::violation(std::string("cublasLtMatmul: ") + operand + " is less aligned than the " +
                            std::to_string(promised) + " bytes the heuristic was told");
}

// Element (i, j) of a stored column-major matrix, as a double.
inline double element(const void* p, bool bf16, int64_t ld, uint64_t i, uint64_t j) {
    const int64_t at = (int64_t)i + (int64_t)j * ld;
    return bf16 ? (double)__bfloat162float(((const __nv_bfloat16*)p)[at]) : (double)((const float*)p)[at];
}

}  // namespace emulated_cublaslt

inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                     cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                     cublasLtMatmulPreference_t pref, int requested,
                                                     cublasLtMatmulHeuristicResult_t* results, int* found) {
    *found = 0;
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    emulated_cublaslt::Problem p;
    const cublasStatus_t status = emulated_cublaslt::problem(*desc, *a, *b, *c, *d, &p);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    results[0] = cublasLtMatmulHeuristicResult_t{};
    for (int i = 0; i < 4; i++) results[0].algo.data[i] = pref->min_alignment[i];
    results[0].algo.data[4] = pref->max_workspace;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                     const void* A, cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b,
                                     const void* beta, const void* C, cublasLtMatrixLayout_t c, void* D,
                                     cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
    using namespace emulated_cublaslt;
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    Problem p;
    const cublasStatus_t status = problem(*desc, *a, *b, *c, *d, &p);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
    if (algo) {
        check_alignment(A, algo->data[0], "A");
        check_alignment(B, algo->data[1], "B");
        check_alignment(C, algo->data[2], "C");
        check_alignment(D, algo->data[3], "D");
        if (workspace_bytes < algo->data[4])
            stand_in::violation("cublasLtMatmul: a workspace of " + std::to_string(workspace_bytes) +
                                " bytes, the heuristic was promised " + std::to_string(algo->data[4]));
    }
    stand_in::check_range(workspace, (int64_t)workspace_bytes, "cublasLtMatmul workspace");
    stand_in::check_range(A, extent_bytes(*a), "cublasLtMatmul A");
    stand_in::check_range(B, extent_bytes(*b), "cublasLtMatmul B");
    stand_in::check_range(C, extent_bytes(*c), "cublasLtMatmul C");
    stand_in::check_range(D, extent_bytes(*d), "cublasLtMatmul D");
    stand_in::apart("cublasLtMatmul", {{D, extent_bytes(*d), "D"}},
                    {{A, extent_bytes(*a), "A"}, {B, extent_bytes(*b), "B"}});
    float al, be;
    memcpy(&al, alpha, sizeof al);
    memcpy(&be, beta, sizeof be);
    const bool ta = desc->op_a == CUBLAS_OP_T, tb = desc->op_b == CUBLAS_OP_T;
    const int64_t lda = a->ld, ldb = b->ld, ldc = c->ld, ldd = d->ld;
    stand_in::launch(stream, [=] {
        // op(A) as rows of k, op(B)^T as rows of k: each output is a dot product of two contiguous rows
        std::vector<double> opa(p.m * p.k), opb(p.n * p.k);
        for (uint64_t i = 0; i < p.m; i++)
            for (uint64_t l = 0; l < p.k; l++)
                opa[i * p.k + l] = ta ? element(A, p.bf16, lda, l, i) : element(A, p.bf16, lda, i, l);
        for (uint64_t j = 0; j < p.n; j++)
            for (uint64_t l = 0; l < p.k; l++)
                opb[j * p.k + l] = tb ? element(B, p.bf16, ldb, j, l) : element(B, p.bf16, ldb, l, j);
        for (uint64_t j = 0; j < p.n; j++)
            for (uint64_t i = 0; i < p.m; i++) {
                double sum = 0.0;
                for (uint64_t l = 0; l < p.k; l++) sum += opa[i * p.k + l] * opb[j * p.k + l];
                const double c_ij = be == 0.0f ? 0.0 : be * element(C, false, ldc, i, j);
                ((float*)D)[(int64_t)i + (int64_t)j * ldd] = (float)(al * sum + c_ij);
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}
