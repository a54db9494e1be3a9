// Kernel emulator (see emulator.h): a CPU model of the part of cuBLASLt that kernels/matmul.cuh calls, written from
// cuBLASLt's documented semantics, so that the emulated builds run the real kernels/matmul.cuh (its row-major to
// column-major mapping, BF16 casts, grouped calls and their streams) against the CPU reference. Not fast, and it says
// nothing about which algorithm the library picks or how fast it runs.
//
// cublasLtMatmul: D = alpha op(A) op(B) + beta C, every matrix column-major (element (i, j) of a layout with
// leading dimension ld at i + j ld), op = identity or transpose as the descriptor's TRANSA / TRANSB say; m and n are
// D's rows and columns, k the columns of op(A). When beta is 0, C is not read (a NaN there does not propagate).
// Products in double, rounded once to FP32 (the library's FP32 accumulation differs only by roundoff). It is queued
// on the stream like a kernel and runs when the stream does.
// Supported, as matmul.cuh uses them: A and B both CUDA_R_32F, both CUDA_R_16BF or both CUDA_R_8F_E4M3, C and D
// CUDA_R_32F, compute CUBLAS_COMPUTE_32F with CUDA_R_32F scales, or CUBLAS_COMPUTE_32F_FAST_TF32 with CUDA_R_32F
// inputs, which are rounded to TF32 (10-bit mantissa, to nearest, ties away from zero, as PTX's cvt.rna.tf32.f32;
// the library may truncate instead); anything else is CUBLAS_STATUS_NOT_SUPPORTED in the heuristic.
// E4M3 follows the FP8 rules of the documentation for Hopper: A transposed and B not ("TN"), k a multiple of 16 and
// m and n multiples of 4 (the block-scaled modes), leading dimensions multiples of 16 bytes and pointers,
// scale pointers included, 16-byte aligned (else NOT_SUPPORTED, INVALID_VALUE for a leading dimension, which the
// library may answer either way, or a contract violation for a pointer), and the block scaling modes DeepSeek's
// recipe needs: each of A and B scaled per 1 x 128 tile (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) or per 128 x 128
// block (..._BLK128x128_32F), not both per block. BF16 and FP32 pointers are aligned to their element at least.
// Element (i, l) of op(A) is its E4M3 value times its scale, with the scales laid out as kernels/fp8.cuh writes them
// (the summed dimension split in 128s; VEC128: block b of row i at b * round_up(m, 4) + i; BLK128x128: block (i / 128,
// b) at (i / 128) * round_up(ceil(k / 128), 4) + b; B likewise with n): this model is what the emulated tests hold
// the layout to, and a GPU's test_gpu is what holds the model to the library.
// CUBLAS_STATUS_INVALID_VALUE, as from the library: layouts that disagree with each other and the ops, ld below the
// rows, C's layout not D's, an unknown attribute or an attribute of the wrong size. A contract violation (thrown, as
// the emulator does; on the GPU a fault or garbage): an operand or the workspace outside device memory, D overlapping
// A or B, a pointer less aligned than the minimum the heuristic was told, a workspace smaller than that maximum.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "counts.h"

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14, CUDA_R_8F_E4M3 = 28 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasLtMatmulDescAttributes_t {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
    CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,
    CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32,
};
enum cublasLtMatmulMatrixScale_t {
    CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0,
    CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4,
    CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5,
};
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
    const void *scale_a = nullptr, *scale_b = nullptr;
    int32_t scale_mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
            scale_mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
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

namespace stand_in {
// What cublasLtGetVersion reports (major * 10000 + minor * 100 + patch): CUDA 13.0's, unless a test says otherwise
inline size_t& cublaslt_version() {
    static size_t version = 130000;
    return version;
}
}  // namespace stand_in
inline size_t cublasLtGetVersion() { return stand_in::cublaslt_version(); }

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
// The operation and scale-mode attributes are int32_t, the scale pointers const void*.
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                     const void* buf, size_t size) {
    if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER || attr == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER) {
        if (size != sizeof(const void*)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? &desc->scale_a : &desc->scale_b, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE || attr == CUBLASLT_MATMUL_DESC_B_SCALE_MODE) {
        int32_t mode;
        if (size != sizeof(mode)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&mode, buf, sizeof(mode));
        (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE ? desc->scale_mode_a : desc->scale_mode_b) = mode;
        return CUBLAS_STATUS_SUCCESS;
    }
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
    cudaDataType_t type;
    bool tf32;  // FP32 inputs rounded to TF32
};
inline bool block_mode(int32_t mode) {
    return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}
