// The kernel emulator's scheduler (see emulator.h): a block's threads are fibers that run one at a time from
// barrier to barrier; the scheduler opens a barrier when every thread it waits for has arrived.
// A switch between fibers is a plain function call that swaps stacks (x86-64: push the callee-saved registers,
// swap the stack pointer, pop them, return), some nanoseconds; ucontext's swapcontext elsewhere (a system call per
// switch, ~50x slower: the permutation checks make tens of millions of switches).
#include "test/kernel_emulator/emulator.h"

#include "test/kernel_emulator/checker.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// The linker's bounds of the section holding every static __shared__ variable (emulator.h); null without any.
extern "C" {
extern unsigned char __start_emulator_shared[] __attribute__((weak));
extern unsigned char __stop_emulator_shared[] __attribute__((weak));
}

namespace emulator {
namespace {

constexpr size_t STACK_BYTES = size_t(256) << 10;  // per thread; kernels keep small arrays, the host math a little

// ---- fibers ----------------------------------------------------------------------------------------------------

#if defined(__x86_64__)
// fiber_switch(&from->sp, to->sp): saves the running fiber's callee-saved registers on its stack and its stack
// pointer in *save, then resumes the fiber whose stack pointer is load (System V ABI: rbp, rbx, r12-r15 are
// callee-saved; everything else is the caller's to save).
extern "C" void emulator_fiber_switch(void** save, void* load);
asm(R"(
    .text
    .globl emulator_fiber_switch
    .type emulator_fiber_switch, @function
emulator_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emulator_fiber_switch, .-emulator_fiber_switch
)");

struct Fiber {
    void* sp = nullptr;
};
// A new fiber on stack [stack, stack + bytes) whose first switch-in calls entry (which must never return): the
// stack holds the six registers fiber_switch pops, then entry as its return address, then a dummy return
// address for entry, so entry starts with the stack aligned as after a call.
inline void fiber_start(Fiber& f, char* stack, size_t bytes, void (*entry)()) {
    uintptr_t top = ((uintptr_t)stack + bytes) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;             // entry's return address: none
    *--sp = (void*)entry;        // fiber_switch's ret lands here
    for (int r = 0; r < 6; r++) *--sp = nullptr;
    f.sp = sp;
}
inline void fiber_switch(Fiber& from, Fiber& to) { emulator_fiber_switch(&from.sp, to.sp); }
#else
}  // namespace
}  // namespace emulator
#include <ucontext.h>
namespace emulator {
namespace {
struct Fiber {
    ucontext_t context;
};
inline void fiber_start(Fiber& f, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stack;
    f.context.uc_stack.ss_size = bytes;
    f.context.uc_link = nullptr;
    makecontext(&f.context, entry, 0);
}
inline void fiber_switch(Fiber& from, Fiber& to) { swapcontext(&from.context, &to.context); }
#endif

// ---- blocks ----------------------------------------------------------------------------------------------------

enum class State { ready, at_warp_barrier, at_block_barrier, done };

// A cp.async copy that has not landed: its data (read when issued), its destination, the group it belongs to
// (the number of the thread's commits before it).
struct AsyncCopy {
    unsigned char data[16];
    unsigned char* dst;
    int group;
};

struct Thread {
    Fiber fiber;
    State state = State::ready;
    Collective collective = Collective::syncwarp;  // at_warp_barrier: which one, its mask and its place
    unsigned mask = 0;
    const void* site = nullptr;
    uint3 index{};
    std::vector<AsyncCopy> copies_in_flight;
    int commits = 0;
};

// Everything about the block that runs now. Collective values are double-buffered by phase: a thread released
// from barrier n reads phase n % 2 while a faster one may already deposit for barrier n + 1 in the other half.
struct Block {
    const std::function<void()>* body = nullptr;
    std::vector<Thread> threads;
    int current = 0;
    Fiber scheduler;
    std::vector<uint64_t> block_values[2];
    int block_phase = 0;
    std::vector<std::array<uint64_t, 32>> warp_values[2];
    std::vector<int> warp_phase;
    std::vector<unsigned char> dynamic_shared_storage;  // 128 bytes more than asked, for the alignment
    unsigned char* dynamic_shared = nullptr;             // 128-byte aligned, as the GPU's
    size_t dynamic_shared_bytes = 0;
    std::string error;  // set by a thread that hit an unsupported use; the scheduler throws it
};

Block* running = nullptr;
std::vector<std::unique_ptr<char[]>> stacks;  // reused from block to block

// EMULATOR_ORDER: forward (default: threads and blocks ascending, each thread one stretch between barriers per
// round), reverse (the same, descending), warps (ascending, and each warp runs through its own warp collectives
// as far as it can, up to a __syncthreads, before the next warp starts: a warp gets far ahead of the others).
enum class Order { forward, reverse, warps };
Order order_from_environment() {
    const char* order = getenv("EMULATOR_ORDER");
    const std::string name = order ? order : "forward";
    if (name == "forward") return Order::forward;
    if (name == "reverse") return Order::reverse;
    if (name == "warps") return Order::warps;
    throw std::invalid_argument("EMULATOR_ORDER=" + name + ": use forward, reverse or warps");
}

// The running thread stops here until the scheduler releases it.
void wait(State at) {
    Block& b = *running;
    Thread& t = b.threads[b.current];
    t.state = at;
    fiber_switch(t.fiber, b.scheduler);
}

// A thread's whole life: the kernel body, then back to the scheduler for good.
void thread_entry() {
    Block& b = *running;
    try {
        (*b.body)();
        if (!b.threads[b.current].copies_in_flight.empty())
            b.error = "a thread exited with cp.async copies it never waited for";
    } catch (const std::exception& e) {
        b.error = e.what();
    }
    wait(State::done);
}

[[noreturn]] void fail(const std::string& what) {
    throw std::logic_error("kernel emulator: " + what + " (grid " + std::to_string(gridDim.x) + "x" +
                           std::to_string(gridDim.y) + "x" + std::to_string(gridDim.z) + ", block " +
                           std::to_string(blockDim.x) + "x" + std::to_string(blockDim.y) + "x" +
                           std::to_string(blockDim.z) + ", block index " + std::to_string(blockIdx.x) + "," +
                           std::to_string(blockIdx.y) + "," + std::to_string(blockIdx.z) + ")");
}

std::string collective_at(const Thread& t) {
    static const char* names[] = {"__syncwarp", "a shuffle", "a vote", "mma.sync", "ldmatrix"};
    return std::string(names[(int)t.collective]) + " at " + checker::source_line(t.site);
}

// Opens warp w's collective if all its lanes wait there (true), or throws if it can never complete: a lane
// exited, lanes wait at different collectives, or a mask leaves out a lane.
bool release_warp(Block& b, int w) {
    const int first = w * 32, lanes = std::min(32, (int)b.threads.size() - first);
    int waiting = 0, done = 0, exited = -1;
    for (int l = 0; l < lanes; l++) {
        waiting += b.threads[first + l].state == State::at_warp_barrier;
        if (b.threads[first + l].state == State::done) done++, exited = l;
    }
    if (waiting == 0) return false;
    if (lanes < 32) fail("a warp collective in a partial warp (block size not a multiple of 32)");
    if (waiting + done < lanes) return false;
    const Thread* one = nullptr;
    for (int l = 0; l < lanes; l++) {
        const Thread& t = b.threads[first + l];
        if (t.state != State::at_warp_barrier) continue;
        if (t.mask != 0xffffffffu) {
            for (int k = 0; k < 32; k++) {
                const Thread& left_out = b.threads[first + k];
                if (!(t.mask >> k & 1) && left_out.state == State::at_warp_barrier)
                    fail("lane " + std::to_string(l) + " of warp " + std::to_string(w) + " calls " + collective_at(t) +
                         " with mask " + std::to_string(t.mask) + ", which leaves out lane " + std::to_string(k) +
                         ", which calls " + collective_at(left_out));
            }
            fail(collective_at(t) + " with a partial mask (the emulator runs full-warp collectives only)");
        }
        if (done > 0)
            fail(collective_at(t) + ": its mask names lane " + std::to_string(exited) + " of warp " +
                 std::to_string(w) + ", which has exited (" + std::to_string(done) + " lanes exited)");
        if (one && one->collective != t.collective)
            fail("the lanes of warp " + std::to_string(w) + " call different collectives: lane " +
                 std::to_string(one - &b.threads[first]) + " " + collective_at(*one) + ", lane " +
                 std::to_string(l) + " " + collective_at(t));
        one = &t;
    }
    if (one->collective == Collective::syncwarp) checker::warp_synced(w);
    b.warp_phase[w] ^= 1;
    for (int l = 0; l < 32; l++) b.threads[first + l].state = State::ready;
    return true;
}

// After every thread has stopped: opens the warp collectives that are complete, else the __syncthreads if every
// thread waits there; throws if neither can open.
void release(Block& b) {
    const int n = (int)b.threads.size();
    bool released = false;
    for (int w = 0; w * 32 < n; w++) released = release_warp(b, w) || released;
    if (released) return;
    int at_block = 0, done = 0;
    for (const Thread& t : b.threads) {
        at_block += t.state == State::at_block_barrier;
        done += t.state == State::done;
    }
    if (at_block == n) {
        checker::barrier();
        b.block_phase ^= 1;
        for (Thread& t : b.threads) t.state = State::ready;
        return;
    }
    if (at_block > 0 && at_block + done == n)
        fail("__syncthreads reached by " + std::to_string(at_block) + " threads after " + std::to_string(done) +
             " exited");
    fail("deadlock: " + std::to_string(at_block) + " threads wait at __syncthreads, the others at a warp collective "
         "their warp does not complete");
}

// Runs the ready lanes of warp w, each until it stops, in the order's direction.
void run_warp(Block& b, int w, Order order) {
    const int first = w * 32, lanes = std::min(32, (int)b.threads.size() - first);
    for (int k = 0; k < lanes; k++) {
        const int i = first + (order == Order::reverse ? lanes - 1 - k : k);
        Thread& t = b.threads[i];
        if (t.state != State::ready) continue;
        b.current = i;
        threadIdx = t.index;
        checker::run_thread(i);
        fiber_switch(b.scheduler, t.fiber);
        checker::run_thread(-1);
        if (!b.error.empty()) fail(b.error);
    }
}

void run_block(Block& b, Order order) {
    const int n = (int)b.threads.size(), warps = (n + 31) / 32;
    for (int i = 0; i < n; i++) {
        b.threads[i].state = State::ready;
        b.threads[i].copies_in_flight.clear();
        b.threads[i].commits = 0;
        fiber_start(b.threads[i].fiber, stacks[i].get(), STACK_BYTES, thread_entry);
    }
    b.block_phase = 0;
    std::fill(b.warp_phase.begin(), b.warp_phase.end(), 0);
    std::fill(b.dynamic_shared, b.dynamic_shared + b.dynamic_shared_bytes, (unsigned char)0xFF);
    if (__start_emulator_shared) std::fill(__start_emulator_shared, __stop_emulator_shared, (unsigned char)0xFF);
    for (;;) {
        for (int k = 0; k < warps; k++) {
            const int w = order == Order::reverse ? warps - 1 - k : k;
            do run_warp(b, w, order);
            while (order == Order::warps && release_warp(b, w));
        }
        if (std::all_of(b.threads.begin(), b.threads.end(), [](const Thread& t) { return t.state == State::done; }))
            return;
        release(b);
    }
}

}  // namespace

void run_grid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body, const void* kernel) {
    gridDim = grid;
    blockDim = block;
    blockIdx = uint3{0, 0, 0};
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.z > 64) fail("invalid block size");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        fail("invalid grid size");
    if (shared_bytes > shared_memory_optin())
        fail(std::to_string(shared_bytes) + " bytes of dynamic shared memory (at most " +
             std::to_string(shared_memory_optin()) + " a block on the target GPU)");
    while (stacks.size() < threads) stacks.emplace_back(new char[STACK_BYTES]);

    Block b;
    b.body = &body;
    b.threads.resize(threads);
    for (unsigned z = 0, i = 0; z < block.z; z++)
        for (unsigned y = 0; y < block.y; y++)
            for (unsigned x = 0; x < block.x; x++) b.threads[i++].index = uint3{x, y, z};
    const size_t warps = (threads + 31) / 32;
    for (int p = 0; p < 2; p++) {
        b.block_values[p].assign(threads, 0);
        b.warp_values[p].assign(warps, std::array<uint64_t, 32>{});
    }
    b.warp_phase.assign(warps, 0);
    b.dynamic_shared_storage.resize(shared_bytes + 128);
    b.dynamic_shared = b.dynamic_shared_storage.data() + (128 - (uintptr_t)b.dynamic_shared_storage.data() % 128);
    b.dynamic_shared_bytes = shared_bytes;

    const Order order = order_from_environment();
    Block* outer = running;
    running = &b;
    checker::begin_launch(kernel, b.dynamic_shared, shared_bytes, (int)threads);
    const uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;
    for (uint64_t k = 0; k < blocks; k++) {
        const uint64_t i = order == Order::reverse ? blocks - 1 - k : k;
        blockIdx = uint3{(unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y), (unsigned)(i / grid.x / grid.y)};
        checker::begin_block(i);
        try {
            run_block(b, order);
        } catch (...) {
            checker::abandon_launch();
            running = outer;
            throw;
        }
    }
    running = outer;
    checker::end_launch();
}

