// train_cpu: the CPU reference trainer (fp32, OpenMP, optionally over MPI ranks). The training driver is shared
// with the GPU trainer ./train (trainer/trainer.cpp); this program runs it over MPI or one process (comm/) with the
// model's arithmetic on the host (trainer/cpu_backend.cpp). Under mpirun every rank runs it; rank 0 alone prints and
// logs, and every rank writes its part of each checkpoint.
#include "comm/comm.h"
#include "trainer/cpu_backend.h"
#include "trainer/trainer.h"

int main(int argc, char** argv) { return train_main(argc, argv, "train_cpu", make_comm, make_cpu_backend); }
