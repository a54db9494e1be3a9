// What a program asks of the emulated device, one record per piece of work: kernel launches (with the bytes of
// device memory they read and write), cuBLASLt products, heuristic lookups and algorithm checks, copies, memsets,
// NCCL calls, and the host's waits for the device. Off unless counting() is set (test/count_step.cpp sets it
// around the steps it counts).
//   - A kernel's bytes are its compulsory traffic: each byte of device memory counts once per launch, read if the
//     launch reads it before writing it, written if it writes it (the hazard checker's per-byte record; so counting
//     needs EMULATOR_CHECK on). Atomics are not seen (they are unchecked).
//   - A product's bytes: A, B (and their scales), C where beta != 0, D; its FLOPs 2 m n k.
//   - Every record has its place in the order the host queued the work (sequence), as an event record has:
//     work between two event records on the timer's stream belongs to that region of the step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace emulator {

enum class Work {
    kernel, gemm, heuristic, algo_check, copy_to_host, copy_to_device, device_copy, memset, host_wait, comm
};

struct Record {
    Work kind;
    std::string name;  // the kernel, the call
    int64_t sequence = 0;
    int64_t bytes_read = 0, bytes_written = 0;
    double flops = 0.0;
};

inline bool& counting() {
    static bool on = false;
    return on;
}
inline std::vector<Record>& records() {
    static std::vector<Record> all;
    return all;
}
// The place of the next piece of work (or event record) the host queues.
inline int64_t& next_sequence() {
    static int64_t sequence = 0;
    return sequence;
}
// Records a piece of work queued now; returns its index in records(), or -1 when not counting.
inline int64_t count_work(Work kind, std::string name, int64_t bytes_read = 0, int64_t bytes_written = 0,
                          double flops = 0.0) {
    const int64_t sequence = next_sequence()++;
    if (!counting()) return -1;
    records().push_back(Record{kind, std::move(name), sequence, bytes_read, bytes_written, flops});
    return (int64_t)records().size() - 1;
}

}  // namespace emulator
