// Expert and data parallelism on the CPU: the dispatch plan on its own, then real MPI jobs (mpirun, 1/2/4 ranks,
// oversubscribed on this machine): EP=2, EP=4 and EP=2 x DP=2 against one process (test/ep_check.cpp), a 4-rank
// checkpoint resumed on 2 ranks, and failures that must end the whole job quickly with one message.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <tuple>
#include <vector>

#include "model/expert_plan.h"
#include "data/shards.h"
#include "io/checkpoint.h"
#include "model/rng.h"
#include "test/test_helpers.h"

namespace {

// Runs the plans of P simulated ranks and moves rows between them as the all-to-all-v would: every expert must
// receive exactly the assignments routed to it, in expert-contiguous order, and the way back must invert it.
void check_dispatch(int P, int E, const std::vector<std::vector<int32_t>>& choices) {
    const int per_rank = E / P;
    std::vector<ExpertPlan> plans;
    for (int r = 0; r < P; r++) plans.push_back(build_expert_plan(choices[r].data(), (int64_t)choices[r].size(), E));
    for (int dst = 0; dst < P; dst++) {
        std::vector<int64_t> recv_counts(P * per_rank);
        for (int s = 0; s < P; s++)
            for (int j = 0; j < per_rank; j++) recv_counts[s * per_rank + j] = plans[s].counts[dst * per_rank + j];
        DispatchPlan d = build_dispatch_plan(plans[dst].counts, recv_counts, P);
        // the rows that arrive at dst, tagged (source rank, assignment), in arrival order
        std::vector<std::pair<int, int64_t>> arrived;
        for (int s = 0; s < P; s++) {
            int64_t first = plans[s].offsets[dst * per_rank], last = plans[s].offsets[(dst + 1) * per_rank];
            for (int64_t row = first; row < last; row++) arrived.push_back({s, plans[s].assignment_of_row[row]});
            DispatchPlan ds = build_dispatch_plan(plans[s].counts, recv_counts, P);
            CHECK(ds.send_rows[dst] == last - first);
        }
        REQUIRE((int64_t)arrived.size() == d.received());
        std::vector<std::pair<int, int64_t>> by_expert(arrived.size(), {-1, -1});
        for (size_t r = 0; r < arrived.size(); r++) by_expert[d.expert_row_of_recv[r]] = arrived[r];
        for (int j = 0; j < per_rank; j++) {
            const int expert = dst * per_rank + j;
            int64_t expected = 0;
            for (int s = 0; s < P; s++) expected += plans[s].counts[expert];
            CHECK(d.expert_counts[j] == expected);
            for (int64_t row = d.expert_offsets[j]; row < d.expert_offsets[j + 1]; row++) {
                auto [src, assignment] = by_expert[row];
                REQUIRE(src >= 0);
                CHECK(choices[src][assignment] == expert);
            }
        }
    }
}

}  // namespace

TEST_CASE("ep: the local plan sorts assignments by expert and inverts") {
    std::vector<int32_t> chosen = {3, 0, 3, 1, 0, 3};
    ExpertPlan p = build_expert_plan(chosen.data(), 6, 5);
    CHECK(p.counts == std::vector<int64_t>{2, 1, 0, 3, 0});
    CHECK(p.offsets == std::vector<int64_t>{0, 2, 3, 3, 6, 6});
    CHECK(p.row_of_assignment == std::vector<int64_t>{3, 0, 4, 2, 1, 5});
    for (int64_t a = 0; a < 6; a++) CHECK(p.assignment_of_row[p.row_of_assignment[a]] == a);
}

