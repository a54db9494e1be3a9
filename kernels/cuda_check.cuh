// CUDA_CHECK(call): a failed CUDA runtime call prints the error, file, line and call, then exits (docs/design.md §4).
// Launches are checked by CUDA_CHECK(cudaGetLastError()); an error inside a kernel surfaces at the next sync.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CUDA_CHECK(call)                                                                                      \
    do {                                                                                                      \
        cudaError_t err_ = (call);                                                                            \
        if (err_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "CUDA error %s (%s) at %s:%d in %s\n", cudaGetErrorName(err_),                   \
                    cudaGetErrorString(err_), __FILE__, __LINE__, #call);                                     \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)
