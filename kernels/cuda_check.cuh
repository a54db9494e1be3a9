// Every CUDA runtime call is checked (docs/design.md §4): a failure prints the error, the file, the line and the call,
// then exits. Kernel launches are checked with CUDA_CHECK(cudaGetLastError()) right after the launch; an error
// inside a running kernel surfaces at the next synchronising call, which is checked too.
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
