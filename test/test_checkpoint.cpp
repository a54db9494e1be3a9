// Checkpoints: the safetensors layer, a save/load round trip, and the bit-exact resume of the real trainer:
// N steps in one run give the same bits as N/2 steps, a resume from the checkpoint, and N/2 more.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <fstream>
#include <string>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "test_helpers.h"

namespace {

std::string make_temp_dir() {
    char pattern[] = "/tmp/moe_ckpt_XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    return pattern;
}

int run(const std::string& cmd) { return system((cmd + " > /dev/null 2>&1").c_str()); }

bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// The "loss" values of a JSON-lines log, as printed (9 significant digits: float exact).
std::vector<std::string> logged_losses(const std::string& path) {
    std::vector<std::string> out;
    std::ifstream f(path);
    for (std::string line; std::getline(f, line);) {
        size_t at = line.find("\"loss\": ");
        if (at != std::string::npos) out.push_back(line.substr(at + 8, line.find(',', at) - at - 8));
    }
    return out;
}

// A fresh model of preset `config` (m, opt, st) saved as checkpoint `step` in dir; returns the file's bytes and
// its header's length.
std::pair<std::string, uint64_t> save_fresh(const std::string& dir, const char* config, int64_t step, Model& m,
                                            AdamWState& opt, TrainState& st) {
    model_init(m, load_config(config));
    opt = adamw_state(m.shard);
    st.step = step;
    checkpoint_save(dir, m, opt, st);
    const std::string bytes = slurp(checkpoint_path(dir, step));
    uint64_t header_bytes = 0;
    memcpy(&header_bytes, bytes.data(), 8);
    return {bytes, header_bytes};
}

}  // namespace

TEST_CASE("checkpoint: safetensors round trip keeps dtypes, shapes, bytes and metadata") {
    std::string dir = make_temp_dir();
    std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-30f};
    std::vector<int32_t> b = {1, -2, 2147483647};
    std::vector<double> c = {3.141592653589793};
    safetensors_write(dir + "/t.safetensors",
                      {{"a", DType::F32, {2, 3}, a.data()}, {"b", DType::I32, {3}, b.data()}, {"c", DType::F64, {}, c.data()}},
                      {{"note", "hello"}});
    SafetensorsReader r(dir + "/t.safetensors");
    CHECK(r.tensors().size() == 3);
    CHECK(r.metadata_value("note") == "hello");
    std::vector<float> a2(6);
    std::vector<int32_t> b2(3);
    double c2 = 0;
    r.read("a", DType::F32, {2, 3}, a2.data());
    r.read("b", DType::I32, {3}, b2.data());
    r.read("c", DType::F64, {}, &c2);
    CHECK(a2 == a);
    CHECK(b2 == b);
    CHECK(c2 == c[0]);
    CHECK_THROWS_WITH_AS(r.read("a", DType::F32, {3, 2}, a2.data()), doctest::Contains("shape"), std::runtime_error);
    CHECK_THROWS_WITH_AS(r.read("b", DType::F32, {3}, a2.data()), doctest::Contains("I32"), std::runtime_error);
    CHECK_THROWS_WITH_AS(r.info("missing"), doctest::Contains("missing"), std::runtime_error);
    // a truncated copy is rejected when opened
    std::string bytes = slurp(dir + "/t.safetensors");
    std::ofstream(dir + "/cut.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 5);
    CHECK_THROWS_WITH_AS(SafetensorsReader(dir + "/cut.safetensors"), doctest::Contains("outside the file"),
                         std::runtime_error);
    system(("rm -rf " + dir).c_str());
}

