// The routed experts' GEMMs through cuBLASLt (docs/design.md §7.6), kernels/matmul.cuh's three products per group
// of rows: rows [offsets[g], offsets[g+1]) use weights g of W (G, N, K). One cuBLASLt call per group with rows,
// spread over the Matmul's streams, so the group sizes come from the host. FP32 and FP8 experts, and BF16 ones whose
// widths grouped_gemm.cuh does not take, run here.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/matmul.cuh"

namespace gpu {

// Where each group's quantized operands go in an Fp8Buffer, one group after another: its rows padded to 4 with their
// scales (fp8_split_rows_of), and its transpose padded to 16 with its scales.
struct Fp8GroupPlace {
    std::vector<int64_t> row_values, row_scales, t_values, t_scales;  // G + 1 prefix sums each
};
inline Fp8GroupPlace fp8_group_place(const int64_t* offsets, int64_t G, int64_t width) {
    Fp8GroupPlace p{{0}, {0}, {0}, {0}};
    for (int64_t g = 0; g < G; g++) {
        const int64_t M = offsets[g + 1] - offsets[g], Mp = fp8_padded_rows(M);
        p.row_values.push_back(p.row_values.back() + round_up(M, 4) * width);
        p.row_scales.push_back(p.row_scales.back() + (M ? fp8_vec128_scales(M, width) : 0));
        p.t_values.push_back(p.t_values.back() + width * Mp);
        p.t_scales.push_back(p.t_scales.back() + (M ? fp8_vec128_scales(width, Mp) : 0));
    }
    return p;
}

// The groups with rows: one product each
inline int64_t grouped_products(const int64_t* offsets, int64_t G) {
    int64_t n = 0;
    for (int64_t g = 0; g < G; g++) n += offsets[g + 1] > offsets[g];
    return n;
}

// Checks the host offsets (G+1 entries, nonnegative, nondecreasing) and returns the first row.
inline int64_t grouped_first_row(const MatmulSite& s, const int64_t* offsets, int64_t G) {
    if (offsets[0] < 0) {
        fprintf(stderr, "internal error: %s: offsets[0] = %ld < 0\n", s.name, (long)offsets[0]);
        exit(1);
    }
    for (int64_t g = 0; g < G; g++)
        if (offsets[g + 1] < offsets[g]) {
            fprintf(stderr, "internal error: %s: offsets[%ld] = %ld > offsets[%ld] = %ld\n", s.name, (long)g,
                    (long)offsets[g], (long)(g + 1), (long)offsets[g + 1]);
            exit(1);
        }
    return offsets[0];
}

// Runs group(g, on) for every nonempty group g, the largest first, each on the stream with the fewest rows so far
// (docs/design.md §7.6). Streams 1.. first wait for the caller's stream (fork); it then waits for them (join).
template <typename GroupCall>
inline void grouped_on_streams(Matmul& mm, const int64_t* offsets, int64_t G, GroupCall&& group) {
    std::vector<int64_t> order;  // the nonempty groups, largest first (ties in group order)
    for (int64_t g = 0; g < G; g++)
        if (offsets[g + 1] > offsets[g]) order.push_back(g);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return offsets[x + 1] - offsets[x] > offsets[y + 1] - offsets[y]; });
    const int64_t most = std::min<int64_t>({mm.group_streams, MATMUL_STREAMS, (int64_t)order.size()});
    const int used = (int)std::max<int64_t>(1, most);
    if (used > 1) CUDA_CHECK(cudaEventRecord(mm.stream_events[0], mm.stream));
    for (int i = 1; i < used; i++) CUDA_CHECK(cudaStreamWaitEvent(mm.streams[i], mm.stream_events[0], 0));
    std::array<int64_t, MATMUL_STREAMS> rows{};
    for (int64_t g : order) {
        const int on = (int)(std::min_element(rows.begin(), rows.begin() + used) - rows.begin());
        rows[on] += offsets[g + 1] - offsets[g];
        group(g, on);
    }
    for (int i = 1; i < used; i++) {
        CUDA_CHECK(cudaEventRecord(mm.stream_events[i], mm.streams[i]));
        CUDA_CHECK(cudaStreamWaitEvent(mm.stream, mm.stream_events[i], 0));
    }
}

