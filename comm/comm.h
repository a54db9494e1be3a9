// The Comm interface (docs/design.md §2): the collectives the trainers need, over world = PP x EP x DP ranks with
// rank = pp_rank * stage_size + dp_rank * ep_size + ep_rank (stage_size = EP x DP: the ranks of one pipeline
// stage). Backends: one process (comm.cpp), MPI for train_cpu (mpi_comm.cpp), NCCL for
// train (nccl_comm.cu). Buffers are host memory; NCCL also takes device buffers, and stages host ones.
// Counts are 64-bit. MPI splits reductions and gathers to fit its int counts; its all-to-all-v counts rows, and over
// 2^31 rows ends the job.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

enum class Group {
    World,           // every rank: losses, gradient norms, expert loads
    Stage,           // the EP x DP ranks of one pipeline stage: its replicated parameters (gradients, optimizer)
    ExpertParallel,  // the ep_size ranks of a stage that together hold all its experts: dispatch and return
    DataParallel,    // the dp_size ranks of a stage that hold the same experts: expert gradients and optimizer
};

// One point-to-point transfer between pipeline stages: `count` floats to or from the rank of stage `stage` that has
// this rank's place (ep_rank, dp_rank) in its stage.
struct PipeTransfer {
    float* data;
    int64_t count;
    int stage;
    bool send;
};

class Comm {
public:
    int rank = 0, world = 1, local_rank = 0;
    int ep_size = 1, ep_rank = 0, dp_size = 1, dp_rank = 0, pp_size = 1, pp_rank = 0;

    // The PP x EP x DP layout above, for `ep` x `pp` dividing the world.
    void set_layout(int ep, int pp) {
        pp_size = pp;
        pp_rank = rank / stage_size();
        ep_size = ep;
        ep_rank = rank % ep;
        dp_size = world / (pp * ep);
        dp_rank = rank % stage_size() / ep;
    }
    int stage_size() const { return world / pp_size; }
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
    // Over group g, on group_size(g) pieces of `piece` values, piece i the group's i-th rank's (docs/design.md §8).
    // reduce_scatter_sum: this rank's piece becomes its sum over the group; the others are left undefined.
    // all_gather: every rank's piece is copied to every rank (FP32 values, or BF16 ones as their bits).
    virtual void reduce_scatter_sum(float* data, int64_t piece, Group g) = 0;
    virtual void all_gather(float* data, int64_t piece, Group g) = 0;
    virtual void all_gather(uint16_t* data, int64_t piece, Group g) = 0;
    // Every transfer posted at once, all complete on return: a send and a receive of two neighbours that wait on each
    // other (the 1F1B schedule's) cannot deadlock.
    virtual void pipe_exchange(const PipeTransfer* transfers, int n) = 0;
    // Over the world: root's bytes to everyone.
    virtual void broadcast(void* data, int64_t bytes, int root) = 0;
    virtual void barrier() = 0;
    // The collectives that follow wait, on the device, for the work queued so far on this CUDA stream (what the
    // caller's device buffers need), so the host need not wait for it. False: this Comm cannot; the caller waits.
    virtual bool follow_stream(void* cuda_stream) { return false; }
    // Prints "PROGRAM: [rank r] message" once, from this rank, and ends the whole job with a non-zero status.
    [[noreturn]] virtual void abort(const std::string& message) = 0;

    int group_size(Group g) const {
        switch (g) {
            case Group::World: return world;
            case Group::Stage: return stage_size();
            case Group::ExpertParallel: return ep_size;
            default: return dp_size;
        }
    }
    int group_rank(Group g) const {
        switch (g) {
            case Group::World: return rank;
            case Group::Stage: return rank % stage_size();
            case Group::ExpertParallel: return ep_rank;
            default: return dp_rank;
        }
    }
};

// Whether mpirun (or srun) started this process.
bool launched_by_mpi();
// srun's task count when srun started this process itself (not mpirun or MPI daemons, nor a shell of srun --pty),
// else 0. Read before MPI_Init, which may set MPI's own variables.
int srun_tasks();
// After MPI_Init, given srun_tasks() and MPI's world: whether this launch cannot work (every task exits). srun without
// a PMI plugin this MPI uses starts N tasks that each see a world of one: N copies of rank 0 would overwrite each
// other's checkpoints. The task of SLURM_PROCID 0 says why.
bool refuse_launch(int srun_tasks, int world, const char* program);
// Why the ranks cannot cut the layout, or "": given this rank's --ep and --pp, whether every rank was given the same
// (an all-reduce before anything is cut by them), and whether EP x PP divides the world.
std::string layout_error(int ep, int pp, bool ranks_agree, int world);

// A one-rank Comm (no other process involved), for models that are not distributed.
Comm& local_comm();

// The MPI backend when the process was started by mpirun (or srun), else the single-process one. ep_size x pp_size
// must divide the world size; the caller checks that ep_size divides n_routed_experts and that the pipeline stages
// can be cut. program names the error lines.
std::unique_ptr<Comm> make_comm(int ep_size, int pp_size, const char* program);
// The NCCL backend (comm/nccl_comm.cu, GPU builds only): under mpirun or alone, one rank per GPU of its host.
std::unique_ptr<Comm> make_nccl_comm(int ep_size, int pp_size, const char* program);
