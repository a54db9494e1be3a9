// The kernel emulator's hazard checker: what it records and when it reports is in checker.h. Device memory comes
// from one reserved range (device_allocate), so that telling device memory from host memory is one comparison.
#include "test/kernel_emulator/checker.h"

#include <cxxabi.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "test/kernel_emulator/emulator.h"
#include "test/kernel_emulator/stand_in.h"

extern "C" {
extern unsigned char __start_emulator_shared[] __attribute__((weak));
extern unsigned char __stop_emulator_shared[] __attribute__((weak));
}

namespace emulator {
namespace {

constexpr size_t MAX_DYNAMIC_SHARED = size_t(227) << 10;
constexpr size_t DEVICE_BYTES = size_t(16) << 30;  // the emulated device's memory (cudaMemGetInfo says 16 GiB)

// ---- source lines and names ------------------------------------------------------------------------------------

struct Symbol {
    uintptr_t address;
    size_t size;
    const char* mangled;
};

// The program's symbols (functions and variables, static locals included) at their run-time addresses, sorted, from
// its own ELF symbol table.
struct Symbols {
    std::vector<char> file;
    std::vector<Symbol> all;
    std::vector<Symbol> local_statics;
    uintptr_t local_statics_end = 0;
    uintptr_t load_bias = 0;

    Symbols() {
        dl_iterate_phdr([](dl_phdr_info* info, size_t, void* bias) { return *(uintptr_t*)bias = info->dlpi_addr, 1; },
                        &load_bias);
        FILE* f = fopen("/proc/self/exe", "rb");
        if (!f) return;
        for (char chunk[1 << 16];;) {
            const size_t n = fread(chunk, 1, sizeof chunk, f);
            file.insert(file.end(), chunk, chunk + n);
            if (n < sizeof chunk) break;
        }
        fclose(f);
        if (file.size() < sizeof(Elf64_Ehdr)) return;
        const auto* header = reinterpret_cast<const Elf64_Ehdr*>(file.data());
        const auto* sections = reinterpret_cast<const Elf64_Shdr*>(file.data() + header->e_shoff);
        for (int s = 0; s < header->e_shnum; s++) {
            if (sections[s].sh_type != SHT_SYMTAB) continue;
            const char* names = file.data() + sections[sections[s].sh_link].sh_offset;
            const auto* symbols = reinterpret_cast<const Elf64_Sym*>(file.data() + sections[s].sh_offset);
            for (size_t i = 0; i < sections[s].sh_size / sizeof(Elf64_Sym); i++) {
                const int type = ELF64_ST_TYPE(symbols[i].st_info);
                if ((type == STT_FUNC || type == STT_OBJECT) && symbols[i].st_size > 0)
                    all.push_back(
                        Symbol{load_bias + symbols[i].st_value, symbols[i].st_size, names + symbols[i].st_name});
            }
        }
        std::sort(all.begin(), all.end(), [](const Symbol& a, const Symbol& b) { return a.address < b.address; });
        // Function-local statics outside the shared-memory section: g++ leaves a template's there (checker.h).
        for (const Symbol& s : all) {
            const bool in_section = __start_emulator_shared && s.address >= (uintptr_t)__start_emulator_shared &&
                                    s.address < (uintptr_t)__stop_emulator_shared;
            if (strncmp(s.mangled, "_ZZ", 3) == 0 && !in_section) local_statics.push_back(s);
        }
        for (const Symbol& s : local_statics) local_statics_end = std::max(local_statics_end, s.address + s.size);
    }
    // The symbol whose bytes hold address, or null.
    const Symbol* at(uintptr_t address) const {
        auto it = std::upper_bound(all.begin(), all.end(), address,
                                   [](uintptr_t a, const Symbol& s) { return a < s.address; });
        if (it == all.begin() || address >= std::prev(it)->address + std::prev(it)->size) return nullptr;
        return &*std::prev(it);
    }
};
const Symbols& symbols() {
    static const Symbols table;
    return table;
}

std::string demangled(const char* mangled) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), free);
    return status == 0 ? name.get() : mangled;
}

