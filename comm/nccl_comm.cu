// The NCCL Comm for the GPU trainer: every collective runs on the Comm's stream and is complete when the call returns;
// follow_stream makes that stream wait for the caller's on the device, with an event. Device buffers are used as they
// are; host buffers (the trainer's flags and losses, the tests' tensors) are staged through a device buffer, freed
// after a transfer over STAGE_KEEP_BYTES. MPI only bootstraps: rank, world, the ranks on this host (each takes its own
// GPU), the NCCL id, and ending the job on failure. NCCL's asynchronous errors are watched while a collective runs, so
// a dead peer ends the job. The all-to-all-v is ncclSend/ncclRecv pairs in one group (docs/design.md §2). Without
// mpirun it is one rank on GPU 0, through NCCL.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"

namespace {

// An empty kernel: cudaFuncGetAttributes on it fails when this binary holds no code the chosen GPU can run.
__global__ void build_probe_kernel() {}

class NcclComm : public Comm {
public:
    NcclComm(int ep, int pp, const char* program) : program_(program), use_mpi_(launched_by_mpi()) {
        int local_ranks = 1;
        MPI_Comm node = MPI_COMM_NULL;  // the ranks on this host
        int range[4] = {ep, -ep, pp, -pp};  // the largest and the smallest --ep and --pp of the ranks
        if (use_mpi_) {
            const int tasks = srun_tasks();
            check_mpi(MPI_Init(nullptr, nullptr), "MPI_Init");
            // Errors return to check_mpi, which names the call (the default handler aborts silently).
            check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
            check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
            check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world), "MPI_Comm_size");
            if (refuse_launch(tasks, world, program)) {
                MPI_Finalize();
                exit(2);
            }
            check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "split");
            check_mpi(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank(node)");
            check_mpi(MPI_Comm_size(node, &local_ranks), "MPI_Comm_size(node)");
            check_mpi(MPI_Allreduce(MPI_IN_PLACE, range, 4, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
        }
        int gpus = 0;
        const cudaError_t counted = cudaGetDeviceCount(&gpus);
        if (counted != cudaSuccess) gpus = 0;
        // each rank takes its local rank's GPU, or the only one it sees (a launcher that gives every rank its own
        // CUDA_VISIBLE_DEVICES, as srun --gpus-per-task does)
        const int device = gpus == 1 ? 0 : local_rank;
        std::string error;
        if (gpus == 0)
            error = std::string("no CUDA GPU found") +
                    (counted != cudaSuccess ? std::string(" (") + cudaGetErrorString(counted) + ")" : "") +
                    "; use ./train_cpu for the CPU trainer";
        else if (device >= gpus)
            error = std::to_string(local_ranks) + " ranks on one host but only " + std::to_string(gpus) +
                    " GPUs: start at most one rank per GPU";
        if (node != MPI_COMM_NULL) {
            const std::string shared = shared_gpu(node, error.empty() ? device : -1, local_ranks);
            if (error.empty()) error = shared;
            check_mpi(MPI_Comm_free(&node), "MPI_Comm_free");
        }
        if (error.empty()) error = layout_error(ep, pp, range[0] == -range[1] && range[2] == -range[3], world);
        agree_on_setup(error);
        set_layout(ep, pp);
        check_cuda(cudaSetDevice(device), "cudaSetDevice");
        cudaFuncAttributes probe;
        if (const cudaError_t rc = cudaFuncGetAttributes(&probe, build_probe_kernel); rc != cudaSuccess) {
            (void)cudaGetLastError();
            cudaDeviceProp prop;
            check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
            const std::string sm = std::to_string(prop.major) + std::to_string(prop.minor);
            abort("this build cannot run on GPU " + std::to_string(device) + " (" + prop.name + ", sm_" + sm +
                  "): " + cudaGetErrorString(rc) + ". If the build lacks that GPU, add -gencode arch=compute_" + sm +
                  ",code=sm_" + sm + " to NVFLAGS in the Makefile and rebuild; if the driver is older than the " +
                  "CUDA toolkit, update the driver");
        }
        check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
        check_cuda(cudaEventCreateWithFlags(&followed_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        ncclUniqueId id;
        if (rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
        if (use_mpi_) {
            check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
            // every rank has the id before any enters NCCL's blocking init: the root may return from the broadcast
            // first, and inside NCCL it no longer drives MPI's progress, which some MPIs need to deliver the id
            check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
        }
        check_nccl(ncclCommInitRank(&world_comm_, world, id, rank), "ncclCommInitRank");
        ncclConfig_t share = NCCL_CONFIG_INITIALIZER;  // the splits share the world's buffers, not each its own
        share.splitShare = 1;
        const int place = group_rank(Group::Stage);  // in its stage
        check_nccl(ncclCommSplit(world_comm_, pp_rank, place, &stage_comm_, &share), "ncclCommSplit(stage)");
        check_nccl(ncclCommSplit(world_comm_, pp_rank * dp_size + dp_rank, ep_rank, &ep_comm_, &share),
                   "ncclCommSplit(EP)");
        check_nccl(ncclCommSplit(world_comm_, pp_rank * ep_size + ep_rank, dp_rank, &dp_comm_, &share),
                   "ncclCommSplit(DP)");
        check_nccl(ncclCommSplit(world_comm_, place, pp_rank, &pipe_comm_, &share), "ncclCommSplit(pipeline)");
        // NCCL (2.22 on) connects lazily and allocates device buffers then. One collective per communicator and one
        // send to each EP peer, here, take most of that before the GPU model plans its memory.
        // NCCL_RUNTIME_CONNECT=0 would connect everything at init.
        double one = 1.0;
        for (Group g : {Group::World, Group::Stage, Group::ExpertParallel, Group::DataParallel})
            all_reduce_sum(&one, 1, g);
        std::vector<int64_t> counts(ep_size, 0), received(ep_size);
        all_to_all(counts.data(), received.data(), 1);
    }
    ~NcclComm() override {
        cudaFree(stage_);
        for (ncclComm_t c : {stage_comm_, ep_comm_, dp_comm_, pipe_comm_, world_comm_}) ncclCommDestroy(c);
        cudaEventDestroy(followed_);
        cudaStreamDestroy(stream_);
        if (use_mpi_) MPI_Finalize();
    }

    bool follow_stream(void* cuda_stream) override {
        check_cuda(cudaEventRecord(followed_, static_cast<cudaStream_t>(cuda_stream)), "cudaEventRecord");
        check_cuda(cudaStreamWaitEvent(stream_, followed_, 0), "cudaStreamWaitEvent");
        return true;
    }

    void all_reduce_sum(float* data, int64_t n, Group g) override { reduce(data, n, ncclFloat32, sizeof(float), g); }
    void all_reduce_sum(double* data, int64_t n, Group g) override { reduce(data, n, ncclFloat64, sizeof(double), g); }
    void all_reduce_sum(int64_t* data, int64_t n, Group g) override { reduce(data, n, ncclInt64, sizeof(int64_t), g); }

    void all_to_all(const int64_t* send, int64_t* recv, int64_t per_rank) override {
        const std::vector<int64_t> counts(ep_size, per_rank);
        exchange(send, counts.data(), recv, counts.data(), 1, ncclInt64);
    }
    void all_to_all_v(const float* send, const int64_t* send_rows, float* recv, const int64_t* recv_rows,
                      int64_t width) override {
        exchange(send, send_rows, recv, recv_rows, width, ncclFloat32);
    }

    // in place: NCCL's reduce-scatter writes piece i at in + i * piece, its all-gather reads it from there
    void reduce_scatter_sum(float* data, int64_t piece, Group g) override {
        if (piece == 0 || group_size(g) == 1) return;
        const size_t bytes = (size_t)(piece * group_size(g)) * sizeof(float);
        on_device(data, bytes, data, bytes, [&](const void* in, void* out) {
            check_nccl(ncclReduceScatter(in, static_cast<float*>(out) + group_rank(g) * piece, piece, ncclFloat32,
                                         ncclSum, nccl_group(g), stream_),
                       "ncclReduceScatter");
        });
    }
    void all_gather(float* data, int64_t piece, Group g) override { gather(data, piece, ncclFloat32, g); }
    void all_gather(uint16_t* data, int64_t piece, Group g) override { gather(data, piece, ncclBfloat16, g); }

    // Device buffers: one group of sends and receives over the pipeline group, whose rank i is stage i's.
    void pipe_exchange(const PipeTransfer* transfers, int n) override {
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        for (int i = 0; i < n; i++) {
            const PipeTransfer& t = transfers[i];
            if (t.send)
                check_nccl(ncclSend(t.data, t.count, ncclFloat32, t.stage, pipe_comm_, stream_), "ncclSend (pipeline)");
            else
                check_nccl(ncclRecv(t.data, t.count, ncclFloat32, t.stage, pipe_comm_, stream_), "ncclRecv (pipeline)");
        }
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        sync();
    }

    void broadcast(void* data, int64_t bytes, int root) override {
        on_device(data, bytes, data, bytes, [&](const void* in, void* out) {
            check_nccl(ncclBroadcast(in, out, bytes, ncclUint8, root, world_comm_, stream_), "ncclBroadcast");
        });
    }

    void barrier() override {
        sync();
        if (use_mpi_) check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    }

    [[noreturn]] void abort(const std::string& message) override {
        fprintf(stderr, "%s: [rank %d] %s\n", program_, rank, message.c_str());
        fflush(stderr);
        // MPI_Abort ends every rank, those waiting inside NCCL too (ncclCommAbort first could itself wait for them)
        if (use_mpi_) MPI_Abort(MPI_COMM_WORLD, 1);
        exit(1);
    }

private:
    static constexpr size_t STAGE_KEEP_BYTES = size_t(256) << 20;  // a larger staging buffer is freed after use

    // all_gather of values of T (float, or BF16 bits), NCCL type `type`
    template <typename T>
    void gather(T* data, int64_t piece, ncclDataType_t type, Group g) {
        if (piece == 0 || group_size(g) == 1) return;
        const size_t bytes = (size_t)(piece * group_size(g)) * sizeof(T);
        on_device(data, bytes, data, bytes, [&](const void* in, void* out) {
            check_nccl(ncclAllGather(static_cast<const T*>(in) + group_rank(g) * piece, out, piece, type,
                                     nccl_group(g), stream_),
                       "ncclAllGather");
        });
    }

    // Over the EP group: send_rows[p] rows of `width` values of type T to rank p, recv_rows[p] from it, each rank's
    // rows consecutive in rank order.
    template <typename T>
    void exchange(const T* send, const int64_t* send_rows, T* recv, const int64_t* recv_rows, int64_t width,
                  ncclDataType_t type) {
        int64_t send_total = 0, recv_total = 0;
        for (int p = 0; p < ep_size; p++) {
            send_total += send_rows[p];
            recv_total += recv_rows[p];
        }
        on_device(send, (size_t)(send_total * width) * sizeof(T), recv, (size_t)(recv_total * width) * sizeof(T),
                  [&](const void* in, void* out) {
            int64_t send_at = 0, recv_at = 0;
            check_nccl(ncclGroupStart(), "ncclGroupStart");
            for (int p = 0; p < ep_size; p++) {
                if (send_rows[p] > 0)
                    check_nccl(ncclSend(static_cast<const T*>(in) + send_at * width, send_rows[p] * width, type, p,
                                        ep_comm_, stream_), "ncclSend");
                if (recv_rows[p] > 0)
                    check_nccl(ncclRecv(static_cast<T*>(out) + recv_at * width, recv_rows[p] * width, type, p,
                                        ep_comm_, stream_), "ncclRecv");
                send_at += send_rows[p];
                recv_at += recv_rows[p];
            }
            check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        });
    }
    void reduce(void* data, int64_t n, ncclDataType_t type, size_t element_bytes, Group g) {
        // every rank passes the same n (an empty buffer may be nullptr); over one rank the sum is the data
        if (n == 0 || group_size(g) == 1) return;
        const size_t bytes = (size_t)n * element_bytes;
        on_device(data, bytes, data, bytes, [&](const void* in, void* out) {
            check_nccl(ncclAllReduce(in, out, n, type, ncclSum, nccl_group(g), stream_), "ncclAllReduce");
        });
    }
    ncclComm_t nccl_group(Group g) const {
        return g == Group::World ? world_comm_ : g == Group::Stage ? stage_comm_ : g == Group::ExpertParallel
                                                                                       ? ep_comm_ : dp_comm_;
    }

    // Runs collective(dev_in, dev_out) for the caller's in and out (in == out: in place), then waits for the stream.
    // A host buffer, pageable or pinned, is replaced by a slice of the staging buffer, copied in before and out after.
    // Empty buffers may be null and are never dereferenced.
    template <typename Collective>
    void on_device(const void* in, size_t in_bytes, void* out, size_t out_bytes, Collective collective) {
        const bool in_place = in == out;
        const bool host_in = in_bytes > 0 && is_host(in);
        const bool host_out = in_place ? host_in : out_bytes > 0 && is_host(out);
        const size_t out_at = in_place || !host_in ? 0 : (in_bytes + 255) / 256 * 256;  // aligned after the input
        const size_t stage_bytes = out_at + (host_out ? out_bytes : 0);
        if (stage_bytes > stage_bytes_) {
            free_stage();
            check_cuda(cudaMalloc(&stage_, stage_bytes), "cudaMalloc (staging buffer for host memory)");
            stage_bytes_ = stage_bytes;
        }
        const void* dev_in = host_in ? stage_ : in;
        void* dev_out = host_out ? stage_ + out_at : out;
        if (host_in)
            check_cuda(cudaMemcpyAsync(stage_, in, in_bytes, cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync (host to staging)");
        collective(dev_in, dev_out);
        if (host_out)
            check_cuda(cudaMemcpyAsync(out, dev_out, out_bytes, cudaMemcpyDeviceToHost, stream_),
                       "cudaMemcpyAsync (staging to host)");
        sync();
        if (stage_bytes_ > STAGE_KEEP_BYTES) free_stage();
    }
    void free_stage() {
        check_cuda(cudaFree(stage_), "cudaFree (staging buffer)");
        stage_ = nullptr;
        stage_bytes_ = 0;
    }
    bool is_host(const void* p) {
        cudaPointerAttributes attr;
        check_cuda(cudaPointerGetAttributes(&attr, p), "cudaPointerGetAttributes");
        return attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost;
    }
    // Waits for the stream, watching the communicators: a peer that died or a broken link leaves NCCL's kernels
    // waiting forever, and only its asynchronous error says so (the job then ends through abort).
    void sync() {
        for (;;) {
            const cudaError_t rc = cudaStreamQuery(stream_);
            if (rc == cudaSuccess) return;
            if (rc != cudaErrorNotReady) check_cuda(rc, "the Comm's stream");
            for (ncclComm_t c : {world_comm_, stage_comm_, ep_comm_, dp_comm_, pipe_comm_}) {
                ncclResult_t pending = ncclSuccess;
                if (c) check_nccl(ncclCommGetAsyncError(c, &pending), "ncclCommGetAsyncError");
                check_nccl(pending, "a collective in flight");
            }
            std::this_thread::yield();
        }
    }

    // The first rank on this host, before local_rank, that takes the same GPU (by PCI address), as an error; empty
    // when there is none. Collective over node: a rank without a device (-1) takes part with an empty address.
    std::string shared_gpu(MPI_Comm node, int device, int local_ranks) {
        constexpr int ID = 32;
        char id[ID] = {0};
        if (device >= 0) check_cuda(cudaDeviceGetPCIBusId(id, ID, device), "cudaDeviceGetPCIBusId");
        std::vector<char> ids((size_t)ID * local_ranks);
        check_mpi(MPI_Allgather(id, ID, MPI_CHAR, ids.data(), ID, MPI_CHAR, node), "MPI_Allgather(node)");
        for (int r = 0; r < local_rank && id[0]; r++)
            if (strncmp(&ids[(size_t)r * ID], id, ID) == 0)
                return "local ranks " + std::to_string(r) + " and " + std::to_string(local_rank) + " share GPU " +
                       id + ": start at most one rank per GPU";
        return "";
    }

    // Before NCCL exists. Some ranks may find a problem and others not, so the ranks agree on the first with one,
    // which says what is wrong, and all exit 1: a rank leaving alone would leave the others waiting.
    void agree_on_setup(const std::string& error) {
        int first = error.empty() ? world : rank;
        if (use_mpi_) check_mpi(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "setup");
        if (first == world) return;
        const std::string where = world > 1 ? "[rank " + std::to_string(rank) + "] " : "";
        if (rank == first) fprintf(stderr, "%s: %s%s\n", program_, where.c_str(), error.c_str());
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
    cudaEvent_t followed_ = nullptr;  // recorded on the stream follow_stream names
    char* stage_ = nullptr;  // device staging buffer for host-memory arguments
    size_t stage_bytes_ = 0;
    ncclComm_t world_comm_ = nullptr, stage_comm_ = nullptr, ep_comm_ = nullptr, dp_comm_ = nullptr,
               pipe_comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(int ep_size, int pp_size, const char* program) {
    return std::make_unique<NcclComm>(ep_size, pp_size, program);
}
