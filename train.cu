// train: the GPU trainer. It keeps train_cpu's command line, config, data and checkpoint formats (DESIGN §3).
// This first version sets up the ranks over NCCL (one GPU each; MPI bootstraps under mpirun), checks the config
// and prints the memory plan of the FP32 master weights, gradients and AdamW state; the training loop with the
// hand-written CUDA kernels is the GPU trainer issue. Until then it exits non-zero after the plan, so no script
// mistakes it for a finished run.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <cuda_runtime.h>

#include "comm/comm.h"
#include "model/config.h"
#include "model/params.h"
#include "model/train_args.h"

#define CUDA_CHECK(call)                                                                                  \
    do {                                                                                                  \
        cudaError_t err_ = (call);                                                                        \
        if (err_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "train: CUDA error %s at %s:%d (%s)\n", cudaGetErrorString(err_), __FILE__, \
                    __LINE__, #call);                                                                     \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

int main(int argc, char** argv) {
    TrainArgs args = parse_train_args(argc, argv, "train");
    Config config = load_config(args.config);
    if (config.n_routed_experts % args.ep != 0) {  // every rank sees it; rank 0 says it
        const char* rank = getenv("OMPI_COMM_WORLD_RANK");
        if (!rank || !strcmp(rank, "0"))
            fprintf(stderr, "train: --ep %d does not divide n_routed_experts %d\n", args.ep, config.n_routed_experts);
        return 2;
    }
    std::unique_ptr<Comm> comm = make_nccl_comm(args.ep, "train");
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    ParamTable table = build_param_table(config, comm->ep_size);
    const double gib = 1024.0 * 1024.0 * 1024.0, param_bytes = 4.0 * table.total;
    printf("rank %d of %d (EP %d x DP %d), GPU %d: %s, %.1f GiB (%.1f GiB free)\n", comm->rank, comm->world,
           comm->ep_size, comm->dp_size, device, prop.name, total_bytes / gib, free_bytes / gib);
    printf("memory plan: parameters %.2f GiB, gradients %.2f GiB, AdamW state %.2f GiB\n", param_bytes / gib,
           param_bytes / gib, 2 * param_bytes / gib);
    fprintf(stderr, "train: the GPU training loop is not built yet; train with ./train_cpu\n");
    return 1;
}
