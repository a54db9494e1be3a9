// The kernel emulator's device (see emulator.h): device memory and streams on the host, so that the GPU model and
// the GPU trainer run unchanged on a machine without a GPU, with checks a GPU does not make:
//   - "device memory" is host memory from cudaMalloc, registered with its size; a range a launch or a copy reads or
//     writes must lie inside one live allocation (a carve or sizing error throws std::logic_error);
//   - new allocations are filled with 0xFF bytes (NaN floats and doubles, -1 integers): a read of memory nothing
//     wrote shows up as NaN (or a wild index) in the results;
//   - streams are queues: a launch or an async copy only runs when its stream is synchronised (cudaStreamSynchronize,
//     cudaDeviceSynchronize, the synchronous cudaMemcpy, cudaFree), as if the GPU were slow. A host read of a
//     device-to-host copy, or a Comm call on device buffers, that is not preceded by the synchronisation it needs
//     sees stale data. Async host<->device copies behave as with pinned host memory (the copy happens in stream
//     order, not at the call), the strict case. Between streams only events order work, as on the GPU: a
//     cudaStreamWaitEvent runs, when its stream reaches it, the recording stream's work up to the record. The
//     synchronous cudaMemcpy and cudaMemset wait, like CUDA's legacy default stream, for the default stream and the
//     blocking streams only, not for those created with cudaStreamNonBlocking; the device-wide synchronisations run
//     the streams newest first, so work that should wait for an older stream's and does not runs too early.
// The namespace is stand_in: what stands in for the device.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

// A stream: the work queued on it, run in order when it is synchronised. done counts the work run so far, so
// done + pending.size() is the position of the next work queued (what an event records).
struct CUstream_st {
    std::deque<std::function<void()>> pending;
    int64_t done = 0;
    bool blocking = true;  // false: created with cudaStreamNonBlocking (the synchronous copies do not wait for it)
};

namespace stand_in {

// ---- device memory ---------------------------------------------------------------------------------------------

struct Memory {
    std::map<uintptr_t, size_t> live;  // base -> bytes
    int64_t live_bytes = 0, peak_bytes = 0;
};
inline Memory& memory() {
    static Memory m;
    return m;
}

[[noreturn]] inline void violation(const std::string& what) { throw std::logic_error("contract violation: " + what); }

// The live allocation (base, bytes) that holds address p, or memory().live.end().
inline std::map<uintptr_t, size_t>::const_iterator allocation_of(const void* p) {
    const std::map<uintptr_t, size_t>& live = memory().live;
    auto it = live.upper_bound((uintptr_t)p);
    if (it == live.begin() || (uintptr_t)p >= std::prev(it)->first + std::prev(it)->second) return live.end();
    return std::prev(it);
}

// Throws unless [p, p + bytes) lies inside one live allocation. what names the launcher and the argument.
inline void check_range(const void* p, int64_t bytes, const std::string& what) {
    if (bytes <= 0) return;
    if (!p) violation(what + ": null pointer for " + std::to_string(bytes) + " bytes");
    const auto it = allocation_of(p);
    if (it == memory().live.end()) violation(what + ": not device memory (" + std::to_string(bytes) + " bytes)");
    const uintptr_t offset = (uintptr_t)p - it->first;
    if (offset + (uintptr_t)bytes > it->second)
        violation(what + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                  ") of an allocation of " + std::to_string(it->second));
}
// n elements of T at p
template <typename T>
inline void dev(const T* p, int64_t n, const std::string& what) {
    check_range(p, n * (int64_t)sizeof(T), what);
}
// rows of `cols` elements with row stride ld (the last row ends at (rows-1)*ld + cols)
template <typename T>
inline void dev_strided(const T* p, int64_t rows, int64_t ld, int64_t cols, const std::string& what) {
    if (rows > 0 && cols > 0) dev(p, (rows - 1) * ld + cols, what);
}

// Outputs must not overlap each other or the inputs, unless a contract says they may (add, router_forward's
// scores and logits): on the GPU an overlap is a race. Extents are whole (a strided range counts from its first to
// its last element).
struct Span {
    const void* p;
    int64_t bytes;
    const char* name;
};
template <typename T>
inline Span span(const T* p, int64_t n, const char* name) {
    return Span{p, p ? n * (int64_t)sizeof(T) : 0, name};
}
inline bool overlap(const Span& a, const Span& b) {
    return a.bytes > 0 && b.bytes > 0 && (uintptr_t)a.p < (uintptr_t)b.p + b.bytes &&
           (uintptr_t)b.p < (uintptr_t)a.p + a.bytes;
}
inline void apart(const std::string& launcher, std::initializer_list<Span> outs, std::initializer_list<Span> ins) {
    for (auto o = outs.begin(); o != outs.end(); ++o) {
        for (auto o2 = o + 1; o2 != outs.end(); ++o2)
            if (overlap(*o, *o2)) violation(launcher + ": outputs " + o->name + " and " + o2->name + " overlap");
        for (const Span& i : ins)
            if (overlap(*o, i)) violation(launcher + ": output " + o->name + " overlaps input " + i.name);
    }
}

// ---- streams ---------------------------------------------------------------------------------------------------

inline CUstream_st& default_stream() {
    static CUstream_st s;
    return s;
}
inline std::vector<CUstream_st*>& streams() {  // every created stream, for the device-wide synchronisations
    static std::vector<CUstream_st*> all{&default_stream()};
    return all;
}
inline CUstream_st& stream_or_default(CUstream_st* s) { return s ? *s : default_stream(); }
inline void launch(CUstream_st* s, std::function<void()> work) {
    stream_or_default(s).pending.push_back(std::move(work));
}
// Runs q's work until `position` items have run (or none is left).
inline void drain_until(CUstream_st& q, int64_t position) {
    while (q.done < position && !q.pending.empty()) {
        std::function<void()> work = std::move(q.pending.front());
        q.pending.pop_front();
        q.done++;
        work();
    }
}
// Runs the work queued on s now (not what that work queues).
inline void drain(CUstream_st* s) {
    CUstream_st& q = stream_or_default(s);
    drain_until(q, q.done + (int64_t)q.pending.size());
}
inline void drain_all() {  // newest stream first (see the top)
    for (size_t i = streams().size(); i-- > 0;) drain(streams()[i]);
}
inline void drain_blocking() {  // what a synchronous copy waits for: the default stream and the blocking streams
    for (size_t i = streams().size(); i-- > 0;)
        if (streams()[i]->blocking) drain(streams()[i]);
}
// After a failed check: forget the queued work (it may point at buffers of the abandoned model).
inline void discard_all() {
    for (CUstream_st* s : streams()) s->pending.clear();
}

}  // namespace stand_in
