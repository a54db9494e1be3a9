// The MPI Comm for the CPU trainer. Large transfers are split into parts whose counts fit MPI's int.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comm.h"

namespace {

void check_mpi(int rc, const char* what) {
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        fprintf(stderr, "MPI error in %s: %s\n", what, msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

constexpr int64_t MAX_PIECE = 1 << 28;  // elements per MPI call

class MpiComm : public Comm {
public:
    MpiComm(int ep, int pp, const char* program) : program_(program) {
        int provided = 0;
        const int tasks = srun_tasks();
        check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        // Errors return to check_mpi, which names the call (the default handler aborts silently); splits inherit it.
        check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
        check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
        check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world), "MPI_Comm_size");
        if (refuse_launch(tasks, world, program)) {
            MPI_Finalize();
            exit(2);
        }
        MPI_Comm node;
        check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "split node");
        check_mpi(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank(node)");
        check_mpi(MPI_Comm_free(&node), "MPI_Comm_free");
        int range[4] = {ep, -ep, pp, -pp};  // the largest and the smallest --ep and --pp of the ranks
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, range, 4, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce(--ep)");
        const bool agree = range[0] == -range[1] && range[2] == -range[3];
        if (const std::string why = layout_error(ep, pp, agree, world); !why.empty()) {
            if (rank == 0) fprintf(stderr, "%s: %s\n", program, why.c_str());
            MPI_Finalize();
            exit(2);
        }
        set_layout(ep, pp);
        const int place = group_rank(Group::Stage);  // in its stage
        check_mpi(MPI_Comm_split(MPI_COMM_WORLD, pp_rank, place, &stage_comm_), "split stage");
        check_mpi(MPI_Comm_split(MPI_COMM_WORLD, pp_rank * dp_size + dp_rank, ep_rank, &ep_comm_), "split EP");
        check_mpi(MPI_Comm_split(MPI_COMM_WORLD, pp_rank * ep_size + ep_rank, dp_rank, &dp_comm_), "split DP");
        check_mpi(MPI_Comm_split(MPI_COMM_WORLD, place, pp_rank, &pipe_comm_), "split pipeline");
    }
    ~MpiComm() override {
        for (MPI_Comm* c : {&stage_comm_, &ep_comm_, &dp_comm_, &pipe_comm_}) MPI_Comm_free(c);
        MPI_Finalize();
    }

    void all_reduce_sum(float* data, int64_t n, Group g) override { reduce(data, n, MPI_FLOAT, g); }
    void all_reduce_sum(double* data, int64_t n, Group g) override { reduce(data, n, MPI_DOUBLE, g); }
    void all_reduce_sum(int64_t* data, int64_t n, Group g) override { reduce(data, n, MPI_INT64_T, g); }

    void all_to_all(const int64_t* send, int64_t* recv, int64_t per_rank) override {
        const int count = checked_int(per_rank);
        check_mpi(MPI_Alltoall(send, count, MPI_INT64_T, recv, count, MPI_INT64_T, ep_comm_), "MPI_Alltoall");
    }

    // Point-to-point pairs with a row datatype: counts are in rows, so they stay far below 2^31.
    void all_to_all_v(const float* send, const int64_t* send_rows, float* recv, const int64_t* recv_rows,
                      int64_t width) override {
        MPI_Datatype row;
        check_mpi(MPI_Type_contiguous(checked_int(width), MPI_FLOAT, &row), "MPI_Type_contiguous");
        check_mpi(MPI_Type_commit(&row), "MPI_Type_commit");
        std::vector<MPI_Request> requests;
        int64_t send_at = 0, recv_at = 0;
        for (int p = 0; p < ep_size; p++) {
            if (recv_rows[p] > 0) {
                requests.emplace_back();
                check_mpi(MPI_Irecv(recv + recv_at * width, checked_int(recv_rows[p]), row, p, 7, ep_comm_,
                                    &requests.back()), "MPI_Irecv");
            }
            recv_at += recv_rows[p];
        }
        for (int p = 0; p < ep_size; p++) {
            if (send_rows[p] > 0) {
                requests.emplace_back();
                check_mpi(MPI_Isend(send + send_at * width, checked_int(send_rows[p]), row, p, 7, ep_comm_,
                                    &requests.back()), "MPI_Isend");
            }
            send_at += send_rows[p];
        }
        check_mpi(MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
        check_mpi(MPI_Type_free(&row), "MPI_Type_free");
    }

    // One reduction to each rank of its piece, then one broadcast from each rank of its piece, in MAX_PIECE parts
    void reduce_scatter_sum(float* data, int64_t piece, Group g) override {
        const MPI_Comm c = group(g);
        for (int root = 0; root < group_size(g); root++)
            for (int64_t at = root * piece; at < (root + 1) * piece; at += MAX_PIECE) {
                const int count = (int)std::min(MAX_PIECE, (root + 1) * piece - at);
                const bool mine = root == group_rank(g);
                check_mpi(MPI_Reduce(mine ? MPI_IN_PLACE : data + at, mine ? data + at : nullptr, count, MPI_FLOAT,
                                     MPI_SUM, root, c),
                          "MPI_Reduce");
            }
    }
    void all_gather(float* data, int64_t piece, Group g) override { gather(data, piece, MPI_FLOAT, g); }
    void all_gather(uint16_t* data, int64_t piece, Group g) override { gather(data, piece, MPI_UINT16_T, g); }

    // Over the pipeline group, whose rank i is stage i's; in MAX_PIECE parts, all posted before any is waited on.
    void pipe_exchange(const PipeTransfer* transfers, int n) override {
        std::vector<MPI_Request> requests;
        for (int i = 0; i < n; i++) {
            const PipeTransfer& t = transfers[i];
            for (int64_t at = 0; at < t.count; at += MAX_PIECE) {
                const int count = (int)std::min(MAX_PIECE, t.count - at);
                requests.emplace_back();
                check_mpi(t.send ? MPI_Isend(t.data + at, count, MPI_FLOAT, t.stage, 9, pipe_comm_, &requests.back())
                                 : MPI_Irecv(t.data + at, count, MPI_FLOAT, t.stage, 9, pipe_comm_, &requests.back()),
                          t.send ? "MPI_Isend (pipeline)" : "MPI_Irecv (pipeline)");
            }
        }
        check_mpi(MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (pipeline)");
    }

    void broadcast(void* data, int64_t bytes, int root) override {
        for (int64_t at = 0; at < bytes; at += MAX_PIECE)
            check_mpi(MPI_Bcast((char*)data + at, (int)std::min(MAX_PIECE, bytes - at), MPI_BYTE, root, MPI_COMM_WORLD),
                      "MPI_Bcast");
    }

    void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

    [[noreturn]] void abort(const std::string& message) override {
        fprintf(stderr, "%s: [rank %d] %s\n", program_, rank, message.c_str());
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        exit(1);
    }

private:
    // all_gather: each rank's piece broadcast from it, in MAX_PIECE parts
    void gather(void* data, int64_t piece, MPI_Datatype type, Group g) {
        int size = 0;
        MPI_Type_size(type, &size);
        for (int root = 0; root < group_size(g); root++)
            for (int64_t at = root * piece; at < (root + 1) * piece; at += MAX_PIECE)
                check_mpi(MPI_Bcast((char*)data + at * size, (int)std::min(MAX_PIECE, (root + 1) * piece - at), type,
                                    root, group(g)),
                          "MPI_Bcast");
    }
    void reduce(void* data, int64_t n, MPI_Datatype type, Group g) {
        int size = 0;
        MPI_Type_size(type, &size);
        for (int64_t at = 0; at < n; at += MAX_PIECE)
            check_mpi(MPI_Allreduce(MPI_IN_PLACE, (char*)data + at * size, (int)std::min(MAX_PIECE, n - at), type,
                                    MPI_SUM, group(g)),
                      "MPI_Allreduce");
    }
    MPI_Comm group(Group g) const {
        return g == Group::World ? MPI_COMM_WORLD : g == Group::Stage ? stage_comm_ : g == Group::ExpertParallel
                                                                                          ? ep_comm_ : dp_comm_;
    }
    int checked_int(int64_t count) const {  // a count in rows, elements or row widths
        if (count > INT32_MAX) {
            fprintf(stderr, "%s: a count of %lld is too large for MPI's int\n", program_, (long long)count);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        return (int)count;
    }

    const char* program_;
    MPI_Comm stage_comm_ = MPI_COMM_NULL, ep_comm_ = MPI_COMM_NULL, dp_comm_ = MPI_COMM_NULL;
    MPI_Comm pipe_comm_ = MPI_COMM_NULL;  // rank i: stage i's rank of this rank's place
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(int ep_size, int pp_size, const char* program) {
    return std::make_unique<MpiComm>(ep_size, pp_size, program);
}
