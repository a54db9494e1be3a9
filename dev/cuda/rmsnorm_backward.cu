// RMSNorm backward, FP32 (the trainer's: kernels/rmsnorm.cuh). The forward is y_nc = x_nc r_n w_c with
// r_n = 1 / sqrt(mean_c x_nc^2 + eps), saved as rstd. The backward:
//   x, dy (N, C), w (C), rstd (N) -> dx (N, C) overwritten, dw (C) accumulated
//   dx_nc = r_n w_c dy_nc - x_nc r_n^3 / C * sum_c' dy_nc' w_c' x_nc'
//   dw_c += sum_n dy_nc x_nc r_n
// dx needs a sum along each row, dw a sum down each column. The versions split that work differently: a thread,
// a block or a warp per row for dx; for dw a thread per column, fixed chunks of rows (deterministic), or float
// atomics in the same pass as dx, so that x and dy are read from memory once.
#include "common.h"
#include "kernels/rmsnorm.cuh"

const std::vector<const char*> VERSIONS = {
    "naive: a thread per row for dx, a thread per column for dw",
    "the trainer's (kernels/rmsnorm.cuh): a thread block per row for dx, dw in fixed chunks of rows, then summed",
    "fused: a warp per row, dw summed in shared memory by atomics, one atomic per column and block",
    "fused as 3, the warp keeps its row in registers between the two passes (16-byte loads)",
};

// Rows a block of versions 3 and 4 takes
constexpr int64_t FUSED_ROWS = 32;

// ---- version 1 -----------------------------------------------------------------------------------------------

__global__ void rmsnorm_dx_thread_per_row(float* dx, const float* dy, const float* x, const float* w,
                                          const float* rstd, int64_t N, int64_t C) {
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float r = rstd[n];
    float dot = 0.0f;
    for (int64_t c = 0; c < C; c++) dot += dy[n * C + c] * w[c] * x[n * C + c];
    const float coef = r * r * r * dot / C;
    for (int64_t c = 0; c < C; c++) dx[n * C + c] = r * w[c] * dy[n * C + c] - x[n * C + c] * coef;
}

__global__ void rmsnorm_dw_thread_per_column(float* dw, const float* dy, const float* x, const float* rstd,
                                             int64_t N, int64_t C) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int64_t n = 0; n < N; n++) acc += dy[n * C + c] * x[n * C + c] * rstd[n];
    dw[c] += acc;
}

// ---- version 3 -----------------------------------------------------------------------------------------------

