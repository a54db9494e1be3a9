// ./test_gpu_emulated: test_gpu's checks (test/test_gpu.cu) on the kernel emulator (emulator.h), so the real kernels,
// kernels/matmul.cuh (over the emulator's CPU model of cuBLASLt, cublasLt.h) and the whole GPU training step meet
// the CPU reference on a machine without a GPU: the kernel checks (test/test_gpu_kernels.cu), the GEMM checks
// (test/test_gpu_matmul.cu), the training-step comparison (test/test_gpu_train.cu's test_training_step) and the
// optimizer shard's NCCL collectives on one rank (over the emulator's NCCL, nccl.h). Not the
// trainer runs of test_gpu, which start ./train (test/test_train_emulated.cpp runs ./train_emulated instead).
// test_cpu runs it twice at once, with the threads in ascending order and with one warp ahead (EMULATOR_ORDER=warps),
// each running every kernel check and half the step checks (--shard 0/2 and 1/2). One line per check, then
// `tests: N passed, M failed`; exit 1 on any failure or on a bad argument.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "test/gpu_check.cuh"

void test_kernels(Rng& rng);  // test/test_gpu_kernels.cu
void test_matmul(Rng& rng);   // test/test_gpu_matmul.cu
void test_matmul_fp8(Rng& rng);
void test_training_step(int shard, int shards);  // test/test_gpu_train.cu
void test_training_step_fp8(int shard, int shards);
void test_nccl_shard_collectives();

int main(int argc, char** argv) {
    int shard = 0, shards = 1;  // --shard I/N: the step checks I, I + N, ... only
    if (argc > 1 && (argc != 3 || strcmp(argv[1], "--shard") != 0 || sscanf(argv[2], "%d/%d", &shard, &shards) != 2 ||
                     shards < 1 || shard < 0 || shard >= shards)) {
        fprintf(stderr, "usage: test_gpu_emulated [--shard I/N] (0 <= I < N: every N-th step check from the I-th)\n");
        return 1;
    }
    Rng rng(20261201);
    test_kernels(rng);
    test_matmul(rng);
    test_nccl_shard_collectives();
    test_matmul_fp8(rng);
    // The whole step at this size without the hazard checker (EMULATOR_CHECK=0), for time:
    // gpu_model_emulated_check runs the same step with it, at tiny sizes.
    setenv("EMULATOR_CHECK", "0", 1);
    test_training_step(shard, shards);
    test_training_step_fp8(shard, shards);
    unsetenv("EMULATOR_CHECK");
    printf("tests: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