// ---- the record of accesses ------------------------------------------------------------------------------------

// One access: the thread (its linear index in the block), the block's barrier epoch and its warp's __syncwarp
// count then, and the return address in the kernel.
struct Stamp {
    uint64_t epoch = 0;
    uint32_t warp_syncs = 0;
    int32_t thread = -1;
    const void* site = nullptr;
};
struct SharedByte {
    Stamp write, read, other_read;  // other_read: the reader before `read` that was another thread
    Stamp copy;                     // a cp.async in flight to this byte (thread -1: none)
};
// A byte of device memory within one launch: the block that wrote it and the one that read it (linear index + 1;
// MANY_BLOCKS: several read), each with the thread and the place (its offset from the program's load address).
constexpr uint32_t MANY_BLOCKS = 0xFFFFFFFFu;
constexpr size_t GRANULE = 1;
struct GlobalGranule {
    uint32_t launch = 0;
    uint32_t writer = 0, reader = 0;
    uint32_t write_site = 0, read_site = 0;
    uint16_t write_thread = 0, read_thread = 0;
};

struct Checker {
    bool active = false;  // a grid runs
    uint32_t launch = 0;
    uint64_t epoch = 0;
    uint64_t block_epoch = 0;  // the epoch the running block started in
    uint64_t block = 0;
    int thread = -1;
    std::vector<uint32_t> warp_syncs;
    const void* kernel = nullptr;
    unsigned char* dynamic_shared = nullptr;
    size_t dynamic_bytes = 0;
    size_t static_bytes = 0;
    std::vector<SharedByte> shared;      // the static section, then the dynamic shared memory
    std::vector<unsigned char> touched;  // static bytes this launch used
    unsigned char* device = nullptr;     // DEVICE_BYTES of device memory
    GlobalGranule* granules = nullptr;   // one per GRANULE bytes of it
    int64_t bytes_read = 0, bytes_written = 0;  // this launch's, each byte once (counts.h)
    std::map<size_t, size_t> free_ranges;
};
Checker c;

std::string thread_name(int t) {
    const int x = t % (int)blockDim.x, y = t / (int)blockDim.x % (int)blockDim.y;
    const int z = t / (int)(blockDim.x * blockDim.y);
    return "thread (" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
}

std::string block_name(uint64_t b) {
    return "block (" + std::to_string(b % gridDim.x) + "," + std::to_string(b / gridDim.x % gridDim.y) + "," +
           std::to_string(b / gridDim.x / gridDim.y) + ")";
}

std::string kernel_name() {
    return c.kernel ? std::string(checker::function_name(c.kernel)) : std::string("a grid run by run_grid");
}

// "name[i]" of the __shared__ variable at p (i in elements of `bytes`), or the byte of dynamic shared memory.
std::string shared_name(const unsigned char* p, size_t bytes) {
    if (p >= c.dynamic_shared && p < c.dynamic_shared + c.dynamic_bytes)
        return "byte " + std::to_string(p - c.dynamic_shared) + " of dynamic shared memory";
    const Symbol* s = symbols().at((uintptr_t)p);
    if (!s) return "static shared memory";
    const size_t offset = (uintptr_t)p - s->address;
    return demangled(s->mangled) + "[" + std::to_string(offset / bytes) + "]";
}

bool ordered(const Stamp& s) {
    return s.thread < 0 || s.thread == c.thread || s.epoch != c.epoch ||
           (s.thread / 32 == c.thread / 32 && s.warp_syncs != c.warp_syncs[c.thread / 32]);
}

[[noreturn]] void race(const char* kind, unsigned char* p, size_t bytes, bool write, const void* site,
                       const Stamp& earlier, const char* earlier_verb) {
    fail_thread(std::string("shared-memory race (") + kind + ") in " + kernel_name() + ": " + thread_name(c.thread) +
                (write ? " writes " : " reads ") + shared_name(p, bytes) + " at " + checker::source_line(site) +
                ", and " + thread_name(earlier.thread) + " " + earlier_verb + " it at " +
                checker::source_line(earlier.site) +
                (earlier.thread / 32 == c.thread / 32 ? ", with no __syncwarp or __syncthreads between"
                                                      : ", with no __syncthreads between"));
}