TEST_CASE("checkpoint: save and load restore weights, AdamW moments, step, data position and RNG") {
    std::string dir = make_temp_dir();
    Model m;
    model_init(m, load_config("tiny"));
    randomize_for_test(m, 5);
    AdamWState opt = adamw_state(m.shard);
    Rng rng(9);
    for (const OptimizerRange& r : m.shard.ranges)  // the gaps between tensors stay 0
        for (int64_t i = r.moments; i < r.moments + r.count; i++) opt.m[i] = rng.normal(), opt.v[i] = rng.uniform();
    opt.step = 17;
    TrainState st;
    st.step = 17;
    st.data_shard = 2;
    st.data_position = 12345;
    st.data_file = "train_000002.bin";
    st.data_tokens = 99999;
    st.rng_state = 0xFEDCBA9876543210ull;
    st.run = "lr=0.001 steps=20";
    checkpoint_save(dir, m, opt, st);
    CHECK(checkpoint_find_latest(dir) == checkpoint_path(dir, 17));

    Config c = checkpoint_config(checkpoint_path(dir, 17));
    Model m2;
    model_init(m2, c);
    AdamWState opt2;
    TrainState st2;
    checkpoint_load(checkpoint_path(dir, 17), m2, opt2, st2);
    CHECK(m2.params == m.params);
    CHECK(opt2.m == opt.m);
    CHECK(opt2.v == opt.v);
    CHECK(opt2.step == 17);
    CHECK(st2.step == 17);
    CHECK(st2.data_shard == 2);
    CHECK(st2.data_position == 12345);
    CHECK(st2.rng_state == 0xFEDCBA9876543210ull);
    CHECK(st2.data_file == "train_000002.bin");
    CHECK(st2.data_tokens == 99999);
    CHECK(st2.run == "lr=0.001 steps=20");

    // a checkpoint of another architecture does not load into this model
    Config other = c;
    other.hidden_size = 48;
    Model m3;
    model_init(m3, other);
    CHECK_THROWS_WITH_AS(checkpoint_load(checkpoint_path(dir, 17), m3, opt2, st2), doctest::Contains("shape"),
                         std::runtime_error);
    system(("rm -rf " + dir).c_str());
}

// The checksums: a saved checkpoint verifies in one part or shared out; a changed data byte is found by the part that
// reads its chunk alone, a changed metadata value, a cut or a longer file by every part. --resume passes over the
// damaged checkpoints, naming each, and goes on from the newest intact one to the straight run's bits.
TEST_CASE("checkpoint: checksums find damage anywhere, and --resume falls back to the newest intact checkpoint") {
    const std::string dir = make_temp_dir();
    Model m;
    AdamWState opt;
    TrainState st;
    const std::pair<std::string, uint64_t> saved = save_fresh(dir, "small", 2, m, opt, st);  // 47 MB: 3 chunks
    const std::string& good = saved.first;
    const uint64_t header_bytes = saved.second;
    const std::string path = checkpoint_path(dir, 2);
    CHECK(checkpoint_verify(path) == "");
    for (int part = 0; part < 3; part++) CHECK(checkpoint_verify(path, part, 3) == "");
    auto write = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; };
    std::string changed = good;
    changed[8 + header_bytes + (16 << 20) + 5] ^= 1;  // in the second chunk
    write(changed);
    CHECK(checkpoint_verify(path, 0, 2) == "");
    CHECK(checkpoint_verify(path, 1, 2) == path + ": data bytes 16777216 to 33554432 do not match their checksum "
                                               "(a damaged file)");
    changed = good;
    const size_t step_at = changed.find("\"step\":\"2\"");
    REQUIRE(step_at < 8 + header_bytes);
    changed[step_at + 8] = '3';
    write(changed);
    CHECK(checkpoint_verify(path, 1, 2) == path + ": its header does not match its checksum (an altered file)");
    for (const std::string& resized : {good.substr(0, good.size() - 4), good + std::string(16 << 20, '\0')}) {
        write(resized);
        CHECK(checkpoint_verify(path, 1, 2).find(path + ": ") == 0);
    }
    for (const char* checksums : {"\"checksum_\"", "\"checksums\":\"x"}) {  // gone, or not a hash
        write(std::string(good).replace(good.find("\"checksums\""), strlen(checksums), checksums));
        CHECK(checkpoint_verify(path) != "");
    }

    // three checkpoints of a 4-step run: the newest damaged, the one before altered
    const std::string common = "./train_cpu --config tiny --vocab 1024 --data 'data/default/train_*.bin' --batch 1 "
                               "--seq 16 --lr 1e-2 --checkpoint-dir ";
    REQUIRE(run(common + dir + "/straight --steps 4") == 0);
    REQUIRE(run(common + dir + "/split --steps 4 --checkpoint-every 1") == 0);
    REQUIRE(remove(checkpoint_path(dir + "/split", 4).c_str()) == 0);
    const std::string third = checkpoint_path(dir + "/split", 3), second = checkpoint_path(dir + "/split", 2);
    std::string bytes = slurp(third);
    bytes[bytes.size() - 1] ^= 1;
    std::ofstream(third, std::ios::binary) << bytes;
    bytes = slurp(second);
    bytes[bytes.find("\"data_position\":\"") + 17] ^= 1;
    std::ofstream(second, std::ios::binary) << bytes;
    CHECK(system((common + dir + "/split --steps 4 --resume > /dev/null 2> " + dir + "/err.txt").c_str()) == 0);
    const std::string err = slurp(dir + "/err.txt");
    CHECK(err.find(third + ": data bytes 0 to") != std::string::npos);
    CHECK(err.find(second + ": its header does not match its checksum (an altered file): passed over") !=
          std::string::npos);
    CHECK(err.find("resuming from " + checkpoint_path(dir + "/split", 1) + ", the newest intact checkpoint") !=
          std::string::npos);
    CHECK(slurp(checkpoint_path(dir + "/split", 4)) == slurp(checkpoint_path(dir + "/straight", 4)));
    system(("rm -rf " + dir).c_str());
}

