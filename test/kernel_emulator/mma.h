// Kernel emulator (see emulator.h): the warp matrix functions of CUDA's <mma.h> (nvcuda::wmma) for 16 x 16 x 16
// tiles with BF16 inputs and FP32 accumulators, the ones kernels/ uses.
// CUDA leaves the mapping of a tile's elements to the fragments of the 32 lanes unspecified: a kernel may only load,
// store, fill and multiply fragments, apply the same operation to every element, or learn each element's place
// from a fragment loaded from a known matrix (attention_bf16.cuh's row-index fragment). So here every lane holds
// the whole tile (element (r, c) at x[r * 16 + c]) and does the whole product itself: each lane ends with what the
// warp as a whole holds on the GPU. A store writes only the lane's share, as on the GPU each lane writes its own
// elements: a lane that reads the stored tile before a __syncwarp reads stale values. The share is element (r, c)
// by lane 4 (r % 8) + (c % 8) / 2 (the accumulator layout PTX documents for mma.sync's m16n8 tiles), so the usual
// loops over a tile (element lane + 32 k, or rows per lane) cross lanes. The products of BF16 values are exact in
// float and summed in k order (the tensor cores' order and rounding inside a 16-term sum differ; tests allow for
// BF16's precision, far coarser).
// Checked as on the GPU (std::logic_error): a pointer not 32-byte aligned, a leading dimension not a multiple of
// 16 bytes.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_bf16.h"
#include "emulator.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator has 16 x 16 x 16 tiles only");
    static constexpr int num_elements = 256;
    float x[num_elements];  // (r, c) at x[r * 16 + c]
};

inline float emulated_value(float v) { return v; }
inline float emulated_value(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
inline void check_tile_pointer(const T* p, unsigned ldm, const char* call) {
    if ((uintptr_t)p % 32 != 0)
        throw std::logic_error(std::string("kernel emulator: ") + call + " with a pointer not 32-byte aligned");
    if (ldm * sizeof(T) % 16 != 0)
        throw std::logic_error(std::string("kernel emulator: ") + call + " with a leading dimension of " +
                               std::to_string(ldm) + " elements, not a multiple of 16 bytes");
}

// matrix_a / matrix_b: the layout is the fragment's
template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
    check_tile_pointer(p, ldm, "load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = emulated_value(std::is_same<Layout, row_major>::value ? p[r * ldm + c] : p[c * ldm + r]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
    check_tile_pointer(p, ldm, "load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
    check_tile_pointer(p, ldm, "store_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            if ((unsigned)(4 * (r % 8) + (c % 8) / 2) == emulator::lane())
                (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

template <typename Use, typename T, typename Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float v) {
    for (float& e : f.x) e = v;
}

// d = a b + c
template <typename T, typename LayoutA, typename LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
    float out[256];
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) {
            float sum = c.x[r * 16 + col];
            for (int k = 0; k < 16; k++) sum += a.x[r * 16 + k] * b.x[k * 16 + col];
            out[r * 16 + col] = sum;
        }
    for (int i = 0; i < 256; i++) d.x[i] = out[i];
}

}  // namespace wmma
}  // namespace nvcuda