// out rows [offsets[g], offsets[g+1]) (=) inp rows @ W_g^T, W (G, N, K) in its precision; offsets on the host. In
// FP8 each group is quantized before the fork, by its own launch, as its scales' layout depends on its row count.
// If cuBLASLt refuses any group's FP8 shape, the whole call runs in BF16.
inline void grouped_matmul_forward(Matmul& mm, float* out, GemmInput inp, const GemmWeight& W, const int64_t* offsets,
                                   int64_t G, int64_t K, int64_t N) {
    if (G <= 0) return;
    const MatmulSite s{"grouped_matmul_forward", offsets[G] - offsets[0], K, N};
    const int64_t first = grouped_first_row(s, offsets, G), rows = offsets[G] - first;
    if (rows == 0) return;
    GemmType type = W.type();
    const Fp8GroupPlace place = type == GemmType::FP8 ? fp8_group_place(offsets, G, K) : Fp8GroupPlace{};
    const Fp8Buffer* q =
        type == GemmType::FP8 ? &matmul_fp8_buffer(mm, FP8_INPUT, place.row_values[G], place.row_scales[G]) : nullptr;
    float* tails = type == GemmType::FP8 ? matmul_fp8_tails(mm, G * 4 * N) : nullptr;
    auto fp8_problem = [&](int64_t g) {  // group g's FP8 products
        const int64_t r0 = offsets[g];
        return fp8_row_products(
            [&](float* o, const __nv_fp8_storage_t* x, const float* x_scales, int64_t M) {
                return fp8_forward_problem(o, x, x_scales, W.at(g, N, K).fp8, M, K, N);
            },
            out + r0 * N, tails + g * 4 * N, offsets[g + 1] - r0, K, N, q->values + place.row_values[g],
            q->scales + place.row_scales[g]);
    };
    for (int64_t g = 0; g < G && type == GemmType::FP8; g++)
        if (!fp8_takes(mm, {"grouped_matmul_forward (one group)", offsets[g + 1] - offsets[g], K, N}, fp8_problem(g)))
            type = GemmType::BF16;
    if (W.type() == GemmType::FP8 && type == GemmType::BF16) mm.fp8_in_bf16 += grouped_products(offsets, G);
    if (type == GemmType::FP8)
        for (int64_t g = 0; g < G; g++)
            fp8_split_rows_of(inp, offsets[g], offsets[g + 1] - offsets[g], K, q->values + place.row_values[g],
                              q->scales + place.row_scales[g], mm.stream);
    const __nv_bfloat16* inp16 = type == GemmType::BF16 ? matmul_bf16_rows(mm, inp, first, K, rows * K, s) : nullptr;
    const float* inp32 = type == GemmType::FP32 || type == GemmType::TF32 ? matmul_input_fp32(inp, s) : nullptr;
    grouped_on_streams(mm, offsets, G, [&](int64_t g, int on) {
        const int64_t r0 = offsets[g], M = offsets[g + 1] - r0;
        const MatmulSite sg{"grouped_matmul_forward (one group)", M, K, N};
        const GemmWeight Wg = W.at(g, N, K);
        if (type == GemmType::FP8) {
            fp8_row_matmul(mm, on, sg, fp8_problem(g), false);
            return;
        }
        const bool bf16 = type == GemmType::BF16;
        const void* x = bf16 ? (const void*)(inp16 + (r0 - first) * K) : (const void*)(inp32 + r0 * K);
        const void* w = bf16 ? (const void*)Wg.bf16 : (const void*)Wg.fp32;
        matmul_lt(mm, on, sg, gemm_forward_problem(type, out + r0 * N, x, w, M, K, N), false);
    });
}