// A header that disagrees with itself or with the file's name is refused: metadata numbers that are not plain digits
// or out of range, a step other than the name's, and (by checkpoint_config, on the header alone, before a model of
// that config is allocated) a tensor whose shape differs from the one its config makes, or a missing moment.
TEST_CASE("checkpoint: a header whose numbers, step or tensors disagree is refused") {
    std::string dir = make_temp_dir();
    Model m;
    AdamWState opt;
    TrainState st;
    const std::pair<std::string, uint64_t> saved = save_fresh(dir, "tiny", 3, m, opt, st);
    const std::string& good = saved.first;
    const uint64_t header_bytes = saved.second;
    const std::string path = checkpoint_path(dir, 3);
    // the file with its header edited: a new header (padded to 8 bytes), the same data after it
    auto write_edited = [&](const std::function<void(nlohmann::json&)>& edit) {
        nlohmann::json header = nlohmann::json::parse(good.substr(8, header_bytes));
        edit(header);
        std::string text = header.dump();
        text.resize((text.size() + 7) / 8 * 8, ' ');
        const uint64_t length = text.size();
        std::ofstream(path, std::ios::binary) << std::string((const char*)&length, 8) << text
                                              << good.substr(8 + header_bytes);
    };
    auto write_with = [&](const std::string& key, const std::string& value) {
        write_edited([&](nlohmann::json& h) { h["__metadata__"][key] = value; });
    };
    const std::pair<const char*, const char*> bad[] = {
        {"step", " 3"}, {"step", "+3"}, {"step", ""}, {"step", "-1"}, {"step", "9223372036854775808"},
        {"step", "123456789012345678901234"}, {"optimizer_step", "18446744073709551615"}, {"data_position", "0x10"},
        {"rng_state", "18446744073709551616"}, {"rng_state", "99999999999999999999"}};  // 2^64, and 20 nines
    for (const auto& [key, value] : bad) {
        CAPTURE(key);
        CAPTURE(value);
        write_with(key, value);
        Model m2;
        model_init(m2, load_config("tiny"));
        AdamWState opt2;
        TrainState st2;
        const std::string quoted = std::string("'") + key + "'";
        CHECK_THROWS_WITH_AS(checkpoint_load(path, m2, opt2, st2), doctest::Contains(quoted.c_str()), std::runtime_error);
    }
    // a NaN in a tensor the optimizer never sees (the router's correction bias), and an inf in a moment
    const ParamTensor& bias = *std::find_if(m.table.tensors.begin(), m.table.tensors.end(),
                                            [](const ParamTensor& t) { return !t.trainable; });
    REQUIRE(!bias.trainable);
    for (const bool in_moment : {false, true}) {
        Model damaged;
        model_init(damaged, load_config("tiny"));
        AdamWState damaged_opt = adamw_state(damaged.shard);
        if (in_moment) damaged_opt.v[3] = INFINITY;
        else damaged.params[bias.offset + 1] = NAN;
        checkpoint_save(dir, damaged, damaged_opt, st);
        Model m2;
        model_init(m2, load_config("tiny"));
        AdamWState opt2;
        TrainState st2;
        const std::string expected = in_moment ? "moments of tensor" : "'" + bias.name + "' (element 1) is NaN";
        CHECK_THROWS_WITH_AS(checkpoint_load(path, m2, opt2, st2), doctest::Contains(expected.c_str()),
                             std::runtime_error);
    }
    checkpoint_save(dir, m, opt, st);
    write_with("step", "65536");  // a plain number, but not the step the file's name says
    {
        Model m2;
        model_init(m2, load_config("tiny"));
        AdamWState opt2;
        TrainState st2;
        CHECK_THROWS_WITH_AS(checkpoint_load(path, m2, opt2, st2),
                             doctest::Contains("says step 65536, its name step 3"), std::runtime_error);
    }
    write_with("rng_state", "18446744073709551615");  // the one metadata number that takes all 64 bits
    checkpoint_load(path, m, opt, st);
    CHECK(st.rng_state == UINT64_MAX);
    CHECK(st.step == 3);
    CHECK_NOTHROW(checkpoint_config(path));
    const int64_t d = m.config.hidden_size;
    write_edited([&](nlohmann::json& h) { h["model.norm.weight"]["shape"] = {2, d / 2}; });
    const std::string reshaped = "'model.norm.weight' is F32 [2, " + std::to_string(d / 2) + "], its config makes F32 [" +
                                 std::to_string(d) + "]";
    CHECK_THROWS_WITH_AS(checkpoint_config(path), doctest::Contains(reshaped.c_str()), std::runtime_error);
    write_edited([&](nlohmann::json& h) {
        h["optimizer.m.renamed"] = h["optimizer.m.model.norm.weight"];
        h.erase("optimizer.m.model.norm.weight");
    });
    CHECK_THROWS_WITH_AS(checkpoint_config(path), doctest::Contains("'optimizer.m.model.norm.weight' is missing"),
                         std::runtime_error);
    system(("rm -rf " + dir).c_str());
}