unsigned char* dynamic_shared_memory() { return running->dynamic_shared; }

const uint64_t* warp_collective(Collective kind, unsigned mask, uint64_t value, const void* site) {
    Block& b = *running;
    Thread& t = b.threads[b.current];
    t.collective = kind;
    t.mask = mask;
    t.site = site;
    const int warp = b.current / 32, phase = b.warp_phase[warp];
    b.warp_values[phase][warp][b.current % 32] = value;
    wait(State::at_warp_barrier);
    return b.warp_values[phase][warp].data();
}

const uint64_t* block_collective(uint64_t value) {
    Block& b = *running;
    const int phase = b.block_phase;
    b.block_values[phase][b.current] = value;
    wait(State::at_block_barrier);
    return b.block_values[phase].data();
}

void check_width(int width) {
    if (width != 32) fail_thread("a shuffle of width " + std::to_string(width) + " (the emulator supports 32 only)");
}

bool in_shared_memory(const void* p, size_t bytes) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    const Block& b = *running;
    const bool dynamic = c >= b.dynamic_shared && c + bytes <= b.dynamic_shared + b.dynamic_shared_bytes;
    const bool in_static =
        __start_emulator_shared && c >= __start_emulator_shared && c + bytes <= __stop_emulator_shared;
    return dynamic || in_static;
}

