// Checkpoint save (every rank writing its part of one file, then the ranks hashing it back), verification (the
// ranks sharing the reading) and load (every rank reading its part).
#include "io/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <map>
#include <stdexcept>
#include <unistd.h>

#define XXH_INLINE_ALL  // header only: nothing to link
#ifdef __AVX512F__
#define XXH_VECTOR XXH_AVX2  // GCC 12 warns falsely inside its AVX-512 path; AVX2 outruns the disk as well
#endif
#include <xxhash.h>

#include "io/files.h"
#include "io/safetensors.h"

static const char* FORMAT = "moe.cu checkpoint";
static const char* VERSION = "2";  // 2: with checksums
// The metadata "checksums": XXH3-64 hashes in hex, space-separated. The first is the header's (the 8-byte length
// and the JSON, this value's digits read as '0'), then one per CHECKSUM_CHUNK bytes of the data section.
static const char* CHECKSUMS_KEY = "\"checksums\":\"";
constexpr uint64_t CHECKSUM_CHUNK = 16 << 20;
constexpr int HASH_DIGITS = 16;

std::string checkpoint_path(const std::string& dir, int64_t step) {
    char name[64];
    snprintf(name, sizeof(name), "/ckpt_%08lld.safetensors", (long long)step);
    return dir + name;
}

// The step a checkpoint's file name says (ckpt_STEP.safetensors), or -1 for another name (a temporary file,
// ckpt_STEP.safetensors.tmp.ID, included)
static long long step_in_name(const std::string& path) {
    long long step;
    char tail[32];
    const std::string name = path.substr(path.find_last_of('/') + 1);
    return sscanf(name.c_str(), "ckpt_%lld.%31s", &step, tail) == 2 && std::string(tail) == "safetensors" ? step : -1;
}

// The checkpoints in dir by step, oldest first.
static std::map<long long, std::string> checkpoints_in(const std::string& dir) {
    std::map<long long, std::string> found;
    DIR* d = opendir(dir.c_str());
    if (!d) return found;
    while (dirent* e = readdir(d))
        if (step_in_name(e->d_name) >= 0) found[step_in_name(e->d_name)] = dir + "/" + e->d_name;
    closedir(d);
    return found;
}

std::string checkpoint_find_latest(const std::string& dir) {
    const std::map<long long, std::string> found = checkpoints_in(dir);
    return found.empty() ? "" : found.rbegin()->second;
}

std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
    std::vector<std::string> paths;
    for (const auto& [step, path] : checkpoints_in(dir)) paths.insert(paths.begin(), path);
    return paths;
}

void checkpoint_prune(const std::string& dir, int keep, int64_t written) {
    std::map<long long, std::string> found = checkpoints_in(dir);
    found.erase(found.upper_bound(written), found.end());
    int64_t extra = (int64_t)found.size() - keep;
    for (auto it = found.begin(); extra > 0; ++it, --extra)
        if (remove(it->second.c_str()) != 0 && errno != ENOENT)  // gone already (another process): fine
            fprintf(stderr, "warning: cannot remove the old checkpoint %s (--keep-checkpoints): %s\n",
                    it->second.c_str(), strerror(errno));
}

// A table tensor's shape in the file (an expert tensor with all E experts), and where this rank's values start.
static std::vector<int64_t> whole_shape(const ParamTensor& t, int ep_size) {
    std::vector<int64_t> shape = t.shape;
    if (t.expert_shard) shape[0] *= ep_size;
    return shape;
}
static int64_t first_in_whole(const ParamTensor& t, const Comm& comm) {
    return t.expert_shard ? comm.ep_rank * t.numel : 0;
}

// The file's tensors in order: every parameter of the whole model, then each trainable one's two moments. params[i],
// m[i] and v[i] are where this rank's table tensor i's start in the data section, in bytes (a pipeline stage's table
// holds its own tensors only).
struct FileLayout {
    std::vector<TensorView> views;  // no data: for the header
    std::vector<uint64_t> params, m, v;
    uint64_t bytes = 0;  // of the data section
};