// Per group g: dinp rows (=|+=) dout rows @ W_g;  dW_g (N, K) (=|+=) dout rows^T @ inp rows (=: an empty group's
// dW_g set to zero); offsets on the host. FP8 as in grouped_matmul_forward: every group quantized before the fork,
// or the whole call in BF16.
inline void grouped_matmul_backward(Matmul& mm, float* dinp, float* dW, GemmInput dout, GemmInput inp,
                                    const GemmWeight& W, const int64_t* offsets, int64_t G, int64_t K, int64_t N,
                                    bool accumulate_dinp = false, bool accumulate_dW = true) {
    if (G <= 0) return;
    const MatmulSite s{"grouped_matmul_backward", offsets[G] - offsets[0], K, N};
    const int64_t first = grouped_first_row(s, offsets, G), rows = offsets[G] - first;
    for (int64_t g = 0; g < G && !accumulate_dW; g++)
        if (offsets[g + 1] == offsets[g])
            CUDA_CHECK(cudaMemsetAsync(dW + g * N * K, 0, N * K * sizeof(float), mm.stream));
    if (rows == 0) return;
    GemmType type = W.type();
    const bool fp8 = type == GemmType::FP8;
    const Fp8GroupPlace grad = fp8 ? fp8_group_place(offsets, G, N) : Fp8GroupPlace{},
                        input = fp8 ? fp8_group_place(offsets, G, K) : Fp8GroupPlace{};
    const Fp8Buffer* g_rows =
        fp8 ? &matmul_fp8_buffer(mm, FP8_GRAD_ROWS, grad.row_values[G], grad.row_scales[G]) : nullptr;
    const Fp8Buffer* g_t = fp8 ? &matmul_fp8_buffer(mm, FP8_GRAD_T, grad.t_values[G], grad.t_scales[G]) : nullptr;
    const Fp8Buffer* x_t = fp8 ? &matmul_fp8_buffer(mm, FP8_INPUT, input.t_values[G], input.t_scales[G]) : nullptr;
    float* tails = fp8 && dinp ? matmul_fp8_tails(mm, G * 4 * K) : nullptr;
    auto fp8_dinp = [&](int64_t g) {  // group g's FP8 products
        const int64_t r0 = offsets[g];
        return fp8_row_products(
            [&](float* o, const __nv_fp8_storage_t* grad_g, const float* grad_scales, int64_t M) {
                return fp8_dinp_problem(o, grad_g, grad_scales, W.at(g, N, K).fp8, M, K, N);
            },
            dinp + r0 * K, tails + g * 4 * K, offsets[g + 1] - r0, N, K, g_rows->values + grad.row_values[g],
            g_rows->scales + grad.row_scales[g]);
    };
    auto fp8_dW = [&](int64_t g) {
        return fp8_dW_problem(dW + g * N * K, g_t->values + grad.t_values[g], g_t->scales + grad.t_scales[g],
                              x_t->values + input.t_values[g], x_t->scales + input.t_scales[g],
                              fp8_padded_rows(offsets[g + 1] - offsets[g]), K, N);
    };
    for (int64_t g = 0; g < G && type == GemmType::FP8; g++) {
        const MatmulSite sg{"grouped_matmul_backward (one group)", offsets[g + 1] - offsets[g], K, N};
        if ((dinp && !fp8_takes(mm, sg, fp8_dinp(g))) || !fp8_takes(mm, sg, fp8_dW(g))) type = GemmType::BF16;
    }
    if (fp8 && type == GemmType::BF16) mm.fp8_in_bf16 += grouped_products(offsets, G) * (dinp ? 2 : 1);
    if (type == GemmType::FP8)
        for (int64_t g = 0; g < G; g++) {
            const int64_t r0 = offsets[g], M = offsets[g + 1] - r0;
            if (M == 0) continue;
            if (dinp)
                fp8_split_rows_of(dout, r0, M, N, g_rows->values + grad.row_values[g],
                                  g_rows->scales + grad.row_scales[g], mm.stream);
            fp8_cols_of(dout, r0, M, N, g_t->values + grad.t_values[g], g_t->scales + grad.t_scales[g], mm.stream);
            fp8_cols_of(inp, r0, M, K, x_t->values + input.t_values[g], x_t->scales + input.t_scales[g], mm.stream);
        }
    const __nv_bfloat16 *dout16 = nullptr, *inp16 = nullptr;
    const float *dout32 = nullptr, *inp32 = nullptr;
    if (type == GemmType::BF16) {
        dout16 = matmul_bf16_rows(mm, dout, first, N, rows * N, s, /*output_grad*/ true);
        inp16 = matmul_bf16_rows(mm, inp, first, K, rows * K, s);
    } else if (type == GemmType::FP32 || type == GemmType::TF32) {
        dout32 = matmul_input_fp32(dout, s);
        inp32 = matmul_input_fp32(inp, s);
    }
    grouped_on_streams(mm, offsets, G, [&](int64_t g, int on) {
        const int64_t r0 = offsets[g], M = offsets[g + 1] - r0;
        const MatmulSite sg{"grouped_matmul_backward (one group)", M, K, N};
        const GemmWeight Wg = W.at(g, N, K);
        float* dW_g = dW + g * N * K;
        if (type == GemmType::FP8) {
            if (dinp) fp8_row_matmul(mm, on, sg, fp8_dinp(g), accumulate_dinp);
            matmul_lt(mm, on, sg, fp8_dW(g), accumulate_dW);
            return;
        }
        const bool bf16 = type == GemmType::BF16;
        const void* grad_g = bf16 ? (const void*)(dout16 + (r0 - first) * N) : (const void*)(dout32 + r0 * N);
        const void* x = bf16 ? (const void*)(inp16 + (r0 - first) * K) : (const void*)(inp32 + r0 * K);
        const void* w = bf16 ? (const void*)Wg.bf16 : (const void*)Wg.fp32;
        if (dinp)
            matmul_lt(mm, on, sg, gemm_dinp_problem(type, dinp + r0 * K, grad_g, w, M, K, N), accumulate_dinp);
        matmul_lt(mm, on, sg, gemm_dW_problem(type, dW_g, grad_g, x, M, K, N), accumulate_dW);
    });
}

}  // namespace gpu
