// Grouped expert GEMM: one launch takes all G groups and reads their offsets from device memory, so no host sync
// (the trainer's BF16 experts: kernels/grouped_gemm.cuh; in FP32 and FP8 it makes one cuBLASLt call per group):
//   x (M, K), W (G, N, K), offsets (G+1) -> out (M, N):  out[r] = x[r] W_g^T  for offsets[g] <= r < offsets[g+1]
// The tiled versions cut each group's rows into tiles; a block finds its (group, tile) by walking the G counts,
// out of a grid of ceil(M / tile rows) + G row slots, the most tiles any split of M rows into G groups can give.
// The versions: a thread per output; FP32 tiles in shared memory; BF16 tiles on the tensor cores (mma.sync), and
// the trainer's: the same with cp.async loads of the next k step overlapping the products of this one.
#include <cuda_bf16.h>

#include "common.h"
#include "kernels/common.cuh"
#include "kernels/grouped_gemm.cuh"

const std::vector<const char*> VERSIONS = {
    "naive: a thread per output, its group by binary search over the offsets",
    "FP32 tiles in shared memory (32 or 64 square, k steps of 32), 256 threads of 2x2 or 4x4 outputs",
    "BF16 on the tensor cores: mma.sync m16n8k16, a warp per 16 rows x 64 columns, ldmatrix from shared memory",
    "the trainer's (kernels/grouped_gemm.cuh): as 3 with 4 warps, double-buffered: cp.async fetches the next k step",
};

using bf16 = __nv_bfloat16;

// The tile schedule: block `slot` takes the slot-th tile when every group's rows are cut into tiles of `rows`, the
// groups in order. Sets g and the tile's rows [m0, m_end); false when the slot is past the last tile.
__device__ inline bool schedule_tile(const int64_t* offsets, int G, int rows, int64_t slot, int& g, int64_t& m0,
                                     int64_t& m_end) {
    for (g = 0; g < G; g++) {
        const int64_t count = offsets[g + 1] - offsets[g], tiles = (count + rows - 1) / rows;
        if (slot < tiles) {
            m0 = offsets[g] + slot * rows;
            m_end = m0 + rows < offsets[g + 1] ? m0 + rows : offsets[g + 1];
            return true;
        }
        slot -= tiles;
    }
    return false;
}

// ---- version 1 -----------------------------------------------------------------------------------------------

__global__ void grouped_gemm_naive(float* out, const float* x, const float* W, const int64_t* offsets, int G,
                                   int64_t M, int64_t N, int64_t K) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    const int64_t r = i / N, n = i % N;
    int low = 0, high = G - 1;  // the last g with offsets[g] <= r: r's group, past any empty group before it
    while (low < high) {
        const int mid = (low + high + 1) / 2;
        if (offsets[mid] <= r) low = mid;
        else high = mid - 1;
    }
    const float* w = W + ((int64_t)low * N + n) * K;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) acc += x[r * K + k] * w[k];
    out[i] = acc;
}

// ---- version 2 -----------------------------------------------------------------------------------------------

constexpr int TILED_THREADS = 256, TILED_BK = 32;

// Block (n tile, row slot), 16 x 16 threads: thread (ty, tx) owns rows ty + 16a and columns tx + 16b of the tile.
// The rows are padded by one float, so the 16 threads that read 16 different rows at the same k hit 16 banks.
constexpr int TILED_MAX_TILE = 64;

// The tiles of x and W, for the largest TILE (a __shared__ array is declared outside a template: docs/design.md §4)
static __device__ float* tiled_shared() {
    __shared__ float tiles[2 * TILED_MAX_TILE * (TILED_BK + 1)];
    return tiles;
}

