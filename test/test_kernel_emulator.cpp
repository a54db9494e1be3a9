// The kernel emulator (test/kernel_emulator/): first the emulator itself (indices, collectives, shared memory, the
// errors it must report, the planted bugs its hazard checker must catch, a missing __syncthreads the thread orders
// expose), then what it is for: the real kernels against the CPU reference
// (./test_gpu_emulated) and the GPU model of gpu/ on the real kernels against the CPU model
// (./gpu_model_emulated_check), each in two thread orders and under mpirun, and the benchmarks' programs on small
// shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test/kernel_emulator/emulator.h"
#include "test/kernel_emulator/planted_bugs.h"
#include "test/test_helpers.h"

namespace {

// Runs body on the emulator with EMULATOR_ORDER=order.
void emulate(const char* order, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
    setenv("EMULATOR_ORDER", order, 1);
    try {
        emulator::run_grid(grid, block, shared_bytes, body);
    } catch (...) {
        unsetenv("EMULATOR_ORDER");
        throw;
    }
    unsetenv("EMULATOR_ORDER");
}

// A block sum through shared memory, twice in a row: the second call's writes must wait for the first call's
// reads, which is what the __syncthreads at the top is for (with_first_sync = false drops it).
void block_sums(std::vector<int>& out, bool with_first_sync) {
    for (int round = 0; round < 2; round++) {
        __shared__ int partial[32];
        int v = (int)threadIdx.x + round * 1000;
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
        if (with_first_sync) __syncthreads();
        if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
        __syncthreads();
        int total = 0;
        for (unsigned w = 0; w < blockDim.x / 32; w++) total += partial[w];
        out[round * blockDim.x + threadIdx.x] = total;
    }
}

// The command's status and output, within 600 s, one OpenMP thread
CommandResult run(const std::string& cmd, const std::string& log) {
    return run_logged("env OMP_NUM_THREADS=1 " + cmd, log, 600);
}

// The program in the forward and the warps order at once (two processes: this machine has two cores).
void run_both_orders(const std::string& program) {
    const char* orders[2] = {"forward", "warps"};
    CommandResult runs[2];
    std::thread second([&] { runs[1] = run("env EMULATOR_ORDER=warps " + program, "emulated_warps.txt"); });
    runs[0] = run("env EMULATOR_ORDER=forward " + program, "emulated_forward.txt");
    second.join();
    for (int i = 0; i < 2; i++) {
        INFO(program << " with EMULATOR_ORDER=" << orders[i] << "\n" << runs[i].out);
        CHECK(runs[i].status == 0);
        // the closing line, "tests: N passed, 0 failed" or "N checks passed, 0 failed": every check passed, and
        // there were checks (test_gpu_emulated has ~780, gpu_model_emulated_check ~160)
        size_t end = runs[i].out.rfind(" passed, 0 failed");
        REQUIRE(end != std::string::npos);
        if (end >= 7 && runs[i].out.compare(end - 7, 7, " checks") == 0) end -= 7;
        const size_t number = runs[i].out.find_last_not_of("0123456789", end - 1) + 1;
        CHECK(atol(runs[i].out.c_str() + number) >= 100);
    }
}

}  // namespace

TEST_CASE("kernel emulator: every thread of every block runs once, with its own indices") {
    for (const char* order : {"forward", "reverse", "warps"}) {
        const dim3 grid(3, 2, 2), block(32, 2, 3);
        std::vector<int> seen(3 * 2 * 2 * 32 * 2 * 3, 0);
        emulate(order, grid, block, 0, [&] {
            const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
            const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
            __syncthreads();  // the indices survive a switch to the other threads
            seen[b * 192 + t]++;
        });
        for (size_t i = 0; i < seen.size(); i++) REQUIRE(seen[i] == 1);
    }
}