size_t shared_index(const unsigned char* p) {
    const size_t in_static = (size_t)(p - __start_emulator_shared);
    return in_static < c.static_bytes ? in_static : c.static_bytes + (size_t)(p - c.dynamic_shared);
}

void shared_access(unsigned char* p, size_t bytes, bool write, const void* site) {
    const size_t index = shared_index(p);
    const Stamp now{c.epoch, c.warp_syncs[c.thread / 32], c.thread, site};
    for (size_t i = 0; i < bytes; i++) {
        SharedByte& e = c.shared[index + i];
        if (e.copy.thread >= 0 && e.copy.epoch >= c.block_epoch)
            fail_thread("cp.async misuse in " + kernel_name() + ": " + thread_name(c.thread) +
                        (write ? " writes " : " reads ") + shared_name(p, bytes) + " at " +
                        checker::source_line(site) + " before the wait that covers the copy " +
                        thread_name(e.copy.thread) + " issued to it at " + checker::source_line(e.copy.site));
        if (!ordered(e.write)) race(write ? "write after write" : "read after write", p, bytes, write, site, e.write,
                                    "wrote");
        if (write) {
            if (!ordered(e.read)) race("write after read", p, bytes, write, site, e.read, "read");
            if (!ordered(e.other_read)) race("write after read", p, bytes, write, site, e.other_read, "read");
            e.write = now;
            e.read = e.other_read = Stamp{};
        } else {
            if (e.read.thread != c.thread) e.other_read = e.read;
            e.read = now;
        }
    }
    if (index < c.static_bytes) std::fill_n(c.touched.begin() + (long)index, bytes, 1);
}

// "byte i of a device allocation of n bytes"
std::string device_name(const unsigned char* p) {
    const auto it = stand_in::allocation_of(p);
    if (it == stand_in::memory().live.end()) return "freed device memory";
    return "byte " + std::to_string((uintptr_t)p - it->first) + " of a device allocation of " +
           std::to_string(it->second) + " bytes";
}

const void* site_at(uint32_t offset) { return (const void*)(symbols().load_bias + offset); }

void global_access(const unsigned char* p, size_t bytes, bool write, const void* site) {
    const size_t offset = (size_t)(p - c.device);
    const uint32_t me = (uint32_t)c.block + 1, at = (uint32_t)((uintptr_t)site - symbols().load_bias);
    for (size_t i = offset / GRANULE; i <= (offset + bytes - 1) / GRANULE; i++) {
        GlobalGranule& g = c.granules[i];
        if (g.launch != c.launch) {  // the launch's first access to the byte: a read counts (counts.h)
            g = GlobalGranule{c.launch};
            if (!write) c.bytes_read += GRANULE;
        }
        if (write && g.writer == 0) c.bytes_written += GRANULE;
        const bool other_writer = g.writer != 0 && g.writer != me;
        if (other_writer || (write && g.reader != 0 && g.reader != me)) {
            const bool many = !other_writer && g.reader == MANY_BLOCKS;
            fail_thread(std::string("device-memory race in ") + kernel_name() + ": " + thread_name(c.thread) +
                        " of " + block_name(c.block) + (write ? " writes " : " reads ") + device_name(p) + " at " +
                        checker::source_line(site) + ", which " +
                        (many ? "other blocks" : block_name((other_writer ? g.writer : g.reader) - 1)) +
                        (other_writer ? " wrote" : " read") + " in the same launch (" +
                        thread_name(other_writer ? g.write_thread : g.read_thread) + " at " +
                        checker::source_line(site_at(other_writer ? g.write_site : g.read_site)) +
                        "): the blocks of a launch are not ordered");
        }
        if (write) g.writer = me, g.write_thread = (uint16_t)c.thread, g.write_site = at;
        else if (g.reader == 0) g.reader = me, g.read_thread = (uint16_t)c.thread, g.read_site = at;
        else if (g.reader != me) g.reader = MANY_BLOCKS;
    }
}

