// The CPU backend of the shared trainer: the reference model of model/model.h, in fp32 with OpenMP, computing on
// the host Model itself.
#pragma once
#include <memory>

#include "trainer/backend.h"

// Reserves the activations of an args.batch x args.seq batch now; refuses --dtype bf16 (std::runtime_error).
// --dtype fp8 runs the linear layers inside the blocks on E4M3-rounded operands (model/fp8.h).
std::unique_ptr<Backend> make_cpu_backend(Model& m, const TrainArgs& args);