TEST_CASE("kernel emulator: shuffles, ballots, __syncthreads_count and dynamic shared memory") {
    std::vector<int> xor_sums(64), ballots(64), counts(64), shared_ok(64);
    emulate("forward", dim3(1), dim3(64), 64 * sizeof(int), [&] {
        const int t = threadIdx.x, lane = t % 32;
        int v = t;
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
        xor_sums[t] = v;
        ballots[t] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
        counts[t] = __syncthreads_count(t % 5 == 0);
        int* shared = reinterpret_cast<int*>(emulator::dynamic_shared_memory());
        shared[63 - t] = t;
        __syncthreads();
        shared_ok[t] = shared[t] == 63 - t;
    });
    unsigned every_third = 0;
    for (int l = 0; l < 32; l += 3) every_third |= 1u << l;
    for (int t = 0; t < 64; t++) {
        const int warp_first = t / 32 * 32;
        CHECK(xor_sums[t] == 32 * warp_first + 496);  // sum of the warp's thread indices
        CHECK((unsigned)ballots[t] == every_third);
        CHECK(counts[t] == 13);  // t = 0, 5, ..., 60
        CHECK(shared_ok[t] == 1);
    }
}

TEST_CASE("kernel emulator: shared memory, static and dynamic, starts as NaN bytes in every block") {
    std::vector<int> seen_static(2), seen_dynamic(2);
    emulate("forward", dim3(2), dim3(32), 16, [&] {
        __shared__ int flag;
        int* dynamic = reinterpret_cast<int*>(emulator::dynamic_shared_memory());
        if (threadIdx.x == 0) {
            seen_static[blockIdx.x] = flag;  // what the previous block left must not show
            seen_dynamic[blockIdx.x] = dynamic[3];
            flag = 7;
            dynamic[3] = 7;
        }
    });
    for (int b = 0; b < 2; b++) {
        CHECK(seen_static[b] == -1);
        CHECK(seen_dynamic[b] == -1);
    }
}

TEST_CASE("kernel emulator: a missing __syncthreads shows in the warps order, and only there it is needed") {
    std::vector<int> out(2 * 128);
    auto expected = [](int round) { return 128 * 127 / 2 + 128 * round * 1000; };
    for (const char* order : {"forward", "reverse", "warps"}) {
        emulate(order, dim3(1), dim3(128), 0, [&] { block_sums(out, true); });
        for (int i = 0; i < 256; i++) REQUIRE(out[i] == expected(i / 128));
    }
    emulate("warps", dim3(1), dim3(128), 0, [&] { block_sums(out, false); });
    bool some_wrong = false;
    for (int i = 0; i < 256; i++) some_wrong = some_wrong || out[i] != expected(i / 128);
    CHECK(some_wrong);
}

// The hazard checker and the typed warp collectives: each planted bug is reported with its kind, the kernel and its
// source lines, whatever the order of the threads; the same kernels without the bugs report nothing.
TEST_CASE("kernel emulator: every planted bug is caught with its place, in every thread order") {
    for (const char* order : {"forward", "reverse", "warps"}) {
        setenv("EMULATOR_ORDER", order, 1);
        const std::vector<PlantedBug> bugs = planted_bugs();
        CHECK(bugs.size() == 10);
        for (const PlantedBug& bug : bugs) {
            INFO(order << ": " << bug.name << "\n" << bug.error);
            CHECK(!bug.error.empty());
            for (const std::string& place : bug.places)
                CHECK_MESSAGE(bug.error.find(place) != std::string::npos, place);
        }
        CHECK(run_without_bugs() == "");
    }
    unsetenv("EMULATOR_ORDER");
}

TEST_CASE("kernel emulator: misuse is reported, not run") {
    auto fails = [](dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
        CHECK_THROWS_AS(emulate("forward", grid, block, shared_bytes, body), std::logic_error);
    };
    fails(dim3(1), dim3(64), 0, [] {  // a __syncthreads only half the block reaches
        if (threadIdx.x < 32) __syncthreads();
    });
    fails(dim3(1), dim3(64), 0, [] {  // threads waiting at __syncthreads while the rest wait at a shuffle
        if (threadIdx.x < 32) __syncthreads();
        else __shfl_xor_sync(0xffffffffu, 1, 1);
    });
    fails(dim3(1), dim3(32), 0, [] {  // a shuffle some lanes of the warp never reach
        if (threadIdx.x < 16) return;
        __shfl_xor_sync(0xffffffffu, 1, 1);
    });
    fails(dim3(1), dim3(32), 0, [] { __shfl_xor_sync(0x0000ffffu, 1, 1); });  // partial masks: unsupported
    fails(dim3(1), dim3(48), 0, [] { __syncwarp(); });                         // a partial warp
    fails(dim3(1), dim3(1025), 0, [] {});
    fails(dim3(1, 65536), dim3(32), 0, [] {});
    fails(dim3(1), dim3(32), 227 * 1024 + 1, [] {});
    fails(dim3(2), dim3(32), 0, [] { throw std::runtime_error("a thread's exception"); });
}