template <int TILE>
__global__ void grouped_gemm_tiled(float* out, const float* x, const float* W, const int64_t* offsets, int G,
                                   int64_t N, int64_t K) {
    static_assert(TILE <= TILED_MAX_TILE, "tiled_shared holds tiles of up to TILED_MAX_TILE rows");
    constexpr int PER = TILE / 16, LD = TILED_BK + 1;
    float *xs = tiled_shared(), *ws = xs + TILE * LD;
    int g;
    int64_t m0, m_end;
    if (!schedule_tile(offsets, G, TILE, blockIdx.y, g, m0, m_end)) return;  // the whole block
    const int64_t n0 = (int64_t)blockIdx.x * TILE;
    const float* Wg = W + (int64_t)g * N * K;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[PER][PER] = {};
    for (int64_t k0 = 0; k0 < K; k0 += TILED_BK) {
        for (int i = threadIdx.x; i < TILE * TILED_BK; i += TILED_THREADS) {
            const int r = i / TILED_BK, kk = i % TILED_BK;  // consecutive threads, consecutive k: coalesced
            const bool k_in = k0 + kk < K;
            xs[r * LD + kk] = m0 + r < m_end && k_in ? x[(m0 + r) * K + k0 + kk] : 0.0f;
            ws[r * LD + kk] = n0 + r < N && k_in ? Wg[(n0 + r) * K + k0 + kk] : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < TILED_BK; kk++) {
            float a[PER], b[PER];
#pragma unroll
            for (int i = 0; i < PER; i++) {
                a[i] = xs[(ty + 16 * i) * LD + kk];
                b[i] = ws[(tx + 16 * i) * LD + kk];
            }
#pragma unroll
            for (int i = 0; i < PER; i++)
#pragma unroll
                for (int j = 0; j < PER; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();  // every thread is done with the tiles before the next k step overwrites them
    }
#pragma unroll
    for (int i = 0; i < PER; i++)
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int64_t r = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (r < m_end && n < N) out[r * N + n] = acc[i][j];
        }
}

// ---- version 3 (version 4 is kernels/grouped_gemm.cuh) ---------------------------------------------------------
// A block has WARPS warps and a tile of 16 WARPS rows x 64 columns; warp w owns rows 16w..16w+15, as eight 16 x 8
// accumulator tiles (the layout of kernels/mma_sync.cuh). Each k step of 32 stages the block's rows of x and the
// tile's 64 rows of W_g (out = x W^T: W's rows are the B operand's columns) in shared memory, BF16, rows padded from
// 32 to 40 values: 80 bytes apart, the 8 rows one ldmatrix phase reads fall in 8 different 16-byte bank groups.
// The products and the store are the trainer's (gpu::gg_mma_step, gpu::gg_store); what version 4 adds is the
// second stage and cp.async.

// dst (rows x GG_LD_K) = columns k0..k0+31 of the rows of src (row stride K; those from `valid` on are zeros), in
// 16-byte pieces (K a multiple of 8)
__device__ inline void load_bf16_tile(bf16* dst, const bf16* src, int rows, int64_t valid, int64_t K, int64_t k0) {
    constexpr int PIECES = gpu::GG_BK / 8;  // a row's pieces
    for (int i = threadIdx.x; i < rows * PIECES; i += blockDim.x) {
        const int r = i / PIECES, c = i % PIECES * 8;
        bf16* d = dst + r * gpu::GG_LD_K + c;
        if (r < valid && k0 + c < K) {
            *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(src + r * K + k0 + c);
        } else {
            *reinterpret_cast<uint4*>(d) = uint4{0, 0, 0, 0};
        }
    }
}

// Version 3: load, sync, multiply, sync, for each k step. Dynamic shared memory: (16 WARPS + 64) x GG_LD_K BF16.
template <int WARPS>
__global__ void grouped_gemm_mma(float* out, const bf16* x, const bf16* W, const int64_t* offsets, int G, int64_t N,
                                 int64_t K) {
    constexpr int BM = 16 * WARPS;
    bf16* xs = gpu::dynamic_shared<bf16>();
    bf16* ws = xs + BM * gpu::GG_LD_K;
    int g;
    int64_t m0, m_end;
    if (!schedule_tile(offsets, G, BM, blockIdx.y, g, m0, m_end)) return;
    const int64_t n0 = (int64_t)blockIdx.x * gpu::GG_BN;
    const bf16* Wn = W + ((int64_t)g * N + n0) * K;
    float acc[8][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += gpu::GG_BK) {
        load_bf16_tile(xs, x + m0 * K, BM, m_end - m0, K, k0);
        load_bf16_tile(ws, Wn, gpu::GG_BN, N - n0, K, k0);
        __syncthreads();
        gpu::gg_mma_step<false, false>(acc, xs, ws);
        __syncthreads();
    }
    gpu::gg_store(out, N, acc, m0, m_end, n0, N, false);
}

// ---- the problem, the CPU reference, the checks ----------------------------------------------------------------

struct Problem {
    int64_t M, N, K;
    int G;
    std::vector<int64_t> offsets;
    std::vector<float> x, W;
    std::vector<bf16> x16, W16;
    std::vector<float> out_ref, out16_ref;  // of the FP32 inputs; of the BF16-rounded ones
};

// Uneven groups, one of them empty, one smaller than a tile.
static Problem make_problem() {
    Problem p;
    Rng rng(5);
    std::vector<int64_t> counts;
    if (EMULATED) {
        counts = {37, 0, 150, 5, 90};
        p.N = 136;  // a partial column tile
        p.K = 200;  // a partial k step of 32
    } else {
        counts.assign(16, 0);
        for (int g = 0; g < 16; g++) counts[g] = g == 3 ? 0 : 64 + (int64_t)(rng.next_u64() % 448);
        p.N = 1024;
        p.K = 1024;
    }
    p.G = (int)counts.size();
    p.offsets.assign(p.G + 1, 0);
    for (int g = 0; g < p.G; g++) p.offsets[g + 1] = p.offsets[g] + counts[g];
    p.M = p.offsets[p.G];
    p.x = randn(p.M * p.K, rng);
    p.W = randn(p.G * p.N * p.K, rng);
    for (float v : p.x) p.x16.push_back(__float2bfloat16_rn(v));
    for (float v : p.W) p.W16.push_back(__float2bfloat16_rn(v));
    p.out_ref.resize(p.M * p.N);
    p.out16_ref.resize(p.M * p.N);
    for (int g = 0; g < p.G; g++)
        for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; r++)
            for (int64_t n = 0; n < p.N; n++) {
                const int64_t xi = r * p.K, wi = ((int64_t)g * p.N + n) * p.K;
                double acc = 0.0, acc16 = 0.0;
                for (int64_t k = 0; k < p.K; k++) {
                    acc += (double)p.x[xi + k] * p.W[wi + k];
                    acc16 += (double)__bfloat162float(p.x16[xi + k]) * __bfloat162float(p.W16[wi + k]);
                }
                p.out_ref[r * p.N + n] = (float)acc;
                p.out16_ref[r * p.N + n] = (float)acc16;
            }
    return p;
}

