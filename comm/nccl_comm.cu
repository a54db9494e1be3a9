// The NCCL Comm for the GPU trainer: every buffer is device memory, every collective runs on the Comm's CUDA
// stream and is complete when the call returns. MPI only bootstraps: rank and world, the ranks on this host (so
// each rank takes the GPU of its local rank), the NCCL unique id, and ending the job on failure. NCCL 2.28 has no
// all-to-all-v: it is built from ncclSend/ncclRecv pairs inside one ncclGroupStart/ncclGroupEnd.
// Run without mpirun it is a one-rank job on GPU 0 that still goes through NCCL.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm.h"

namespace {

class NcclComm : public Comm {
public:
    NcclComm(int ep, const char* program) : program_(program), use_mpi_(launched_by_mpi()) {
        if (use_mpi_) {
            check_mpi(MPI_Init(nullptr, nullptr), "MPI_Init");
            check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
            check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world), "MPI_Comm_size");
        }
        int local_ranks = 1;
        if (use_mpi_) {
            MPI_Comm node;
            check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "split");
            check_mpi(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank(node)");
            check_mpi(MPI_Comm_size(node, &local_ranks), "MPI_Comm_size(node)");
            check_mpi(MPI_Comm_free(&node), "MPI_Comm_free");
        }
        int gpus = 0;
        if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
        if (gpus == 0) fatal_setup("no CUDA GPU found; use ./train_cpu for the CPU trainer");
        if (local_ranks > gpus)
            fatal_setup(std::to_string(local_ranks) + " ranks on one host but only " + std::to_string(gpus) +
                        " GPUs: start at most one rank per GPU");
        if (ep < 1 || world % ep != 0)
            fatal_setup("--ep " + std::to_string(ep) + " does not divide the " + std::to_string(world) +
                        " ranks (world = EP x DP)");
        ep_size = ep;
        ep_rank = rank % ep;
        dp_size = world / ep;
        dp_rank = rank / ep;
        check_cuda(cudaSetDevice(local_rank), "cudaSetDevice");
        check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
        ncclUniqueId id;
        if (rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
        if (use_mpi_) check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
        check_nccl(ncclCommInitRank(&world_comm_, world, id, rank), "ncclCommInitRank");
        check_nccl(ncclCommSplit(world_comm_, dp_rank, ep_rank, &ep_comm_, nullptr), "ncclCommSplit(EP)");
        check_nccl(ncclCommSplit(world_comm_, ep_rank, dp_rank, &dp_comm_, nullptr), "ncclCommSplit(DP)");
    }
    ~NcclComm() override {
        ncclCommDestroy(ep_comm_);
        ncclCommDestroy(dp_comm_);
        ncclCommDestroy(world_comm_);
        cudaStreamDestroy(stream_);
        if (use_mpi_) MPI_Finalize();
    }

    void all_reduce_sum(float* data, int64_t n, Group g) override { reduce(data, n, ncclFloat32, g); }
    void all_reduce_sum(double* data, int64_t n, Group g) override { reduce(data, n, ncclFloat64, g); }
    void all_reduce_sum(int64_t* data, int64_t n, Group g) override { reduce(data, n, ncclInt64, g); }

    void all_to_all(const int64_t* send, int64_t* recv, int64_t per_rank) override {
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        for (int p = 0; p < ep_size; p++) {
            check_nccl(ncclSend(send + p * per_rank, per_rank, ncclInt64, p, ep_comm_, stream_), "ncclSend");
            check_nccl(ncclRecv(recv + p * per_rank, per_rank, ncclInt64, p, ep_comm_, stream_), "ncclRecv");
        }
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        sync();
    }

    void all_to_all_v(const float* send, const int64_t* send_rows, float* recv, const int64_t* recv_rows,
                      int64_t width) override {
        int64_t send_at = 0, recv_at = 0;
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        for (int p = 0; p < ep_size; p++) {
            if (send_rows[p] > 0)
                check_nccl(ncclSend(send + send_at * width, send_rows[p] * width, ncclFloat32, p, ep_comm_, stream_),
                           "ncclSend");
            if (recv_rows[p] > 0)
                check_nccl(ncclRecv(recv + recv_at * width, recv_rows[p] * width, ncclFloat32, p, ep_comm_, stream_),
                           "ncclRecv");
            send_at += send_rows[p];
            recv_at += recv_rows[p];
        }
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        sync();
    }

    void gather_to_ep_root(const float* data, int64_t n, float* out) override {
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        if (ep_rank == 0)
            for (int p = 0; p < ep_size; p++)
                check_nccl(ncclRecv(out + p * n, n, ncclFloat32, p, ep_comm_, stream_), "ncclRecv");
        check_nccl(ncclSend(data, n, ncclFloat32, 0, ep_comm_, stream_), "ncclSend");
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        sync();
    }

    void broadcast(void* data, int64_t bytes, int root) override {
        check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, world_comm_, stream_), "ncclBroadcast");
        sync();
    }

    void barrier() override {
        sync();
        if (use_mpi_) check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    }

    [[noreturn]] void abort(const std::string& message) override {
        fprintf(stderr, "%s: [rank %d] %s\n", program_, rank, message.c_str());
        fflush(stderr);
        ncclCommAbort(world_comm_);
        if (use_mpi_) MPI_Abort(MPI_COMM_WORLD, 1);
        exit(1);
    }

private:
    void reduce(void* data, int64_t n, ncclDataType_t type, Group g) {
        ncclComm_t c = g == Group::World ? world_comm_ : g == Group::ExpertParallel ? ep_comm_ : dp_comm_;
        check_nccl(ncclAllReduce(data, data, n, type, ncclSum, c, stream_), "ncclAllReduce");
        sync();
    }
    void sync() { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

    // Before NCCL exists: rank 0 says what is wrong, every rank exits non-zero.
    [[noreturn]] void fatal_setup(const std::string& message) {
        if (rank == 0) fprintf(stderr, "%s: %s\n", program_, message.c_str());
        if (use_mpi_) MPI_Finalize();
        exit(1);
    }
    void check_mpi(int rc, const char* what) {
        if (rc != MPI_SUCCESS) {
            fprintf(stderr, "%s: [rank %d] MPI error in %s\n", program_, rank, what);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    void check_cuda(cudaError_t rc, const char* what) {
        if (rc != cudaSuccess) abort(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(rc));
    }
    void check_nccl(ncclResult_t rc, const char* what) {
        if (rc != ncclSuccess)
            abort(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(rc) +
                  " (NCCL_DEBUG=WARN says more)");
    }

    const char* program_;
    bool use_mpi_;
    cudaStream_t stream_ = nullptr;
    ncclComm_t world_comm_ = nullptr, ep_comm_ = nullptr, dp_comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(int ep_size, const char* program) {
    return std::make_unique<NcclComm>(ep_size, program);
}
