// Training plots (tools/plot.h): synthetic logs plotted and the PNG read back and looked at — size, white
// margins, where the curves are, what the log scale and a resumed log change — and the one-line errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <sys/wait.h>
#include <tuple>
#include <vector>

#include "tools/plot.h"

#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#include <stb/stb_image.h>

namespace {

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/moe_plot_XXXXXX";
        REQUIRE(mkdtemp(tmpl) != nullptr);
        path = tmpl;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string operator/(const std::string& name) const { return path + "/" + name; }
};

struct Image {
    int w = 0, h = 0;
    std::vector<unsigned char> px;
    const unsigned char* at(int x, int y) const { return &px[((size_t)y * w + x) * 3]; }
    bool is(int x, int y, const unsigned char* rgb) const {
        const unsigned char* p = at(x, y);
        return p[0] == rgb[0] && p[1] == rgb[1] && p[2] == rgb[2];
    }
    bool dark(int x, int y) const { return std::max({at(x, y)[0], at(x, y)[1], at(x, y)[2]}) < 100; }
};

Image load_png(const std::string& path) {
    Image im;
    int channels = 0;
    unsigned char* p = stbi_load(path.c_str(), &im.w, &im.h, &channels, 3);
    REQUIRE_MESSAGE(p != nullptr, "cannot read back " << path);
    im.px.assign(p, p + (size_t)im.w * im.h * 3);
    stbi_image_free(p);
    return im;
}

// The frame of the plot area inside the panel [x0, x1) x [y0, y1): the outermost dark lines longer than half
// the panel (text and tick marks are short, grid lines light).
struct Box {
    int left = -1, top = -1, right = -1, bottom = -1;
};
Box find_frame(const Image& im, int x0, int y0, int x1, int y1) {
    auto longest_run = [&](int n, const std::function<bool(int)>& dark) {
        int best = 0, run = 0;
        for (int i = 0; i < n; i++) best = std::max(best, run = dark(i) ? run + 1 : 0);
        return best;
    };
    Box b;
    for (int y = y0; y < y1; y++)
        if (longest_run(x1 - x0, [&](int i) { return im.dark(x0 + i, y); }) > (x1 - x0) / 2) {
            if (b.top < 0) b.top = y;
            b.bottom = y;
        }
    for (int x = x0; x < x1; x++)
        if (longest_run(y1 - y0, [&](int i) { return im.dark(x, y0 + i); }) > (y1 - y0) / 2) {
            if (b.left < 0) b.left = x;
            b.right = x;
        }
    return b;
}

// Mean y of the pixels of colour `rgb` strictly inside `b` with x in [xa, xb), and how many there are.
std::pair<double, int> mean_y(const Image& im, const Box& b, int xa, int xb, const unsigned char* rgb) {
    double sum = 0;
    int n = 0;
    for (int y = b.top + 1; y < b.bottom; y++)
        for (int x = std::max(xa, b.left + 1); x < std::min(xb, b.right); x++)
            if (im.is(x, y, rgb)) sum += y, n++;
    return {n ? sum / n : 0, n};
}

// One log line; NaN values are left out.
std::string log_line(int step, double loss, double val, int layers) {
    char buf[512];
    int n = snprintf(buf, sizeof(buf),
                     "{\"step\": %d, \"loss\": %.6f, \"loss_main\": %.6f, \"loss_mtp\": %.6f, \"loss_balance\": 0.0005, "
                     "\"lr\": 3e-3, \"grad_norm\": 1.2, \"tokens_per_s\": %.1f, \"tokens\": %d",
                     step, loss * 1.3, loss, loss * 1.05, 4000.0 + 50 * (step % 7), step * 256);
    std::string s(buf, n);
    if (layers > 0) {
        s += ", \"load_imbalance\": [";
        for (int l = 0; l < layers; l++) s += (l ? "," : "") + std::to_string(1.0 + (2.0 + l) / (step + 1));
        s += "]";
    }
    if (val == val) s += ", \"val_loss\": " + std::to_string(val);
    return s + "}\n";
}

