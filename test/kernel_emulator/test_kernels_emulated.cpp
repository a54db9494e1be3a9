// ./test_kernels_emulated: the kernel and GEMM checks of test_gpu (test/test_gpu_kernels.cu, test/test_gpu_matmul.cu)
// on the kernel emulator (emulator.h; the GEMMs through its CPU model of cuBLASLt, cublasLt.h), so the real kernels
// and kernels/matmul.cuh meet the CPU reference on a machine without a GPU. test_cpu runs it twice,
// with the threads and blocks in ascending and in descending order (EMULATOR_ORDER=reverse). One line per check,
// then `tests: N passed, M failed`; exit 1 on any failure.
#include <cstdio>

#include "test/gpu_check.cuh"

void test_kernels(Rng& rng);  // test/test_gpu_kernels.cu
void test_matmul(Rng& rng);   // test/test_gpu_matmul.cu

int main() {
    Rng rng(20261201);
    test_kernels(rng);
    test_matmul(rng);
    printf("tests: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