// A kernel that touches a function-local static outside the shared-memory section: g++ puts a template's there, so
// a __shared__ array declared in a template would be neither shared memory to the checker nor reset per block.
void check_local_static(const unsigned char* p, const void* site) {
    const std::vector<Symbol>& statics = symbols().local_statics;
    if (statics.empty() || (uintptr_t)p < statics[0].address || (uintptr_t)p >= symbols().local_statics_end) return;
    auto it = std::upper_bound(statics.begin(), statics.end(), (uintptr_t)p,
                               [](uintptr_t a, const Symbol& s) { return a < s.address; });
    const Symbol& s = *std::prev(it);
    if ((uintptr_t)p < s.address + s.size)
        fail_thread("in " + kernel_name() + ": " + demangled(s.mangled) + " at " + checker::source_line(site) +
                    " is a static variable of a template (or of a function g++ placed like one): a __shared__ array "
                    "there is not shared memory on the kernel emulator. Declare it in a function that is not a "
                    "template (docs/design.md §4)");
}

void access(const void* address, size_t bytes, bool write, const void* site) {
    if (!c.active || c.thread < 0 || bytes == 0) return;
    unsigned char* p = (unsigned char*)address;
    if ((size_t)(p - c.device) < DEVICE_BYTES) return global_access(p, bytes, write, site);
    if ((size_t)(p - __start_emulator_shared) < c.static_bytes || (size_t)(p - c.dynamic_shared) < c.dynamic_bytes)
        return shared_access(p, bytes, write, site);
    check_local_static(p, site);
}

// The opt-in shared memory per block of the GPU the build targets (EMULATOR_TARGET, default sm_90).
size_t shared_memory_limit(std::string* target_name) {
    const char* target = getenv("EMULATOR_TARGET");
    const std::string name = target ? target : "sm_90";
    if (target_name) *target_name = name;
    if (name == "sm_90" || name == "sm_90a") return size_t(227) << 10;
    if (name == "sm_80") return size_t(163) << 10;
    if (name == "sm_86" || name == "sm_89") return size_t(99) << 10;
    throw std::invalid_argument("EMULATOR_TARGET=" + name + ": use sm_80, sm_86, sm_89 or sm_90");
}

}  // namespace

size_t shared_memory_optin() { return shared_memory_limit(nullptr); }

void checked_access(const void* p, size_t bytes, bool write, const void* site) { access(p, bytes, write, site); }