static const Problem& problem() {
    static const Problem p = make_problem();
    return p;
}

struct Buffers {
    DeviceArray<int64_t> offsets;
    DeviceArray<float> x, W, out;
    DeviceArray<bf16> x16, W16;
    explicit Buffers(const Problem& p)
        : offsets(p.offsets), x(p.x), W(p.W), out(p.M * p.N), x16(p.x16), W16(p.W16) {}
};

// Version v with `config`: threads per block (1), tile size (2), warps per block (3, 4).
static void run(int v, int config, Buffers& b, const Problem& p) {
    const int64_t M = p.M, N = p.N, K = p.K;
    if (v == 1) {
        gpu::launch_kernel(grouped_gemm_naive, (unsigned)gpu::ceil_div(M * N, config), config, 0, nullptr,
                           b.out.ptr, b.x.ptr, b.W.ptr, b.offsets.ptr, p.G, M, N, K);
    } else if (v == 2) {
        const dim3 grid((unsigned)gpu::ceil_div(N, config), (unsigned)(gpu::ceil_div(M, config) + p.G));
        gpu::launch_kernel(config == 32 ? grouped_gemm_tiled<32> : grouped_gemm_tiled<64>, grid, TILED_THREADS, 0,
                           nullptr, b.out.ptr, b.x.ptr, b.W.ptr, b.offsets.ptr, p.G, N, K);
    } else {
        if (K % 8 != 0 || N % 8 != 0) {
            fprintf(stderr, "versions 3 and 4 take K and N multiples of 8 (16-byte pieces), K = %lld N = %lld\n",
                    (long long)K, (long long)N);
            exit(1);
        }
        if (v == 4) {
            gpu::grouped_gemm_forward(b.out.ptr, b.x16.ptr, b.W16.ptr, b.offsets.ptr, p.G, M, K, N, nullptr);
            return;
        }
        const int rows = 16 * config;
        const dim3 grid((unsigned)gpu::ceil_div(N, gpu::GG_BN), (unsigned)(gpu::ceil_div(M, rows) + p.G));
        const size_t shared = (size_t)(rows + gpu::GG_BN) * gpu::GG_LD_K * sizeof(bf16);
        gpu::launch_kernel(config == 4 ? grouped_gemm_mma<4> : grouped_gemm_mma<8>, grid, 32 * config, shared, nullptr,
                           b.out.ptr, b.x16.ptr, b.W16.ptr, b.offsets.ptr, p.G, N, K);
    }
}

// The configurations version v is checked and timed at: threads per block (1), tile size (2), warps (3, 4).
static std::vector<int> configs(int v) {
    if (v == 1) return {128, 256, 512, 1024};
    if (v == 2) return {32, 64};
    if (v == 3) return {4, 8};
    return {gpu::GG_WARPS};
}

static std::string config_name(int v, int config) {
    if (v == 1) return fmt("block %d", config);
    if (v == 2) return fmt("tile %dx%d", config, config);
    return fmt("%d warps, tile %dx%d", config, 16 * config, gpu::GG_BN);
}

// FP32 (1, 2): tol 1e-5, sums of K = 1024 products in another order than the double reference: ~sqrt(K) u of the
// terms' scale, ~1e-6 of the result's (a k step left out is ~0.1).
// BF16 (3, 4): against the reference on the same BF16-rounded inputs, whose products are exact in FP32, so only
// the accumulation differs: the tensor cores add each 16 products with truncation, errors that do not cancel, about
// K/16 ulps of the partial sums (~2e-6 of the result's scale here); tol 1e-4.
static bool check_version(int v) {
    const Problem& p = problem();
    bool ok = true;
    for (int config : configs(v)) {
        Buffers b(p);
        run(v, config, b, p);
        const std::string what = "out, " + config_name(v, config);
        ok = (v <= 2 ? check(what, b.out.get(), p.out_ref, 1e-5) : check(what, b.out.get(), p.out16_ref, 1e-4)) && ok;
    }
    return ok;
}

static void time_version(int v) {
    const Problem& p = problem();
    Buffers b(p);
    for (int config : configs(v))
        print_time(config_name(v, config), time_ms([&] { run(v, config, b, p); }), 0, 2.0 * p.M * p.N * p.K);
}

int main(int argc, char** argv) {
    return lab_main(argc, argv, "grouped_gemm", VERSIONS, check_version, time_version);
}
