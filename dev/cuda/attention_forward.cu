// Causal multi-head attention, forward (the trainer's: kernels/attention.cuh, FP32, and kernels/attention_bf16.cuh,
// BF16 on the tensor cores, with kernels/mma_sync.cuh and kernels/async_copy.cuh). B sequences of T tokens, H heads:
//   q, k (B*T, H, dqk), v (B*T, H, dv) -> o (B*T, H, dv), lse (B, H, T)
//   s_ij = scale q_i . k_j (j <= i);  lse_i = log sum_j exp(s_ij);  o_i = sum_j exp(s_ij - lse_i) v_j
// The versions try: a thread per query reading keys from global memory; key tiles in shared memory, a thread per
// query with an online softmax (the running max and sum rescaled tile by tile, no T x T matrix); the trainer's
// FP32 64 x 64 register tiles; the trainer's tensor-core kernel (cp.async pipelined), with 4 or 8 warps a block.
#include <algorithm>

#include <cuda_bf16.h>

#include "common.h"
#include "kernels/attention.cuh"

const std::vector<const char*> VERSIONS = {
    "naive: a thread per query: its max, then its sum and output, keys and values read from global memory",
    "key and value tiles of 32 in shared memory, a thread per query, online softmax, output rows in shared memory",
    "the trainer's FP32 (kernels/attention.cuh): 64 x 64 tiles, 256 threads of 4 x 4 entries, online softmax",
    "the trainer's BF16 (kernels/attention_bf16.cuh): mma.sync, 4 warps of 16 queries, cp.async pipelined",
    "the trainer's BF16 with 8 warps a block (128 queries): half the streamed bytes per product",
};

// ---- version 1 -----------------------------------------------------------------------------------------------

// Thread (b, h, i), i fastest. o's row is the accumulator.
__global__ void attention_naive(float* o, float* lse, const float* q, const float* k, const float* v, int B, int T,
                                int H, int dqk, int dv, float scale) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)B * H * T) return;
    const int64_t i = idx % T, bh = idx / T, b = bh / H, h = bh % H;
    const float* qi = q + ((b * T + i) * H + h) * dqk;
    float* oi = o + ((b * T + i) * H + h) * dv;
    float m = -INFINITY;
    for (int64_t j = 0; j <= i; j++) {
        const float* kj = k + ((b * T + j) * H + h) * dqk;
        float s = 0.0f;
        for (int e = 0; e < dqk; e++) s += qi[e] * kj[e];
        m = fmaxf(m, s * scale);
    }
    for (int e = 0; e < dv; e++) oi[e] = 0.0f;
    float l = 0.0f;
    for (int64_t j = 0; j <= i; j++) {
        const float *kj = k + ((b * T + j) * H + h) * dqk, *vj = v + ((b * T + j) * H + h) * dv;
        float s = 0.0f;
        for (int e = 0; e < dqk; e++) s += qi[e] * kj[e];
        const float p = expf(s * scale - m);
        l += p;
        for (int e = 0; e < dv; e++) oi[e] += p * vj[e];
    }
    for (int e = 0; e < dv; e++) oi[e] /= l;
    lse[bh * T + i] = m + logf(l);
}

// ---- version 2 -----------------------------------------------------------------------------------------------

constexpr int KV_TILE = 32;

// Row stride in shared memory: odd, so that the 32 threads of a warp, reading element e of 32 different rows, hit
// 32 different banks.
__host__ __device__ inline int odd_stride(int d) { return d | 1; }

inline size_t tiled_shared_bytes(int queries, int dqk, int dv) {
    return sizeof(float) * (size_t)(queries + KV_TILE) * (odd_stride(dqk) + odd_stride(dv));
}

