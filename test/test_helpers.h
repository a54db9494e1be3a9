// Shared helpers for the CPU tests: a relative CHECK, a scratch directory of this process for the files tests write,
// reading a whole file, running a program with its output kept (and, from random_model.h, random weights and batches).
#pragma once
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "model/model.h"
#include "model/rng.h"
#include "test/random_model.h"

// CHECK that got is within rel * |want| of want. (doctest::Approx is not used: it also allows rel * max(1, |got|),
// an absolute slack that would make checks of small values vacuous.)
#define CHECK_REL(got, want, rel)                                                                              \
    CHECK_MESSAGE(std::fabs((double)(got) - (double)(want)) <= (rel) * std::fabs((double)(want)),           \
                  "got " << fmt9(got) << ", want " << fmt9(want))
// BF16 rounding computed from its definition, not from the writers' bit trick: the nearer of the two neighbouring
// BF16 values (in double), ties to the even one. For finite x below the last BF16 value's rounding boundary.
inline float bf16_reference(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t lo_bits = u & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
    float lo, hi;
    memcpy(&lo, &lo_bits, 4);
    memcpy(&hi, &hi_bits, 4);
    const double dlo = std::fabs((double)x - lo), dhi = std::fabs((double)hi - x);
    if (dlo != dhi) return dlo < dhi ? lo : hi;
    return ((lo_bits >> 16) & 1) ? hi : lo;
}
inline std::string fmt9(double v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

// This test_cpu process's own scratch directory, $TMPDIR/moe_test_XXXXXX (or /tmp/...), made by mkdtemp on first use
// and removed with everything in it when the process exits normally, so that two test runs at once on one machine
// never share a file. The path has no spaces or quotes (unless $TMPDIR does), so it goes into shell commands as it is.
inline const std::string& test_dir() {
    // a pointer that is never freed: the atexit handler below runs after static destructors registered later
    static const std::string* dir = [] {
        const char* tmp = std::getenv("TMPDIR");
        std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/moe_test_XXXXXX";
        std::vector<char> buf(pattern.begin(), pattern.end());
        buf.push_back('\0');
        if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
        const std::string* made = new std::string(buf.data());
        std::atexit([] {
            std::error_code ec;  // best effort, never throws
            std::filesystem::remove_all(test_dir(), ec);
        });
        return made;
    }();
    return *dir;
}

// NAME inside test_dir(): test_path("log.jsonl") is $TMPDIR/moe_test_XXXXXX/log.jsonl.
inline std::string test_path(const std::string& name) { return test_dir() + "/" + name; }

// The whole file as bytes ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Everything fn writes to stderr (fd 2), through a temporary file.
inline std::string capture_stderr(const std::function<void()>& fn) {
    char name[] = "/tmp/moe_test_stderr_XXXXXX";
    int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    try {
        fn();
    } catch (...) {
        fflush(stderr), dup2(saved, 2), close(saved), close(fd), unlink(name);
        throw;
    }
    fflush(stderr), dup2(saved, 2), close(saved), close(fd);
    std::string text = slurp(name);
    unlink(name);
    return text;
}

// The environment of one mpirun: as root, one OpenMP thread per rank, and a session directory of its own (OpenMPI
// creates its shared one when a job starts and removes it when the job ends, and two mpiruns that start together
// can fail on it: "mkdir ... File exists").
inline std::string mpirun_env() {
    static std::atomic<int> launches{0};
    const std::string session = test_path("mpirun_session_" + std::to_string(launches++));
    std::filesystem::create_directories(session);
    return "env OMPI_MCA_orte_tmpdir_base=" + session +
           " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 ";
}

// The start of a command line that runs a program on `ranks` MPI ranks, oversubscribed (this VM's 2 cores run 4).
inline std::string mpirun_command(int ranks) {
    return mpirun_env() + "mpirun --oversubscribe -np " + std::to_string(ranks) + " ";
}

// A shell command run under `timeout seconds` (a hang becomes a failure, status 124), its stdout and stderr kept in
// test_path(log): the exit status (128 when killed by a signal) and that output.
struct CommandResult {
    int status;
    std::string out;
};
inline CommandResult run_logged(const std::string& cmd, const std::string& log, int seconds) {
    const std::string path = test_path(log);
    const int rc = system(("timeout " + std::to_string(seconds) + " " + cmd + " > " + path + " 2>&1").c_str());
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, slurp(path)};
}

// An MPI job: its exit status (128 when killed by a signal), wall time and output.
struct MpiJob {
    int status;
    double seconds;
    std::string out, err;
};

// mpirun as root on an oversubscribed machine; a 120 s timeout turns a hang into a failure. Its output goes to
// test_path(name + "_out.txt") and "_err.txt", so that jobs of other names can run at the same time.
inline MpiJob mpirun(int ranks, const std::string& args, const std::string& name = "mpi") {
    const std::string out = test_path(name + "_out.txt"), err = test_path(name + "_err.txt");
    const std::string cmd = "timeout 120 " + mpirun_command(ranks) + args + " > " + out + " 2> " + err;
    const auto start = std::chrono::steady_clock::now();
    const int rc = system(cmd.c_str());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, seconds, slurp(out), slurp(err)};
}

// How often `what` occurs in `text`.
inline int occurrences(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
    return n;
}

// The value of `key` on every line of a JSON-lines log that has it, as written ("[1.2,1.0]" for a list).
inline std::vector<std::string> log_values(const std::string& log, const std::string& key) {
    std::vector<std::string> values;
    std::istringstream in(slurp(log));
    const std::string label = "\"" + key + "\": ";
    for (std::string line; std::getline(in, line);) {
        const size_t at = line.find(label);
        if (at == std::string::npos) continue;
        const size_t from = at + label.size();
        const size_t to = line[from] == '[' ? line.find(']', from) + 1 : line.find_first_of(",}", from);
        values.push_back(line.substr(from, to - from));
    }
    return values;
}
