// Kernel emulator (see emulator.h): a CPU model of the part of NCCL that comm/nccl_comm.cu calls, over MPI, so that
// ./train_emulated runs the real NCCL Comm (its EP and DP communicators, the all-to-all-v built from grouped sends
// and receives, the staging of host buffers) under mpirun on a machine without GPUs.
//   - A communicator is an MPI communicator: ncclCommInitRank takes MPI_COMM_WORLD (rank and size must be MPI's),
//     ncclCommSplit is MPI_Comm_split. Without MPI (a run without mpirun) only one-rank communicators exist.
//   - Every operation is queued on its stream, like a kernel, and runs (with blocking MPI calls) when the stream is
//     synchronised, as NCCL's run when the GPU gets to them. Sends and receives between ncclGroupStart and
//     ncclGroupEnd run together: all receives and sends posted, then waited for.
//   - As NCCL requires, every buffer must be device memory (the emulator's allocations): anything else is a
//     contract violation (thrown), e.g. a host buffer the Comm forgot to stage.
// Errors return as NCCL's would: ncclInvalidArgument for a bad peer, root or count, ncclInvalidUsage for a
// mismatched group or rank, ncclSystemError when setting up MPI fails; an MPI call that fails while the queued
// work runs throws.
#pragma once
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <mpi.h>

#include "counts.h"
#include "cuda_runtime.h"

enum ncclResult_t {
    ncclSuccess = 0,
    ncclSystemError = 2,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
};
enum ncclDataType_t { ncclUint8 = 1, ncclInt64 = 4, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
enum ncclRedOp_t { ncclSum = 0 };
struct ncclUniqueId {
    char internal[128];
};
struct ncclConfig_t {  // of NCCL's fields, the one nccl_comm.cu sets (communicators share nothing here anyway)
    int splitShare;
};
#define NCCL_CONFIG_INITIALIZER {0}
struct ncclComm {
    MPI_Comm mpi;  // MPI_COMM_NULL for a one-rank communicator without MPI
    int rank, size;
};
typedef ncclComm* ncclComm_t;

inline const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclSystemError: return "system error (emulated: an MPI call failed)";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
    }
    return "unknown result";
}

namespace emulated_nccl {

inline bool mpi_running() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
}
inline size_t type_bytes(ncclDataType_t t) {
    return t == ncclUint8 ? 1 : t == ncclBfloat16 ? 2 : t == ncclFloat32 ? 4 : 8;
}
inline MPI_Datatype mpi_type(ncclDataType_t t) {
    return t == ncclUint8      ? MPI_UINT8_T
           : t == ncclBfloat16 ? MPI_UINT16_T
           : t == ncclInt64    ? MPI_INT64_T
           : t == ncclFloat32  ? MPI_FLOAT
                               : MPI_DOUBLE;
}
// count elements of t as an MPI count (of bytes for the point-to-point transfers), or -1 when MPI's int cannot
inline int mpi_count(size_t count) { return count > (size_t)INT_MAX ? -1 : (int)count; }

// A point-to-point transfer of the open group.
struct Transfer {
    bool send;
    void* buf;
    size_t bytes;
    int peer;
    ncclComm_t comm;
    cudaStream_t stream;
};
struct Group {
    int depth = 0;
    std::vector<Transfer> transfers;
};
inline Group& group() {
    static Group g;
    return g;
}

// Runs a group's transfers: everything posted, then waited for. A one-rank communicator without MPI pairs each
// send to itself with the receive of the same position.
inline void run_transfers(const std::vector<Transfer>& transfers) {
    if (transfers.empty()) return;
    if (transfers[0].comm->mpi == MPI_COMM_NULL) {
        std::vector<const Transfer*> sends, recvs;
        for (const Transfer& t : transfers) (t.send ? sends : recvs).push_back(&t);
        if (sends.size() != recvs.size()) stand_in::violation("ncclGroupEnd: unmatched sends and receives on one rank");
        for (size_t i = 0; i < sends.size(); i++) {
            if (sends[i]->bytes != recvs[i]->bytes) stand_in::violation("ncclGroupEnd: a send and a receive differ");
            memcpy(recvs[i]->buf, sends[i]->buf, sends[i]->bytes);
        }
        return;
    }
    std::vector<MPI_Request> requests(transfers.size());
    for (size_t pass = 0; pass < 2; pass++)  // receives first
        for (size_t i = 0; i < transfers.size(); i++) {
            const Transfer& t = transfers[i];
            if (t.send != (pass == 1)) continue;
            const int rc = t.send ? MPI_Isend(t.buf, (int)t.bytes, MPI_BYTE, t.peer, 0, t.comm->mpi, &requests[i])
                                  : MPI_Irecv(t.buf, (int)t.bytes, MPI_BYTE, t.peer, 0, t.comm->mpi, &requests[i]);
            if (rc != MPI_SUCCESS) stand_in::violation("emulated NCCL: MPI_Isend/MPI_Irecv failed");
        }
    if (MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        stand_in::violation("emulated NCCL: MPI_Waitall failed");
}

inline ncclResult_t add_transfer(bool send, const void* buf, size_t count, ncclDataType_t type, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
    const size_t bytes = count * type_bytes(type);
    if (peer < 0 || peer >= comm->size || mpi_count(bytes) < 0) return ncclInvalidArgument;
    stand_in::check_range(buf, (int64_t)bytes, send ? "ncclSend buffer" : "ncclRecv buffer");
    emulator::count_work(emulator::Work::comm, send ? "ncclSend" : "ncclRecv", send ? (int64_t)bytes : 0,
                         send ? 0 : (int64_t)bytes);
    group().transfers.push_back(Transfer{send, const_cast<void*>(buf), bytes, peer, comm, stream});
    if (group().depth == 0) {  // outside a group: a group of its own
        std::vector<Transfer> one;
        one.swap(group().transfers);
        stand_in::launch(stream, [one] { run_transfers(one); });
    }
    return ncclSuccess;
}

}  // namespace emulated_nccl

inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    memset(id, 0, sizeof *id);
    strcpy(id->internal, "emulated NCCL over MPI_COMM_WORLD");
    return ncclSuccess;
}

inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (strcmp(id.internal, "emulated NCCL over MPI_COMM_WORLD") != 0) return ncclInvalidArgument;
    if (!emulated_nccl::mpi_running()) {
        if (nranks != 1 || rank != 0) return ncclInvalidUsage;
        *comm = new ncclComm{MPI_COMM_NULL, 0, 1};
        return ncclSuccess;
    }
    int mpi_rank = 0, mpi_size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    if (nranks != mpi_size || rank != mpi_rank) return ncclInvalidUsage;
    MPI_Comm dup;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) return ncclSystemError;
    *comm = new ncclComm{dup, rank, nranks};
    return ncclSuccess;
}

// The ranks of comm with the same color form a new communicator, ordered by key (collective over comm).
inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
    if (comm->mpi == MPI_COMM_NULL) {
        *newcomm = new ncclComm{MPI_COMM_NULL, 0, 1};
        return ncclSuccess;
    }
    MPI_Comm split;
    if (MPI_Comm_split(comm->mpi, color, key, &split) != MPI_SUCCESS) return ncclSystemError;
    int rank = 0, size = 0;
    MPI_Comm_rank(split, &rank);
    MPI_Comm_size(split, &size);
    *newcomm = new ncclComm{split, rank, size};
    return ncclSuccess;
}

// The emulated collectives report their errors when they run (they throw), so none is ever pending.
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* error) {
    *error = ncclSuccess;
    return ncclSuccess;
}

inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    stand_in::drain_all();  // NCCL finishes the communicator's queued work first
    if (comm->mpi != MPI_COMM_NULL && emulated_nccl::mpi_running()) MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}
inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
    stand_in::discard_all();
    delete comm;
    return ncclSuccess;
}

inline ncclResult_t ncclGroupStart() {
    emulated_nccl::group().depth++;
    return ncclSuccess;
}
inline ncclResult_t ncclGroupEnd() {
    emulated_nccl::Group& g = emulated_nccl::group();
    if (g.depth == 0) return ncclInvalidUsage;
    if (--g.depth > 0 || g.transfers.empty()) return ncclSuccess;
    std::vector<emulated_nccl::Transfer> transfers;
    transfers.swap(g.transfers);
    for (const emulated_nccl::Transfer& t : transfers)
        if (t.stream != transfers[0].stream || t.comm != transfers[0].comm) return ncclInvalidUsage;
    stand_in::launch(transfers[0].stream, [transfers] { emulated_nccl::run_transfers(transfers); });
    return ncclSuccess;
}

inline ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    return emulated_nccl::add_transfer(true, buf, count, type, peer, comm, stream);
}
inline ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    return emulated_nccl::add_transfer(false, buf, count, type, peer, comm, stream);
}

// NCCL 2.28's all-to-all: block j of in (count elements) goes to rank j, rank i's block lands in block i of out.
// nccl.h documents no in-place form, so in == out is refused.
inline ncclResult_t ncclAlltoAll(const void* in, void* out, size_t count, ncclDataType_t type, ncclComm_t comm,
                                 cudaStream_t stream) {
    const size_t bytes = count * emulated_nccl::type_bytes(type);
    if (emulated_nccl::mpi_count(bytes) < 0) return ncclInvalidArgument;
    stand_in::check_range(in, (int64_t)(bytes * comm->size), "ncclAlltoAll input");
    stand_in::check_range(out, (int64_t)(bytes * comm->size), "ncclAlltoAll output");
    if (in == out) return ncclInvalidArgument;
    emulator::count_work(emulator::Work::comm, "ncclAlltoAll", (int64_t)(bytes * comm->size),
                         (int64_t)(bytes * comm->size));
    stand_in::launch(stream, [=] {
        if (comm->mpi == MPI_COMM_NULL) {
            memcpy(out, in, bytes);
            return;
        }
        if (MPI_Alltoall(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, comm->mpi) != MPI_SUCCESS)
            stand_in::violation("emulated NCCL: MPI_Alltoall failed");
    });
    return ncclSuccess;
}