void* device_allocate(size_t bytes) {
    if (!c.device) {
        void* device = mmap(nullptr, DEVICE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                            -1, 0);
        void* granules = mmap(nullptr, DEVICE_BYTES / GRANULE * sizeof(GlobalGranule), PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (device == MAP_FAILED || granules == MAP_FAILED) return nullptr;
        c.device = (unsigned char*)device;
        c.granules = (GlobalGranule*)granules;
        c.free_ranges[0] = DEVICE_BYTES;
    }
    bytes = (bytes + 255) / 256 * 256;
    for (auto it = c.free_ranges.begin(); it != c.free_ranges.end(); ++it) {
        if (it->second < bytes) continue;
        const size_t offset = it->first, left = it->second - bytes;
        c.free_ranges.erase(it);
        if (left > 0) c.free_ranges[offset + bytes] = left;
        return c.device + offset;
    }
    return nullptr;
}

void device_free(void* p, size_t bytes) {
    size_t offset = (size_t)((unsigned char*)p - c.device);
    bytes = (bytes + 255) / 256 * 256;
    // Give whole pages back to the host, with their record.
    const size_t page = 4096, first = (offset + page - 1) / page * page, last = (offset + bytes) / page * page;
    if (last > first) {
        madvise(c.device + first, last - first, MADV_DONTNEED);
        const size_t record_first = first / GRANULE * sizeof(GlobalGranule);
        const size_t record_last = last / GRANULE * sizeof(GlobalGranule);
        const size_t page_first = (record_first + page - 1) / page * page, page_last = record_last / page * page;
        if (page_last > page_first)
            madvise((unsigned char*)c.granules + page_first, page_last - page_first, MADV_DONTNEED);
    }
    auto next = c.free_ranges.lower_bound(offset);
    if (next != c.free_ranges.end() && next->first == offset + bytes) {
        bytes += next->second;
        c.free_ranges.erase(next);
    }
    auto before = c.free_ranges.lower_bound(offset);
    if (before != c.free_ranges.begin() && std::prev(before)->first + std::prev(before)->second == offset) {
        --before;
        offset = before->first;
        bytes += before->second;
    }
    c.free_ranges[offset] = bytes;
}

namespace checker {

void begin_launch(const void* kernel, unsigned char* dynamic_shared, size_t dynamic_bytes, int threads) {
    c.kernel = kernel;
    c.launch++;
    c.dynamic_shared = dynamic_shared;
    c.dynamic_bytes = dynamic_bytes;
    c.static_bytes = __start_emulator_shared ? (size_t)(__stop_emulator_shared - __start_emulator_shared) : 0;
    if (c.shared.size() < c.static_bytes + MAX_DYNAMIC_SHARED) c.shared.resize(c.static_bytes + MAX_DYNAMIC_SHARED);
    c.touched.assign(c.static_bytes, 0);
    c.warp_syncs.assign((size_t)(threads + 31) / 32, 0);
    c.thread = -1;
    c.bytes_read = c.bytes_written = 0;
    const char* check = getenv("EMULATOR_CHECK");
    c.active = !(check && std::string(check) == "0");
}

void begin_block(uint64_t block) {
    c.block = block;
    c.block_epoch = ++c.epoch;
}

void run_thread(int thread) { c.thread = thread; }
void barrier() { c.epoch++; }
void warp_synced(int warp) { c.warp_syncs[(size_t)warp]++; }

void abandon_launch() {
    c.active = false;
    c.thread = -1;
}

void end_launch() {
    abandon_launch();
    // static shared memory: every __shared__ variable the launch touched, whole
    size_t static_used = 0;
    for (size_t i = 0; i < c.static_bytes; i++) {
        if (!c.touched[i]) continue;
        const Symbol* s = symbols().at((uintptr_t)(__start_emulator_shared + i));
        if (!s) {
            static_used++;
            continue;
        }
        static_used += s->size;
        i = (size_t)(s->address + s->size - (uintptr_t)__start_emulator_shared) - 1;
    }
    std::string target;
    const size_t limit = shared_memory_limit(&target);
    if (static_used + c.dynamic_bytes > limit)
        throw std::logic_error("kernel emulator: " + kernel_name() + " uses " + std::to_string(static_used) +
                               " bytes of static and " + std::to_string(c.dynamic_bytes) + " bytes of dynamic shared "
                               "memory, over the " + std::to_string(limit) + " a block may have on " + target);
}

void async_issued(unsigned char* dst, const void* src, const void* site) {
    access(src, 16, false, site);
    access(dst, 16, true, site);  // a race with an earlier access shows here, where the copy is issued
    if (!c.active) return;
    const size_t index = shared_index(dst);
    for (size_t i = 0; i < 16; i++) c.shared[index + i].copy = Stamp{c.epoch, 0, c.thread, site};
}

void async_landed(unsigned char* dst) {
    if (!c.active) return;
    const size_t index = shared_index(dst);
    for (size_t i = 0; i < 16; i++) {
        SharedByte& e = c.shared[index + i];
        e.write = Stamp{c.epoch, c.warp_syncs[c.thread / 32], c.thread, e.copy.site};
        e.read = e.other_read = Stamp{};
        e.copy = Stamp{};
    }
}

const char* source_line(const void* return_address) {
    static std::map<const void*, std::string> lines;
    auto it = lines.find(return_address);
    if (it != lines.end()) return it->second.c_str();
    // addr2line -i prints the chain of inlined calls, innermost first, each as a name line and a file:line line.
    // The first place outside the emulator's stand-ins of CUDA (a shuffle's body, cp.async's) is the kernel's.
    const uintptr_t at = (uintptr_t)return_address - 1 - symbols().load_bias;
    char command[96];
    snprintf(command, sizeof command, "addr2line -i -e /proc/%d/exe 0x%lx 2>/dev/null", (int)getpid(),
             (unsigned long)at);
    char cwd[4096];
    const std::string directory = getcwd(cwd, sizeof cwd) ? std::string(cwd) + "/" : std::string("");
    std::vector<std::string> chain;
    if (FILE* p = popen(command, "r")) {
        for (char text[4096]; fgets(text, sizeof text, p);) {
            std::string line = text;
            while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
            const size_t discriminator = line.find(" (discriminator");
            if (discriminator != std::string::npos) line.erase(discriminator);
            const size_t relative = line.find("/./");  // the build's directory, then the path as given
            if (relative != std::string::npos) line.erase(0, relative + 3);
            if (line.compare(0, directory.size(), directory) == 0) line.erase(0, directory.size());
            chain.push_back(line);
        }
        pclose(p);
    }
    std::string line = chain.empty() ? "" : chain[0];
    for (const std::string& place : chain) {
        const bool stand_in = place.find("kernel_emulator/emulator.h") != std::string::npos ||
                              place.find("kernel_emulator/kernels/") != std::string::npos;
        if (!stand_in) {
            line = place;
            break;
        }
    }
    if (line.empty() || line[0] == '?') {
        const Symbol* s = symbols().at((uintptr_t)return_address - 1);
        line = s ? demangled(s->mangled) + " (no line information: build with -g1)" : "an unknown place";
    }
    return lines.emplace(return_address, line).first->second.c_str();
}

void launch_bytes(int64_t* read, int64_t* written) {
    *read = c.bytes_read;
    *written = c.bytes_written;
}

const char* function_name(const void* function) {
    static std::map<const void*, std::string> names;
    auto it = names.find(function);
    if (it != names.end()) return it->second.c_str();
    const Symbol* s = symbols().at((uintptr_t)function);
    return names.emplace(function, s ? demangled(s->mangled) : std::string("an unnamed kernel")).first->second.c_str();
}

}  // namespace checker
}  // namespace emulator

