// The GPU model's orchestration on the CPU (no GPU needed): ./gpu_model_cpu_check runs gpu/gpu_model.cu compiled
// as C++ against the stand-ins of test/cpu_stand_in/ and compares it with the CPU reference model, alone and
// under mpirun (EP=2, EP=4, EP=2 x DP=2, oversubscribed on this machine) against one process.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "test/test_helpers.h"

namespace {

// The command's status and output, within 300 s, one OpenMP thread
CommandResult run(const std::string& cmd) {
    return run_logged("env OMP_NUM_THREADS=1 " + cmd, "gpu_model_cpu_check.txt", 300);
}

}  // namespace

TEST_CASE("gpu model on the CPU: one process matches the CPU model (losses, gradients, AdamW, sampling, BF16)") {
    CommandResult r = run("./gpu_model_cpu_check");
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK(r.out.find("failed, ok") != std::string::npos);
}

TEST_CASE("gpu model on the CPU: EP=2, EP=4 and EP=2 x DP=2 under mpirun match one process") {
    for (auto [ranks, ep] : {std::pair<int, int>{2, 2}, {4, 4}, {4, 2}}) {
        CommandResult r = run("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np " +
                    std::to_string(ranks) + " ./gpu_model_cpu_check --ep " + std::to_string(ep));
        INFO("ranks " << ranks << " ep " << ep << "\n" << r.out);
        CHECK(r.status == 0);
        CHECK(r.out.find("failed, ok") != std::string::npos);
    }
}