TEST_CASE("checkpoint: --keep-checkpoints keeps the newest N up to the one written, and nothing else is touched") {
    const std::string dir = make_temp_dir();
    for (const char* name : {"ckpt_00000002.safetensors", "ckpt_00000010.safetensors", "ckpt_00000004.safetensors",
                             "ckpt_00000012.safetensors.tmp", "notes.txt"})
        std::ofstream(dir + "/" + name) << "x";
    checkpoint_prune(dir, 5, 10);  // fewer than 5: nothing goes
    CHECK(file_exists(checkpoint_path(dir, 2)));
    checkpoint_prune(dir, 1, 4);  // up to step 4 (10 is another run's): 4 stays, 2 goes
    CHECK(!file_exists(checkpoint_path(dir, 2)));
    CHECK(file_exists(checkpoint_path(dir, 4)));
    CHECK(file_exists(checkpoint_path(dir, 10)));
    checkpoint_prune(dir, 2, 10);  // 4 and 10 are the newest 2
    CHECK(file_exists(checkpoint_path(dir, 4)));
    CHECK(file_exists(checkpoint_path(dir, 10)));
    CHECK(file_exists(dir + "/ckpt_00000012.safetensors.tmp"));  // a write in progress is not a checkpoint
    CHECK(file_exists(dir + "/notes.txt"));
    CHECK(checkpoint_find_latest(dir) == checkpoint_path(dir, 10));

    // through the trainer: checkpoints every 2 steps of 8, the newest 2 kept, and the run resumes from the newest
    const std::string common = "./train_cpu --config test/data/ep-tiny.json --data 'data/default/train_*.bin' "
                               "--batch 2 --seq 32 --checkpoint-dir " + dir + "/run --keep-checkpoints 2";
    REQUIRE(run(common + " --steps 8 --checkpoint-every 2") == 0);
    for (int step : {2, 4}) CHECK(!file_exists(checkpoint_path(dir + "/run", step)));
    for (int step : {6, 8}) CHECK(file_exists(checkpoint_path(dir + "/run", step)));
    REQUIRE(run(common + " --steps 10 --resume") == 0);
    CHECK(!file_exists(checkpoint_path(dir + "/run", 6)));
    CHECK(file_exists(checkpoint_path(dir + "/run", 10)));
    system(("rm -rf " + dir).c_str());
}