static FileLayout file_layout(const Model& model) {
    const int ep = model.comm->ep_size;
    const ParamTable whole = build_param_table(model.config, ep);
    FileLayout f;
    for (const ParamTensor& t : whole.tensors) f.views.push_back({t.name, DType::F32, whole_shape(t, ep), nullptr});
    for (const ParamTensor& t : whole.tensors)
        for (const char* moment : {"optimizer.m.", "optimizer.v."})
            if (t.trainable) f.views.push_back({moment + t.name, DType::F32, whole_shape(t, ep), nullptr});
    const std::vector<uint64_t> offsets = safetensors_offsets(f.views);
    std::map<std::string, size_t> index;  // of each view, by name
    for (size_t i = 0; i < f.views.size(); i++) index[f.views[i].name] = i;
    for (const ParamTensor& t : model.table.tensors) {
        f.params.push_back(offsets[index.at(t.name)]);
        f.m.push_back(t.trainable ? offsets[index.at("optimizer.m." + t.name)] : 0);
        f.v.push_back(t.trainable ? offsets[index.at("optimizer.v." + t.name)] : 0);
    }
    f.bytes = offsets.back();
    return f;
}

static uint64_t checksum_chunks(uint64_t data_bytes) { return (data_bytes + CHECKSUM_CHUNK - 1) / CHECKSUM_CHUNK; }

// The "checksums" value as the header is first written: one hash for the header and one per data chunk, all zeros
static std::string checksums_placeholder(uint64_t data_bytes) {
    std::string zeros;
    for (uint64_t i = 0; i <= checksum_chunks(data_bytes); i++) zeros += (i ? " " : "") + std::string(HASH_DIGITS, '0');
    return zeros;
}

static std::string hex(uint64_t hash) {
    char text[HASH_DIGITS + 1];
    snprintf(text, sizeof(text), "%016llx", (unsigned long long)hash);
    return text;
}

// Where the "checksums" value starts in a header, or npos
static size_t checksums_at(const std::string& header) {
    const size_t key = header.find(CHECKSUMS_KEY);
    return key == std::string::npos ? key : key + strlen(CHECKSUMS_KEY);
}

// n bytes at offset of fd written from (or read into) bytes, in as many calls as it takes; false with errno set on
// failure (EIO: no progress, for a read the file's end).
static bool pread_or_pwrite(int fd, uint64_t offset, char* bytes, uint64_t n, bool write) {
    while (n > 0) {
        const size_t most = std::min<uint64_t>(n, 1 << 30);
        const ssize_t done = write ? pwrite(fd, bytes, most, (off_t)offset) : pread(fd, bytes, most, (off_t)offset);
        if (done < 0 && errno == EINTR) continue;
        if (done <= 0) {
            if (done == 0) errno = EIO;
            return false;
        }
        bytes += done, offset += done, n -= done;
    }
    return true;
}
static bool write_at(int fd, uint64_t offset, const void* bytes, uint64_t n) {
    return pread_or_pwrite(fd, offset, (char*)bytes, n, /*write*/ true);
}
static bool read_at(int fd, uint64_t offset, void* bytes, uint64_t n) {
    return pread_or_pwrite(fd, offset, (char*)bytes, n, /*write*/ false);
}

// The hash of data chunk `chunk` of the file fd whose data section starts at `data` and holds data_bytes
static bool hash_chunk(int fd, uint64_t data, uint64_t data_bytes, uint64_t chunk, std::vector<char>& buffer,
                       uint64_t* hash) {
    const uint64_t begin = chunk * CHECKSUM_CHUNK, n = std::min(CHECKSUM_CHUNK, data_bytes - begin);
    if (buffer.size() < n) buffer.resize(n);
    if (!read_at(fd, data + begin, buffer.data(), n)) return false;
    *hash = XXH3_64bits(buffer.data(), n);
    return true;
}