TEST_CASE("kernel emulator: the real kernels match the CPU reference (test_gpu's kernel checks)") {
    run_both_orders("./test_gpu_emulated");
}

TEST_CASE("kernel emulator: the GPU model on the real kernels matches the CPU model, alone and under mpirun") {
    run_both_orders("./gpu_model_emulated_check");
    for (auto [ranks, ep] : {std::pair<int, int>{2, 2}, {4, 4}, {4, 2}}) {
        const CommandResult r = run(mpirun_command(ranks) + "./gpu_model_emulated_check --ep " + std::to_string(ep),
                                    "emulated_ep" + std::to_string(ep) + "_ranks" + std::to_string(ranks) + ".txt");
        INFO("ranks " << ranks << " ep " << ep << "\n" << r.out);
        CHECK(r.status == 0);
        CHECK(r.out.find("failed, ok") != std::string::npos);
    }
}

// The benchmarks' programs end to end on small shapes, so that a first run on a GPU is not lost to a crash in code
// that only runs there: every section printed, the smoke step's loss finite and falling (3 AdamW steps on
// one batch), and bench_comm's own checks (return of dispatch gives x back; the BF16 dispatch delivers the FP32
// one's rows rounded) passed on 1 rank and on 4 ranks (EP 2 x DP 2) through the NCCL model.
TEST_CASE("kernel emulator: make bench's and make bench-comm's programs run end to end") {
    const CommandResult bench = run("./bench_gpu_emulated --smoke", "bench_gpu_smoke.txt");
    INFO(bench.out);
    CHECK(bench.status == 0);
    for (const char* section : {"device copy", "GEMM, BF16 inputs", "GEMM, FP8 inputs", "8 experts, 4 streams",
                                "training step", "region (one step)", "attention share", "memory-bound kernel",
                                "of 27 kernels under",
                                "bf16 tensor, 4 warps", "bf16 tensor, 8 warps", "fp32 CUDA cores"})
        CHECK_MESSAGE(bench.out.find(section) != std::string::npos, section);
    double first = 0.0, last = 0.0;
    const size_t at = bench.out.find("loss (first warm-up -> last)");
    REQUIRE(at != std::string::npos);
    REQUIRE(sscanf(bench.out.c_str() + at, "loss (first warm-up -> last) %lf -> %lf", &first, &last) == 2);
    CHECK(std::isfinite(first));
    CHECK(last < first);

    const std::string comm_args = " --tokens 64 --hidden 16 --experts 8 --topk 2 --iters 2";
    const CommandResult one = run("./bench_comm_emulated" + comm_args, "bench_comm_1.txt");
    const CommandResult four =
        run("env STAND_IN_GPUS=4 " + mpirun_command(4) + "./bench_comm_emulated --ep 2" + comm_args,
            "bench_comm_4.txt");
    for (const CommandResult* r : {&one, &four}) {
        INFO(r->out);
        CHECK(r->status == 0);
        CHECK(r->out.find("round trip return(dispatch(x)) == x: ok") != std::string::npos);
        CHECK(r->out.find("BF16 dispatch == FP32 dispatch rounded: ok") != std::string::npos);
        CHECK(r->out.find("return (sort + all-to-all-v + combine)") != std::string::npos);
    }
    CHECK(four.out.find("4 ranks (EP 2 x DP 2)") != std::string::npos);
}

// The kernel lab (dev/cuda/): every version of every program against its CPU reference, built for the emulator and
// run in two thread orders (on a machine with a GPU, built with nvcc and run once).
TEST_CASE("kernel lab: every version of every dev/cuda program matches its CPU reference") {
    const CommandResult r = run("make --no-print-directory -C dev/cuda check", "lab.txt");
    INFO(r.out);
    CHECK(r.status == 0);
    const size_t at = r.out.rfind("lab: ");
    REQUIRE(at != std::string::npos);
    int passed = 0, failed = -1;
    REQUIRE(sscanf(r.out.c_str() + at, "lab: %d passed, %d failed", &passed, &failed) == 2);
    CHECK(failed == 0);
    CHECK(passed >= 22);  // 22 versions in 6 programs
}
