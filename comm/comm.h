// The Comm interface: the collectives the trainers need, over a world of ranks laid out as EP x DP (docs/design.md §2).
// rank = dp_rank * ep_size + ep_rank: the ranks of one expert-parallel group are consecutive (on one node when
// ep_size divides the GPUs per node). Backends: one process (comm/comm.cpp) and MPI (comm/mpi_comm.cpp, for
// train_cpu); the NCCL backend for train.cu builds on the same interface.
// Buffers are host memory for the single-process and MPI backends; NCCL takes both: device buffers directly,
// host buffers staged through device memory (copied in, the collective, copied out).
// Counts are 64-bit everywhere. The MPI backend splits reductions and gathers into pieces MPI's int counts can
// express; its all-to-all-v counts rows (a row datatype), and a transfer of over 2^31 rows ends the job.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

enum class Group {
    World,           // every rank: replicated parameters (their gradients, optimizer shards), losses, expert loads
    ExpertParallel,  // the ep_size ranks that together hold all experts: dispatch and combine
    DataParallel,    // the dp_size ranks that hold the same experts: expert gradients and optimizer shards
};

class Comm {
public:
    int rank = 0, world = 1, local_rank = 0;
    int ep_size = 1, ep_rank = 0, dp_size = 1, dp_rank = 0;

    // The EP x DP layout above, for `ep` dividing the world.
    void set_layout(int ep) {
        ep_size = ep;
        ep_rank = rank % ep;
        dp_size = world / ep;
        dp_rank = rank / ep;
    }
    virtual ~Comm() = default;
    virtual void all_reduce_sum(float* data, int64_t n, Group g) = 0;
    virtual void all_reduce_sum(double* data, int64_t n, Group g) = 0;
    virtual void all_reduce_sum(int64_t* data, int64_t n, Group g) = 0;
    // Over the EP group: sends per_rank values to each rank from send (rank-major), receives per_rank from each.
    virtual void all_to_all(const int64_t* send, int64_t* recv, int64_t per_rank) = 0;
    // Over the EP group: rows of `width` floats; send_rows[p] rows go to EP rank p (consecutive in send, rank
    // order), recv_rows[p] rows arrive from EP rank p (consecutive in recv, rank order).
    virtual void all_to_all_v(const float* send, const int64_t* send_rows, float* recv, const int64_t* recv_rows,
                              int64_t width) = 0;
    // Over group g, on a buffer of group_size(g) pieces of `piece` values, piece i being the i-th rank's of the group
    // (the optimizer's shards, model/optimizer.h). reduce_scatter_sum: this rank's piece becomes the sum over the
    // group of that piece (the others are left undefined). all_gather: every rank's piece is copied to every rank.
    virtual void reduce_scatter_sum(float* data, int64_t piece, Group g) = 0;
    virtual void all_gather(float* data, int64_t piece, Group g) = 0;
    // Over the world: root's bytes to everyone.
    virtual void broadcast(void* data, int64_t bytes, int root) = 0;
    virtual void barrier() = 0;
    // Prints "PROGRAM: [rank r] message" once, from this rank, and ends the whole job with a non-zero status.
    [[noreturn]] virtual void abort(const std::string& message) = 0;

    int group_size(Group g) const { return g == Group::World ? world : g == Group::ExpertParallel ? ep_size : dp_size; }
    int group_rank(Group g) const { return g == Group::World ? rank : g == Group::ExpertParallel ? ep_rank : dp_rank; }
};

// Whether mpirun (or srun) started this process.
bool launched_by_mpi();
// srun's task count when srun started this process itself (not mpirun or MPI daemons, nor a shell of srun --pty),
// else 0. Read before MPI_Init, which may set MPI's own variables.
int srun_tasks();
// After MPI_Init, given srun_tasks() and MPI's world size: whether this launch cannot work (the caller exits). srun
// without a PMI plugin that this MPI uses starts N tasks that each see a world of one (MPICH, Intel MPI; Open MPI 4
// refuses such a start in MPI_Init itself): N copies of rank 0 would train side by side and overwrite each other's
// checkpoints. Every task exits; the one of SLURM_PROCID 0 says why.
bool refuse_launch(int srun_tasks, int world, const char* program);
// Why the ranks cannot cut the layout, or "": given this rank's --ep and the largest and smallest --ep over the
// ranks (an all-reduce before anything is cut by it), whether they agree and divide the world.
std::string layout_error(int ep, int ep_max, int ep_min, int world);

// A one-rank Comm (no other process involved), for models that are not distributed.
Comm& local_comm();

// The MPI backend when the process was started by mpirun (or srun), else the single-process one. ep_size must
// divide the world size; the caller checks that it divides n_routed_experts. program names the error lines.
std::unique_ptr<Comm> make_comm(int ep_size, const char* program);
// The NCCL backend (comm/nccl_comm.cu, GPU builds only): under mpirun or alone, one rank per GPU of its host.
std::unique_ptr<Comm> make_nccl_comm(int ep_size, const char* program);