inline cublasStatus_t problem(const cublasLtMatmulDescOpaque_t& desc, const cublasLtMatrixLayoutOpaque_t& a,
                              const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
                              const cublasLtMatrixLayoutOpaque_t& d, Problem* p) {
    const bool tf32 = desc.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a.type == CUDA_R_32F;
    if ((desc.compute != CUBLAS_COMPUTE_32F && !tf32) || desc.scale != CUDA_R_32F || a.type != b.type ||
        (a.type != CUDA_R_32F && a.type != CUDA_R_16BF && a.type != CUDA_R_8F_E4M3) || c.type != CUDA_R_32F ||
        d.type != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool ta = desc.op_a == CUBLAS_OP_T, tb = desc.op_b == CUBLAS_OP_T;
    if (a.type == CUDA_R_8F_E4M3) {
        const bool both_blocks = desc.scale_mode_a == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
                                 desc.scale_mode_b == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        if (!ta || tb || !block_mode(desc.scale_mode_a) || !block_mode(desc.scale_mode_b) || both_blocks)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        if (a.ld % 16 != 0 || b.ld % 16 != 0) return CUBLAS_STATUS_INVALID_VALUE;  // as "an impossible configuration"
    } else if (desc.scale_mode_a != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
               desc.scale_mode_b != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const uint64_t m = d.rows, n = d.cols, k = ta ? a.rows : a.cols;
    if (a.type == CUDA_R_8F_E4M3 && (k % 16 != 0 || m % 4 != 0 || n % 4 != 0)) return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool shapes_agree = (ta ? a.cols : a.rows) == m && (tb ? b.cols : b.rows) == k &&
                              (tb ? b.rows : b.cols) == n && c.rows == m && c.cols == n && c.ld == d.ld;
    const bool lds_fit = a.ld >= (int64_t)a.rows && b.ld >= (int64_t)b.rows && d.ld >= (int64_t)d.rows;
    if (!shapes_agree || !lds_fit) return CUBLAS_STATUS_INVALID_VALUE;
    *p = Problem{m, n, k, a.type, tf32};
    return CUBLAS_STATUS_SUCCESS;
}

// Bytes from the first to the last element of a layout.
inline int64_t extent_bytes(const cublasLtMatrixLayoutOpaque_t& l) {
    if (l.rows == 0 || l.cols == 0) return 0;
    const int64_t elements = (int64_t)(l.cols - 1) * l.ld + (int64_t)l.rows;
    return elements * (l.type == CUDA_R_8F_E4M3 ? 1 : l.type == CUDA_R_16BF ? 2 : 4);
}

inline void check_alignment(const void* p, uint64_t promised, const char* operand) {
    if ((uintptr_t)p % promised != 0)
        stand_in::violation(std::string("cublasLtMatmul: ") + operand + " is less aligned than the " +
                            std::to_string(promised) + " bytes the heuristic was told");
}

// x rounded to TF32: its low 13 mantissa bits dropped, to nearest, ties away from zero (Inf and NaN kept).
inline float tf32_round(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & ~0x1fffu;
    memcpy(&x, &bits, sizeof x);
    return x;
}

// Element (i, j) of a stored column-major matrix, as a double (E4M3 without its scale; FP32 rounded to TF32 if tf32).
EMULATOR_UNCHECKED inline double element(const void* p, cudaDataType_t type, int64_t ld, uint64_t i, uint64_t j,
                                         bool tf32 = false) {
    const int64_t at = (int64_t)i + (int64_t)j * ld;
    if (type == CUDA_R_8F_E4M3) return stand_in_e4m3_value(((const __nv_fp8_storage_t*)p)[at]);
    if (type == CUDA_R_16BF) return (double)__bfloat162float(((const __nv_bfloat16*)p)[at]);
    const float x = ((const float*)p)[at];
    return (double)(tf32 ? tf32_round(x) : x);
}

// An FP8 operand's scales: the scale of element (outer index i, summed index l) of op(A) (outer m) or op(B)^T
// (outer n), and how many floats the layout spans.
struct Scales {
    const float* at;
    int32_t mode;
    uint64_t outer, k;
    uint64_t blocks() const { return (k + 127) / 128; }
    uint64_t floats() const {
        return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? blocks() * ((outer + 3) / 4 * 4)
                                                               : (outer + 127) / 128 * ((blocks() + 3) / 4 * 4);
    }
    EMULATOR_UNCHECKED double of(uint64_t i, uint64_t l) const {
        return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? at[l / 128 * ((outer + 3) / 4 * 4) + i]
                                                               : at[i / 128 * ((blocks() + 3) / 4 * 4) + l / 128];
    }
};

// D = alpha op(A) op(B) + beta C, in double (see the top). Unchecked: it stands in for the library, not a kernel.
EMULATOR_UNCHECKED inline void multiply(const Problem& p, float al, float be, bool ta, bool tb, const void* A,
                                        int64_t lda, const void* B, int64_t ldb, const void* C, int64_t ldc, float* D,
                                        int64_t ldd, bool fp8, const Scales& scale_a, const Scales& scale_b) {
    // op(A) as rows of k, op(B)^T as rows of k: each output is a dot product of two contiguous rows. Plain pointers:
    // g++ does not inline the checked std::vector accessors into this unchecked function.
    std::vector<double> a_rows(p.m * p.k), b_rows(p.n * p.k);
    double *opa = a_rows.data(), *opb = b_rows.data();
    for (uint64_t i = 0; i < p.m; i++)
        for (uint64_t l = 0; l < p.k; l++)
            opa[i * p.k + l] = (ta ? element(A, p.type, lda, l, i, p.tf32) : element(A, p.type, lda, i, l, p.tf32)) *
                               (fp8 ? scale_a.of(i, l) : 1.0);
    for (uint64_t j = 0; j < p.n; j++)
        for (uint64_t l = 0; l < p.k; l++)
            opb[j * p.k + l] = (tb ? element(B, p.type, ldb, j, l, p.tf32) : element(B, p.type, ldb, l, j, p.tf32)) *
                               (fp8 ? scale_b.of(j, l) : 1.0);
    for (uint64_t j = 0; j < p.n; j++)
        for (uint64_t i = 0; i < p.m; i++) {
            const double *x = opa + i * p.k, *y = opb + j * p.k;
            double sums[4] = {0.0, 0.0, 0.0, 0.0};  // four chains: the adds' latency is what bounds the loop
            uint64_t l = 0;
            for (; l + 4 <= p.k; l += 4)
                for (int c = 0; c < 4; c++) sums[c] += x[l + c] * y[l + c];
            for (; l < p.k; l++) sums[0] += x[l] * y[l];
            const double sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
            const double c_ij = be == 0.0f ? 0.0 : be * element(C, CUDA_R_32F, ldc, i, j);
            ((float*)D)[(int64_t)i + (int64_t)j * ldd] = (float)(al * sum + c_ij);
        }
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
    emulator::count_work(emulator::Work::heuristic, "cublasLtMatmulAlgoGetHeuristic");
    results[0] = cublasLtMatmulHeuristicResult_t{};
    for (int i = 0; i < 4; i++) results[0].algo.data[i] = pref->min_alignment[i];
    results[0].algo.data[4] = pref->max_workspace;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// Whether algo (from the heuristic, for another problem) serves this one: it does whenever the problem is one the
// model takes, with the workspace the heuristic was told. The alignments the algorithm assumes are checked by
// cublasLtMatmul against the pointers.
inline cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              const cublasLtMatmulAlgo_t* algo,
                                              cublasLtMatmulHeuristicResult_t* result) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    emulated_cublaslt::Problem p;
    const cublasStatus_t status = emulated_cublaslt::problem(*desc, *a, *b, *c, *d, &p);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    emulator::count_work(emulator::Work::algo_check, "cublasLtMatmulAlgoCheck");
    *result = cublasLtMatmulHeuristicResult_t{};
    result->algo = *algo;
    result->workspaceSize = algo->data[4];
    result->state = CUBLAS_STATUS_SUCCESS;
    result->wavesCount = 1.0f;
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
    const bool fp8 = p.type == CUDA_R_8F_E4M3;
    const uint64_t element_bytes = fp8 ? 1 : p.type == CUDA_R_16BF ? 2 : 4;
    check_alignment(A, element_bytes, "A (its element)");
    check_alignment(B, element_bytes, "B (its element)");
    check_alignment(C, 4, "C (its element)");
    check_alignment(D, 4, "D (its element)");
    const Scales scale_a{(const float*)desc->scale_a, desc->scale_mode_a, p.m, p.k},
        scale_b{(const float*)desc->scale_b, desc->scale_mode_b, p.n, p.k};
    if (fp8) {
        if (!scale_a.at || !scale_b.at) return CUBLAS_STATUS_INVALID_VALUE;
        check_alignment(A, 16, "A (FP8)");
        check_alignment(B, 16, "B (FP8)");
        check_alignment(scale_a.at, 16, "A's scales");
        check_alignment(scale_b.at, 16, "B's scales");
        stand_in::check_range(scale_a.at, (int64_t)(scale_a.floats() * sizeof(float)), "cublasLtMatmul A scales");
        stand_in::check_range(scale_b.at, (int64_t)(scale_b.floats() * sizeof(float)), "cublasLtMatmul B scales");
    }
    float al, be;
    memcpy(&al, alpha, sizeof al);
    memcpy(&be, beta, sizeof be);
    const bool ta = desc->op_a == CUBLAS_OP_T, tb = desc->op_b == CUBLAS_OP_T;
    const uint64_t inputs = (p.m + p.n) * p.k * element_bytes + (fp8 ? (scale_a.floats() + scale_b.floats()) * 4 : 0);
    const char* call = fp8 ? "cublasLtMatmul fp8"
                       : element_bytes == 2 ? "cublasLtMatmul bf16"
                       : p.tf32             ? "cublasLtMatmul tf32"
                                            : "cublasLtMatmul fp32";
    emulator::count_work(emulator::Work::gemm, call,
                         (int64_t)(inputs + (be == 0.0f ? 0 : p.m * p.n * 4)), (int64_t)(p.m * p.n * 4),
                         2.0 * (double)p.m * (double)p.n * (double)p.k);
    const int64_t lda = a->ld, ldb = b->ld, ldc = c->ld, ldd = d->ld;
    stand_in::launch(stream, [=] {
        emulated_cublaslt::multiply(p, al, be, ta, tb, A, lda, B, ldb, C, ldc, (float*)D, ldd, fp8, scale_a, scale_b);
    });
    return CUBLAS_STATUS_SUCCESS;
}
