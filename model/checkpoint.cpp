// Checkpoint save and load through the safetensors reader and writer.
#include "checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <map>
#include <stdexcept>
#include <sys/stat.h>

#include "files.h"
#include "safetensors.h"

static const char* FORMAT = "moe.cu checkpoint";

std::string checkpoint_path(const std::string& dir, int64_t step) {
    char name[64];
    snprintf(name, sizeof(name), "/ckpt_%08lld.safetensors", (long long)step);
    return dir + name;
}

// The checkpoints in dir by step, oldest first (a temporary file being written, ckpt_STEP.safetensors.tmp, is not one)
static std::map<long long, std::string> checkpoints_in(const std::string& dir) {
    std::map<long long, std::string> found;
    DIR* d = opendir(dir.c_str());
    if (!d) return found;
    while (dirent* e = readdir(d)) {
        long long step;
        char tail[32];
        if (sscanf(e->d_name, "ckpt_%lld.%31s", &step, tail) == 2 && std::string(tail) == "safetensors")
            found[step] = dir + "/" + e->d_name;
    }
    closedir(d);
    return found;
}

std::string checkpoint_find_latest(const std::string& dir) {
    const std::map<long long, std::string> found = checkpoints_in(dir);
    return found.empty() ? "" : found.rbegin()->second;
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

CheckpointData checkpoint_collect(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st,
                                  bool copies) {
    Comm& comm = *m.comm;
    CheckpointData data;
    // Whole expert tensors: gathered from the EP group of replica 0 (params, then the two moments); with copies,
    // rank 0's other tensors copied too.
    auto whole = [&](const ParamTensor& t, const float* local) -> const float* {
        const bool gather = t.expert_shard && comm.ep_size > 1;
        if (gather && comm.dp_rank != 0) return nullptr;
        if (!gather && !(copies && comm.rank == 0)) return local;
        data.owned.emplace_back(comm.rank == 0 ? t.numel * (gather ? comm.ep_size : 1) : 0);
        if (gather)
            comm.gather_to_ep_root(local, t.numel, data.owned.back().data());
        else
            std::copy(local, local + t.numel, data.owned.back().begin());
        return data.owned.back().data();
    };
    auto full_shape = [&](const ParamTensor& t) {
        std::vector<int64_t> shape = t.shape;
        if (t.expert_shard) shape[0] *= comm.ep_size;
        return shape;
    };
    for (const ParamTensor& t : m.table.tensors)
        data.views.push_back({t.name, DType::F32, full_shape(t), whole(t, m.params.data() + t.offset)});
    for (const ParamTensor& t : m.table.tensors) {
        if (!t.trainable) continue;
        data.views.push_back({"optimizer.m." + t.name, DType::F32, full_shape(t), whole(t, opt.m.data() + t.offset)});
        data.views.push_back({"optimizer.v." + t.name, DType::F32, full_shape(t), whole(t, opt.v.data() + t.offset)});
    }
    if (comm.rank != 0) return CheckpointData{};
    make_dirs(dir);
    data.path = checkpoint_path(dir, st.step);
    data.meta = {
        {"format", FORMAT},
        {"version", "1"},
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
    return data;
}

void checkpoint_write(const CheckpointData& data) {
    if (!data.path.empty()) safetensors_write(data.path, data.views, data.meta);
}

void checkpoint_save(const std::string& dir, const Model& m, const AdamWState& opt, const TrainState& st) {
    checkpoint_write(checkpoint_collect(dir, m, opt, st, /*copies*/ false));
    m.comm->barrier();
}

static void check_format(const SafetensorsReader& r, const std::string& path) {
    auto it = r.metadata().find("format");
    if (it == r.metadata().end() || it->second != FORMAT)
        throw std::runtime_error(path + ": not a moe.cu checkpoint (no format metadata)");
    if (r.metadata_value("version") != "1")
        throw std::runtime_error(path + ": checkpoint version " + r.metadata_value("version") + " is not supported");
}

Config checkpoint_config(const std::string& path) {
    SafetensorsReader r(path);
    check_format(r, path);
    return parse_config_json(r.metadata_value("config"), path);
}

static uint64_t parse_integer(const SafetensorsReader& r, const std::string& key, const std::string& path) {
    const std::string s = r.metadata_value(key);
    try {
        size_t used = 0;
        unsigned long long v = std::stoull(s, &used);
        if (used == s.size() && s[0] != '-') return v;
    } catch (const std::exception&) {
    }
    throw std::runtime_error(path + ": metadata '" + key + "' is not a non-negative integer");
}

void checkpoint_load(const std::string& path, Model& m, AdamWState& opt, TrainState& st) {
    SafetensorsReader r(path);
    check_format(r, path);
    opt.m.assign(m.table.total, 0.0f);
    opt.v.assign(m.table.total, 0.0f);
    const Comm& comm = *m.comm;
    for (const ParamTensor& t : m.table.tensors) {
        // an expert shard is rows [ep_rank * E_local, (ep_rank + 1) * E_local) of the whole tensor
        std::vector<int64_t> shape = t.shape;
        int64_t first = 0;
        if (t.expert_shard) {
            first = comm.ep_rank * shape[0];
            shape[0] *= comm.ep_size;
        }
        const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
        r.read_rows(t.name, DType::F32, shape, first, rows, m.params.data() + t.offset);
        if (!t.trainable) continue;
        r.read_rows("optimizer.m." + t.name, DType::F32, shape, first, rows, opt.m.data() + t.offset);
        r.read_rows("optimizer.v." + t.name, DType::F32, shape, first, rows, opt.v.data() + t.offset);
    }
    st.step = parse_integer(r, "step", path);
    opt.step = parse_integer(r, "optimizer_step", path);
    st.data_shard = parse_integer(r, "data_shard", path);
    st.data_position = parse_integer(r, "data_position", path);
    st.rng_state = parse_integer(r, "rng_state", path);
    st.data_file = r.metadata_value("data_file");
    st.data_tokens = parse_integer(r, "data_tokens", path);
    auto run = r.metadata().find("run");
    st.run = run == r.metadata().end() ? "" : run->second;
}