static std::map<std::string, std::string> checkpoint_metadata(const Model& m, const AdamWState& opt,
                                                              const TrainState& st, uint64_t data_bytes) {
    return {
        {"format", FORMAT},
        {"version", VERSION},
        {"checksums", checksums_placeholder(data_bytes)},
        {"config", config_to_json(m.config)},
        {"step", std::to_string(st.step)},
        {"optimizer_step", std::to_string(opt.step)},
        {"data_shard", std::to_string(st.data_shard)},
        {"data_position", std::to_string(st.data_position)},
        {"data_file", st.data_file},
        {"data_tokens", std::to_string(st.data_tokens)},
        {"rng_state", std::to_string(st.rng_state)},
        {"run", st.run},
    };
}

// A number no other write in the directory used: the time in nanoseconds and the process id
static int64_t unique_id() {
    return (int64_t)(std::chrono::system_clock::now().time_since_epoch().count() ^ ((int64_t)getpid() << 40));
}
static std::string temporary_path(const std::string& path, int64_t id) {
    return path + ".tmp." + std::to_string((uint64_t)id);
}

// Removes the temporary files of checkpoint writes in dir that never finished (a job that died during one).
static void remove_unfinished_writes(const std::string& dir) {
    DIR* d = opendir(dir.c_str());
    if (!d) return;
    while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name.rfind("ckpt_", 0) == 0 && name.find(".safetensors.tmp") != std::string::npos)
            remove((dir + "/" + name).c_str());
    }
    closedir(d);
}

