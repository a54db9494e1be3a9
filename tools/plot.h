// Training plots: a JSON-lines log written by ./train_cpu --log drawn as one PNG with four panels
// (loss against steps, loss against tokens, tokens/s, expert-load imbalance per MoE layer). ./plot is its CLI.
#pragma once
#include <string>

struct PlotOptions {
    bool log_scale = false;  // logarithmic y axis on the two loss panels
    int width = 1400, height = 1000;
};

// Colours of the train and validation loss curves (RGB), as the legend shows them.
constexpr unsigned char PLOT_TRAIN_RGB[3] = {31, 119, 180}, PLOT_VAL_RGB[3] = {214, 39, 40};

// Reads a JSON-lines training log and writes a PNG with four panels:
//   (a) train loss (`loss_main`, else `loss`) and validation loss (`val_loss`, markers and line) against `step`;
//   (b) the same against `tokens`;   (c) `tokens_per_s` against `step`;
//   (d) `load_imbalance` (max/mean expert load of each MoE layer) against `step`, with a dashed line at 1.
// A step that appears again (a run resumed from a checkpoint appends to the log) takes its later line. Absent,
// null, NaN and infinite values (also the words nan/inf/NaN/Infinity, which JSON lacks) are skipped; lines
// without "step" and blank lines are ignored. The PNG is written to PNG_PATH.tmp and renamed.
// Throws std::runtime_error with one line: a missing or unreadable log, no step lines, a malformed line (naming
// its line number), a size outside 1000x700 to 20000x20000, an unwritable output.
void plot_training_log(const std::string& log_path, const std::string& png_path, const PlotOptions& opt);
