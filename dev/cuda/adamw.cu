// AdamW, FP32 (the trainer's: kernels/adamw.cuh; the CPU's: model/optimizer.cpp). Step t (1-based), per value:
//   p, grad, m, v (n) -> p, m, v updated in place;  g = grad * grad_multiplier (the clip factor)
//   m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2;   p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p)
// Memory-bound: 16 bytes read and 12 written per value, so the versions differ in how they move the bytes: a
// thread per value, the trainer's thread block per span of 4096 values (one launch for many tensors), and 16-byte loads
// and stores in a grid-stride loop.
#include <cmath>

#include "common.h"
#include "kernels/adamw.cuh"

const std::vector<const char*> VERSIONS = {
    "naive: a thread per value",
    "the trainer's (kernels/adamw.cuh): a thread block per span of 4096 values of a range, the ranges in one table",
    "four values a thread by 16-byte loads and stores, a grid-stride loop (the n % 4 last ones one by one)",
};

// The update's constants, as adamw_update computes them on the host
struct AdamW {
    float lr, beta1, beta2, eps, weight_decay, bias1, bias2, grad_multiplier;
};

__device__ inline void adamw_value(float& p, float& m, float& v, float grad, const AdamW& a) {
    const float g = grad * a.grad_multiplier;
    m = a.beta1 * m + (1.0f - a.beta1) * g;
    v = a.beta2 * v + (1.0f - a.beta2) * g * g;
    p -= a.lr * (m / a.bias1 / (sqrtf(v / a.bias2) + a.eps) + a.weight_decay * p);
}

// ---- version 1 -----------------------------------------------------------------------------------------------

__global__ void adamw_thread_per_value(float* params, float* m, float* v, const float* grads, AdamW a, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) adamw_value(params[i], m[i], v[i], grads[i], a);
}

// ---- version 3 -----------------------------------------------------------------------------------------------

// Pieces of four values: piece q is values 4q..4q+3 (16-byte aligned, as cudaMalloc's buffers are).
__global__ void adamw_vectorized(float* params, float* m, float* v, const float* grads, AdamW a, int64_t n) {
    const int64_t pieces = n / 4, stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    Float4 *p4 = reinterpret_cast<Float4*>(params), *m4 = reinterpret_cast<Float4*>(m);
    Float4* v4 = reinterpret_cast<Float4*>(v);
    const Float4* g4 = reinterpret_cast<const Float4*>(grads);
    for (int64_t q = first; q < pieces; q += stride) {
        Float4 pq = p4[q], mq = m4[q], vq = v4[q];
        const Float4 gq = g4[q];
        for (int j = 0; j < 4; j++) adamw_value(pq.v[j], mq.v[j], vq.v[j], gq.v[j], a);
        p4[q] = pq;
        m4[q] = mq;
        v4[q] = vq;
    }
    const int64_t i = 4 * pieces + first;  // the last n % 4 values
    if (i < n) adamw_value(params[i], m[i], v[i], grads[i], a);
}

// ---- the problem, the CPU reference, the checks ----------------------------------------------------------------

struct Problem {
    int64_t n;
    OptimizerConfig oc;
    float lr, grad_multiplier;
    int64_t step;
    std::vector<float> params, grads, m, v;
    std::vector<float> params_ref, m_ref, v_ref;
};

// Weights at an initialisation's scale (0.02) and lr 1e-3, so one update moves a weight by some percent of it and
// an error in the update shows in p. Moments as after a few steps; step 3, so the bias corrections matter.
static Problem make_problem() {
    Problem p;
    p.n = EMULATED ? 10007 : (int64_t)1 << 26;  // 10007: n % 4 = 3 values after the 16-byte pieces
    p.oc.beta1 = 0.9f;
    p.oc.beta2 = 0.95f;
    p.oc.eps = 1e-8f;
    p.oc.weight_decay = 0.1f;
    p.lr = 1e-3f;
    p.grad_multiplier = 0.5f;
    p.step = 3;
    Rng rng(11);
    p.params = randn(p.n, rng, 0.02f);
    p.grads = randn(p.n, rng);
    p.m = randn(p.n, rng, 0.1f);
    p.v = randn(p.n, rng, 0.1f);
    for (float& x : p.v) x = x * x;
    p.params_ref.resize(p.n);
    p.m_ref.resize(p.n);
    p.v_ref.resize(p.n);
    const double b1 = p.oc.beta1, b2 = p.oc.beta2;  // in double: the exact update of the FP32 inputs
    const double bias1 = 1.0 - std::pow(b1, (double)p.step), bias2 = 1.0 - std::pow(b2, (double)p.step);
    for (int64_t i = 0; i < p.n; i++) {
        const double g = (double)p.grads[i] * p.grad_multiplier;
        const double m = b1 * p.m[i] + (1.0 - b1) * g, v = b2 * p.v[i] + (1.0 - b2) * g * g;
        const double w = p.params[i];
        p.params_ref[i] = (float)(w - p.lr * (m / bias1 / (std::sqrt(v / bias2) + p.oc.eps) + p.oc.weight_decay * w));
        p.m_ref[i] = (float)m;
        p.v_ref[i] = (float)v;
    }
    return p;
}

