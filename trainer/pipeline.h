// Pipeline parallelism (docs/design.md §2.1): the main blocks cut into PP stages of consecutive blocks, and the
// 1F1B schedule (PipeDream-Flush, as Megatron runs it) over one step's micro-batches. A stage runs `warmup` =
// min(PP - 1 - stage, M) forwards, then alternates one forward and one backward, then runs the backwards left:
//   stage 0  F0 F1 F2 F3 B0 F4 B1 ...           (PP = 4, M micro-batches)
//   stage 3           F0 B0 F1 B1 ...
// so a stage keeps at most min(warmup + 1, M) micro-batches' activations. Neighbours pass one message per
// micro-batch each way, through Comm::pipe_exchange: the activations forward, their gradients backward.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/comm.h"
#include "model/config.h"

// The first main block of every stage, then num_hidden_layers: PP + 1 values. split: the first blocks of stages 1 to
// PP - 1 as given (--pp-split), or empty: the cut whose slowest stage has the fewest training FLOPs per token of
// sequences of T tokens (the heads and MTP counted on the last stage). Throws one line when no cut is possible.
std::vector<int> pipeline_cut(const Config& c, int pp, const std::vector<int>& split, int T);

// One stage's part of micro-batch `micro`, kept in activation slot `slot` from its forward to its backward.
// forward: from `in` (the previous stage's message) to `out`; backward: from `dout` to `din`.
struct StageWork {
    std::function<void(int micro, int slot, const float* in, float* out)> forward;
    std::function<void(int micro, int slot, const float* dout, float* din)> backward;
};

// The four message buffers of `floats` values each: host memory, or device memory with the NCCL Comm.
struct StageMessages {
    float *in, *out, *dout, *din;
    int64_t floats;
};
// The four carved from one buffer of 4 x floats values; none (nullptr each) for a buffer of nullptr: one stage.
StageMessages stage_messages(float* buffer, int64_t floats);

// The activation slots this rank's stage uses for `micro_batches`: the most micro-batches it has in flight.
int pipeline_slots(const Comm& comm, int micro_batches);
// One step's forwards and backwards over `micro_batches` micro-batches, in the 1F1B order above. Collective over the
// pipeline; with one stage, each micro-batch's forward then its backward.
void pipeline_train(Comm& comm, int micro_batches, const StageWork& work, const StageMessages& messages);
// One forward through the stages (evaluation, sampling): receive, forward(in, out), send.
void pipeline_forward(Comm& comm, const std::function<void(const float* in, float* out)>& forward,
                      const StageMessages& messages);
