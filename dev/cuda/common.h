// What the lab programs share: one line per check, timing, and main's loop over the versions; the device arrays,
// random inputs and the error measure are test/device_array.h's. Built by nvcc for a GPU, or by g++ against the
// kernel emulator with LAB_EMULATED defined (README.md).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/launch.cuh"
#include "test/device_array.h"  // DeviceArray, fmt, randn, max_rel_error

#ifdef LAB_EMULATED
constexpr bool EMULATED = true;  // small sizes, no timing: the emulator says nothing about speed
#else
constexpr bool EMULATED = false;
#endif

struct alignas(16) Float4 {  // four floats moved by one 16-byte load or store
    float v[4];
};

// One line per check; true when the error is within tol (0: every value exact).
template <typename A, typename B>
bool check(const std::string& what, const std::vector<A>& got, const std::vector<B>& want, double tol) {
    const double err = max_rel_error(got, want);
    const bool ok = err <= tol;
    printf("  %-48s max rel err %9.2e  tol %7.1e  %s\n", what.c_str(), err, tol, ok ? "ok" : "FAIL");
    return ok;
}

// Mean milliseconds of one launch() on the default stream: `warmup` untimed runs, then `iters` between two events.
template <typename F>
float time_ms(F launch, int warmup = 3, int iters = 20) {
    for (int i = 0; i < warmup; i++) launch();
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < iters; i++) launch();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return ms / iters;
}

// One timing line: the time, and the bandwidth (bytes moved) or the throughput (flops), whichever is not 0.
inline void print_time(const std::string& what, float ms, double bytes, double flops) {
    if (flops > 0) printf("  %-32s %9.4f ms  %8.2f TFLOP/s\n", what.c_str(), ms, flops / (ms * 1e-3) / 1e12);
    else printf("  %-32s %9.4f ms  %8.1f GB/s\n", what.c_str(), ms, bytes / (ms * 1e-3) / 1e9);
}

// main of every lab program. ./NAME checks every version; ./NAME N checks version N, then times it unless built
// for the emulator. check_version(v) prints its checks and says whether all passed; an error the emulator throws
// (a barrier not every thread reaches, an out-of-bounds copy) fails the version. The last line counts the
// versions: "NAME: P passed, F failed" (make check adds them up); the exit status is 1 if any failed.
inline int lab_main(int argc, char** argv, const char* name, const std::vector<const char*>& versions,
                    bool (*check_version)(int), void (*time_version)(int)) {
    const int count = (int)versions.size();
    int first = 1, last = count;
    if (argc > 1) {
        first = last = atoi(argv[1]);
        if (first < 1 || first > count) {
            fprintf(stderr, "usage: %s [version 1..%d]\n", argv[0], count);
            return 2;
        }
    }
    int passed = 0, failed = 0;
    for (int v = first; v <= last; v++) {
        printf("%s version %d: %s\n", name, v, versions[v - 1]);
        bool ok = false;
        try {
            ok = check_version(v);
        } catch (const std::exception& e) {
            printf("  FAIL: %s\n", e.what());
#ifdef LAB_EMULATED
            stand_in::discard_all();  // the failed launch's queued work
#endif
        }
        (ok ? passed : failed)++;
        if (ok && argc > 1) {
            if (EMULATED) printf("  timing skipped: the kernel emulator says nothing about speed\n");
            else time_version(v);
        }
    }
    printf("%s: %d passed, %d failed\n", name, passed, failed);
    return failed > 0 ? 1 : 0;
}
