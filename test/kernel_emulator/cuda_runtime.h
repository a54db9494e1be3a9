// The kernel emulator's CUDA runtime (see emulator.h, stand_in.h): the part of the runtime API that gpu/, kernels/
// and train.cu use, on host memory. Streams queue their work; events order it between streams but time nothing
// (every region lasts 0 ms). What the host asks of the device is counted (counts.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

#include "checker.h"
#include "counts.h"
#include "emulator.h"  // what kernel code sees of CUDA
#include "stand_in.h"

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorNotReady = 600 };
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
typedef CUstream_st* cudaStream_t;
struct CUevent_st {  // where the last record was made: a stream and its position, and the host's place (counts.h)
    CUstream_st* stream = nullptr;
    int64_t position = 0;
    int64_t sequence = 0;
};
typedef CUevent_st* cudaEvent_t;
constexpr unsigned cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2;
struct cudaDeviceProp {
    char name[256] = "kernel emulator";
    size_t totalGlobalMem = size_t(16) << 30;
    size_t sharedMemPerBlockOptin = size_t(227) << 10;
    int major = 9, minor = 0, multiProcessorCount = 1;
};
namespace stand_in {
// The device cudaGetDeviceProperties describes: a Hopper GPU, unless a test says otherwise
inline cudaDeviceProp& device_properties() {
    static cudaDeviceProp properties;
    return properties;
}
}  // namespace stand_in

inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorNotReady: return "cudaErrorNotReady";
    }
    return "unknown error";
}
inline const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

// A 16 GiB device, whatever the host has (the memory plans of the test configs are far below it): free is 16 GiB
// less what cudaMalloc holds, so train's "free before / after" line shows what init allocated.
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *total_bytes = size_t(16) << 30;
    const int64_t live = stand_in::memory().live_bytes;
    *free_bytes = live < (int64_t)*total_bytes ? *total_bytes - (size_t)live : 0;
    return cudaSuccess;
}

// 256-byte aligned host memory filled with 0xFF (NaN as floats), registered with its size.
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    void* q = emulator::device_allocate(bytes);
    if (!q) return cudaErrorMemoryAllocation;
    memset(q, 0xFF, bytes);
    stand_in::Memory& m = stand_in::memory();
    m.live[(uintptr_t)q] = bytes;
    m.live_bytes += (int64_t)bytes;
    m.peak_bytes = std::max(m.peak_bytes, m.live_bytes);
    *p = q;
    return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaMalloc(T** p, size_t bytes) {
    return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
// Waits for the device first (as the real cudaFree may), so queued work never touches freed memory.
inline cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    emulator::count_work(emulator::Work::host_wait, "cudaFree");
    stand_in::drain_all();
    stand_in::Memory& m = stand_in::memory();
    auto it = m.live.find((uintptr_t)p);
    if (it == m.live.end()) stand_in::violation("cudaFree of a pointer cudaMalloc did not return");
    m.live_bytes -= (int64_t)it->second;
    emulator::device_free(p, it->second);
    m.live.erase(it);
    return cudaSuccess;
}

// Pinned host memory: plain host memory here (copies from and to it run in stream order either way).
inline cudaError_t cudaMallocHost(void** p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void* p) {
    stand_in::drain_all();  // as cudaFree: no queued copy outlives it
    free(p);
    return cudaSuccess;
}

inline void stand_in_check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* call) {
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
        stand_in::check_range(dst, (int64_t)bytes, std::string(call) + " dst");
    if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice)
        stand_in::check_range(src, (int64_t)bytes, std::string(call) + " src");
}
// A copy's record: to the host, to the device, or within it.
inline void stand_in_count_copy(size_t bytes, cudaMemcpyKind kind, const char* call) {
    using emulator::Work;
    const Work work = kind == cudaMemcpyDeviceToHost ? Work::copy_to_host
                      : kind == cudaMemcpyHostToDevice ? Work::copy_to_device : Work::device_copy;
    emulator::count_work(work, call, kind == cudaMemcpyHostToDevice ? 0 : (int64_t)bytes,
                         kind == cudaMemcpyDeviceToHost ? 0 : (int64_t)bytes);
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream = nullptr) {
    stand_in_check_copy(dst, src, bytes, kind, "cudaMemcpyAsync");
    stand_in_count_copy(bytes, kind, "cudaMemcpyAsync");
    stand_in::launch(stream, [=] { memcpy(dst, src, bytes); });
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    stand_in_check_copy(dst, src, bytes, kind, "cudaMemcpy");
    emulator::count_work(emulator::Work::host_wait, "cudaMemcpy");
    stand_in_count_copy(bytes, kind, "cudaMemcpy");
    stand_in::drain_blocking();
    memcpy(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr) {
    stand_in::check_range(dst, (int64_t)bytes, "cudaMemsetAsync");
    emulator::count_work(emulator::Work::memset, "cudaMemsetAsync", 0, (int64_t)bytes);
    stand_in::launch(stream, [=] { memset(dst, value, bytes); });
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
    stand_in::check_range(dst, (int64_t)bytes, "cudaMemset");
    emulator::count_work(emulator::Work::host_wait, "cudaMemset");
    emulator::count_work(emulator::Work::memset, "cudaMemset", 0, (int64_t)bytes);
    stand_in::drain_blocking();
    memset(dst, value, bytes);
    return cudaSuccess;
}

// height rows of width bytes, pitch bytes apart
inline cudaError_t cudaMemset2DAsync(void* dst, size_t pitch, int value, size_t width, size_t height,
                                     cudaStream_t stream = nullptr) {
    if (width == 0 || height == 0) return cudaSuccess;
    stand_in::check_range(dst, (int64_t)((height - 1) * pitch + width), "cudaMemset2DAsync");
    emulator::count_work(emulator::Work::memset, "cudaMemset2DAsync", 0, (int64_t)(width * height));
    stand_in::launch(stream, [=] {
        for (size_t r = 0; r < height; r++) memset((char*)dst + r * pitch, value, width);
    });
    return cudaSuccess;
}

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    *s = new CUstream_st;
    (*s)->blocking = (flags & cudaStreamNonBlocking) == 0;
    stand_in::streams().push_back(*s);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
// Waits for the device first: no queued work (a wait on one of its events included) outlives the stream.
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    stand_in::drain_all();
    auto& all = stand_in::streams();
    for (size_t i = 0; i < all.size(); i++)
        if (all[i] == s) all.erase(all.begin() + i);
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    emulator::count_work(emulator::Work::host_wait, "cudaStreamSynchronize");
    stand_in::drain(s);
    return cudaSuccess;
}
// Runs the stream's queue, so its work is always complete when asked (never cudaErrorNotReady).
inline cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }
inline cudaError_t cudaDeviceSynchronize() {
    emulator::count_work(emulator::Work::host_wait, "cudaDeviceSynchronize");
    stand_in::drain_all();
    return cudaSuccess;
}

inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
    *e = new CUevent_st;
    return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
    CUstream_st& q = stand_in::stream_or_default(s);
    *e = CUevent_st{&q, q.done + (int64_t)q.pending.size(), emulator::next_sequence()++};
    return cudaSuccess;
}
// Work queued on s after this waits for the work queued on the event's stream before its record.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
    const CUevent_st at = *e;
    if (at.stream) stand_in::launch(s, [at] { stand_in::drain_until(*at.stream, at.position); });
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    emulator::count_work(emulator::Work::host_wait, "cudaEventSynchronize");
    if (e->stream) stand_in::drain_until(*e->stream, e->position);
    return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
    *ms = 0.0f;
    return cudaSuccess;
}

// One GPU, or STAND_IN_GPUS of them (the emulated NCCL runs take one per rank, as train.cu requires).
inline cudaError_t cudaGetDeviceCount(int* n) {
    const char* gpus = getenv("STAND_IN_GPUS");
    *n = gpus ? atoi(gpus) : 1;
    return cudaSuccess;
}

// Device d's PCI address: one per device number, so ranks that take the same device share it
inline cudaError_t cudaDeviceGetPCIBusId(char* id, int length, int device) {
    snprintf(id, (size_t)length, "0000:%02x:00.0", device);
    return cudaSuccess;
}

// Device memory is what cudaMalloc returned (a registered allocation); anything else is unregistered host memory.
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2 };
struct cudaPointerAttributes {
    cudaMemoryType type;
    int device;
};
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
    const bool device = stand_in::allocation_of(p) != stand_in::memory().live.end();
    *attr = cudaPointerAttributes{device ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered, 0};
    return cudaSuccess;
}

// Every function "has code for the device".
struct cudaFuncAttributes {
    int maxThreadsPerBlock = 1024;
};
template <typename F>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F*) {
    *attr = cudaFuncAttributes{};
    return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
    *d = 0;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaRuntimeGetVersion(int* v) {  // "CUDA 13.0", the toolkit the project builds with
    *v = 13000;
    return cudaSuccess;
}
inline cudaError_t cudaDriverGetVersion(int* v) { return cudaRuntimeGetVersion(v); }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    *p = stand_in::device_properties();
    return cudaSuccess;
}

// Launches. Above 48 KiB of dynamic shared memory a kernel needs cudaFuncSetAttribute first, as on the GPU; the
// launch runs when its stream is synchronised, and the emulator checks static and dynamic shared memory together
// against the target GPU's limit then.
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
namespace stand_in {
inline std::map<const void*, int>& dynamic_shared_limits() {  // kernel -> its raised limit
    static std::map<const void*, int> limits;
    return limits;
}
}  // namespace stand_in
template <typename... Params>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attribute, int value) {
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > emulator::shared_memory_optin())
        return cudaErrorInvalidValue;
    stand_in::dynamic_shared_limits()[(const void*)kernel] = value;
    return cudaSuccess;
}
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes = 0;
    cudaStream_t stream = nullptr;
    void* attrs = nullptr;
    unsigned numAttrs = 0;
};
template <typename... Params, typename... Args>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Params...), Args&&... args) {
    const auto raised = stand_in::dynamic_shared_limits().find((const void*)kernel);
    const size_t limit = raised == stand_in::dynamic_shared_limits().end() ? size_t(48) << 10 : (size_t)raised->second;
    if (config->dynamicSmemBytes > limit) return cudaErrorInvalidValue;
    // converted to the parameter types now, as CUDA does
    const std::tuple<Params...> params(std::forward<Args>(args)...);
    const cudaLaunchConfig_t c = *config;
    const int64_t record = emulator::count_work(
        emulator::Work::kernel, emulator::counting() ? emulator::checker::function_name((const void*)kernel) : "");
    stand_in::launch(c.stream, [=] {
        emulator::run_grid(c.gridDim, c.blockDim, c.dynamicSmemBytes, [&] { std::apply(kernel, params); },
                           (const void*)kernel);
        if (record >= 0 && (size_t)record < emulator::records().size()) {  // not cleared since
            emulator::Record& r = emulator::records()[(size_t)record];
            emulator::checker::launch_bytes(&r.bytes_read, &r.bytes_written);
        }
    });
    return cudaSuccess;
}
