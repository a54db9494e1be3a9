// Pipeline parallelism: the stage cut, the 1F1B schedule on threads (one per stage), and train_cpu under mpirun with
// PP 2, PP 4, PP 2 x EP 2 and PP 2 x DP 2 against one rank, resumed across layouts, refusing what cannot be cut, and
// ending the whole job when a stage fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "model/config.h"
#include "test/test_helpers.h"
#include "trainer/pipeline.h"
#include "trainer/plan.h"

TEST_CASE("pipeline: the cut gives every stage a block and balances the stages' FLOPs") {
    const Config v3 = parse_config_file("deepseek-v3"), tiny = parse_config_file("test/data/pp-tiny.json");
    CHECK(pipeline_cut(tiny, 1, {}, 32) == std::vector<int>{0, 4});
    CHECK(pipeline_cut(tiny, 4, {}, 32) == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(pipeline_cut(tiny, 2, {3}, 32) == std::vector<int>{0, 3, 4});
    // the slowest stage of the balanced cut is no slower than that of any other cut (all cuts of V3 into 3 stages)
    const int L = v3.num_hidden_layers, T = 4096;
    std::vector<double> cost(L);
    for (int l = 0; l < L; l++) cost[l] = block_flops_per_token(v3, l, T);
    auto slowest = [&](const std::vector<int>& first) {
        double worst = 0;
        for (size_t s = 0; s + 1 < first.size(); s++) {
            double stage = s + 2 == first.size() ? heads_flops_per_token(v3, T) : 0.0;
            for (int l = first[s]; l < first[s + 1]; l++) stage += cost[l];
            worst = std::max(worst, stage);
        }
        return worst;
    };
    const std::vector<int> cut = pipeline_cut(v3, 3, {}, T);
    double best = 1e300;
    for (int a = 1; a < L; a++)
        for (int b = a + 1; b < L; b++) best = std::min(best, slowest({0, a, b, L}));
    CHECK(slowest(cut) == doctest::Approx(best).epsilon(1e-12));
    // 16 stages of V3's 61 layers (DeepSeek's layout): each holds 3 or 4 blocks, the last fewer for the heads
    const std::vector<int> sixteen = pipeline_cut(v3, 16, {}, T);
    REQUIRE(sixteen.size() == 17);
    for (int s = 0; s < 16; s++) CHECK(sixteen[s + 1] - sixteen[s] >= 1);
    CHECK(sixteen[16] - sixteen[15] <= sixteen[1] - sixteen[0]);

    auto refusal = [&](int pp, const std::vector<int>& split) {
        try {
            pipeline_cut(tiny, pp, split, 32);
        } catch (const std::runtime_error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    CHECK(refusal(5, {}) == "--pp 5 exceeds the model's 4 layers: every pipeline stage needs a block");
    CHECK(refusal(3, {2, 2}) == "--pp-split leaves stage 1 without a block (give rising layers between 1 and 3)");
    CHECK(refusal(2, {4}) == "--pp-split leaves stage 1 without a block (give rising layers between 1 and 3)");
    CHECK(refusal(3, {2}) == "--pp-split gives 1 layers; --pp 3 needs 2");
}

namespace {

// The stages of one pipeline as threads: pipe_exchange through mailboxes (a send is queued, a receive waits for its
// message). Nothing else of Comm is used by the schedule.
struct Mailboxes {
    std::mutex mutex;
    std::condition_variable arrived;
    std::map<std::pair<int, int>, std::deque<std::vector<float>>> queues;  // (from, to) -> messages in order
};

class ThreadComm : public Comm {
public:
    ThreadComm(Mailboxes& boxes, int stage, int stages) : boxes_(boxes) {
        rank = stage;
        world = stages;
        set_layout(1, stages);
    }
    void pipe_exchange(const PipeTransfer* transfers, int n) override {
        std::unique_lock<std::mutex> lock(boxes_.mutex);
        for (int i = 0; i < n; i++)
            if (transfers[i].send)
                boxes_.queues[{pp_rank, transfers[i].stage}].emplace_back(transfers[i].data,
                                                                         transfers[i].data + transfers[i].count);
        boxes_.arrived.notify_all();
        for (int i = 0; i < n; i++) {
            if (transfers[i].send) continue;
            std::deque<std::vector<float>>& queue = boxes_.queues[{transfers[i].stage, pp_rank}];
            boxes_.arrived.wait(lock, [&] { return !queue.empty(); });
            std::copy(queue.front().begin(), queue.front().end(), transfers[i].data);
            queue.pop_front();
        }
    }
    void all_reduce_sum(float*, int64_t, Group) override { unused(); }
    void all_reduce_sum(double*, int64_t, Group) override { unused(); }
    void all_reduce_sum(int64_t*, int64_t, Group) override { unused(); }
    void all_to_all(const int64_t*, int64_t*, int64_t) override { unused(); }
    void all_to_all_v(const float*, const int64_t*, float*, const int64_t*, int64_t) override { unused(); }
    void reduce_scatter_sum(float*, int64_t, Group) override { unused(); }
    void all_gather(float*, int64_t, Group) override { unused(); }
    void all_gather(uint16_t*, int64_t, Group) override { unused(); }
    void broadcast(void*, int64_t, int) override { unused(); }
    void barrier() override { unused(); }
    [[noreturn]] void abort(const std::string& message) override { throw std::runtime_error(message); }

private:
    [[noreturn]] static void unused() { throw std::logic_error("the schedule uses pipe_exchange only"); }
    Mailboxes& boxes_;
};

// What one stage saw of the schedule.
struct StageTrace {
    std::string order;  // "F0 F1 B0 ..."
    std::vector<std::string> faults;
    int most_in_flight = 0, slots = 0;
};

// Runs the schedule on `stages` threads over M micro-batches. Every message carries its micro-batch's number and
// the stage that wrote it; each stage checks it got the message of the micro-batch it works on, and that a slot is
// not taken by another micro-batch between its forward and its backward.
std::vector<StageTrace> run_schedule(int stages, int M) {
    Mailboxes boxes;
    std::vector<StageTrace> traces(stages);
    std::vector<std::thread> threads;
    for (int stage = 0; stage < stages; stage++)
        threads.emplace_back([&, stage] {
            ThreadComm comm(boxes, stage, stages);
            StageTrace& trace = traces[stage];
            trace.slots = pipeline_slots(comm, M);
            std::vector<float> buffers(4 * 2);
            const StageMessages messages{&buffers[0], &buffers[2], &buffers[4], &buffers[6], 2};
            std::vector<int> slot_holds(trace.slots, -1);
            int in_flight = 0;
            auto fault = [&](const std::string& what, int micro) {
                trace.faults.push_back(what + " at micro-batch " + std::to_string(micro));
            };
            const StageWork work{
                [&](int micro, int slot, const float* in, float* out) {
                    trace.order += "F" + std::to_string(micro) + " ";
                    if (stage > 0 && (in[0] != micro || in[1] != stage - 1)) fault("forward message", micro);
                    if (slot < 0 || slot >= trace.slots || slot_holds[slot] >= 0) fault("slot taken", micro);
                    else slot_holds[slot] = micro;
                    trace.most_in_flight = std::max(trace.most_in_flight, ++in_flight);
                    out[0] = (float)micro;
                    out[1] = (float)stage;
                },
                [&](int micro, int slot, const float* dout, float* din) {
                    trace.order += "B" + std::to_string(micro) + " ";
                    if (stage + 1 < stages && (dout[0] != micro || dout[1] != stage + 1)) fault("gradient", micro);
                    if (slot < 0 || slot >= trace.slots || slot_holds[slot] != micro) fault("slot lost", micro);
                    else slot_holds[slot] = -1;
                    in_flight--;
                    din[0] = (float)micro;
                    din[1] = (float)stage;
                }};
            pipeline_train(comm, M, work, messages);
        });
    for (std::thread& t : threads) t.join();
    return traces;
}

}  // namespace

TEST_CASE("pipeline: 1F1B passes each micro-batch's messages in order, with more micro-batches than stages and fewer") {
    for (int stages : {1, 2, 4})
        for (int M : {1, 2, 3, 4, 8}) {
            const std::vector<StageTrace> traces = run_schedule(stages, M);
            for (int stage = 0; stage < stages; stage++) {
                const StageTrace& t = traces[stage];
                INFO("PP " << stages << ", " << M << " micro-batches, stage " << stage << ": " << t.order);
                CHECK(t.faults.empty());
                // every micro-batch forward then backward, in order; at most `slots` in flight, as 1F1B promises
                std::string forwards, backwards;
                std::istringstream words(t.order);
                for (std::string w; words >> w;) (w[0] == 'F' ? forwards : backwards) += w.substr(1) + " ";
                std::string expected;
                for (int i = 0; i < M; i++) expected += std::to_string(i) + " ";
                CHECK(forwards == expected);
                CHECK(backwards == expected);
                CHECK(t.slots == std::min(stages - stage, M));
                CHECK(t.most_in_flight == t.slots);
            }
            if (stages == 4 && M == 8) {
                CHECK(traces[0].order == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 ");
                CHECK(traces[3].order == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 ");
            }
        }
}

namespace {

const std::string PP_TRAIN = "./train_cpu --config test/data/pp-tiny.json --data 'data/default/train_*.bin' --seq 32 "
                             "--lr 1e-2 --steps 6 --grad-accum 3";
// with an evaluation every 3 steps and 16 tokens sampled at the end
const std::string EVAL_SAMPLE = " --val 'data/default/val_*.bin' --eval-every 3 --eval-batches 2 --sample 16 "
                                "--tokenizer data/default/tokenizer.bin";

// What a run printed from its sample on
std::string sample_of(const std::string& out) {
    const size_t at = out.find("sample (");
    return at == std::string::npos ? "" : out.substr(at);
}

// Each step's value of `key` in two logs, relatively within `tolerance`.
void check_logs_agree(const std::string& log, const std::string& reference, const std::string& key,
                      double tolerance) {
    const std::vector<std::string> a = log_values(log, key), b = log_values(reference, key);
    REQUIRE(a.size() == b.size());
    REQUIRE(!a.empty());
    for (size_t i = 0; i < a.size(); i++) {
        INFO(key << " at step " << i + 1);
        CHECK(std::stod(a[i]) == doctest::Approx(std::stod(b[i])).epsilon(tolerance));
    }
}

}  // namespace

// Tolerances: PP alone moves no arithmetic between ranks but two double sums over the stages (the losses, the squared
// gradient norm), so with --grad-clip 0 the weights are the same bits and the checkpoints the same file, and the
// logged values agree to double rounding (1e-12); --recompute gives the same bits too (test_recompute.cpp). With EP
// or DP the gradients are also FP32 sums over ranks in another order (as in test_ep.cpp): 1e-5 over 6 steps of lr
// 1e-2. The expert loads are integers: equal.
TEST_CASE("pipeline: train_cpu with PP 2, PP 4, PP 2 x EP 2 and PP 2 x DP 2 logs one rank's losses, gradient norms, "
          "expert loads and validation losses; PP alone writes its checkpoint byte for byte and samples its text") {
    struct Layout {
        std::string name;
        int ranks;
        std::string flags;
        double tolerance;
    };
    // 3 micro-batches: more than PP 2's stages, fewer than PP 4's; one rank with batch 2 sees the tokens of two
    // ranks of batch 1 in a stage
    const std::vector<Layout> layouts = {{"pp2", 2, "--pp 2 --batch 2", 1e-12},
                                         {"pp4", 4, "--pp 4 --batch 2", 1e-12},
                                         {"pp2_split", 2, "--pp 2 --pp-split 1 --batch 2", 1e-12},
                                         // the micro-batches in flight share the activation sets, each recomputed
                                         {"pp2_recompute", 2, "--pp 2 --batch 2 --recompute", 1e-12},
                                         {"pp2_ep2", 4, "--pp 2 --ep 2 --batch 1", 1e-5},
                                         {"pp2_dp2", 4, "--pp 2 --batch 1", 1e-5}};
    const std::string one_log = test_path("pp_one.jsonl"), one_ckpt = test_path("pp_one");
    const MpiJob one = mpirun(1, PP_TRAIN + EVAL_SAMPLE + " --batch 2 --grad-clip 0 --log " + one_log +
                                     " --checkpoint-dir " + one_ckpt, "pp_one");
    REQUIRE_MESSAGE(one.status == 0, one.err);
    for (const Layout& layout : layouts) {
        const std::string log = test_path(layout.name + ".jsonl"), ckpt = test_path(layout.name);
        const MpiJob job = mpirun(layout.ranks, PP_TRAIN + EVAL_SAMPLE + " " + layout.flags + " --grad-clip 0 --log " +
                                                    log + " --checkpoint-dir " + ckpt, layout.name);
        INFO(layout.name << "\n" << job.out << job.err);
        REQUIRE(job.status == 0);
        for (const char* key : {"loss", "loss_main", "loss_mtp", "loss_balance", "grad_norm", "val_loss"})
            check_logs_agree(log, one_log, key, layout.tolerance);
        CHECK(log_values(log, "load_imbalance") == log_values(one_log, "load_imbalance"));
        if (layout.tolerance < 1e-9) {
            CHECK(slurp(ckpt + "/ckpt_00000006.safetensors") == slurp(one_ckpt + "/ckpt_00000006.safetensors"));
            CHECK(sample_of(job.out) == sample_of(one.out));  // the last stage samples, every rank takes its tokens
        }
    }
    CHECK(occurrences(mpirun(4, PP_TRAIN + " --pp 4 --batch 2 --steps 1", "pp4_cut").out,
                      "pipeline stages, their first layers: 0 1 2 3") == 1);
}

TEST_CASE("pipeline: a checkpoint of PP 2 x EP 2 resumes as PP 1, as EP 4 and as PP 4, continuing one rank's run") {
    const std::string ckpt = test_path("pp_resume"), one_log = test_path("pp_resume_one.jsonl");
    // a global batch of 4 sequences per micro-step in every layout
    REQUIRE(mpirun(1, PP_TRAIN + " --batch 4 --log " + one_log, "pp_resume_one").status == 0);
    const MpiJob saved = mpirun(4, PP_TRAIN + " --pp 2 --ep 2 --batch 2 --checkpoint-every 3 --checkpoint-dir " + ckpt,
                                "pp_resume_save");
    REQUIRE_MESSAGE(saved.status == 0, saved.err);
    REQUIRE(remove((ckpt + "/ckpt_00000006.safetensors").c_str()) == 0);
    const std::vector<std::string> reference = log_values(one_log, "loss");
    REQUIRE(reference.size() == 6);
    for (auto [ranks, flags] : std::vector<std::pair<int, std::string>>{
             {1, "--batch 4"}, {4, "--ep 4 --batch 1"}, {4, "--pp 4 --batch 4"}}) {
        const std::string log = test_path("pp_resumed.jsonl");
        system(("rm -f " + log).c_str());
        const MpiJob resumed = mpirun(ranks, PP_TRAIN + " " + flags + " --resume --checkpoint-dir " + ckpt + " --log " +
                                              log + " --checkpoint-every 100", "pp_resumed");
        INFO(flags << "\n" << resumed.out << resumed.err);
        REQUIRE(resumed.status == 0);
        CHECK(occurrences(resumed.out, "resumed from " + ckpt + "/ckpt_00000003.safetensors at step 3") == 1);
        const std::vector<std::string> losses = log_values(log, "loss");
        REQUIRE(losses.size() == 3);
        for (int i = 0; i < 3; i++)
            CHECK(std::stod(losses[i]) == doctest::Approx(std::stod(reference[3 + i])).epsilon(1e-5));
        system(("rm -f " + ckpt + "/ckpt_00000006.safetensors").c_str());  // the next layout resumes from step 3 too
    }
}

TEST_CASE("pipeline: a cut that leaves a stage without a block is refused on every rank with one line; a failing or "
          "dying stage ends the whole job within seconds") {
    const std::vector<std::tuple<std::string, int, std::string, std::string>> refusals = {
        {"pp_too_deep", 4, PP_TRAIN + " --batch 1 --pp 4 --config test/data/ep-tiny.json",
         "--pp 4 exceeds the model's 2 layers: every pipeline stage needs a block"},
        {"pp_empty_stage", 2, PP_TRAIN + " --batch 1 --pp 2 --pp-split 4",
         "--pp-split leaves stage 1 without a block (give rising layers between 1 and 3)"},
        {"pp_undivided", 3, PP_TRAIN + " --batch 1 --pp 2", "--ep 1 x --pp 2 does not divide the 3 ranks"},
        {"pp_export", 2, PP_TRAIN + " --batch 1 --pp 2 --export-hf " + test_path("pp_hf"),
         "--export-hf needs --ep 1 and --pp 1"},
    };
    for (const auto& [name, ranks, args, message] : refusals) {
        const MpiJob job = mpirun(ranks, args, name);
        INFO(name << "\n" << job.err);
        CHECK(job.status != 0);
        CHECK(occurrences(job.err, message) == 1);
        CHECK(job.out.find("step ") == std::string::npos);
    }
    // rank 1, the last stage, fails at step 2 while rank 0 waits for its gradients: one line, every rank ends
    const MpiJob error = mpirun(2, "env MOE_FAULT=1:2:error " + PP_TRAIN + " --steps 50 --batch 1 --pp 2", "pp_error");
    CHECK(error.status != 0);
    CHECK(occurrences(error.err, "injected fault at step 2") == 1);
    CHECK(error.seconds < 60);
    // rank 0, the first stage, is killed while the last waits for its activations
    const MpiJob crash = mpirun(2, "env MOE_FAULT=0:2:crash " + PP_TRAIN + " --steps 50 --batch 1 --pp 2", "pp_crash");
    CHECK(crash.status != 0);
    CHECK(crash.seconds < 60);
}

TEST_CASE("pipeline: --init-from-hf on two stages trains as one rank from the same files") {
    const std::string hf = test_path("pp_hf_in");
    const std::string one = test_path("pp_hf_one.jsonl"), two = test_path("pp_hf_two.jsonl");
    REQUIRE(mpirun(1, PP_TRAIN + " --batch 2 --steps 2 --export-hf " + hf + " --export-dtype f32", "pp_hf_export")
                .status == 0);
    REQUIRE(mpirun(1, PP_TRAIN + " --batch 2 --steps 3 --init-from-hf " + hf + " --log " + one, "pp_hf_one").status ==
            0);
    const MpiJob staged = mpirun(2, PP_TRAIN + " --batch 2 --steps 3 --pp 2 --init-from-hf " + hf + " --log " + two,
                                 "pp_hf_two");
    INFO(staged.err);
    REQUIRE(staged.status == 0);
    CHECK(staged.err.find("MTP") == std::string::npos);  // each stage found its tensors, MTP's included
    for (const char* key : {"loss", "grad_norm"}) check_logs_agree(two, one, key, 1e-12);
}