// ---- what g++ calls for -fsanitize=thread ------------------------------------------------------------------------
// Each load or store of n bytes in an instrumented file calls __tsan_read<n> or __tsan_write<n> first; the return
// address is the access's place in the kernel.
#define EMULATOR_ACCESS(n)                                                                                           \
    void __tsan_read##n(void* p) { emulator::access(p, n, false, __builtin_return_address(0)); }                     \
    void __tsan_write##n(void* p) { emulator::access(p, n, true, __builtin_return_address(0)); }                     \
    void __tsan_unaligned_read##n(void* p) { emulator::access(p, n, false, __builtin_return_address(0)); }           \
    void __tsan_unaligned_write##n(void* p) { emulator::access(p, n, true, __builtin_return_address(0)); }
extern "C" {
EMULATOR_ACCESS(1)
EMULATOR_ACCESS(2)
EMULATOR_ACCESS(4)
EMULATOR_ACCESS(8)
EMULATOR_ACCESS(16)
void __tsan_read_range(void* p, size_t n) { emulator::access(p, n, false, __builtin_return_address(0)); }
void __tsan_write_range(void* p, size_t n) { emulator::access(p, n, true, __builtin_return_address(0)); }
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
// The guard of a function's static variable, read before its first use (no thread of the emulator is concurrent).
unsigned char __tsan_atomic8_load(const volatile unsigned char* p, int) { return *p; }
}
