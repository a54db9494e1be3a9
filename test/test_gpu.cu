// test_gpu (make test-gpu): every kernel of kernels/ against the CPU reference (test_gpu_kernels.cu), then the
// GEMMs (test_gpu_matmul.cu), the whole training step, the optimizer shard's NCCL collectives and the trainers
// (test_gpu_train.cu), then FP8's GEMMs and step (on Hopper). One line per check, then
// `tests: N passed, M failed`; exit 1 on any failure or when there is no GPU.
#include <cstdio>

#include "test/gpu_check.cuh"

void test_kernels(Rng& rng);  // test/test_gpu_kernels.cu
void test_matmul(Rng& rng);   // test/test_gpu_matmul.cu
void test_matmul_fp8(Rng& rng);
void test_training_step(int shard = 0, int shards = 1);  // test/test_gpu_train.cu
void test_training_step_fp8(int shard = 0, int shards = 1);
void test_nccl_shard_collectives();
void test_trainers();

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("test_gpu: no CUDA GPU found\n");
        return 1;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("test_gpu on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    Rng rng(20261201);
    test_kernels(rng);
    test_matmul(rng);
    test_training_step();
    test_nccl_shard_collectives();
    test_trainers();
    // FP8 last: cuBLASLt's block-scaled FP8 GEMMs are Hopper's only and have not run here yet; whatever goes wrong
    // there (a crash included) must not cost the checks above
    printf("before the FP8 checks: %d passed, %d failed\n", passed, failed);
    fflush(stdout);
    if (prop.major == 9) {
        test_matmul_fp8(rng);
        test_training_step_fp8();
    } else {
        printf("(not a Hopper GPU: the FP8 checks need cuBLASLt's 128-block scaled FP8 GEMMs; not run)\n");
    }
    printf("tests: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