TEST_CASE("ep: dispatch plans route every row to its expert, with idle experts and silent ranks") {
    Rng rng(99);
    for (int P : {1, 2, 4}) {
        const int E = 8;
        std::vector<std::vector<int32_t>> random(P), skewed(P);
        for (int r = 0; r < P; r++) {
            for (int a = 0; a < 40; a++) random[r].push_back((int32_t)(rng.next_u64() % E));
            // rank 1 (when there is one) sends nothing; the others use experts 0 and 5 only
            if (r != 1 || P == 1)
                for (int a = 0; a < 12; a++) skewed[r].push_back(a % 3 == 0 ? 5 : 0);
        }
        check_dispatch(P, E, random);
        check_dispatch(P, E, skewed);
    }
}

namespace {

const std::string TRAIN = "./train_cpu --config test/data/ep-tiny.json --data 'data/default/train_*.bin' --seq 32 --lr 1e-2";

}  // namespace

TEST_CASE("ep: EP=2, EP=4, DP=2 and EP=2 x DP=2 give the loss and gradients of one process, and the same 10 steps; "
          "its checkpoint saved from them is the same file") {
    // the last: experts shaped so that their buckets leave a tail for the DP group (ep_check --expert-tail)
    for (auto [ranks, ep, flags] : std::vector<std::tuple<int, int, const char*>>{
             {1, 1, ""}, {2, 2, ""}, {4, 4, ""}, {2, 1, ""}, {4, 2, ""}, {4, 2, " --expert-tail"}}) {
        MpiJob j = mpirun(ranks, "./ep_check --ep " + std::to_string(ep) + flags);
        INFO("ranks " << ranks << " ep " << ep << flags << "\n" << j.out << j.err);
        CHECK(j.status == 0);
        CHECK(j.out.find(", ok") != std::string::npos);
    }
}

TEST_CASE("ep: train_cpu on 4 ranks (EP 2 x DP 2) matches 1 rank, its checkpoint resumes on 2 ranks, and it evaluates "
          "alike on 1, 2 and 4") {
    const std::string ckpt = test_path("ep_ckpt"), log_one = test_path("ep_one.jsonl"),
                      log_four = test_path("ep_four.jsonl"), log_two = test_path("ep_two.jsonl");
    const std::string clean = "rm -rf " + ckpt + " " + log_one + " " + log_four + " " + log_two;
    system(clean.c_str());
    // one rank with batch 4 sees the tokens of four ranks with batch 1
    MpiJob one = mpirun(1, TRAIN + " --steps 6 --batch 4 --log " + log_one);
    MpiJob four = mpirun(4, TRAIN + " --steps 6 --batch 1 --ep 2 --checkpoint-dir " + ckpt + " --checkpoint-every 3 "
                                 "--log " + log_four);
    REQUIRE_MESSAGE(one.status == 0, one.err);
    REQUIRE_MESSAGE(four.status == 0, four.err);
    std::vector<std::string> a = log_values(log_one, "loss"), b = log_values(log_four, "loss");
    REQUIRE(a.size() == 6);
    REQUIRE(b.size() == 6);
    for (int i = 0; i < 6; i++) CHECK(std::stod(b[i]) == doctest::Approx(std::stod(a[i])).epsilon(1e-5));
    // forget steps 4-6 and continue on 2 ranks (EP 2, batch 2: the same global batch)
    REQUIRE(remove((ckpt + "/ckpt_00000006.safetensors").c_str()) == 0);
    MpiJob two = mpirun(2, TRAIN + " --steps 6 --batch 2 --ep 2 --checkpoint-dir " + ckpt + " --resume "
                                "--log " + log_two);
    REQUIRE_MESSAGE(two.status == 0, two.err);
    CHECK(two.out.find("resumed from " + ckpt + "/ckpt_00000003.safetensors") != std::string::npos);
    std::vector<std::string> c = log_values(log_two, "loss");
    REQUIRE(c.size() == 3);
    for (int i = 0; i < 3; i++) CHECK(std::stod(c[i]) == doctest::Approx(std::stod(a[3 + i])).epsilon(1e-5));
    // the validation loss of the newest checkpoint: the mean over the same global batches on 1, 2 and 4 ranks
    const std::string evaluate = TRAIN + " --val 'data/default/val_*.bin' --eval-batches 2 --checkpoint-dir " + ckpt +
                                 " --resume --eval-only";
    std::vector<double> val_losses;
    for (auto [ranks, ep] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {4, 2}}) {
        MpiJob eval = mpirun(ranks, evaluate + " --batch " + std::to_string(4 / ranks) + " --ep " + std::to_string(ep));
        INFO("ranks " << ranks << "\n" << eval.out << eval.err);
        REQUIRE(eval.status == 0);
        const size_t at = eval.out.find("val_loss ");
        REQUIRE(at != std::string::npos);
        val_losses.push_back(std::stod(eval.out.substr(at + 9)));
    }
    CHECK(val_losses[1] == doctest::Approx(val_losses[0]).epsilon(1e-5));
    CHECK(val_losses[2] == doctest::Approx(val_losses[0]).epsilon(1e-5));
    system(clean.c_str());
}