inline ncclResult_t ncclAllReduce(const void* in, void* out, size_t count, ncclDataType_t type, ncclRedOp_t,
                                  ncclComm_t comm, cudaStream_t stream) {
    const size_t bytes = count * emulated_nccl::type_bytes(type);
    if (emulated_nccl::mpi_count(count) < 0) return ncclInvalidArgument;
    stand_in::check_range(in, (int64_t)bytes, "ncclAllReduce input");
    stand_in::check_range(out, (int64_t)bytes, "ncclAllReduce output");
    emulator::count_work(emulator::Work::comm, "ncclAllReduce", (int64_t)bytes, (int64_t)bytes);
    stand_in::launch(stream, [=] {
        if (comm->mpi == MPI_COMM_NULL) {
            if (in != out) memmove(out, in, bytes);
            return;
        }
        if (MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, (int)count, emulated_nccl::mpi_type(type), MPI_SUM,
                          comm->mpi) != MPI_SUCCESS)
            stand_in::violation("emulated NCCL: MPI_Allreduce failed");
    });
    return ncclSuccess;
}

// Reduce-scatter: out (count elements) = the sum over the ranks of block `rank` of in (count * size elements);
// all-gather: block i of out (count * size elements) = rank i's in (count elements). In place when out is in's
// block of this rank (reduce-scatter) or in is out's (all-gather), as NCCL documents: the input is copied first.
inline ncclResult_t ncclReduceScatter(const void* in, void* out, size_t count, ncclDataType_t type, ncclRedOp_t,
                                      ncclComm_t comm, cudaStream_t stream) {
    const size_t bytes = count * emulated_nccl::type_bytes(type);
    if (emulated_nccl::mpi_count(count) < 0) return ncclInvalidArgument;
    stand_in::check_range(in, (int64_t)(bytes * comm->size), "ncclReduceScatter input");
    stand_in::check_range(out, (int64_t)bytes, "ncclReduceScatter output");
    emulator::count_work(emulator::Work::comm, "ncclReduceScatter", (int64_t)(bytes * comm->size), (int64_t)bytes);
    stand_in::launch(stream, [=] {
        std::vector<char> input((const char*)in, (const char*)in + bytes * comm->size);
        if (comm->mpi == MPI_COMM_NULL) {
            memcpy(out, input.data(), bytes);
            return;
        }
        if (MPI_Reduce_scatter_block(input.data(), out, (int)count, emulated_nccl::mpi_type(type), MPI_SUM,
                                     comm->mpi) != MPI_SUCCESS)
            stand_in::violation("emulated NCCL: MPI_Reduce_scatter_block failed");
    });
    return ncclSuccess;
}
inline ncclResult_t ncclAllGather(const void* in, void* out, size_t count, ncclDataType_t type, ncclComm_t comm,
                                  cudaStream_t stream) {
    const size_t bytes = count * emulated_nccl::type_bytes(type);
    if (emulated_nccl::mpi_count(bytes) < 0) return ncclInvalidArgument;
    stand_in::check_range(in, (int64_t)bytes, "ncclAllGather input");
    stand_in::check_range(out, (int64_t)(bytes * comm->size), "ncclAllGather output");
    emulator::count_work(emulator::Work::comm, "ncclAllGather", (int64_t)bytes, (int64_t)(bytes * comm->size));
    stand_in::launch(stream, [=] {
        std::vector<char> input((const char*)in, (const char*)in + bytes);
        if (comm->mpi == MPI_COMM_NULL) {
            memcpy(out, input.data(), bytes);
            return;
        }
        if (MPI_Allgather(input.data(), (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, comm->mpi) != MPI_SUCCESS)
            stand_in::violation("emulated NCCL: MPI_Allgather failed");
    });
    return ncclSuccess;
}

inline ncclResult_t ncclBroadcast(const void* in, void* out, size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
    const size_t bytes = count * emulated_nccl::type_bytes(type);
    if (root < 0 || root >= comm->size || emulated_nccl::mpi_count(bytes) < 0) return ncclInvalidArgument;
    if (comm->rank == root) stand_in::check_range(in, (int64_t)bytes, "ncclBroadcast input");
    stand_in::check_range(out, (int64_t)bytes, "ncclBroadcast output");
    emulator::count_work(emulator::Work::comm, "ncclBroadcast", comm->rank == root ? (int64_t)bytes : 0,
                         (int64_t)bytes);
    stand_in::launch(stream, [=] {
        if (comm->rank == root && in != out) memmove(out, in, bytes);
        if (comm->mpi != MPI_COMM_NULL && MPI_Bcast(out, (int)bytes, MPI_BYTE, root, comm->mpi) != MPI_SUCCESS)
            stand_in::violation("emulated NCCL: MPI_Bcast failed");
    });
    return ncclSuccess;
}