TEST_CASE("checkpoint: a run of 8 steps interrupted after 4 and resumed equals the straight run, to the bit") {
    std::string dir = make_temp_dir();
    // a tiny model with the default data's vocabulary; MTP, groups and the balance loss are all on
    std::ofstream(dir + "/config.json") << R"({"vocab_size": 1024, "hidden_size": 32, "intermediate_size": 64,
        "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "q_lora_rank": 16,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 8,
        "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1, "aux_loss_alpha": 0.01})";
    // three threads (whatever the machine has), so that the one-thread run at the end compares different splits
    const std::string common = "OMP_NUM_THREADS=3 ./train_cpu --config " + dir + "/config.json " +
                               "--data 'data/default/train_*.bin' --steps 8 --batch 2 --seq 32 --grad-accum 2 " +
                               "--lr 1e-2 --warmup 2";
    REQUIRE(run(common + " --checkpoint-dir " + dir + "/straight --log " + dir + "/straight.jsonl") == 0);
    REQUIRE(run(common + " --checkpoint-dir " + dir + "/split --checkpoint-every 4 --log " + dir + "/first.jsonl") == 0);
    // forget everything after step 4, as if the first run had died there
    REQUIRE(remove(checkpoint_path(dir + "/split", 8).c_str()) == 0);
    REQUIRE(run(common + " --checkpoint-dir " + dir + "/split --resume --log " + dir + "/second.jsonl") == 0);

    std::vector<std::string> straight = logged_losses(dir + "/straight.jsonl"), second = logged_losses(dir + "/second.jsonl");
    REQUIRE(straight.size() == 8);
    REQUIRE(second.size() == 4);
    for (int i = 0; i < 4; i++) CHECK(second[i] == straight[4 + i]);
    std::string a = slurp(checkpoint_path(dir + "/straight", 8)), b = slurp(checkpoint_path(dir + "/split", 8));
    CHECK(a.size() > 100000);
    CHECK(a == b);  // weights, AdamW moments, router biases, data position and RNG, byte for byte

    // and the same bytes with one thread as with three: every reduction runs in a fixed order inside one thread
    REQUIRE(run("OMP_NUM_THREADS=1 " + common.substr(common.find("./")) + " --checkpoint-dir " + dir + "/one_thread") ==
            0);
    CHECK(slurp(checkpoint_path(dir + "/one_thread", 8)) == a);
    system(("rm -rf " + dir).c_str());
}

TEST_CASE("checkpoint: --async-checkpoint writes the synchronous bytes, on 1 rank and with EP 2; a failed write ends "
          "the run") {
    const std::string dir = make_temp_dir();
    const std::string common = "./train_cpu --config test/data/ep-tiny.json --data 'data/default/train_*.bin' --seq 32 "
                               "--batch 2 --lr 1e-2 --steps 4 --checkpoint-every 1";
    for (int ranks : {1, 2}) {
        INFO("ranks " << ranks);
        const std::string launch = mpirun_command(ranks) + common + " --ep " + std::to_string(ranks);
        const std::string sync_dir = dir + "/sync" + std::to_string(ranks);
        const std::string async_dir = dir + "/async" + std::to_string(ranks);
        REQUIRE(run(launch + " --checkpoint-dir " + sync_dir) == 0);
        REQUIRE(run(launch + " --checkpoint-dir " + async_dir + " --async-checkpoint") == 0);
        for (int step = 1; step <= 4; step++) {  // each written while the next step trained
            const std::string written = slurp(checkpoint_path(sync_dir, step));
            CHECK(!written.empty());
            CHECK(slurp(checkpoint_path(async_dir, step)) == written);
        }
    }
    // with --keep-checkpoints the old ones are pruned once a write is committed: the newest 2 remain
    const std::string kept = dir + "/kept";
    REQUIRE(run(common + " --checkpoint-dir " + kept + " --async-checkpoint --keep-checkpoints 2") == 0);
    CHECK(!file_exists(checkpoint_path(kept, 2)));
    CHECK(file_exists(checkpoint_path(kept, 3)));
    CHECK(file_exists(checkpoint_path(kept, 4)));
    // rank 1's part of the checkpoint of step 2 fails (MOE_FAULT): written on a thread, the failure ends the run at
    // the end of step 3 or 4, once every rank's writer is done (synchronously: at once, before step 3). Either way one
    // line from rank 1, a non-zero exit on every rank, and no checkpoint of step 2 or later. (Rank 0's stdout and rank
    // 1's stderr reach mpirun's output in no fixed order: only whether step 3 was logged is checked.)
    for (const bool async : {true, false}) {
        INFO("async " << async);
        const std::string failing = dir + "/failing" + std::to_string(async);
        const CommandResult r = run_logged(mpirun_command(2) + "env MOE_FAULT=1:2:write " + common + " --ep 2 " +
                                               "--checkpoint-dir " + failing + (async ? " --async-checkpoint" : ""),
                                           "write_fail.txt", 120);
        INFO(r.out);
        CHECK(r.status == 1);
        const std::string message = "[rank 1] injected write failure";
        const size_t error = r.out.find(message);
        CHECK(error != std::string::npos);
        CHECK(r.out.find("injected write failure", error + message.size()) == std::string::npos);  // once
        CHECK((r.out.find("step     3/4") != std::string::npos) == async);
        CHECK(file_exists(checkpoint_path(failing, 1)));
        CHECK(!file_exists(checkpoint_path(failing, 2)));
        CHECK(!file_exists(checkpoint_path(failing, 3)));
        CHECK(system(("ls -a " + failing + " | grep -q tmp").c_str()) != 0);  // the failed write's file removed
    }
    system(("rm -rf " + dir).c_str());
}