TEST_CASE("ep: a failing or dying rank ends the whole job within seconds, the reason printed once") {
    // rank 1 hits an error at step 2: it says so, once, and every rank stops
    MpiJob error = mpirun(4, "env MOE_FAULT=1:2:error " + TRAIN + " --steps 50 --batch 1 --ep 2");
    CHECK(error.status != 0);
    CHECK(occurrences(error.err, "injected fault at step 2") == 1);
    CHECK(error.err.find("[rank 1]") != std::string::npos);
    CHECK(error.seconds < 60);
    // rank 3 is killed outright: mpirun notices and ends the job
    MpiJob crash = mpirun(4, "env MOE_FAULT=3:2:crash " + TRAIN + " --steps 50 --batch 1 --ep 2");
    CHECK(crash.status != 0);
    CHECK(crash.seconds < 60);
    // a later shard with a token outside the vocabulary (the loader checks a shard when it reaches it): said once
    std::vector<uint32_t> good(4096), bad(4096);
    for (size_t i = 0; i < good.size(); i++) good[i] = bad[i] = (uint32_t)(i * 7 % 1024);
    bad[100] = 5000;  // ep-tiny's vocabulary is 1024
    write_shard(test_path("ep_shards_000.bin"), good, 1);
    write_shard(test_path("ep_shards_001.bin"), bad, 1);
    MpiJob bad_shard = mpirun(2, "./train_cpu --config test/data/ep-tiny.json --seq 32 --batch 4 --steps 50 --data '" +
                                  test_path("ep_shards_*.bin") + "'");
    CHECK(bad_shard.status != 0);
    CHECK(occurrences(bad_shard.err, "holds token 5000") == 1);
    CHECK(bad_shard.seconds < 60);
    // the same shards as validation data, which every rank reaches in the same evaluation: said once too
    const std::string ckpt = test_path("ep_eval_ckpt");
    REQUIRE(mpirun(1, TRAIN + " --steps 1 --batch 1 --checkpoint-dir " + ckpt).status == 0);
    MpiJob bad_val = mpirun(2, "./train_cpu --config test/data/ep-tiny.json --seq 32 --batch 4 --eval-only --resume "
                            "--eval-batches 40 --checkpoint-dir " + ckpt + " --val '" + test_path("ep_shards_*.bin") +
                            "'");
    CHECK(bad_val.status != 0);
    CHECK(occurrences(bad_val.err, "holds token 5000") == 1);
    system(("rm -rf " + ckpt).c_str());
}

// The launcher's command (train_cpu, or mpirun around it) run in the background until its log has a line, then sent
// `signal`; returns the job with its exit status.
static MpiJob stopped_by(const std::string& launcher, const std::string& log, const std::string& signal) {
    const std::string out = test_path("stop_out.txt"), err = test_path("stop_err.txt"), script = test_path("stop.sh");
    std::ofstream(script) << launcher << " > " << out << " 2> " << err << " &\npid=$!\nwhile [ ! -s " << log
                          << " ] && kill -0 $pid 2> /dev/null; do sleep 0.1; done\nkill -" << signal
                          << " $pid\nwait $pid\n";
    const int rc = system(("timeout -k 10 120 sh " + script).c_str());
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, 0.0, slurp(out), slurp(err)};
}

