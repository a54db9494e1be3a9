// The training driver shared by train_cpu and train: the command line, ranks, config, data, the training loop,
// logs, evaluation, checkpoints, Hugging Face import and export, plotting and sampling. A program picks the ranks'
// transport (make_comm) and where the arithmetic runs (make_backend, trainer/backend.h); everything else is this.
#pragma once
#include <memory>

#include "comm/comm.h"
#include "trainer/backend.h"

using MakeComm = std::unique_ptr<Comm> (*)(int ep_size, const char* program);

// Runs the program's command line; returns the exit status (a failure on any rank ends the job, non-zero).
// program names the error lines and the usage text.
int train_main(int argc, char** argv, const char* program, MakeComm make_comm, MakeBackend make_backend);
