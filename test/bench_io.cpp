// Benchmark of Hugging Face export/import (io/hf.h) against the disk itself: a model of about 1 GB
// of fp32 parameters is exported (F32 and BF16) and imported twice, next to a plain sequential fwrite+fsync and
// fread of the same number of bytes in the same run. Every read is cold: the file's pages are dropped from the
// page cache (fsync, then posix_fadvise DONTNEED) before it is read. Five interleaved rounds give each operation's
// best and worst rate (a VM's disk varies a lot). Peak RSS (getrusage) shows that memory stays at one model plus
// one tensor. No assertions. Build: see the Makefile; usage: ./bench_io [DIR] (default /tmp/moe_bench_io, deleted).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <stdexcept>
#include <string>
#include <vector>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"
#include "io/hf.h"

static const char* CONFIG = R"({"vocab_size": 16384, "hidden_size": 1024, "intermediate_size": 4096,
  "moe_intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "q_lora_rank": 384,
  "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
  "n_routed_experts": 48, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
  "first_k_dense_replace": 0, "num_nextn_predict_layers": 1, "max_position_embeddings": 1024})";

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double peak_rss_mb() {  // MiB
    rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return ru.ru_maxrss / 1024.0;
}

static uint64_t file_size(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) throw std::runtime_error("cannot stat " + path);
    return (uint64_t)st.st_size;
}

// Drops a (synced) file's pages from the page cache so that the next read comes from the disk.
static void drop_cache(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0 || fsync(fd) != 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0 || close(fd) != 0)
        throw std::runtime_error("cannot drop the page cache of " + path);
}

// Each operation's bytes and its fastest and slowest time over the rounds, printed at the end.
struct Timing {
    uint64_t bytes = 0;
    double best = 1e30, worst = 0;
};
static std::vector<std::pair<std::string, Timing>> timings;

static void report(const std::string& what, uint64_t bytes, double seconds) {
    auto it = std::find_if(timings.begin(), timings.end(), [&](const auto& t) { return t.first == what; });
    if (it == timings.end()) it = timings.insert(timings.end(), {what, Timing()});
    it->second.bytes = bytes;
    it->second.best = std::min(it->second.best, seconds);
    it->second.worst = std::max(it->second.worst, seconds);
}

// The disk: one sequential write (fsync included) and one cold read of the same bytes, 64 MB at a time.
static void plain_io(std::vector<float>& buf, const std::string& raw) {
    const size_t chunk = 16 << 20;  // floats
    const uint64_t bytes = buf.size() * 4;
    double t0 = now();
    FILE* f = fopen(raw.c_str(), "wb");
    bool ok = f != nullptr;
    for (size_t i = 0; ok && i < buf.size(); i += chunk) {
        size_t n = std::min(chunk, buf.size() - i);
        ok = fwrite(buf.data() + i, 4, n, f) == n;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) throw std::runtime_error("writing " + raw + " failed");
    report("plain fwrite+fsync", bytes, now() - t0);
    drop_cache(raw);
    t0 = now();
    f = fopen(raw.c_str(), "rb");
    ok = f != nullptr;
    for (size_t i = 0; ok && i < buf.size(); i += chunk) {
        size_t n = std::min(chunk, buf.size() - i);
        ok = fread(buf.data() + i, 4, n, f) == n;
    }
    if (f && fclose(f) != 0) ok = false;
    if (!ok) throw std::runtime_error("reading " + raw + " failed");
    report("plain fread (cold)", bytes, now() - t0);
    if (remove(raw.c_str()) != 0) throw std::runtime_error("cannot remove " + raw);
}

// Weak, so that a test_cpu link that still takes every test/*.cpp keeps test_main.cpp's main (the Makefile is
// to exclude this file from test_cpu and build it as bench_io).
int main(int argc, char** argv) {
    const std::string dir = argc > 1 ? argv[1] : "/tmp/moe_bench_io";
    try {
        // Only what export/import use: config, table, parameters (model_init would also allocate the gradients).
        Model m;
        m.config = parse_config_json(CONFIG, "bench config");
        m.comm = &local_comm();
        m.table = build_param_table(m.config);
        m.params.assign(m.table.total, 0.0f);
        model_init_weights(m, 1);
        int64_t largest = 0;  // as exported: one expert of a stacked tensor
        for (const ParamTensor& t : m.table.tensors)
            largest = std::max(largest, t.shape.size() == 3 ? t.numel / t.shape[0] : t.numel);
        const uint64_t bytes = (uint64_t)m.table.total * 4;
        printf("model: %lld parameters (%.1f MB fp32), largest exported tensor %.1f MB fp32\n",
               (long long)m.table.total, bytes / 1e6, largest * 4 / 1e6);
        if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw std::runtime_error("cannot create " + dir);

        const int rounds = 5;  // the disk of a VM varies from run to run: interleave the operations, keep each one's range
        for (int round = 0; round < rounds; round++) {
            plain_io(m.params, dir + "/raw.bin");
            for (ExportDType dt : {ExportDType::F32, ExportDType::BF16}) {
                const std::string name = dt == ExportDType::F32 ? "F32" : "BF16", out = dir + "/hf_" + name;
                double t0 = now();
                export_hf(m, out, dt);
                const uint64_t written = file_size(out + "/model.safetensors");
                report("export_hf " + name, written, now() - t0);
                for (const char* when : {" (cold)", " again (cold)"}) {  // the first read after a write is often slower
                    drop_cache(out + "/model.safetensors");
                    t0 = now();
                    import_hf(m, out);
                    report("import_hf " + name + when, written, now() - t0);
                }
                // every write of the bench goes to a new file, with the previous ones deleted (as for plain_io)
                if (remove((out + "/model.safetensors").c_str()) != 0 || remove((out + "/config.json").c_str()) != 0)
                    throw std::runtime_error("cannot remove the files of " + out);
            }
        }
        printf("%-28s %9s %20s %14s\n", "operation", "MB", "MB/s best (worst)", "s best");
        for (const auto& t : timings)
            printf("%-28s %9.1f %9.1f (%7.1f) %14.2f\n", t.first.c_str(), t.second.bytes / 1e6,
                   t.second.bytes / 1e6 / t.second.best, t.second.bytes / 1e6 / t.second.worst, t.second.best);
        printf("peak RSS %.1f MiB = the parameters' %.1f MiB + %.1f MiB (one BF16 tensor: %.1f MiB)\n", peak_rss_mb(),
               bytes / 1048576.0, peak_rss_mb() - bytes / 1048576.0, largest * 2 / 1048576.0);
        printf("(the HF files also hold the MTP copies of the embedding and head; MB/s counts the file's bytes)\n");
    } catch (const std::exception& e) {
        fprintf(stderr, "error: %s\n", e.what());
        if (system(("rm -rf '" + dir + "'").c_str()) != 0) fprintf(stderr, "cannot remove %s\n", dir.c_str());
        return 1;
    }
    if (system(("rm -rf '" + dir + "'").c_str()) != 0) {
        fprintf(stderr, "cannot remove %s\n", dir.c_str());
        return 1;
    }
    return 0;
}
