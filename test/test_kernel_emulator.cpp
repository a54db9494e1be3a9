// The kernel emulator (test/kernel_emulator/): first the emulator itself (indices, collectives, shared memory, the
// errors it must report, the planted bugs its hazard checker must catch, a missing __syncthreads the thread orders
// expose), then what it is for: the real kernels against the CPU reference
// (./test_gpu_emulated) and the GPU model of gpu/ on the real kernels against the CPU model
// (./gpu_model_emulated_check), each in two thread orders and under mpirun, and the benchmarks' programs on small
// shapes, the step's counts (make bench-emulated) included.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "test/kernel_emulator/cublasLt.h"
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

// The program in the forward and the warps order at once (two processes: this machine has two cores), each with
// its own arguments.
void run_both_orders(const std::string& program, const std::string& forward_args = "",
                     const std::string& warps_args = "") {
    const char* orders[2] = {"forward", "warps"};
    CommandResult runs[2];
    std::thread second(
        [&] { runs[1] = run("env EMULATOR_ORDER=warps " + program + warps_args, "emulated_warps.txt"); });
    runs[0] = run("env EMULATOR_ORDER=forward " + program + forward_args, "emulated_forward.txt");
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

// The heuristic's answer for an FP8 product D (m, n) = op(A) (m, k) op(B) (k, n), A scaled per 128 x 128 block or
// per 1 x 128 tile as a_blocks says, B as b_blocks says; A stored (k, m) if ta else (m, k), B (n, k) if tb else (k, n).
static cublasStatus_t fp8_heuristic(uint64_t m, uint64_t n, uint64_t k, bool ta = true, bool tb = false,
                                    bool a_blocks = true, bool b_blocks = false) {
    cublasLtHandle_t handle;
    cublasLtCreate(&handle);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const int32_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t block = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, tile = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const int32_t mode_a = a_blocks ? block : tile, mode_b = b_blocks ? block : tile;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b));
    cublasLtMatrixLayout_t a, b, d;
    const uint64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, a_rows, ta ? m : k, (int64_t)(a_rows + 15) / 16 * 16);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, b_rows, tb ? k : n, (int64_t)(b_rows + 15) / 16 * 16);
    cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, m, n, (int64_t)m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, 1, &result, &found);
    for (cublasLtMatrixLayout_t l : {a, b, d}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
    return status;
}

// What cuBLAS's documentation says block-scaled FP8 takes: "TN", k a multiple of 16, m and n multiples of 4, and of
// the scale modes VEC128 for both or BLK128x128 for one of the two. The model refuses the rest as the library would.
TEST_CASE("kernel emulator: the cuBLASLt model refuses the FP8 shapes and modes the documentation excludes") {
    CHECK(fp8_heuristic(128, 8, 128) == CUBLAS_STATUS_SUCCESS);
    CHECK(fp8_heuristic(144, 4, 208) == CUBLAS_STATUS_SUCCESS);
    CHECK(fp8_heuristic(128, 8, 128, true, false, false, true) == CUBLAS_STATUS_SUCCESS);
    CHECK(fp8_heuristic(128, 8, 128, true, false, false, false) == CUBLAS_STATUS_SUCCESS);
    CHECK(fp8_heuristic(128, 6, 128) == CUBLAS_STATUS_NOT_SUPPORTED);  // n not a multiple of 4
    CHECK(fp8_heuristic(130, 8, 128) == CUBLAS_STATUS_NOT_SUPPORTED);  // m not a multiple of 4
    CHECK(fp8_heuristic(128, 8, 136) == CUBLAS_STATUS_NOT_SUPPORTED);  // k not a multiple of 16
    CHECK(fp8_heuristic(128, 8, 128, false) == CUBLAS_STATUS_NOT_SUPPORTED);                    // "NN"
    CHECK(fp8_heuristic(128, 8, 128, true, true) == CUBLAS_STATUS_NOT_SUPPORTED);               // "TT"
    CHECK(fp8_heuristic(128, 8, 128, true, false, true, true) == CUBLAS_STATUS_NOT_SUPPORTED);  // both per block
}

