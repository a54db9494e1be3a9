// The CPU reference's building blocks, forward and backward side by side (fp32, OpenMP).
// Conventions: weights are [out, in] and y = x W^T; activation gradients are overwritten (=) unless the
// argument says accumulate; parameter gradients always accumulate (+=). Every reduction runs in a fixed
// order inside one thread, so results are bit-identical for any number of threads.
#pragma once
#include <cstdint>

// C (M, N) (=|+=) A (M, K) @ B (K, N), all row-major.
void gemm_nn(float* C, const float* A, const float* B, int64_t M, int64_t K, int64_t N, bool accumulate);
// out (M, N) = inp (M, K) @ W^T, W (N, K)
void matmul_forward(float* out, const float* inp, const float* W, int64_t M, int64_t K, int64_t N);
// dinp (M, K) (=|+=) dout (M, N) @ W;  dW (N, K) += dout^T @ inp. dinp may be nullptr (input needs no gradient).
void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W, int64_t M,
                     int64_t K, int64_t N, bool accumulate_dinp);

// RMSNorm over rows: out = inp / sqrt(mean(inp^2) + eps) * w.  inp, out (M, C); rstd (M) saved for backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t M, int64_t C, float eps);
// h (M, C) = a + b (the residual add), then out = RMSNorm(h) as above.
void residual_rmsnorm_forward(float* h, float* out, float* rstd, const float* a, const float* b, const float* w,
                              int64_t M, int64_t C, float eps);
// dinp (M, C) (=|+=); dw (C) +=.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int64_t M, int64_t C, bool accumulate_dinp);

// dst[r][c] = src[r][c] for r < rows, c < cols, row strides dst_ld and src_ld (a block of columns).
void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols);

// SwiGLU gate, elementwise over n values: out = silu(g) * u.
void swiglu_forward(float* out, const float* g, const float* u, int64_t n);
// dg, du (n) overwritten.
void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, int64_t n);

// out (M, d) = embed[tokens]; backward: dembed[tokens] += dout (serial over rows: deterministic).
void embedding_forward(float* out, const int32_t* tokens, const float* embed, int64_t M, int64_t d);
void embedding_backward(float* dembed, const float* dout, const int32_t* tokens, int64_t M, int64_t d);

// Cross-entropy of logits (M, V) against targets; rows with target < 0 are ignored. Returns the rows' summed loss.
// dlogits, unless null: d(loss_scale * summed loss) / d logits, zero in ignored rows.
double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int64_t M,
                                      int64_t V, float loss_scale);

inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
inline float sigmoidf_(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
