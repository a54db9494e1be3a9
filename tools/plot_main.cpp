// ./plot: the training plots of a JSON-lines log (./train_cpu --log) as one PNG; see tools/plot.h.
// Bad flags exit 2 and a log or output that fails exits 1, each with one line on stderr.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "tools/plot.h"

static const char* USAGE =
    "usage: %s --log FILE.jsonl --out FILE.png [--log-scale]\n"
    "  --log FILE     the JSON-lines log of ./train_cpu --log\n"
    "  --out FILE     the PNG to write: (a) loss against steps, (b) loss against tokens, (c) tokens/s,\n"
    "                 (d) expert load imbalance of each MoE layer\n"
    "  --log-scale    logarithmic y axis for the loss panels\n"
    "  --help         this text\n";

[[noreturn]] static void bad(const char* program, const std::string& msg) {
    fprintf(stderr, "%s: %s (see --help)\n", program, msg.c_str());
    exit(2);
}

int main(int argc, char** argv) {
    std::string log, out;
    PlotOptions opt;
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            printf(USAGE, argv[0]);
            return 0;
        }
        if (!strcmp(flag, "--log-scale")) {
            opt.log_scale = true;
            continue;
        }
        if (strcmp(flag, "--log") && strcmp(flag, "--out"))
            bad(argv[0], strncmp(flag, "--", 2) ? std::string("unexpected argument '") + flag + "'"
                                                : std::string("unknown flag ") + flag);
        if (i + 1 >= argc || !argv[i + 1][0]) bad(argv[0], std::string(flag) + " needs a value");
        (strcmp(flag, "--log") ? out : log) = argv[++i];
    }
    if (log.empty()) bad(argv[0], "--log FILE.jsonl is required");
    if (out.empty()) bad(argv[0], "--out FILE.png is required");
    try {
        plot_training_log(log, out, opt);
    } catch (const std::exception& e) {
        fprintf(stderr, "%s: %s\n", argv[0], e.what());
        return 1;
    }
    printf("wrote %s\n", out.c_str());
    return 0;
}