// A block takes FUSED_ROWS rows, a warp one row at a time; dw_s (C floats of dynamic shared memory) collects the
// block's part of dw, which is then added to dw with one atomic per column.
__global__ void rmsnorm_backward_fused(float* dx, float* dw, const float* dy, const float* x, const float* w,
                                       const float* rstd, int64_t N, int64_t C) {
    float* dw_s = gpu::dynamic_shared<float>();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_s[c] = 0.0f;
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int64_t first = blockIdx.x * FUSED_ROWS, last = first + FUSED_ROWS < N ? first + FUSED_ROWS : N;
    for (int64_t n = first + warp; n < last; n += warps) {
        const float *xn = x + n * C, *dyn = dy + n * C;
        const float r = rstd[n];
        float dot = 0.0f;
        for (int64_t c = lane; c < C; c += 32) dot += dyn[c] * w[c] * xn[c];
        const float coef = r * r * r * gpu::warp_sum(dot) / C;
        for (int64_t c = lane; c < C; c += 32) {
            dx[n * C + c] = r * w[c] * dyn[c] - xn[c] * coef;
            atomicAdd(&dw_s[c], dyn[c] * xn[c] * r);
        }
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(&dw[c], dw_s[c]);
}

// ---- version 4 -----------------------------------------------------------------------------------------------

// As version 3, with lane l holding the 16-byte pieces l, l + 32, ... of its row's x and dy (PIECES of them: C up
// to 128 PIECES, C a multiple of 4), read once for both passes.
template <int PIECES>
__global__ void rmsnorm_backward_fused_registers(float* dx, float* dw, const float* dy, const float* x,
                                                 const float* w, const float* rstd, int64_t N, int64_t C) {
    float* dw_s = gpu::dynamic_shared<float>();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_s[c] = 0.0f;
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int64_t first = blockIdx.x * FUSED_ROWS, last = first + FUSED_ROWS < N ? first + FUSED_ROWS : N;
    const int64_t pieces = C / 4;
    const Float4* w4 = reinterpret_cast<const Float4*>(w);
    for (int64_t n = first + warp; n < last; n += warps) {
        const Float4* x4 = reinterpret_cast<const Float4*>(x + n * C);
        const Float4* dy4 = reinterpret_cast<const Float4*>(dy + n * C);
        Float4 xs[PIECES], dys[PIECES];
        const float r = rstd[n];
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < PIECES; i++) {
            const int64_t p = lane + 32 * i;
            if (p >= pieces) continue;
            xs[i] = x4[p];
            dys[i] = dy4[p];
            const Float4 wp = w4[p];
            for (int j = 0; j < 4; j++) dot += dys[i].v[j] * wp.v[j] * xs[i].v[j];
        }
        const float coef = r * r * r * gpu::warp_sum(dot) / C;
        Float4* dx4 = reinterpret_cast<Float4*>(dx + n * C);
#pragma unroll
        for (int i = 0; i < PIECES; i++) {
            const int64_t p = lane + 32 * i;
            if (p >= pieces) continue;
            const Float4 wp = w4[p];
            Float4 out;
            for (int j = 0; j < 4; j++) {
                out.v[j] = r * wp.v[j] * dys[i].v[j] - xs[i].v[j] * coef;
                atomicAdd(&dw_s[4 * p + j], dys[i].v[j] * xs[i].v[j] * r);
            }
            dx4[p] = out;
        }
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(&dw[c], dw_s[c]);
}

// ---- the problem, the CPU reference, the checks ----------------------------------------------------------------

struct Problem {
    int64_t N, C;
    std::vector<float> x, dy, w, rstd, dw0;  // dw0: what dw holds before (the kernels add to it)
    std::vector<float> dx_ref, dw_ref;
};

// Random inputs, rstd from x (eps 1e-6), and the reference in double: the FP32 inputs' exact result, near enough.
static Problem make_problem() {
    Problem p;
    p.N = EMULATED ? 300 : 16384;  // 300: three of the trainer's dw chunks, the last partial
    p.C = EMULATED ? 200 : 2048;   // 200: not a multiple of 32 lanes or of 128 (a warp's 16-byte pieces)
    Rng rng(42);
    p.x = randn(p.N * p.C, rng);
    p.dy = randn(p.N * p.C, rng);
    p.w = randn(p.C, rng);
    p.dw0 = randn(p.C, rng);
    p.rstd.resize(p.N);
    p.dx_ref.resize(p.N * p.C);
    std::vector<double> dw(p.dw0.begin(), p.dw0.end());
    for (int64_t n = 0; n < p.N; n++) {
        const float* x = &p.x[n * p.C];
        const float* dy = &p.dy[n * p.C];
        double ss = 0.0, dot = 0.0;
        for (int64_t c = 0; c < p.C; c++) ss += (double)x[c] * x[c];
        p.rstd[n] = (float)(1.0 / std::sqrt(ss / p.C + 1e-6));
        const double r = p.rstd[n];
        for (int64_t c = 0; c < p.C; c++) dot += (double)dy[c] * p.w[c] * x[c];
        for (int64_t c = 0; c < p.C; c++) {
            p.dx_ref[n * p.C + c] = (float)(r * p.w[c] * dy[c] - x[c] * r * r * r * dot / p.C);
            dw[c] += (double)dy[c] * x[c] * r;
        }
    }
    p.dw_ref.assign(dw.begin(), dw.end());
    return p;
}

static const Problem& problem() {
    static const Problem p = make_problem();
    return p;
}

struct Buffers {
    DeviceArray<float> x, dy, w, rstd, dx, dw, scratch;
    explicit Buffers(const Problem& p)
        : x(p.x), dy(p.dy), w(p.w), rstd(p.rstd), dx(p.N * p.C), dw(p.dw0),
          scratch(gpu::rmsnorm_backward_scratch_floats(p.N, p.C)) {}
};

// Version v with `block` threads per block (the trainer's launcher picks its own).
static void run(int v, int block, Buffers& b, int64_t N, int64_t C) {
    const unsigned fused_blocks = (unsigned)gpu::ceil_div(N, FUSED_ROWS);
    if (v == 1) {
        gpu::launch_kernel(rmsnorm_dx_thread_per_row, (unsigned)gpu::ceil_div(N, block), block, 0, nullptr,
                           b.dx.ptr, b.dy.ptr, b.x.ptr, b.w.ptr, b.rstd.ptr, N, C);
        gpu::launch_kernel(rmsnorm_dw_thread_per_column, (unsigned)gpu::ceil_div(C, block), block, 0, nullptr,
                           b.dw.ptr, b.dy.ptr, b.x.ptr, b.rstd.ptr, N, C);
    } else if (v == 2) {
        gpu::rmsnorm_backward(b.dx.ptr, b.dw.ptr, b.dy.ptr, b.x.ptr, b.w.ptr, b.rstd.ptr, N, C, nullptr, b.scratch.ptr,
                              nullptr);
    } else if (v == 3) {
        gpu::launch_kernel(rmsnorm_backward_fused, fused_blocks, block, C * sizeof(float), nullptr, b.dx.ptr,
                           b.dw.ptr, b.dy.ptr, b.x.ptr, b.w.ptr, b.rstd.ptr, N, C);
    } else {
        if (C % 4 != 0 || C > 128 * 16) {
            fprintf(stderr, "version 4 takes C a multiple of 4, at most 2048 (C = %lld)\n", (long long)C);
            exit(1);
        }
        auto kernel = C <= 128 * 4   ? rmsnorm_backward_fused_registers<4>
                      : C <= 128 * 8 ? rmsnorm_backward_fused_registers<8>
                                     : rmsnorm_backward_fused_registers<16>;
        gpu::launch_kernel(kernel, fused_blocks, block, C * sizeof(float), nullptr, b.dx.ptr, b.dw.ptr, b.dy.ptr,
                           b.x.ptr, b.w.ptr, b.rstd.ptr, N, C);
    }
}

// The block sizes version v is checked and timed at (the trainer's launcher picks its own).
static std::vector<int> block_sizes(int v) {
    if (v == 2) return {gpu::RMSNORM_THREADS};
    if (v == 4) return {64, 128, 256};  // up to 168 registers a thread: 256 threads fit an SM's 64K
    return {64, 128, 256, 512, 1024};
}

// tol 1e-4 for both: FP32 sums of up to C = 2048 (dx) and N = 16384 (dw) terms, in another order than the double
// reference; their roundoff is near sqrt(n) u (u = 6e-8) of the terms' scale, ~1e-6 of the result's here, while a
// term left out or counted twice is an error of a few 1e-4 or more.
static bool check_version(int v) {
    const Problem& p = problem();
    bool ok = true;
    for (int block : block_sizes(v)) {
        Buffers b(p);
        run(v, block, b, p.N, p.C);
        ok = check(fmt("dx, block %d", block), b.dx.get(), p.dx_ref, 1e-4) && ok;
        ok = check(fmt("dw +=, block %d", block), b.dw.get(), p.dw_ref, 1e-4) && ok;
    }
    return ok;
}

static void time_version(int v) {
    const Problem& p = problem();
    Buffers b(p);
    // read x and dy, write dx; read w, read and write dw; read rstd
    const double bytes = 4.0 * (3 * p.N * p.C + 3 * p.C + p.N);
    for (int block : block_sizes(v))
        print_time(fmt("block %d", block), time_ms([&] { run(v, block, b, p.N, p.C); }), bytes, 0);
}

int main(int argc, char** argv) {
    return lab_main(argc, argv, "rmsnorm_backward", VERSIONS, check_version, time_version);
}