// Every kernel check in both orders; the whole-step checks (unchecked, for time) half in each.
TEST_CASE("kernel emulator: the real kernels match the CPU reference (test_gpu's kernel checks)") {
    run_both_orders("./test_gpu_emulated", " --shard 0/2", " --shard 1/2");
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
                                "of 26 kernels under",
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

// make bench-emulated's counts (test/count_step.cpp) on tiny: every region of the step, and AdamW's bytes its real
// traffic, each byte once per launch: it reads the parameter, the gradient and both moments (16 bytes a parameter,
// 12 with BF16 moments) and its table of ranges (a few hundred bytes), and writes the parameter, both moments and
// the BF16 copy (14, or 10); the gradient norm's first pass reads each gradient once (4 bytes). At one rank in BF16
// the host waits for the device once for the losses of all the step's micro-batches, once for the gradient norm, and
// at the end of the counted step: no more, with 1 micro-batch or 3.
TEST_CASE("kernel emulator: make bench-emulated counts each kernel's bytes once") {
    for (const bool bf16_moments : {false, true}) {
        CAPTURE(bf16_moments);
        const std::string flags = bf16_moments ? " --moments bf16" : "";
        const CommandResult r = run("./count_step_emulated --config tiny --steps 1" + flags,
                                    bf16_moments ? "count_step_tiny_bf16_moments.txt" : "count_step_tiny.txt");
        INFO(r.out);
        REQUIRE(r.status == 0);
        for (const char* region : {"zero grads, tokens in", "embedding", "attention forward", "router", "permute",
                                   "expert GEMMs", "shared experts", "head", "cross-entropy", "attention backward",
                                   "grad norm", "AdamW", "router bias"})
            CHECK_MESSAGE(r.out.find("\n" + std::string(region) + " ") != std::string::npos, region);
        Model host;
        model_init(host, load_config("tiny"));
        int moe_blocks = 0;
        for (int l = 0; l < host.config.num_blocks(); l++) moe_blocks += host.config.is_moe_layer(l);
        const size_t waits_at = r.out.find("host waits for the device");
        REQUIRE(waits_at != std::string::npos);
        double waits = 0.0;
        REQUIRE(sscanf(r.out.c_str() + waits_at, "host waits for the device %lf", &waits) == 1);
        // BF16 at one rank: the losses, the gradient norm, and count_step's own wait at the step's end; none for the
        // expert counts (the experts' GEMMs read their offsets on the device)
        CHECK(waits == 3);
        if (!bf16_moments) {
            const CommandResult three = run("./count_step_emulated --config tiny --steps 1 --grad-accum 3",
                                            "count_step_tiny_accum.txt");
            REQUIRE(three.status == 0);
            const size_t at = three.out.find("host waits for the device");
            REQUIRE(at != std::string::npos);
            double accum_waits = 0.0;
            REQUIRE(sscanf(three.out.c_str() + at, "host waits for the device %lf", &accum_waits) == 1);
            CHECK(accum_waits == 3);  // one wait for the three micro-batches' losses
        }
        double P = 0.0, P_fp32 = 0.0;  // the values AdamW updates, and of them those of tensors read in FP32
        for (const OptimizerRange& range : host.shard.ranges) {
            P += (double)range.count;
            if (range.first < host.table.fp32_total) P_fp32 += (double)range.count;
        }
        const double table_bytes = 4096;
        auto traffic = [&](const std::string& kernel, double* read, double* written) {
            const size_t at = r.out.find("\n" + kernel + " ");
            REQUIRE_MESSAGE(at != std::string::npos, kernel);
            double launches = 0.0;
            REQUIRE(sscanf(r.out.c_str() + at + kernel.size() + 1, "%lf %lf %lf", &launches, read, written) == 3);
            CHECK(launches == 1.0);
            *read *= 1e6;  // MB to bytes (printed to the byte)
            *written *= 1e6;
        };
        double read = 0.0, written = 0.0;
        traffic(bf16_moments ? "gpu::adamw_kernel<__nv_bfloat16>" : "gpu::adamw_kernel<float>", &read, &written);
        // read: the master weight, the gradient, m and v; written: the master weight, m, v and the working copy, FP32
        // or BF16
        const double moment_bytes = bf16_moments ? 2 : 4;
        CHECK(written == doctest::Approx((4 + 2 * moment_bytes) * P + 4 * P_fp32 + 2 * (P - P_fp32)).epsilon(1e-12));
        CHECK(read >= (8 + 2 * moment_bytes) * P);
        CHECK(read <= (8 + 2 * moment_bytes) * P + table_bytes);
        traffic("gpu::grad_norm_partial_kernel", &read, &written);
        CHECK(read >= 4 * P);
        CHECK(read <= 4 * P + table_bytes);
        // BF16 mode: the router's three products per MoE block in TF32, and no GEMM left in FP32
        const size_t tf32_at = r.out.find("\ncublasLtMatmul tf32 ");
        REQUIRE(tf32_at != std::string::npos);
        double tf32_calls = 0.0;
        REQUIRE(sscanf(r.out.c_str() + tf32_at, "\ncublasLtMatmul tf32 %lf", &tf32_calls) == 1);
        CHECK(tf32_calls == 3 * moe_blocks);
        CHECK(r.out.find("\ncublasLtMatmul fp32 ") == std::string::npos);
    }
}

// CUBLAS_COMPUTE_32F_FAST_TF32: each FP32 operand rounded to TF32 (a 10-bit mantissa), to nearest with ties away
// from zero; CUBLAS_COMPUTE_32F: FP32 as stored. TF32 with BF16 operands is not a mode the library has.
TEST_CASE("kernel emulator: the cuBLASLt model rounds the operands of TF32 products") {
    using namespace emulated_cublaslt;
    CHECK(tf32_round(1.0f + 0x1p-12f) == 1.0f);                  // under half a TF32 ulp (2^-11 at 1)
    CHECK(tf32_round(1.0f + 3 * 0x1p-12f) == 1.0f + 0x1p-10f);   // over half
    CHECK(tf32_round(1.0f + 0x1p-11f) == 1.0f + 0x1p-10f);       // a tie, away from zero
    CHECK(tf32_round(-1.0f - 0x1p-11f) == -1.0f - 0x1p-10f);
    CHECK(tf32_round(0x1p-136f) == 0x1p-136f);  // the smallest TF32 subnormal (bit 13 of the FP32 one)
    CHECK(tf32_round(0x1p-140f) == 0.0f);       // under half of it
    CHECK(std::isinf(tf32_round(INFINITY)));
    CHECK(std::isnan(tf32_round(NAN)));
    // D (1, 1) = A (1, 2) B (2, 1): (1 + 2^-12) + (1 + 2^-11)
    const float A[2] = {1.0f + 0x1p-12f, 1.0f + 0x1p-11f}, B[2] = {1.0f, 1.0f};
    const cublasLtMatrixLayoutOpaque_t a{CUDA_R_32F, 1, 2, 1}, b{CUDA_R_32F, 2, 1, 2}, d{CUDA_R_32F, 1, 1, 1};
    for (const bool tf32 : {false, true}) {
        const cublasLtMatmulDescOpaque_t desc{tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
        Problem p;
        REQUIRE(problem(desc, a, b, d, d, &p) == CUBLAS_STATUS_SUCCESS);
        CHECK(p.tf32 == tf32);
        float D = 0.0f;
        multiply(p, 1.0f, 0.0f, false, false, A, 1, B, 2, nullptr, 1, &D, 1, false, Scales{}, Scales{});
        CHECK(D == (tf32 ? 2.0f + 0x1p-10f : 2.0f + 3 * 0x1p-12f));
    }
    const cublasLtMatmulDescOpaque_t desc{CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F};
    const cublasLtMatrixLayoutOpaque_t a16{CUDA_R_16BF, 1, 2, 1}, b16{CUDA_R_16BF, 2, 1, 2};
    Problem p;
    CHECK(problem(desc, a16, b16, d, d, &p) == CUBLAS_STATUS_NOT_SUPPORTED);
}