void async_copy(void* shared_dst, const void* global_src) {
    if (reinterpret_cast<uintptr_t>(shared_dst) % 16 != 0 || reinterpret_cast<uintptr_t>(global_src) % 16 != 0 ||
        !in_shared_memory(shared_dst, 16))
        fail_thread("cp.async: an address not 16-byte aligned, or a destination outside shared memory");
    Thread& t = running->threads[running->current];
    checker::async_issued(static_cast<unsigned char*>(shared_dst), global_src, __builtin_return_address(0));
    AsyncCopy copy;
    memcpy(copy.data, global_src, 16);
    copy.dst = static_cast<unsigned char*>(shared_dst);
    copy.group = t.commits;
    memset(copy.dst, 0xFF, 16);
    t.copies_in_flight.push_back(copy);
}

void async_commit() { running->threads[running->current].commits++; }

void async_wait(int in_flight) {
    Thread& t = running->threads[running->current];
    std::vector<AsyncCopy> still;
    for (const AsyncCopy& c : t.copies_in_flight) {
        if (c.group < t.commits - in_flight) {
            memcpy(c.dst, c.data, 16);
            checker::async_landed(c.dst);
        } else {
            still.push_back(c);
        }
    }
    t.copies_in_flight.swap(still);
}

void fail_thread(const std::string& what) {
    running->error = what;
    wait(State::done);
    abort();  // the scheduler never resumes a thread that is done
}

}  // namespace emulator