static const Problem& problem() {
    static const Problem p = make_problem();
    return p;
}

struct Buffers {
    DeviceArray<float> params, grads, m, v;
    std::vector<int64_t> packed;  // the trainer's table of ranges: one range, all n values, with weight decay
    DeviceArray<int64_t> table;
    gpu::ShardRanges shard;
    explicit Buffers(const Problem& p)
        : params(p.params), grads(p.grads), m(p.m), v(p.v), packed(one_range(p.n)), table(packed),
          shard(gpu::shard_ranges_of(packed, table.ptr)) {}
    static std::vector<int64_t> one_range(int64_t n) {
        OptimizerShard s;
        OptimizerRange r;
        r.first = 0;
        r.count = n;
        r.moments = 0;
        r.weight_decay = true;
        s.ranges.push_back(r);
        s.moments = n;
        return gpu::shard_ranges_pack(s);
    }
};

static void run(int v, int block, Buffers& b, const Problem& p) {
    // the bias corrections in FP32 on the host, as adamw_update and the CPU's optimizer
    const AdamW a{p.lr,
                  p.oc.beta1,
                  p.oc.beta2,
                  p.oc.eps,
                  p.oc.weight_decay,
                  1.0f - powf(p.oc.beta1, (float)p.step),
                  1.0f - powf(p.oc.beta2, (float)p.step),
                  p.grad_multiplier};
    if (v == 1) {
        gpu::launch_kernel(adamw_thread_per_value, (unsigned)gpu::ceil_div(p.n, block), block, 0, nullptr,
                           b.params.ptr, b.m.ptr, b.v.ptr, b.grads.ptr, a, p.n);
    } else if (v == 2) {
        gpu::adamw_update(b.shard, b.params.ptr, nullptr, nullptr, 0, b.grads.ptr, b.m.ptr, b.v.ptr, p.oc, p.lr,
                          p.step, p.grad_multiplier, nullptr);
    } else {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        const int64_t fill = (int64_t)prop.multiProcessorCount * (2048 / block);  // every SM full, once
        const int64_t needed = gpu::ceil_div(p.n / 4, block);
        const unsigned blocks = (unsigned)(needed < 1 ? 1 : needed < fill ? needed : fill);
        gpu::launch_kernel(adamw_vectorized, blocks, block, 0, nullptr, b.params.ptr, b.m.ptr, b.v.ptr, b.grads.ptr,
                           a, p.n);
    }
}

// The block sizes version v is checked and timed at (the trainer's launcher picks its own).
static std::vector<int> block_sizes(int v) {
    if (v == 2) return {gpu::ADAMW_THREADS};
    return {64, 128, 256, 512, 1024};
}

// Against the double reference. m, v: tol 1e-6, two or three FP32 roundings (u = 6e-8 each). p: tol 2e-6, more
// of them, and the bias corrections 1 - b^t lose bits to cancellation in FP32 (1 - 0.95^3: 6x powf's error), as
// they do in the trainer and the CPU's optimizer (~5 u seen). The update is some percent of p, so an update wrong
// by a few parts in 10^4 of itself fails.
static bool check_version(int v) {
    const Problem& p = problem();
    bool ok = true;
    for (int block : block_sizes(v)) {
        Buffers b(p);
        run(v, block, b, p);
        ok = check(fmt("params, block %d", block), b.params.get(), p.params_ref, 2e-6) && ok;
        ok = check(fmt("m, block %d", block), b.m.get(), p.m_ref, 1e-6) && ok;
        ok = check(fmt("v, block %d", block), b.v.get(), p.v_ref, 1e-6) && ok;
    }
    return ok;
}

static void time_version(int v) {
    const Problem& p = problem();
    Buffers b(p);
    for (int block : block_sizes(v))
        print_time(fmt("block %d", block), time_ms([&] { run(v, block, b, p); }), 28.0 * p.n, 0);
}

int main(int argc, char** argv) { return lab_main(argc, argv, "adamw", VERSIONS, check_version, time_version); }