// Block (b*H + h, query tile of blockDim.x), a thread per query. Dynamic shared memory: the block's q rows and o
// accumulators, the current tile of keys and values. Entry (i, j) counts iff j <= i < T.
__global__ void attention_tiled(float* o, float* lse, const float* q, const float* k, const float* v, int T, int H,
                                int dqk, int dv, float scale) {
    const int ldq = odd_stride(dqk), ldv = odd_stride(dv), Q = blockDim.x;
    float* qs = gpu::dynamic_shared<float>();  // (Q, ldq)
    float* os = qs + Q * ldq;                  // (Q, ldv)
    float* ks = os + Q * ldv;                  // (KV_TILE, ldq)
    float* vs = ks + KV_TILE * ldq;            // (KV_TILE, ldv)
    const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
    const int i0 = blockIdx.y * Q, r = threadIdx.x, i = i0 + r;
    const int64_t stride_qk = (int64_t)H * dqk, stride_v = (int64_t)H * dv;
    const float* q_seq = q + (b * T * H + h) * dqk;
    const float* k_seq = k + (b * T * H + h) * dqk;
    const float* v_seq = v + (b * T * H + h) * dv;
    for (int idx = threadIdx.x; idx < Q * dqk; idx += Q) {  // coalesced: consecutive threads, consecutive e
        const int row = idx / dqk, e = idx % dqk;
        qs[row * ldq + e] = i0 + row < T ? q_seq[(i0 + row) * stride_qk + e] : 0.0f;
    }
    for (int e = 0; e < dv; e++) os[r * ldv + e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int last_key = (i0 + Q < T ? i0 + Q : T) - 1;  // the block's last query sees keys up to itself
    for (int j0 = 0; j0 <= last_key; j0 += KV_TILE) {
        __syncthreads();  // every thread is done with the previous tile (and qs is complete)
        for (int idx = threadIdx.x; idx < KV_TILE * dqk; idx += Q) {
            const int row = idx / dqk, e = idx % dqk;
            ks[row * ldq + e] = j0 + row < T ? k_seq[(j0 + row) * stride_qk + e] : 0.0f;
        }
        for (int idx = threadIdx.x; idx < KV_TILE * dv; idx += Q) {
            const int row = idx / dv, e = idx % dv;
            vs[row * ldv + e] = j0 + row < T ? v_seq[(j0 + row) * stride_v + e] : 0.0f;
        }
        __syncthreads();
        if (i >= T) continue;  // a padding query: it only helps load
        float s[KV_TILE], tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < KV_TILE; j++) {
            float dot = 0.0f;
            for (int e = 0; e < dqk; e++) dot += qs[r * ldq + e] * ks[j * ldq + e];
            s[j] = j0 + j <= i ? dot * scale : -INFINITY;
            tile_max = fmaxf(tile_max, s[j]);
        }
        // Every query has key 0 in the first tile, so m is finite from then on: no exp(-inf - -inf).
        const float m_new = fmaxf(m, tile_max), correction = expf(m - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < KV_TILE; j++) {
            s[j] = expf(s[j] - m_new);
            sum += s[j];
        }
        l = l * correction + sum;
        m = m_new;
        for (int e = 0; e < dv; e++) {
            float acc = os[r * ldv + e] * correction;
#pragma unroll
            for (int j = 0; j < KV_TILE; j++) acc += s[j] * vs[j * ldv + e];
            os[r * ldv + e] = acc;
        }
    }
    if (i >= T) return;
    for (int e = 0; e < dv; e++) o[((b * T + i) * H + h) * dv + e] = os[r * ldv + e] / l;
    lse[bh * T + i] = m + logf(l);
}

// ---- the problem, the CPU reference, the checks ----------------------------------------------------------------

struct Problem {
    int B, T, H, dqk, dv;
    float scale;
    std::vector<float> q, k, v;
    std::vector<__nv_bfloat16> q16, k16, v16;
};

struct Reference {
    std::vector<float> o, lse;
};

static Problem make_problem() {
    Problem p;
    p.B = 2;
    p.T = EMULATED ? 200 : 1024;  // 200: the last tiles of queries and keys partial
    p.H = EMULATED ? 2 : 8;
    p.dqk = EMULATED ? 40 : 192;  // DeepSeek-V3's head dims on a GPU; 40 and 24: not multiples of 16
    p.dv = EMULATED ? 24 : 128;
    p.scale = 1.0f / sqrtf((float)p.dqk);
    Rng rng(13);
    const int64_t N = (int64_t)p.B * p.T * p.H;
    p.q = randn(N * p.dqk, rng, 1.5f);  // scores of a few units: peaked softmax rows
    p.k = randn(N * p.dqk, rng, 1.5f);
    p.v = randn(N * p.dv, rng);
    for (float x : p.q) p.q16.push_back(__float2bfloat16_rn(x));
    for (float x : p.k) p.k16.push_back(__float2bfloat16_rn(x));
    for (float x : p.v) p.v16.push_back(__float2bfloat16_rn(x));
    return p;
}

static const Problem& problem() {
    static const Problem p = make_problem();
    return p;
}

// In double, of q, k, v as given (the FP32 inputs, or their BF16 roundings)
static Reference reference(const Problem& p, const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v) {
    Reference ref;
    const int64_t T = p.T, H = p.H, dqk = p.dqk, dv = p.dv;
    ref.o.resize(p.B * T * H * dv);
    ref.lse.resize(p.B * H * T);
    std::vector<double> s(T), o(dv);
    for (int64_t b = 0; b < p.B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const float* qi = &q[((b * T + i) * H + h) * dqk];
                double m = -INFINITY, l = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    const float* kj = &k[((b * T + j) * H + h) * dqk];
                    double dot = 0.0;
                    for (int64_t e = 0; e < dqk; e++) dot += (double)qi[e] * kj[e];
                    s[j] = dot * p.scale;
                    m = std::fmax(m, s[j]);
                }
                std::fill(o.begin(), o.end(), 0.0);
                for (int64_t j = 0; j <= i; j++) {
                    const double e_s = std::exp(s[j] - m);
                    l += e_s;
                    const float* vj = &v[((b * T + j) * H + h) * dv];
                    for (int64_t e = 0; e < dv; e++) o[e] += e_s * vj[e];
                }
                for (int64_t e = 0; e < dv; e++) ref.o[((b * T + i) * H + h) * dv + e] = (float)(o[e] / l);
                ref.lse[(b * H + h) * T + i] = (float)(m + std::log(l));
            }
    return ref;
}

