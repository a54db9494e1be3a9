// DeepSeek-V3 router, forward, FP32 (the trainer's: kernels/router.cuh; the selection: model/router.h).
//   logits (N, E), bias (E) -> scores (N, E) = sigmoid(logits), chosen (N, k) int32, weights (N, k)
//   per token: c = s + bias; keep the topk_group groups whose two best c have the largest sum; chosen = the k best c
//   among the kept groups' experts, ties to the lower index; weights_j = s[chosen_j] (/ sum_j' s[chosen_j'] with
//   norm_topk_prob) * routed_scaling_factor
// The versions: a thread per token that runs router_select with its scratch in global memory (the trainer's) or in
// shared memory, and a warp per token that holds E/32 experts a lane in registers and selects by warp shuffles.
#include "common.h"
#include "kernels/router.cuh"

const std::vector<const char*> VERSIONS = {
    "the trainer's (kernels/router.cuh): a thread per token, router_select's scratch in global memory",
    "a thread per token, router_select's scratch in shared memory",
    "a warp per token: E/32 experts a lane in registers, group scores and picks by warp shuffles",
};

constexpr unsigned FULL = 0xffffffffu;
constexpr int WARP_MAX_PER_LANE = 8;  // version 3 takes E <= 256, a multiple of 32, and G, k <= 32

// ---- version 2 -----------------------------------------------------------------------------------------------

// E + 1 floats of dynamic shared memory a thread: the pad puts element e of the 32 threads of a warp in 32
// different banks (with E floats, a multiple of 32, they would all fall in one).
__global__ void router_thread_shared_scratch(float* scores, int32_t* chosen, float* weights, const float* logits,
                                             const float* bias, Config c, int64_t N) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const int E = c.n_routed_experts, k = c.num_experts_per_tok;
    float* scratch = gpu::dynamic_shared<float>() + threadIdx.x * (E + 1);
    for (int e = 0; e < E; e++) scores[t * E + e] = gpu::sigmoid(logits[t * E + e]);
    router_select(c, scores + t * E, bias, scratch, chosen + t * k, weights + t * k);
}

// ---- version 3 -----------------------------------------------------------------------------------------------

// The warp's best (value, index) pair: the larger value, ties to the lower index (router_select's scans keep the
// first best); index -1 is none. Every lane ends with the same pair.
__device__ inline void warp_argmax(float& v, int& i) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other_v = __shfl_xor_sync(FULL, v, offset);
        const int other_i = __shfl_xor_sync(FULL, i, offset);
        if (other_i >= 0 && (i < 0 || other_v > v || (other_v == v && other_i < i))) {
            v = other_v;
            i = other_i;
        }
    }
}