TEST_CASE("ep: SIGTERM, or SIGUSR1 through mpirun, ends the run after a step with a checkpoint that resumes") {
    const std::string ckpt = test_path("stop_ckpt"), log = test_path("stop.jsonl");
    system(("rm -rf " + ckpt + " " + log).c_str());
    const std::string run = " --steps 100000 --batch 1 --checkpoint-dir " + ckpt + " --log " + log;
    MpiJob term = stopped_by(TRAIN + run, log, "TERM");
    INFO(term.out << term.err);
    CHECK(term.status == 128 + SIGTERM);
    const size_t at = term.out.find("stopped by SIGTERM after step ");
    REQUIRE(at != std::string::npos);
    const long long step = atoll(term.out.c_str() + at + strlen("stopped by SIGTERM after step "));
    CHECK(step >= 1);
    CHECK(checkpoint_find_latest(ckpt) == checkpoint_path(ckpt, step));
    CHECK((long long)log_values(log, "loss").size() == step);  // every finished step logged, the checkpoint at the last
    MpiJob resumed = mpirun(1, TRAIN + " --batch 1 --steps " + std::to_string(step + 2) + " --checkpoint-dir " + ckpt +
                                " --resume");
    CHECK(resumed.status == 0);
    CHECK(resumed.out.find("resumed from " + checkpoint_path(ckpt, step)) != std::string::npos);

    // two ranks: mpirun forwards SIGUSR1 to both, which agree on the step to stop after
    system(("rm -rf " + ckpt + " " + log).c_str());
    MpiJob usr1 = stopped_by(mpirun_command(2) + TRAIN + " --ep 2" + run, log, "USR1");
    INFO(usr1.out << usr1.err);
    CHECK(usr1.status == 128 + SIGUSR1);
    CHECK(occurrences(usr1.out, "stopped by SIGUSR1 after step ") == 1);
    CHECK(!checkpoint_find_latest(ckpt).empty());
    system(("rm -rf " + ckpt + " " + log).c_str());
}