double falling_loss(int step) { return 3.0 + 5.0 * std::exp(-step / 15.0) + 0.1 * ((step * 7) % 5) / 5; }

// Step t of a run with a falling loss, validation every 10 steps, `layers` MoE layers.
std::string clean_line(int t, int layers = 4) {
    return log_line(t, falling_loss(t), t % 10 ? NAN : falling_loss(t) + 0.2, layers);
}

std::string synthetic_log(int steps, int layers = 4) {
    std::string s;
    for (int t = 1; t <= steps; t++) s += clean_line(t, layers);
    return s;
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("plot: four panels, white margins, the loss curves in panel (a), falling from left to right") {
    TempDir dir;
    write_file(dir / "log.jsonl", synthetic_log(100));
    plot_training_log(dir / "log.jsonl", dir / "plot.png", PlotOptions{});
    CHECK(!std::filesystem::exists(dir / "plot.png.tmp"));
    const Image im = load_png(dir / "plot.png");
    REQUIRE(im.w == 1400);
    REQUIRE(im.h == 1000);
    const unsigned char white[3] = {255, 255, 255};
    int non_white = 0;
    for (int y = 0; y < im.h; y++)
        for (int x = 0; x < im.w; x++)
            if ((x < 6 || y < 6 || x >= im.w - 6 || y >= im.h - 6) && !im.is(x, y, white)) non_white++;
    CHECK(non_white == 0);

    // Every panel has its frame; panel (a) is the top-left quarter.
    for (int p = 0; p < 4; p++) {
        int x0 = p % 2 * 700, y0 = p / 2 * 500;
        Box b = find_frame(im, x0, y0, x0 + 700, y0 + 500);
        INFO("panel " << p);
        CHECK(b.left > x0 + 40);
        CHECK(b.right - b.left > 450);
        CHECK(b.bottom - b.top > 250);
    }
    Box a = find_frame(im, 0, 0, 700, 500);
    CHECK(mean_y(im, a, 0, 700, PLOT_TRAIN_RGB).second > 300);
    CHECK(mean_y(im, a, 0, 700, PLOT_VAL_RGB).second > 100);
    const int tenth = (a.right - a.left) / 10;
    auto [left_y, left_n] = mean_y(im, a, a.left, a.left + tenth, PLOT_TRAIN_RGB);
    auto [right_y, right_n] = mean_y(im, a, a.right - tenth, a.right, PLOT_TRAIN_RGB);
    REQUIRE(left_n > 10);
    REQUIRE(right_n > 10);
    CHECK(left_y + 0.4 * (a.bottom - a.top) < right_y);  // higher on the screen is a smaller y

    PlotOptions small;
    small.width = 1000, small.height = 700;
    plot_training_log(dir / "log.jsonl", dir / "small.png", small);
    const Image s = load_png(dir / "small.png");
    CHECK(s.w == 1000);
    CHECK(s.h == 700);
}

TEST_CASE("plot: the log scale changes the loss panels and nothing else") {
    TempDir dir;
    write_file(dir / "log.jsonl", synthetic_log(100));
    PlotOptions log_scale;
    log_scale.log_scale = true;
    plot_training_log(dir / "log.jsonl", dir / "linear.png", PlotOptions{});
    plot_training_log(dir / "log.jsonl", dir / "log.png", log_scale);
    const Image lin = load_png(dir / "linear.png"), log = load_png(dir / "log.png");
    REQUIRE(lin.px.size() == log.px.size());
    size_t half = lin.px.size() / 2, top_diff = 0, bottom_diff = 0;
    for (size_t i = 0; i < lin.px.size(); i++) (i < half ? top_diff : bottom_diff) += lin.px[i] != log.px[i];
    CHECK(top_diff > 1000);
    CHECK(bottom_diff == 0);
}

TEST_CASE("plot: a resumed log with repeated steps is drawn from the later lines") {
    TempDir dir;
    // The first run went to step 30, with a spike after step 20; the resumed run redid 21..30 and went on to 40.
    std::string first, clean = synthetic_log(40);
    for (int t = 1; t <= 30; t++) first += t <= 20 ? clean_line(t) : log_line(t, 50.0, t % 10 ? NAN : 60.0, 4);
    std::string resumed;
    for (int t = 21; t <= 40; t++) resumed += clean_line(t);
    write_file(dir / "resumed.jsonl", first + resumed);
    write_file(dir / "clean.jsonl", clean);
    plot_training_log(dir / "resumed.jsonl", dir / "resumed.png", PlotOptions{});
    plot_training_log(dir / "clean.jsonl", dir / "clean.png", PlotOptions{});
    CHECK(load_png(dir / "resumed.png").px == load_png(dir / "clean.png").px);
}

TEST_CASE("plot: one step, no val_loss, a dense model, NaN and infinity, huge ranges") {
    TempDir dir;
    PlotOptions log_scale;
    log_scale.log_scale = true;
    auto plots = [&](const std::string& text, const PlotOptions& opt) {
        write_file(dir / "log.jsonl", text);
        plot_training_log(dir / "log.jsonl", dir / "plot.png", opt);
        const Image im = load_png(dir / "plot.png");
        return im.w == opt.width && im.h == opt.height;
    };
    CHECK(plots(log_line(1, 7.0, NAN, 4), PlotOptions{}));
    CHECK(plots(log_line(1, 7.0, 7.1, 4), log_scale));
    CHECK(plots(synthetic_log(30, 0), PlotOptions{}));  // dense: no load_imbalance
    std::string no_val;
    for (int t = 1; t <= 30; t++) no_val += log_line(t, falling_loss(t), NAN, 58);
    CHECK(plots(no_val, log_scale));
    // Non-finite values as C and Python print them, nulls, and a line with nothing plottable.
    std::string odd = synthetic_log(20) +
                      "{\"step\": 21, \"loss\": nan, \"loss_main\": -nan, \"val_loss\": NaN, \"tokens_per_s\": inf, "
                      "\"tokens\": -Infinity, \"load_imbalance\": [1.5, null, Infinity, 1.2]}\n"
                      "{\"step\": 22, \"loss\": null, \"note\": \"nan inf \\\" NaN\"}\n\n";
    CHECK(plots(odd, PlotOptions{}));
    CHECK(plots(odd, log_scale));
    // Losses from 1e-8 to 1e8 (zero and negative ones, which a log axis skips), tokens to 1e15.
    std::string wide;
    for (int t = 0; t <= 16; t++) {
        char buf[160];
        snprintf(buf, sizeof(buf), "{\"step\": %d, \"loss\": %g, \"val_loss\": %g, \"tokens_per_s\": %g, \"tokens\": %g}\n",
                 t * 1000000, std::pow(10.0, 8 - t), t == 3 ? 0.0 : -1.0 + t, std::pow(10.0, t - 3), std::pow(10.0, t));
        wide += buf;
    }
    CHECK(plots(wide, PlotOptions{}));
    CHECK(plots(wide, log_scale));
    PlotOptions tiny;
    tiny.width = 1000, tiny.height = 700;
    CHECK(plots(wide, tiny));
}

TEST_CASE("plot: a missing log, a log without steps, a malformed line, an unwritable output") {
    TempDir dir;
    const PlotOptions opt;
    const std::string out = dir / "plot.png";
    std::string e = error_of([&] { plot_training_log(dir / "missing.jsonl", out, opt); });
    CHECK(e.find("cannot open the log " + dir / "missing.jsonl") != std::string::npos);
    CHECK(e.find("No such file") != std::string::npos);
    e = error_of([&] { plot_training_log(dir.path, out, opt); });
    CHECK(e.find("cannot read the log " + dir.path) != std::string::npos);

    write_file(dir / "empty.jsonl", "");
    CHECK(error_of([&] { plot_training_log(dir / "empty.jsonl", out, opt); }).find("no training steps") !=
          std::string::npos);
    write_file(dir / "nosteps.jsonl", "{\"config\": \"small\"}\n\n{\"loss\": 3}\n");
    CHECK(error_of([&] { plot_training_log(dir / "nosteps.jsonl", out, opt); }).find("no training steps") !=
          std::string::npos);

    write_file(out, "keep me");
    const std::string good = synthetic_log(2);
    for (const auto& [text, expect] : std::vector<std::pair<std::string, std::string>>{
             {good + "{\"step\": 3, \"loss\": 1.5,\n", "line 3: malformed JSON: {\"step\": 3, \"loss\": 1.5,"},
             {good + "\n[1, 2]\n", "line 4: not a JSON object"},
             {"{\"step\": \"one\", \"loss\": 2}\n", "line 1: \"step\" is not a number"},
             {good + "{\"step\": 3, \"loss\": \"low\"}\n", "line 3: \"loss\" is not a number"},
             {good + "{\"step\": 3, \"load_imbalance\": 1.5}\n", "line 3: \"load_imbalance\" is not a list"}}) {
        write_file(dir / "bad.jsonl", text);
        e = error_of([&] { plot_training_log(dir / "bad.jsonl", out, opt); });
        INFO("error: " << e);
        CHECK(e.find(dir / "bad.jsonl " + expect) != std::string::npos);
        CHECK(e.find('\n') == std::string::npos);
    }
    std::ifstream kept(out);
    CHECK(std::string(std::istreambuf_iterator<char>(kept), {}) == "keep me");  // failures leave the output be

    write_file(dir / "good.jsonl", good);
    e = error_of([&] { plot_training_log(dir / "good.jsonl", dir / "no/such/dir/plot.png", opt); });
    CHECK(e.find("cannot write " + dir / "no/such/dir/plot.png") != std::string::npos);
    e = error_of([&] { plot_training_log(dir / "good.jsonl", dir.path, opt); });  // a directory: rename fails
    CHECK(e.find("cannot write " + dir.path) != std::string::npos);
    CHECK(!std::filesystem::exists(dir.path + ".tmp"));
    PlotOptions too_small;
    too_small.width = 100;
    CHECK(error_of([&] { plot_training_log(dir / "good.jsonl", out, too_small); }).find("plot size") !=
          std::string::npos);
}

TEST_CASE("plot: ./plot writes the PNG, --help, and one-line errors with exit 1 or 2") {
    REQUIRE_MESSAGE(std::filesystem::exists("./plot"), "./plot is not built (make plot)");
    TempDir dir;
    write_file(dir / "log.jsonl", synthetic_log(20));
    auto run = [&](const std::string& args, std::string* err = nullptr) {
        int rc = system(("timeout 60 ./plot " + args + " > " + dir / "stdout" + " 2> " + dir / "stderr").c_str());
        std::ifstream f(dir / "stderr");
        if (err) *err = std::string(std::istreambuf_iterator<char>(f), {});
        return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
    };
    CHECK(run("--log " + dir / "log.jsonl" + " --out " + dir / "a.png" + " --log-scale") == 0);
    CHECK(load_png(dir / "a.png").w == 1400);
    CHECK(run("--help") == 0);
    for (const auto& [args, status, expect] : std::vector<std::tuple<std::string, int, std::string>>{
             {"--bogus 1", 2, "unknown flag --bogus"},
             {"--log " + dir / "log.jsonl", 2, "--out FILE.png is required"},
             {"--out x.png", 2, "--log FILE.jsonl is required"},
             {"--log", 2, "--log needs a value"},
             {"stray", 2, "unexpected argument 'stray'"},
             {"--log " + dir / "missing.jsonl" + " --out " + dir / "b.png", 1, "cannot open the log"}}) {
        std::string err;
        CHECK(run(args, &err) == status);
        INFO("stderr: " << err);
        CHECK(err.find(expect) != std::string::npos);
        CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    }
}