// Lane l holds experts 32 i + l. The values compared are router_select's, so the choice is the same bit for bit.
__global__ void router_warp_per_token(float* scores, int32_t* chosen, float* weights, const float* logits,
                                      const float* bias, Config c, int64_t N) {
    const int lane = threadIdx.x % 32;
    const int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (t >= N) return;  // the whole warp
    const int E = c.n_routed_experts, G = c.n_group, per_group = E / G, k = c.num_experts_per_tok;
    const int per_lane = E / 32;
    const float masked = -1e30f;  // router_select's: below any score plus bias
    float s[WARP_MAX_PER_LANE], choice[WARP_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < WARP_MAX_PER_LANE; i++) {
        s[i] = 0.0f;
        choice[i] = masked;
        if (i < per_lane) {
            const int e = 32 * i + lane;
            s[i] = gpu::sigmoid(logits[t * E + e]);
            scores[t * E + e] = s[i];
            choice[i] = s[i] + bias[e];
        }
    }
    if (G > 1) {
        // Group g's score (its two best c) ends in lane g: each lane's two best of the group, then the pairs merged
        // across the warp (as multisets: a value that appears twice is both the best and the second best).
        float group_score = 0.0f;
        for (int grp = 0; grp < G; grp++) {
            float top1 = masked, top2 = masked;
#pragma unroll
            for (int i = 0; i < WARP_MAX_PER_LANE; i++) {
                if (i >= per_lane || (32 * i + lane) / per_group != grp) continue;
                if (choice[i] > top1) {
                    top2 = top1;
                    top1 = choice[i];
                } else if (choice[i] > top2) {
                    top2 = choice[i];
                }
            }
            for (int offset = 16; offset > 0; offset >>= 1) {
                const float other1 = __shfl_xor_sync(FULL, top1, offset);
                const float other2 = __shfl_xor_sync(FULL, top2, offset);
                if (other1 > top1) {
                    top2 = fmaxf(top1, other2);
                    top1 = other1;
                } else {
                    top2 = fmaxf(top2, other1);
                }
            }
            if (lane == grp) group_score = per_group >= 2 ? top1 + top2 : top1;
        }
        unsigned kept = 0;  // bit g: group g kept
        for (int round = 0; round < c.topk_group; round++) {
            const bool candidate = lane < G && !(kept >> lane & 1u);
            float v = candidate ? group_score : masked;
            int g = candidate ? lane : -1;
            warp_argmax(v, g);
            kept |= 1u << g;
        }
#pragma unroll
        for (int i = 0; i < WARP_MAX_PER_LANE; i++)
            if (i < per_lane && !(kept >> ((32 * i + lane) / per_group) & 1u)) choice[i] = masked;
    }
    // k picks; after pick j lane j keeps the expert and its score, and every lane the running sum in pick order.
    float sum = 0.0f, my_score = 0.0f;
    int my_expert = -1;
    for (int j = 0; j < k; j++) {
        float v = masked;
        int best = -1;
#pragma unroll
        for (int i = 0; i < WARP_MAX_PER_LANE; i++) {
            if (i < per_lane && choice[i] > masked && (best < 0 || choice[i] > v)) {
                v = choice[i];
                best = 32 * i + lane;
            }
        }
        warp_argmax(v, best);
        if (best < 0) {  // non-finite scores leave too few experts: router_select's -1 for every pick
            if (lane < k) {
                chosen[t * k + lane] = -1;
                weights[t * k + lane] = 0.0f;
            }
            return;
        }
        float s_best = 0.0f;
#pragma unroll
        for (int i = 0; i < WARP_MAX_PER_LANE; i++) {
            if (32 * i + lane == best) {
                s_best = s[i];
                choice[i] = masked;
            }
        }
        s_best = __shfl_sync(FULL, s_best, best % 32);
        sum += s_best;
        if (lane == j) {
            my_expert = best;
            my_score = s_best;
        }
    }
    if (lane < k) {
        chosen[t * k + lane] = my_expert;
        weights[t * k + lane] = (c.norm_topk_prob ? my_score / sum : my_score) * c.routed_scaling_factor;
    }
}

// ---- the problem, the CPU reference, the checks ----------------------------------------------------------------

// Two routers: DeepSeek-V3's grouped one and a flat one without groups. Every other token's logits are multiples of
// 1/2, and the bias takes five values, so that experts and groups tie and the tie rule is checked too.
struct Case {
    const char* name;
    Config c;
    int64_t N;
    std::vector<float> logits, bias, scores_ref;
};

static Config router_config(int E, int G, int topk_group, int k, bool norm, float scale) {
    Config c;
    c.n_routed_experts = E;
    c.n_group = G;
    c.topk_group = topk_group;
    c.num_experts_per_tok = k;
    c.norm_topk_prob = norm;
    c.routed_scaling_factor = scale;
    return c;
}

static std::vector<Case> make_cases() {
    std::vector<Case> cases(2);
    cases[0].name = "grouped";
    cases[0].c = EMULATED ? router_config(64, 8, 3, 6, true, 2.5f) : router_config(256, 8, 4, 8, true, 2.5f);
    cases[1].name = "flat";
    cases[1].c = EMULATED ? router_config(96, 1, 1, 8, false, 1.0f) : router_config(64, 1, 1, 6, false, 1.0f);
    Rng rng(7);
    for (Case& tc : cases) {
        const int64_t N = tc.N = EMULATED ? 300 : 32768;
        const int E = tc.c.n_routed_experts;
        tc.logits = randn(N * E, rng, 2.0f);
        for (int64_t t = 0; t < N; t += 2)
            for (int e = 0; e < E; e++) tc.logits[t * E + e] = std::round(tc.logits[t * E + e] * 2.0f) / 2.0f;
        tc.bias.resize(E);
        for (float& b : tc.bias) b = (float)((int)(rng.next_u64() % 5) - 2) / 8.0f;
        tc.scores_ref.resize(N * E);
        for (int64_t i = 0; i < N * E; i++) tc.scores_ref[i] = 1.0f / (1.0f + expf(-tc.logits[i]));
    }
    return cases;
}

static const std::vector<Case>& cases() {
    static const std::vector<Case> all = make_cases();
    return all;
}