// The launches below are independent, so they run side by side (each refusal is a few seconds of mpirun starting).
TEST_CASE("ep: bad layouts and launches are one error from rank 0 and a non-zero exit everywhere") {
    const std::string dirs = test_path("ep_unshared");
    const std::string emulated = "env STAND_IN_GPUS=2 ./train_emulated --dtype fp32" + TRAIN.substr(TRAIN.find(' '));
    // launch name -> {ranks, arguments}
    const std::vector<std::tuple<std::string, int, std::string>> launches = {
        {"undivided", 3, TRAIN + " --steps 2 --batch 1 --ep 2"},
        {"experts", 3, TRAIN + " --steps 2 --batch 1 --ep 3"},
        {"alone", 1, TRAIN + " --steps 2 --batch 1 --ep 2"},
        // two ranks started with other flags (mpirun's MPMD form: one program line per rank): another config, more
        // steps (a hang before the flags were compared), a checkpoint directory (a hang: one rank probed it)
        {"other_config", 1, TRAIN + " --steps 2 --batch 1 : -np 1 " + TRAIN + " --steps 2 --batch 1 --config tiny"},
        {"other_steps", 1, TRAIN + " --steps 2 --batch 1 : -np 1 " + TRAIN + " --steps 2 --batch 1 --steps 3"},
        {"other_dir", 1, TRAIN + " --steps 2 --batch 1 : -np 1 " + TRAIN + " --steps 2 --batch 1 --checkpoint-dir " +
                             test_path("ep_other")},
        // a directory's path is not compared (the probe below is), but an empty one is: only rank 0 would probe
        {"empty_dir", 1, TRAIN + " --steps 2 --batch 1 --checkpoint-dir " + test_path("ep_dir") + " : -np 1 " + TRAIN +
                             " --steps 2 --batch 1 --checkpoint-dir ''"},
        // flags are parsed before MPI starts: a flag only rank 1 rejects is one line from rank 1, the same bad flag
        // on every rank one line from rank 0 (the others wait before they speak, and mpirun ends them first)
        {"rank1_flag", 1, TRAIN + " --steps 2 --batch 1 : -np 1 " + TRAIN + " --steps 2 --batch x"},
        {"every_rank_flag", 2, TRAIN + " --steps 2 --batch x"},
        // another --ep corrupted the all-to-all's buffers (MPI) or hung the first all-to-all (NCCL), before
        // anything compared the flags: both Comms compare it first
        {"ep_mismatch_mpi", 1, TRAIN + " --steps 2 --batch 1 : -np 1 " + TRAIN + " --steps 2 --batch 1 --ep 2"},
        {"ep_mismatch_nccl", 1, emulated + " --steps 2 --batch 1 : -np 1 " + emulated + " --steps 2 --batch 1 --ep 2"},
        // the Slurm variables around mpirun's one rank (MPI daemons that srun started): a launch that works
        {"under_mpirun", 1, "env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2 " + TRAIN + " --steps 1 --batch 1"},
        // ranks that do not see one checkpoint directory, as on nodes without a shared file system (here: two
        // directories): found before training
        {"unshared", 1, TRAIN + " --steps 2 --batch 1 --checkpoint-dir " + dirs + "/a : -np 1 " + TRAIN +
                            " --steps 2 --batch 1 --checkpoint-dir " + dirs + "/b"},
    };
    std::map<std::string, MpiJob> jobs;
    std::vector<std::thread> running;
    std::mutex guard;
    for (const auto& [name, ranks, args] : launches)
        running.emplace_back([&, name = name, ranks = ranks, args = args] {
            MpiJob job = mpirun(ranks, args, "ep_" + name);
            std::lock_guard<std::mutex> lock(guard);
            jobs[name] = job;
        });
    // srun without a PMI plugin that MPI uses: each task alone in a world of one (Slurm's variables, no mpirun)
    const CommandResult lone =
        run_logged("env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2 " + TRAIN + " --steps 2 --batch 1", "ep_lone.txt", 60);
    for (std::thread& t : running) t.join();

    const std::string differ = "rank 1's flags or build differ from rank 0's";
    const std::vector<std::tuple<std::string, std::string>> refusals = {
        {"undivided", "does not divide the 3 ranks"},
        {"experts", "does not divide n_routed_experts"},
        {"alone", "does not divide the 1 ranks"},
        {"other_config", differ},
        {"other_steps", differ},
        {"other_dir", differ},
        {"empty_dir", differ},
        {"rank1_flag", "[rank 1] --batch needs an integer"},
        {"every_rank_flag", "--batch needs an integer"},
        {"ep_mismatch_mpi", "the ranks were given different --ep or --pp: start every rank with the same flags"},
        {"ep_mismatch_nccl", "the ranks were given different --ep or --pp: start every rank with the same flags"},
        {"unshared", "[rank 1] --checkpoint-dir " + dirs + "/b: this rank does not see the file rank 0 created there"},
    };
    for (const auto& [name, message] : refusals) {
        const MpiJob& job = jobs.at(name);
        INFO(name << "\n" << job.err);
        CHECK(job.status != 0);
        CHECK(occurrences(job.err, message) == 1);
    }
    CHECK(jobs.at("unshared").out.find("step") == std::string::npos);
    CHECK(lone.status == 2);
    CHECK(occurrences(lone.out, "srun started 2 tasks, but MPI sees each of them alone: start them with srun --mpi=pmix") == 1);
    CHECK(jobs.at("under_mpirun").status == 0);
    system(("rm -rf " + dirs).c_str());
}
