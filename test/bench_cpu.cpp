// make bench-cpu: train_cpu's training step against the PyTorch twin training the same model from the same
// weights on the same batch, with the same number of threads, on this machine. Prints ms/step, tokens/s and the
// ratio. A benchmark, not a test: timings vary with the machine and its load, so nothing here asserts on them.
//   usage: ./bench_cpu [--config small] [--batch 8] [--seq 128] [--steps 10] [--threads N]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "data/dataloader.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "io/safetensors.h"

int main(int argc, char** argv) {
    std::string preset = "small";
    int B = 8, T = 128, steps = 10, threads = omp_get_max_threads();
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string flag = argv[i];
        if (flag == "--config") preset = argv[i + 1];
        else if (flag == "--batch") B = atoi(argv[i + 1]);
        else if (flag == "--seq") T = atoi(argv[i + 1]);
        else if (flag == "--steps") steps = atoi(argv[i + 1]);
        else if (flag == "--threads") threads = atoi(argv[i + 1]);
        else { fprintf(stderr, "bench_cpu: unknown flag %s\n", argv[i]); return 2; }
    }
    if (B < 1 || T < 2 || steps < 1 || threads < 1) { fprintf(stderr, "bench_cpu: bad sizes\n"); return 2; }
    omp_set_num_threads(threads);
    keep_freed_memory();  // as train_cpu
    try {
        Config c = load_config(preset);
        Model m;
        model_init(m, c);
        model_init_weights(m, 1337);
        DataLoader loader("data/default/train_*.bin", B, T, 0, 1, c.vocab_size);
        std::vector<int32_t> inputs((int64_t)B * T), targets((int64_t)B * T), tokens;
        loader.next_batch(inputs.data(), targets.data());
        for (int b = 0; b < B; b++) {
            tokens.insert(tokens.end(), inputs.begin() + (int64_t)b * T, inputs.begin() + (int64_t)(b + 1) * T);
            tokens.push_back(targets[(int64_t)b * T + T - 1]);
        }
        // the twin's input: the initial weights and this batch
        system("mkdir -p build/bench");
        std::ofstream("build/bench/config.json") << config_to_json(c);
        std::vector<TensorView> views;
        for (const ParamTensor& t : m.table.tensors) views.push_back({t.name, DType::F32, t.shape, m.params.data() + t.offset});
        views.push_back({"tokens", DType::I32, {B, T + 1}, tokens.data()});
        safetensors_write("build/bench/in.safetensors", views, {});

        // moe.cu: the same step as train_cpu (forward, backward, clip, AdamW, bias update), 2 untimed warm-ups
        OptimizerConfig oc;
        oc.lr = 1e-3f;
        AdamWState opt = adamw_state(m.shard);
        double seconds = 0.0, first_loss = 0.0, last_loss = 0.0;
        for (int step = 0; step < steps + 2; step++) {
            auto t0 = std::chrono::steady_clock::now();
            model_zero_grads(m);
            last_loss = model_forward(m, inputs.data(), targets.data(), B, T, true).total;
            if (step == 0) first_loss = last_loss;
            model_backward(m, 1.0f);
            model_adamw(m, opt, oc, oc.lr, clip_factor(oc, model_grad_norm(m)));
            model_update_router_bias(m, m.expert_counts);
            if (step >= 2) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        const double ms = 1000.0 * seconds / steps, tps = (double)B * T / (seconds / steps);

        // PyTorch twin
        char cmd[512];
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/python3 test/ref/bench.py build/bench/config.json build/bench/in.safetensors --steps %d "
                 "--threads %d --lr 1e-3",
                 steps, threads);
        FILE* p = popen(cmd, "r");
        if (!p) { fprintf(stderr, "bench_cpu: cannot run %s\n", cmd); return 1; }
        char line[4096] = {0};
        std::string out;
        while (fgets(line, sizeof(line), p)) out += line;
        if (pclose(p) != 0) { fprintf(stderr, "bench_cpu: the PyTorch bench failed: %s\n", cmd); return 1; }
        double torch_ms = 0.0, torch_tps = 0.0, torch_first = 0.0;
        size_t at = out.find("\"ms_per_step\": ");
        if (at != std::string::npos) torch_ms = atof(out.c_str() + at + 15);
        at = out.find("\"tokens_per_s\": ");
        if (at != std::string::npos) torch_tps = atof(out.c_str() + at + 16);
        at = out.find("\"loss_first\": ");
        if (at != std::string::npos) torch_first = atof(out.c_str() + at + 14);

        printf("bench-cpu: preset %s, batch %d x %d tokens, %d timed steps, %d threads\n", preset.c_str(), B, T, steps, threads);
        printf("| implementation | ms/step | tokens/s | first loss |\n|---|---|---|---|\n");
        printf("| moe.cu train_cpu | %.1f | %.0f | %.6f |\n", ms, tps, first_loss);
        printf("| PyTorch %s (twin) | %.1f | %.0f | %.6f |\n", "float32", torch_ms, torch_tps, torch_first);
        printf("speed ratio (moe.cu / PyTorch tokens/s): %.2f\n", torch_tps > 0 ? tps / torch_tps : 0.0);
    } catch (const std::exception& e) {
        fprintf(stderr, "bench_cpu: %s\n", e.what());
        return 1;
    }
    return 0;
}