struct Buffers {
    DeviceArray<float> logits, bias, scores, weights, scratch;
    DeviceArray<int32_t> chosen;
    explicit Buffers(const Case& tc)
        : logits(tc.logits), bias(tc.bias), scores(tc.N * tc.c.n_routed_experts),
          weights(tc.N * tc.c.num_experts_per_tok), scratch(tc.N * tc.c.n_routed_experts),
          chosen(tc.N * tc.c.num_experts_per_tok) {}
};

static void run(int v, int block, Buffers& b, const Case& tc) {
    const Config& c = tc.c;
    if (v == 1) {
        gpu::router_forward(b.scores.ptr, b.chosen.ptr, b.weights.ptr, b.scratch.ptr, b.logits.ptr, b.bias.ptr, c,
                            tc.N, nullptr);
    } else if (v == 2) {
        const size_t shared = (size_t)block * (c.n_routed_experts + 1) * sizeof(float);
        gpu::launch_kernel(router_thread_shared_scratch, (unsigned)gpu::ceil_div(tc.N, block), block, shared, nullptr,
                           b.scores.ptr, b.chosen.ptr, b.weights.ptr, b.logits.ptr, b.bias.ptr, c, tc.N);
    } else {
        if (c.n_routed_experts % 32 != 0 || c.n_routed_experts > 32 * WARP_MAX_PER_LANE || c.n_group > 32 ||
            c.num_experts_per_tok > 32) {
            fprintf(stderr, "version 3 takes E a multiple of 32 up to %d, and G, k <= 32\n", 32 * WARP_MAX_PER_LANE);
            exit(1);
        }
        gpu::launch_kernel(router_warp_per_token, (unsigned)gpu::ceil_div(tc.N * 32, block), block, 0, nullptr,
                           b.scores.ptr, b.chosen.ptr, b.weights.ptr, b.logits.ptr, b.bias.ptr, c, tc.N);
    }
}

// The block sizes version v is checked and timed at (the trainer's launcher picks its own).
static std::vector<int> block_sizes(int v) {
    if (v == 1) return {gpu::ROUTER_FORWARD_THREADS};
    if (v == 2) return {32, 64, 128};  // (E + 1) floats of shared memory a thread: within 227 KiB at E = 256
    return {64, 128, 256, 512};
}

// scores: tol 1e-6, one expf (the device's is within 2 ulp of the host's) and a division.
// chosen and weights: against router_select run on the host on the device's scores, so that a last-bit difference
// of expf cannot turn a near tie; every version compares the same values in the same order (tol 0), and forms the
// weights by the same operations (tol 1e-6: only a contraction into a fused multiply-add may differ).
static bool check_version(int v) {
    bool ok = true;
    for (const Case& tc : cases())
        for (int block : block_sizes(v)) {
            const int E = tc.c.n_routed_experts, k = tc.c.num_experts_per_tok;
            Buffers b(tc);
            run(v, block, b, tc);
            const std::vector<float> scores = b.scores.get();
            std::vector<int32_t> chosen_ref(tc.N * k);
            std::vector<float> weights_ref(tc.N * k), scratch(E);
            for (int64_t t = 0; t < tc.N; t++)
                router_select(tc.c, &scores[t * E], tc.bias.data(), scratch.data(), &chosen_ref[t * k],
                              &weights_ref[t * k]);
            ok = check(fmt("scores, %s E=%d, block %d", tc.name, E, block), scores, tc.scores_ref, 1e-6) && ok;
            ok = check(fmt("chosen, %s G=%d k=%d, block %d", tc.name, tc.c.n_group, k, block), b.chosen.get(),
                       chosen_ref, 0) && ok;
            ok = check(fmt("weights, %s, block %d", tc.name, block), b.weights.get(), weights_ref, 1e-6) && ok;
        }
    return ok;
}

static void time_version(int v) {
    for (const Case& tc : cases()) {
        Buffers b(tc);
        const int E = tc.c.n_routed_experts, k = tc.c.num_experts_per_tok;
        const double bytes = 4.0 * (2 * tc.N * E + E + 2 * tc.N * k);  // read logits, write scores, chosen, weights
        for (int block : block_sizes(v))
            print_time(fmt("%s, block %d", tc.name, block), time_ms([&] { run(v, block, b, tc); }), bytes, 0);
    }
}

int main(int argc, char** argv) {
    return lab_main(argc, argv, "router_forward", VERSIONS, check_version, time_version);
}