// Crash consistency: one training run lived as many processes, each killed with SIGKILL (no handler runs) at a
// chosen point and resumed by the next, half of the kills aimed inside a checkpoint write (as soon as its temporary
// file appears, plus 0 to 20 ms). Every resume must find an intact checkpoint, and every run that reaches its end
// must write the uninterrupted run's final checkpoint, byte for byte.
TEST_CASE("checkpoint: a run killed with SIGKILL at 24 points, half aimed inside checkpoint writes, resumes alike") {
    const std::string dir = make_temp_dir();
    const std::string common = "./train_cpu --config small --data 'data/default/train_*.bin' --steps 8 --batch 1 "
                               "--seq 16 --checkpoint-every 1 --resume --checkpoint-dir ";
    REQUIRE(run(common + dir + "/straight") == 0);
    const std::string straight = slurp(checkpoint_path(dir + "/straight", 8));
    const std::string killed = dir + "/killed";
    auto writing = [&] {  // a temporary checkpoint file exists
        for (const auto& entry : std::filesystem::directory_iterator(killed))
            if (entry.path().string().find(".safetensors.tmp.") != std::string::npos) return true;
        return false;
    };
    Rng rng(11);
    int kills = 0, kills_in_writes = 0, completed = 0;
    while (kills < 24) {
        std::filesystem::create_directories(killed);
        const pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            execl("/bin/sh", "sh", "-c", ("exec " + common + killed + " > /dev/null 2> " + dir + "/err").c_str(),
                  (char*)nullptr);
            _exit(127);
        }
        const bool aim_at_write = kills % 2 == 0;
        const double delay_ms = aim_at_write ? 20 * rng.uniform() : 50 + 500 * rng.uniform();
        int status = 0;
        bool exited = false;
        auto exited_now = [&] { return exited = exited || waitpid(pid, &status, WNOHANG) == pid; };
        while (aim_at_write && !exited_now() && !writing()) usleep(200);
        usleep((useconds_t)(1000 * delay_ms));
        if (!exited_now()) {
            kill(pid, SIGKILL);
            REQUIRE(waitpid(pid, &status, 0) == pid);
            kills++;
            kills_in_writes += writing();
            const std::string latest = checkpoint_find_latest(killed);
            if (!latest.empty()) CHECK(checkpoint_verify(latest) == "");
            continue;
        }
        INFO("resume stderr: " << slurp(dir + "/err"));
        REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
        CHECK(slurp(dir + "/err").find("passed over") == std::string::npos);
        CHECK(slurp(checkpoint_path(killed, 8)) == straight);
        completed++;
        std::filesystem::remove_all(killed);  // the next kills start a new run
    }
    REQUIRE(run(common + killed) == 0);  // the last run, to its end
    CHECK(slurp(checkpoint_path(killed, 8)) == straight);
    MESSAGE(kills << " kills, " << kills_in_writes << " inside a checkpoint write; " << completed + 1 << " runs ended");
    CHECK(kills_in_writes >= 6);
    system(("rm -rf " + dir).c_str());
}