CheckpointWrite checkpoint_begin(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st,
                                 bool copies) {
    Comm& comm = *m.comm;
    const FileLayout layout = file_layout(m);
    CheckpointWrite w;
    w.step = st.step;
    w.path = checkpoint_path(dir, st.step);
    // From rank 0: where the data section starts, and a new ID for the temporary file's name. Ranks that do not
    // share the directory then find no file rather than a stale one.
    int64_t shared[2] = {0, 0};
    if (comm.rank == 0) {
        std::string header = safetensors_header(layout.views, checkpoint_metadata(m, opt, st, layout.bytes));
        w.checksums_at = checksums_at(header);
        header.replace(w.checksums_at, HASH_DIGITS, hex(XXH3_64bits(header.data(), header.size())));
        shared[0] = (int64_t)header.size();
        shared[1] = unique_id();
        w.temporary = temporary_path(w.path, shared[1]);
        make_dirs(dir);
        remove_unfinished_writes(dir);
        const int fd = open(w.temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const bool ok = fd >= 0 && write_at(fd, 0, header.data(), header.size()) &&
                        ftruncate(fd, (off_t)(header.size() + layout.bytes)) == 0;
        const int err = errno;
        if (fd >= 0) close(fd);
        if (!ok) {
            remove(w.temporary.c_str());
            throw std::runtime_error("cannot write " + w.temporary + ": " + strerror(err));
        }
    }
    comm.broadcast(shared, sizeof(shared), 0);  // once the file exists
    w.temporary = temporary_path(w.path, shared[1]);
    w.data = (uint64_t)shared[0];
    w.data_bytes = layout.bytes;
    const uint64_t data = w.data;
    auto add = [&](uint64_t begin, const ParamTensor& t, int64_t first, const float* values, int64_t count) {
        w.parts.push_back({data + begin + 4 * (uint64_t)(first_in_whole(t, comm) + first), values, count});
    };
    // Outside the optimizer: replicated tensors from the first rank of their stage, expert tensors from dp_rank 0.
    for (size_t i = 0; i < m.table.tensors.size(); i++) {
        const ParamTensor& t = m.table.tensors[i];
        if (!t.trainable && (t.expert_shard ? comm.dp_rank == 0 : comm.group_rank(Group::Stage) == 0))
            add(layout.params[i], t, 0, m.params.data() + t.offset, t.numel);
    }
    for (const OptimizerRange& r : m.shard.ranges) {
        if (!r.owned) continue;
        const ParamTensor& t = m.table.tensors[r.tensor];
        add(layout.params[r.tensor], t, r.first - t.offset, m.params.data() + r.first, r.count);
        add(layout.m[r.tensor], t, r.first - t.offset, opt.m.data() + r.moments, r.count);
        add(layout.v[r.tensor], t, r.first - t.offset, opt.v.data() + r.moments, r.count);
    }
    if (copies) {
        int64_t total = 0;
        for (const CheckpointWrite::Part& p : w.parts) total += p.count;
        w.copies.resize(total);
        float* next = w.copies.data();
        for (CheckpointWrite::Part& p : w.parts) {
            std::copy(p.values, p.values + p.count, next);
            p.values = next;
            next += p.count;
        }
    }
    return w;
}

void checkpoint_write_part(const CheckpointWrite& w) {
    const int fd = open(w.temporary.c_str(), O_WRONLY);
    if (fd < 0)
        throw std::runtime_error("cannot open " + w.temporary + ", which rank 0 created: " + strerror(errno) +
                                 " (--checkpoint-dir must be one directory for every rank: a shared file system)");
    bool ok = true;
    for (const CheckpointWrite::Part& p : w.parts) ok = ok && write_at(fd, p.offset, p.values, 4 * (uint64_t)p.count);
    ok = ok && fsync(fd) == 0;
    const int err = errno;
    close(fd);
    if (!ok) throw std::runtime_error("cannot write " + w.path + ": " + strerror(err));
}

void checkpoint_commit(const CheckpointWrite& w, Comm& comm) {
    comm.barrier();  // every part is written
    // the data chunks' hashes, chunk c from rank c % world, read back from the file; the last value counts failures
    const uint64_t chunks = checksum_chunks(w.data_bytes);
    std::vector<int64_t> hashes(chunks + 1, 0);
    const int fd = open(w.temporary.c_str(), O_RDONLY);
    std::vector<char> buffer;
    for (uint64_t c = comm.rank; c < chunks && fd >= 0 && !hashes[chunks]; c += comm.world)
        hashes[chunks] = !hash_chunk(fd, w.data, w.data_bytes, c, buffer, (uint64_t*)&hashes[c]);
    const int err = fd < 0 || hashes[chunks] ? errno : 0;
    if (fd < 0) hashes[chunks] = 1;
    else close(fd);
    comm.all_reduce_sum(hashes.data(), (int64_t)hashes.size(), Group::World);
    if (hashes[chunks] != 0) {
        comm.barrier();  // every rank is done reading
        if (comm.rank == 0) remove(w.temporary.c_str());
        throw std::runtime_error("cannot read back " + w.temporary + " to checksum it" +
                                 (err ? std::string(": ") + strerror(err) : " (on another rank)"));
    }
    if (comm.rank == 0) {
        std::string text;
        for (uint64_t c = 0; c < chunks; c++) text += " " + hex((uint64_t)hashes[c]);
        const int out = open(w.temporary.c_str(), O_WRONLY);
        const bool ok = out >= 0 && write_at(out, w.checksums_at + HASH_DIGITS, text.data(), text.size()) &&
                        fsync(out) == 0;
        const int write_err = errno;
        if (out >= 0) close(out);
        if (!ok) {
            remove(w.temporary.c_str());
            throw std::runtime_error("cannot write " + w.temporary + ": " + strerror(write_err));
        }
        rename_durably(w.temporary, w.path);
    }
    comm.barrier();  // and the checkpoint is there for every rank
}

std::string checkpoint_verify(const std::string& path, int part, int parts) {
    try {
        SafetensorsReader check(path);  // the file's structure: a header that parses, data covered exactly
    } catch (const std::exception& e) {
        return e.what();
    }
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return "cannot open " + path + ": " + strerror(errno);
    const uint64_t file_bytes = (uint64_t)lseek(fd, 0, SEEK_END);
    uint64_t header_bytes = 0;
    std::string header(8, '\0'), error;
    bool read = read_at(fd, 0, &header[0], 8);
    memcpy(&header_bytes, header.data(), 8);
    header.resize(8 + header_bytes);  // the reader has bounded it
    const uint64_t data = header.size(), data_bytes = file_bytes - data, chunks = checksum_chunks(data_bytes);
    read = read && read_at(fd, 8, &header[8], header_bytes);
    const size_t at = checksums_at(header);
    if (!read)
        error = std::string("cannot read: ") + strerror(errno);
    else if (at == std::string::npos)
        error = "it has no checksums (written by a moe.cu older than checkpoint version " + std::string(VERSION) + ")";
    std::vector<uint64_t> hashes;  // the header's, then the chunks'
    for (uint64_t i = 0; error.empty() && i <= chunks; i++) {
        const size_t digits = at + i * (HASH_DIGITS + 1);
        const std::string stored = header.substr(digits, HASH_DIGITS);
        const char after = digits + HASH_DIGITS < header.size() ? header[digits + HASH_DIGITS] : 0;
        if (stored.size() != HASH_DIGITS || stored.find_first_not_of("0123456789abcdef") != std::string::npos ||
            after != (i < chunks ? ' ' : '"'))
            error = "its checksums do not cover its " + std::to_string(data_bytes) + " data bytes";
        hashes.push_back(strtoull(stored.c_str(), nullptr, 16));
        std::fill(header.begin() + digits, header.begin() + digits + stored.size(), '0');  // as it was hashed
    }
    if (error.empty() && hashes[0] != XXH3_64bits(header.data(), header.size()))
        error = "its header does not match its checksum (an altered file)";
    std::vector<char> buffer;
    uint64_t hash = 0;
    for (uint64_t c = part; error.empty() && c < chunks; c += parts) {
        if (!hash_chunk(fd, data, data_bytes, c, buffer, &hash)) error = std::string("cannot read: ") + strerror(errno);
        else if (hash != hashes[c + 1])
            error = "data bytes " + std::to_string(c * CHECKSUM_CHUNK) + " to " +
                    std::to_string(std::min(data_bytes, (c + 1) * CHECKSUM_CHUNK)) +
                    " do not match their checksum (a damaged file)";
    }
    close(fd);
    return error.empty() ? "" : path + ": " + error;
}

std::string checkpoint_check_dir(const std::string& dir, Comm& comm) {
    int64_t id = comm.rank == 0 ? unique_id() : 0;
    const auto probe_path = [&] { return dir + "/.moe_probe." + std::to_string((uint64_t)id); };
    std::string error;
    if (comm.rank == 0) {
        try {
            make_dirs(dir);
            FILE* f = fopen(probe_path().c_str(), "wb");
            if (!f || fclose(f) != 0) error = "cannot write " + probe_path() + ": " + strerror(errno);
        } catch (const std::runtime_error& e) {
            error = e.what();
        }
    }
    comm.broadcast(&id, sizeof(id), 0);  // once the file exists
    if (comm.rank != 0 && access(probe_path().c_str(), F_OK) != 0)
        error = "--checkpoint-dir " + dir + ": this rank does not see the file rank 0 created there (" + probe_path() +
                "): every rank must see the same directory (a shared file system across nodes)";
    comm.barrier();
    if (comm.rank == 0) remove(probe_path().c_str());
    return error;
}

void checkpoint_save(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st) {
    const CheckpointWrite w = checkpoint_begin(dir, m, opt, st, /*copies*/ false);
    checkpoint_write_part(w);
    checkpoint_commit(w, *m.comm);
}

static void check_format(const SafetensorsReader& r, const std::string& path) {
    auto it = r.metadata().find("format");
    if (it == r.metadata().end() || it->second != FORMAT)
        throw std::runtime_error(path + ": not a moe.cu checkpoint (no format metadata)");
    if (r.metadata_value("version") != VERSION)
        throw std::runtime_error(path + ": checkpoint version " + r.metadata_value("version") + " is not supported");
}

Config checkpoint_config(const std::string& path) {
    SafetensorsReader r(path);
    check_format(r, path);
    const Config c = parse_config_json(r.metadata_value("config"), path);
    // every tensor the config makes, and its moments, present with its shape in F32: checked on the header, before
    // a model of that config is allocated
    for (const ParamTensor& t : build_param_table(c).tensors)
        for (const std::string& name : {t.name, "optimizer.m." + t.name, "optimizer.v." + t.name}) {
            if (name != t.name && !t.trainable) continue;
            if (!r.has(name)) throw std::runtime_error(path + ": tensor '" + name + "' is missing");
            const TensorInfo& info = r.info(name);
            if (info.dtype != DType::F32 || info.shape != t.shape)
                throw std::runtime_error(path + ": tensor '" + name + "' is " + dtype_name(info.dtype) + " " +
                                         shape_string(info.shape) + ", its config makes F32 " +
                                         shape_string(t.shape));
        }
    return c;
}

// A metadata value of decimal digits only, at most max
static uint64_t parse_integer(const SafetensorsReader& r, const std::string& key, const std::string& path,
                              uint64_t max = (uint64_t)1 << 62) {
    const std::string s = r.metadata_value(key);
    const bool digits = !s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos;
    if (digits && (s.size() < 20 || s <= "18446744073709551615")) {
        const uint64_t v = std::stoull(s);
        if (v <= max) return v;
    }
    throw std::runtime_error(path + ": metadata '" + key + "' is not an integer between 0 and " + std::to_string(max));
}

void checkpoint_load(const std::string& path, Model& m, AdamWState& opt, TrainState& st) {
    SafetensorsReader r(path);
    check_format(r, path);
    const Comm& comm = *m.comm;
    for (const ParamTensor& t : m.table.tensors)
        r.read_range(t.name, DType::F32, whole_shape(t, comm.ep_size), first_in_whole(t, comm), t.numel,
                     m.params.data() + t.offset);
    opt = adamw_state(m.shard);
    for (const OptimizerRange& range : m.shard.ranges) {
        const ParamTensor& t = m.table.tensors[range.tensor];
        const int64_t first = first_in_whole(t, comm) + range.first - t.offset;
        r.read_range("optimizer.m." + t.name, DType::F32, whole_shape(t, comm.ep_size), first, range.count,
                     opt.m.data() + range.moments);
        r.read_range("optimizer.v." + t.name, DType::F32, whole_shape(t, comm.ep_size), first, range.count,
                     opt.v.data() + range.moments);
    }
    if (const std::string bad = first_non_finite(m.table, m.params.data()); !bad.empty())
        throw std::runtime_error(path + ": " + bad + " is NaN or inf (a damaged checkpoint)");
    for (const OptimizerRange& range : m.shard.ranges)
        for (const std::vector<float>* moment : {&opt.m, &opt.v})
            for (int64_t i = 0; i < range.count; i++)
                if (!std::isfinite((*moment)[range.moments + i]))
                    throw std::runtime_error(path + ": the AdamW moments of tensor '" +
                                             m.table.tensors[range.tensor].name + "' hold NaN or inf");
    st.step = parse_integer(r, "step", path);
    const long long named = step_in_name(path);  // a checkpoint's name says its step too: the two must agree
    if (named >= 0 && named != st.step)
        throw std::runtime_error(path + ": its metadata says step " + std::to_string(st.step) +
                                 ", its name step " + std::to_string(named) + " (an altered or renamed file)");
    opt.step = parse_integer(r, "optimizer_step", path);
    st.data_shard = parse_integer(r, "data_shard", path);
    st.data_position = parse_integer(r, "data_position", path);
    st.rng_state = parse_integer(r, "rng_state", path, UINT64_MAX);
    st.data_file = r.metadata_value("data_file");
    st.data_tokens = parse_integer(r, "data_tokens", path);
    auto run = r.metadata().find("run");
    st.run = run == r.metadata().end() ? "" : run->second;
}
