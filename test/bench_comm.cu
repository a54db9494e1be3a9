// bench_comm: the expert-parallel token exchange of one MoE layer on the GPU against NCCL's plain all-to-all on the
// same bytes (`make bench-comm`; BENCH_RANKS=8 runs it under mpirun -np 8, one rank per GPU).
//
// What runs: each rank routes --tokens tokens (4096) to --topk (8) of --experts (256) experts at random (distinct
// experts per token, a fixed seed per rank), builds the dispatch plan on the host (build_expert_plan, the counts
// exchanged by plan_dispatch: model/expert_plan.h) over an EP group of every rank (--ep
// for fewer), and times, through the NCCL Comm (make_nccl_comm) with FP32 rows of --hidden (7168) floats and the
// kernels of kernels/permute.cuh (the sorts are permute_forward with k = 1, as gpu/moe.cu does them):
//   dispatch      permute the token rows into plan order (gpu::permute_forward) + comm->all_to_all_v + sort the
//                 received rows into expert order: what an MoE layer does before its expert GEMMs
//   return        the reverse: sort back to arrival order + comm->all_to_all_v back, then combine: the weighted
//                 sum per token (gpu::combine_forward)
//   dispatch BF16 the dispatch as the model does it with --dtype bf16: BF16 rows (half the bytes), exchanged as
//                 pairs of BF16 values per float (the hidden size must be even)
//   all-to-all-v  comm->all_to_all_v alone, dispatch routing: the exchange without the two kernels
//   send/recv     comm->all_to_all_v with an equal split: the ncclSend/ncclRecv group on uniform sizes
//   ncclAlltoAll  NCCL's own all-to-all, equal split, on its own communicator over the same EP ranks: the reference
// Every operation is complete when it returns (the Comm's contract: a stream synchronisation after each call; the
// reference gets the same), timed with CUDA events over --iters (20) repetitions after 3 warm-up ones.
// Alone (no mpirun) it is one rank on GPU 0: every exchange is a self-copy through NCCL.
//
// How to read it: bytes = bytes one rank sends per operation, averaged over the ranks (dispatch sends its N*k
// rows; return sends back the rows it received, the same on average); time = mean over ranks of each rank's mean.
// algbw = bytes / time; busbw = algbw * (P-1)/P, as nccl-tests defines it for all-to-all (the self-part moves no
// link bytes; 0 on one rank). `vs a2a` is algbw / ncclAlltoAll's algbw (the same ratio in busbw): the
// target is dispatch and return at 0.8 or more. A dispatch/return round trip with weights 1/k is checked
// against the input first (return of dispatch, combined, gives x back), and the BF16 dispatch against the FP32 one's rows
// rounded, so the timed paths are known to move the right rows.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/comm.h"
#include "model/expert_plan.h"
#include "kernels/permute.cuh"
#include "model/rng.h"
#include "test/random_model.h"

