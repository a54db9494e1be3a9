// CPU stand-in (see stand_in.h) for comm/nccl_comm.cu's make_nccl_comm, for train_stand_in (train.cu compiled as
// C++ against the stand-ins): the stand-ins' "device" memory is host memory, so the host Comm serves both the
// trainer's host buffers and the GPU model's device buffers: the single-process Comm alone, the MPI one under
// mpirun (comm/comm.cpp, comm/mpi_comm.cpp). Like NCCL, it reads a device buffer when called: the GPU model must
// have synchronised its stream first (the stand-ins' streams only run when synchronised, so a missing
// synchronisation shows up as stale data here).
#include "comm/comm.h"

std::unique_ptr<Comm> make_nccl_comm(int ep_size, const char* program) { return make_comm(ep_size, program); }