static std::vector<float> widened(const std::vector<__nv_bfloat16>& x) {
    std::vector<float> r;
    for (__nv_bfloat16 b : x) r.push_back(__bfloat162float(b));
    return r;
}

// The references are computed when first needed: the BF16 one only for versions 4 and 5.
static const Reference& reference_fp32() {
    static const Reference r = reference(problem(), problem().q, problem().k, problem().v);
    return r;
}
static const Reference& reference_bf16() {
    static const Reference r = reference(problem(), widened(problem().q16), widened(problem().k16),
                                         widened(problem().v16));
    return r;
}

struct Buffers {
    DeviceArray<float> q, k, v, o, lse;
    DeviceArray<__nv_bfloat16> q16, k16, v16;
    explicit Buffers(const Problem& p)
        : q(p.q), k(p.k), v(p.v), o((int64_t)p.B * p.T * p.H * p.dv), lse((int64_t)p.B * p.H * p.T), q16(p.q16),
          k16(p.k16), v16(p.v16) {}
};

static void run(int version, int block, Buffers& b, const Problem& p) {
    const int B = p.B, T = p.T, H = p.H, dqk = p.dqk, dv = p.dv;
    if (version == 1) {
        gpu::launch_kernel(attention_naive, (unsigned)gpu::ceil_div((int64_t)B * H * T, block), block, 0, nullptr,
                           b.o.ptr, b.lse.ptr, b.q.ptr, b.k.ptr, b.v.ptr, B, T, H, dqk, dv, p.scale);
    } else if (version == 2) {
        const dim3 grid((unsigned)(B * H), (unsigned)gpu::ceil_div(T, block));
        gpu::launch_kernel(attention_tiled, grid, block, tiled_shared_bytes(block, dqk, dv), nullptr, b.o.ptr,
                           b.lse.ptr, b.q.ptr, b.k.ptr, b.v.ptr, T, H, dqk, dv, p.scale);
    } else if (version == 3) {
        gpu::attention_forward(b.o.ptr, b.lse.ptr, b.q.ptr, b.k.ptr, b.v.ptr, dv, B, T, H, dqk, dv, p.scale, nullptr);
    } else {
        auto forward = version == 4 ? gpu::attention_forward_bf16<4> : gpu::attention_forward_bf16<8>;
        forward(b.o.ptr, b.lse.ptr, b.q16.ptr, b.k16.ptr, b.v16.ptr, dv, B, T, H, dqk, dv, p.scale, nullptr);
    }
}

// The block sizes version v is checked and timed at (the trainer's launchers pick their own).
static std::vector<int> block_sizes(int v) {
    if (v == 1) return {64, 128, 256, 512};
    if (v == 2) return {32, 64, 128};  // 128 queries at DeepSeek-V3's dims: 206 KB of shared memory
    if (v == 3) return {gpu::ATTN_THREADS};
    return {32 * (v == 4 ? 4 : 8)};
}

// FP32 (1-3): tol 1e-5 against the double reference: dot products of dqk terms and sums over up to T keys in FP32,
// ~sqrt(n) u relative (1e-6); a key left out of a row of i keys moves it by ~1/i.
// BF16 (4, 5): the reference takes the same BF16-rounded q, k, v; the kernels also round P to BF16 before P V
// (2^-9 relative each), errors near 2e-3; tol 1e-2.
static bool check_version(int v) {
    const Problem& p = problem();
    const Reference& ref = v <= 3 ? reference_fp32() : reference_bf16();
    const double tol = v <= 3 ? 1e-5 : 1e-2;
    bool ok = true;
    for (int block : block_sizes(v)) {
        Buffers b(p);
        run(v, block, b, p);
        ok = check(fmt("o, block %d", block), b.o.get(), ref.o, tol) && ok;
        ok = check(fmt("lse, block %d", block), b.lse.get(), ref.lse, tol) && ok;
    }
    return ok;
}

static void time_version(int v) {
    const Problem& p = problem();
    Buffers b(p);
    const double flops = 2.0 * p.B * p.H * (p.T * (p.T + 1.0) / 2) * (p.dqk + p.dv);  // the causal half
    for (int block : block_sizes(v))
        print_time(fmt("block %d", block), time_ms([&] { run(v, block, b, p); }), 0, flops);
}

int main(int argc, char** argv) {
    return lab_main(argc, argv, "attention_forward", VERSIONS, check_version, time_version);
}