#define NCCL_CHECK(call)                                                                                      \
    do {                                                                                                      \
        ncclResult_t rc_ = (call);                                                                            \
        if (rc_ != ncclSuccess) {                                                                             \
            fprintf(stderr, "bench_comm: NCCL error %s at %s:%d in %s\n", ncclGetErrorString(rc_), __FILE__, \
                    __LINE__, #call);                                                                         \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)

constexpr int WARMUP = 3;

// The launcher's number (rank or size) from the first of these environment variables that is set, else fallback.
static int launcher_int(const char* const* names, int fallback) {
    for (; *names; names++)
        if (const char* v = getenv(*names)) return atoi(v);
    return fallback;
}

[[noreturn]] static void usage(const char* message) {
    static const char* const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", nullptr};
    if (launcher_int(rank_vars, 0) == 0)
        fprintf(stderr,
                "bench_comm: %s\nusage: bench_comm [--tokens N (4096)] [--hidden D (7168)] [--topk K (8)] "
                "[--experts E (256)] [--iters I (20)] [--ep P (every rank)]\n",
                message);
    exit(2);
}

template <typename T>
static T* device_alloc(int64_t n) {
    T* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, (size_t)(n > 0 ? n : 1) * sizeof(T)));
    return p;
}

template <typename T>
static T* device_copy(const std::vector<T>& v) {
    T* p = device_alloc<T>((int64_t)v.size());
    if (!v.empty()) CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

int main(int argc, char** argv) {
    int64_t N = 4096, d = 7168;
    int k = 8, E = 256, iters = 20;
    static const char* const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", nullptr};
    int ep = launcher_int(size_vars, 1);
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage((std::string(argv[i]) + " needs a value").c_str());
        const char* flag = argv[i];
        char* end = nullptr;
        const long long v = strtoll(argv[++i], &end, 10);
        if (*end != '\0' || v < 1 || v > (1ll << 30)) usage((std::string(flag) + ": not a positive integer").c_str());
        if (!strcmp(flag, "--tokens")) N = v;
        else if (!strcmp(flag, "--hidden")) d = v;
        else if (!strcmp(flag, "--topk")) k = (int)v;
        else if (!strcmp(flag, "--experts")) E = (int)v;
        else if (!strcmp(flag, "--iters")) iters = (int)v;
        else if (!strcmp(flag, "--ep")) ep = (int)v;
        else usage((std::string("unknown flag ") + flag).c_str());
    }
    if (k > E) usage("--topk is larger than --experts");
    if (ep < 1 || E % ep != 0) usage(("--ep " + std::to_string(ep) + " does not divide --experts").c_str());
    if (N * k > (1ll << 31) - 1) usage("--tokens x --topk is over 2^31 rows");

    std::unique_ptr<Comm> comm = make_nccl_comm(ep, 1, "bench_comm");
    const int P = comm->ep_size;
    const bool lead = comm->rank == 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));

    // Routing and plans on the host: the counts go through the Comm from host memory (staged by the NCCL Comm).
    Rng rng(1234 + (uint64_t)comm->rank);
    const std::vector<int32_t> chosen = random_routing(N, k, E, rng);
    const ExpertPlan plan = build_expert_plan(chosen.data(), N * k, E);
    const DispatchPlan dispatch = plan_dispatch(*comm, plan.counts);
    const int64_t rows = N * k, R = dispatch.received(), peer_rows = rows / P;  // peer_rows: the equal split
    const std::vector<int64_t> equal_rows(P, peer_rows);

    // Device buffers: tokens x (N, d), rows in plan order (N*k, d), arrived rows (R, d) in source order, expert rows
    // (R, d) in expert order, combined tokens out (N, d). arrived also receives the equal-split references.
    std::vector<float> x_host(N * d);
    for (float& v : x_host) v = rng.uniform() - 0.5f;
    float* x = device_copy(x_host);
    float* weights = device_copy(std::vector<float>(N * k, 1.0f / k));
    int64_t* assignment_of_row = device_copy(plan.assignment_of_row);
    int64_t* row_of_assignment = device_copy(plan.row_of_assignment);
    // the permutations as gathers (gpu::permute_forward with k = 1, as gpu/moe.cu does): expert row e takes
    // received row expert_to_recv[e]; received row r takes expert row recv_to_expert[r]
    std::vector<int64_t> expert_to_recv(R);
    for (int64_t r = 0; r < R; r++) expert_to_recv[dispatch.expert_row_of_recv[r]] = r;
    int64_t* expert_to_recv_dev = device_copy(expert_to_recv);
    int64_t* recv_to_expert_dev = device_copy(dispatch.expert_row_of_recv);
    float* sent = device_alloc<float>(rows * d);
    float* arrived = device_alloc<float>((R > peer_rows * P ? R : peer_rows * P) * d);
    float* expert_rows = device_alloc<float>(R * d);
    float* out = device_alloc<float>(N * d);
    // the BF16 dispatch's buffers: x rounded to BF16, and the rows in plan, arrival and expert order
    std::vector<__nv_bfloat16> x16_host(N * d);
    for (int64_t i = 0; i < N * d; i++) x16_host[i] = __float2bfloat16_rn(x_host[i]);
    __nv_bfloat16* x16 = device_copy(x16_host);
    __nv_bfloat16* sent16 = device_alloc<__nv_bfloat16>(rows * d);
    __nv_bfloat16* arrived16 = device_alloc<__nv_bfloat16>(R * d);
    __nv_bfloat16* expert_rows16 = device_alloc<__nv_bfloat16>(R * d);

    // NCCL's all-to-all gets its own communicator over the same EP ranks (the Comm keeps its own private).
    ncclUniqueId id;
    if (lead) NCCL_CHECK(ncclGetUniqueId(&id));
    comm->broadcast(&id, sizeof(id), 0);
    ncclComm_t world_nccl, ep_nccl;
    NCCL_CHECK(ncclCommInitRank(&world_nccl, comm->world, id, comm->rank));
    NCCL_CHECK(ncclCommSplit(world_nccl, comm->dp_rank, comm->ep_rank, &ep_nccl, nullptr));

    // rows of T (float, or __nv_bfloat16 moved as d/2 floats a row, as gpu/moe.cu's dispatch_rows does)
    auto dispatch_as = [&](auto* rows_in, const auto* rows_x, auto* rows_arrived, auto* rows_expert) {
        using T = std::remove_pointer_t<decltype(rows_in)>;
        gpu::permute_forward(rows_in, rows_x, assignment_of_row, N, k, d, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));  // the Comm runs on its own stream
        comm->all_to_all_v(reinterpret_cast<const float*>(rows_in), dispatch.send_rows.data(),
                           reinterpret_cast<float*>(rows_arrived), dispatch.recv_rows.data(),
                           d * (int64_t)sizeof(T) / (int64_t)sizeof(float));
        gpu::permute_forward(rows_expert, rows_arrived, expert_to_recv_dev, R, 1, d, stream);
    };
    auto run_dispatch = [&] { dispatch_as(sent, x, arrived, expert_rows); };
    auto run_return = [&] {
        gpu::permute_forward(arrived, expert_rows, recv_to_expert_dev, R, 1, d, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        comm->all_to_all_v(arrived, dispatch.recv_rows.data(), sent, dispatch.send_rows.data(), d);
        gpu::combine_forward(out, sent, weights, row_of_assignment, N, k, d, false, stream);
    };

    auto run_dispatch_bf16 = [&] { dispatch_as(sent16, x16, arrived16, expert_rows16); };

    // Round trip: with weights 1/k, the combined return(dispatch(x)) is x up to the rounding of k terms. And the BF16 dispatch
    // delivers the FP32 dispatch's expert rows, rounded (exactly).
    run_dispatch();
    std::vector<float> expert_host(R * d);
    CUDA_CHECK(cudaMemcpyAsync(expert_host.data(), expert_rows, expert_host.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
    run_return();
    std::vector<float> back(N * d);
    CUDA_CHECK(cudaMemcpyAsync(back.data(), out, back.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double max_error = 0.0;
    for (int64_t i = 0; i < N * d; i++) {
        const double e = fabs((double)back[i] - x_host[i]);
        if (!(e <= max_error)) max_error = e;  // a NaN sticks
    }
    int64_t bf16_wrong = 0;
    if (d % 2 == 0) {
        run_dispatch_bf16();
        std::vector<__nv_bfloat16> expert16_host(R * d);
        CUDA_CHECK(cudaMemcpyAsync(expert16_host.data(), expert_rows16, expert16_host.size() * sizeof(__nv_bfloat16),
                                   cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int64_t i = 0; i < R * d; i++)
            bf16_wrong += __bfloat162float(expert16_host[i]) != __bfloat162float(__float2bfloat16_rn(expert_host[i]));
    }
    double bad = max_error <= 1e-5 && bf16_wrong == 0 ? 0.0 : 1.0;
    comm->all_reduce_sum(&bad, 1, Group::World);
    if (bad > 0) {  // every rank stops; the ones that saw it say so
        if (max_error > 1e-5)
            fprintf(stderr, "bench_comm: [rank %d] dispatch/return round trip is wrong: max |out - x| = %g\n",
                    comm->rank, max_error);
        if (bf16_wrong > 0)
            fprintf(stderr, "bench_comm: [rank %d] the BF16 dispatch delivered %ld wrong values\n", comm->rank,
                    (long)bf16_wrong);
        return 1;
    }

    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    // Times op (iters after WARMUP; the mean over ranks of each rank's mean), prints its row and returns its algbw.
    // bytes: this rank's, averaged over the ranks too. reference: the algbw of the ratio (0: this row is it).
    auto measure = [&](const char* name, double bytes, const std::function<void()>& op, double reference) {
        for (int i = 0; i < WARMUP; i++) op();
        CUDA_CHECK(cudaStreamSynchronize(stream));
        comm->barrier();
        CUDA_CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < iters; i++) op();
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float elapsed = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
        double mean[2] = {(double)elapsed / iters, bytes};
        comm->all_reduce_sum(mean, 2, Group::World);
        const double ms = mean[0] / comm->world, b = mean[1] / comm->world;
        const double alg = b / (ms * 1e-3) / 1e9, bus = alg * (P - 1) / P;
        if (lead)
            printf("%-44s %10.1f %10.3f %11.1f %11.1f %9.2f\n", name, b / 1e6, ms, alg, bus,
                   alg / (reference > 0 ? reference : alg));
        return alg;
    };

    if (lead) {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, comm->local_rank));
        printf("bench_comm: %d rank%s (EP %d x DP %d) on %s; %lld tokens x top-%d of %d experts, hidden %lld, FP32\n",
               comm->world, comm->world == 1 ? "" : "s", P, comm->dp_size, prop.name, (long long)N, k, E,
               (long long)d);
        printf("round trip return(dispatch(x)) == x: ok (max error %.2g)%s; %d iterations after %d warm-up\n",
               max_error, d % 2 == 0 ? ", BF16 dispatch == FP32 dispatch rounded: ok" : "", iters, WARMUP);
        printf("%-44s %10s %10s %11s %11s %9s\n", "operation", "MB/rank", "time ms", "algbw GB/s", "busbw GB/s",
               "vs a2a");
    }
    const double row_bytes = (double)d * sizeof(float);
    const double equal_bytes = (double)(peer_rows * P) * row_bytes;
    const double a2a = measure("ncclAlltoAll (equal split, reference)", equal_bytes, [&] {
        NCCL_CHECK(ncclAlltoAll(sent, arrived, (size_t)(peer_rows * d), ncclFloat32, ep_nccl, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }, 0.0);
    measure("send/recv all-to-all (equal split, Comm)", equal_bytes, [&] {
        comm->all_to_all_v(sent, equal_rows.data(), arrived, equal_rows.data(), d);
    }, a2a);
    measure("all-to-all-v alone (dispatch routing)", rows * row_bytes, [&] {
        comm->all_to_all_v(sent, dispatch.send_rows.data(), arrived, dispatch.recv_rows.data(), d);
    }, a2a);
    measure("dispatch (permute + all-to-all-v + sort)", rows * row_bytes, run_dispatch, a2a);
    measure("return (sort + all-to-all-v + combine)", R * row_bytes, run_return, a2a);
    if (d % 2 == 0)
        measure("dispatch, BF16 rows (the model's bf16 path)", rows * row_bytes / 2, run_dispatch_bf16, a2a);

    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    NCCL_CHECK(ncclCommDestroy(ep_nccl));
    NCCL_CHECK(ncclCommDestroy(world_nccl));
    for (void* p : {(void*)x, (void*)weights, (void*)assignment_of_row, (void*)row_of_assignment, (void*)expert_to_recv_dev,
                    (void*)recv_to_expert_dev, (void*)sent, (void*)arrived, (void*)expert_rows, (void*)out, (void*)x16,
                    (void*)sent16, (void*)arrived16, (void*)expert_rows16})
        CUDA_CHECK(cudaFree(p));
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}
