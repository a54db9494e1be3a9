// The stage cut and the 1F1B schedule (see pipeline.h).
#include "trainer/pipeline.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "trainer/plan.h"

std::vector<int> pipeline_cut(const Config& c, int pp, const std::vector<int>& split, int T) {
    const int L = c.num_hidden_layers;
    if (pp > L)
        throw std::runtime_error("--pp " + std::to_string(pp) + " exceeds the model's " + std::to_string(L) +
                                 " layers: every pipeline stage needs a block");
    std::vector<int> first(pp + 1, L);
    first[0] = 0;
    if (!split.empty()) {
        if ((int)split.size() != pp - 1)
            throw std::runtime_error("--pp-split gives " + std::to_string(split.size()) + " layers; --pp " +
                                     std::to_string(pp) + " needs " + std::to_string(pp - 1));
        std::copy(split.begin(), split.end(), first.begin() + 1);
        for (int s = 0; s < pp; s++)
            if (first[s] >= first[s + 1])
                throw std::runtime_error("--pp-split leaves stage " + std::to_string(s) + " without a block (give " +
                                         "rising layers between 1 and " + std::to_string(L - 1) + ")");
        return first;
    }
    // cost[s][l]: the least cost of the slowest of stages 0..s holding blocks [0, l); from[s][l]: stage s's first block
    std::vector<double> prefix(L + 1, 0.0);
    for (int l = 0; l < L; l++) prefix[l + 1] = prefix[l] + block_flops_per_token(c, l, T);
    const double heads = heads_flops_per_token(c, T);
    const double none = 1e300;
    std::vector<std::vector<double>> cost(pp, std::vector<double>(L + 1, none));
    std::vector<std::vector<int>> from(pp, std::vector<int>(L + 1, 0));
    for (int l = 1; l <= L; l++) cost[0][l] = prefix[l] + (pp == 1 && l == L ? heads : 0);
    for (int s = 1; s < pp; s++)
        for (int l = s + 1; l <= L; l++)
            for (int j = s; j < l; j++) {
                const double stage = prefix[l] - prefix[j] + (s == pp - 1 && l == L ? heads : 0);
                const double slowest = std::max(cost[s - 1][j], stage);
                if (slowest < cost[s][l]) {
                    cost[s][l] = slowest;
                    from[s][l] = j;
                }
            }
    for (int s = pp - 1; s > 0; s--) first[s] = from[s][first[s + 1]];
    return first;
}

StageMessages stage_messages(float* buffer, int64_t floats) {
    if (!buffer) return StageMessages{};
    return {buffer, buffer + floats, buffer + 2 * floats, buffer + 3 * floats, floats};
}

int pipeline_slots(const Comm& comm, int micro_batches) {
    return std::min(comm.pp_size - comm.pp_rank, micro_batches);
}

// The transfers of one point in a schedule, posted together; none across a missing neighbour.
static void exchange(Comm& comm, const StageMessages& m, bool send_forward, bool receive_forward, bool send_backward,
                     bool receive_backward) {
    const int stage = comm.pp_rank;
    const bool first = stage == 0, last = stage == comm.pp_size - 1;
    PipeTransfer t[4];
    int n = 0;
    if (send_forward && !last) t[n++] = {m.out, m.floats, stage + 1, true};
    if (receive_backward && !last) t[n++] = {m.dout, m.floats, stage + 1, false};
    if (send_backward && !first) t[n++] = {m.din, m.floats, stage - 1, true};
    if (receive_forward && !first) t[n++] = {m.in, m.floats, stage - 1, false};
    if (n > 0) comm.pipe_exchange(t, n);
}

void pipeline_train(Comm& comm, int micro_batches, const StageWork& work, const StageMessages& m) {
    const int M = micro_batches;
    const int warmup = std::min(comm.pp_size - 1 - comm.pp_rank, M), slots = pipeline_slots(comm, M);
    int forwards = 0, backwards = 0;
    auto forward = [&] {
        work.forward(forwards, forwards % slots, m.in, m.out);
        forwards++;
    };
    auto backward = [&] {
        work.backward(backwards, backwards % slots, m.dout, m.din);
        backwards++;
    };
    for (int i = 0; i < warmup; i++) {  // forwards only, filling the pipeline
        exchange(comm, m, false, true, false, false);
        forward();
        exchange(comm, m, true, false, false, false);
    }
    if (warmup < M) exchange(comm, m, false, true, false, false);
    for (int i = warmup; i < M; i++) {  // one forward, one backward
        forward();
        exchange(comm, m, true, false, false, true);
        backward();
        exchange(comm, m, false, i + 1 < M, true, false);
    }
    for (int i = 0; i < warmup; i++) {  // backwards only, draining it
        exchange(comm, m, false, false, false, true);
        backward();
        exchange(comm, m, false, false, true, false);
    }
}

void pipeline_forward(Comm& comm, const std::function<void(const float* in, float* out)>& forward,
                      const StageMessages& m) {
    exchange(comm, m, false, true, false, false);
    forward(m.in, m.out);
    exchange(comm, m, true, false, false, false);
}
