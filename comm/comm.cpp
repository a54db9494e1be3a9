// The single-process Comm: collectives over one rank are copies, and the choice of backend.
#include "comm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

std::unique_ptr<Comm> make_mpi_comm(int ep_size, int pp_size, const char* program);

namespace {

class SingleComm : public Comm {
public:
    explicit SingleComm(const char* program) : program_(program) {}
    void all_reduce_sum(float*, int64_t, Group) override {}
    void all_reduce_sum(double*, int64_t, Group) override {}
    void all_reduce_sum(int64_t*, int64_t, Group) override {}
    void all_to_all(const int64_t* send, int64_t* recv, int64_t per_rank) override {
        memcpy(recv, send, per_rank * sizeof(int64_t));
    }
    void all_to_all_v(const float* send, const int64_t* send_rows, float* recv, const int64_t*,
                      int64_t width) override {
        memcpy(recv, send, send_rows[0] * width * sizeof(float));
    }
    void reduce_scatter_sum(float*, int64_t, Group) override {}
    void all_gather(float*, int64_t, Group) override {}
    void all_gather(uint16_t*, int64_t, Group) override {}
    void pipe_exchange(const PipeTransfer*, int) override {}  // one stage: nothing to pass
    void broadcast(void*, int64_t, int) override {}
    void barrier() override {}
    [[noreturn]] void abort(const std::string& message) override {
        fprintf(stderr, "%s: %s\n", program_, message.c_str());
        exit(1);
    }

private:
    const char* program_;
};

}  // namespace

bool launched_by_mpi() {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") || getenv("SLURM_PROCID");
}

int srun_tasks() {
    const char* tasks = getenv("SLURM_STEP_NUM_TASKS");
    const bool srun_task = tasks && getenv("SLURM_PROCID") && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") &&
                           !getenv("PMIX_RANK") && !getenv("SLURM_PTY_PORT");
    return srun_task ? atoi(tasks) : 0;
}

bool refuse_launch(int tasks, int world, const char* program) {
    if (tasks <= 1 || world != 1) return false;
    if (!strcmp(getenv("SLURM_PROCID"), "0"))
        fprintf(stderr, "%s: srun started %d tasks, but MPI sees each of them alone: start them with srun --mpi=pmix "
                "(or another plugin from srun --mpi=list that this MPI supports)\n", program, tasks);
    return true;
}

std::string layout_error(int ep, int pp, bool ranks_agree, int world) {
    if (!ranks_agree) return "the ranks were given different --ep or --pp: start every rank with the same flags";
    if (ep < 1 || pp < 1 || world % ((int64_t)ep * pp) != 0)
        return "--ep " + std::to_string(ep) + " x --pp " + std::to_string(pp) + " does not divide the " +
               std::to_string(world) + " ranks (world = PP x EP x DP)";
    return "";
}

Comm& local_comm() {
    static SingleComm single("moe.cu");
    return single;
}

std::unique_ptr<Comm> make_comm(int ep_size, int pp_size, const char* program) {
    if (launched_by_mpi()) return make_mpi_comm(ep_size, pp_size, program);
    if (ep_size * pp_size != 1) {
        const int ranks = ep_size * pp_size;
        fprintf(stderr, "%s: --ep %d x --pp %d needs %d or more ranks: launch with mpirun -np N (N a multiple of %d)\n",
                program, ep_size, pp_size, ranks, ranks);
        exit(2);
    }
    return std::make_unique<SingleComm>(program);
}
