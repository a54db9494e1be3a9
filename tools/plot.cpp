// Training plots (see plot.h): the JSON-lines log of ./train_cpu --log drawn as a PNG of four panels. Everything
// is drawn here on an RGB canvas: 2 px lines, markers, 1-2-5 ticks (decades and 2x/5x on a log axis), legends,
// and text in our own 5x9 bitmap font drawn 2x. stb_image_write encodes the PNG; nlohmann/json parses the lines.
#include "tools/plot.h"
#include "io/files.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <nlohmann/json.hpp>
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

namespace {

// ---- Font: printable ASCII 32..126, 5 px wide, 9 rows (7 above the baseline, 2 for descenders). One hex pair per
// row from the top, bit 4 the leftmost pixel; rows left out are blank.
const char* const FONT[95] = {
    "", "04040404040004", "0A0A0A", "0A0A1F0A1F0A0A", "040F140E051E04", "18190204081303", "0C12140815120D", "040408",
    "02040808080402", "08040202020408", "0004150E1504", "0004041F0404", "00000000000C0408", "0000001F",
    "00000000000C0C", "000102040810", "0E11131519110E", "040C040404040E", "0E11010204081F", "1F02040201110E",
    "02060A121F0202", "1F101E0101110E", "0608101E11110E", "1F010204080808", "0E11110E11110E", "0E11110F01020C",
    "000C0C000C0C", "000C0C000C0408", "02040810080402", "00001F001F", "08040201020408", "0E110102040004",
    "0E11010D15150E", "0E11111F111111", "1E11111E11111E", "0E11101010110E", "1C12111111121C", "1F10101E10101F",
    "1F10101E101010", "0E11101711110F", "1111111F111111", "0E04040404040E", "0702020202120C", "11121418141211",
    "1010101010101F", "111B1515111111", "11111915131111", "0E11111111110E", "1E11111E101010", "0E11111115120D",
    "1E11111E141211", "0F10100E01011E", "1F040404040404", "1111111111110E", "11111111110A04", "1111111515150A",
    "11110A040A1111", "11110A04040404", "1F01020408101F", "0E08080808080E", "001008040201", "0E02020202020E",
    "040A11", "000000000000001F", "0804", "00000E010F110F", "1010161911111E", "00000E1010110E", "01010D1311110F",
    "00000E111F100E", "0609081C080808", "00000F1111130D010E", "10101619111111", "04000C0404040E",
    "02000602020202120C", "10101214181412", "0C04040404040E", "00001A15151111", "00001619111111", "00000E1111110E",
    "0000161911111E1010", "00000D1311110F0101", "00001619101010", "00000F100E011E", "08081C08080906",
    "0000111111130D", "00001111110A04", "0000111115150A", "0000110A040A11", "0000111111130D010E", "00001F0204081F",
    "03040408040403", "04040404040404", "18040402040418", "0000081502"
};
constexpr int SCALE = 2, ADVANCE = 6 * SCALE, TEXT_H = 9 * SCALE;

int text_width(const std::string& s) { return s.empty() ? 0 : (int)s.size() * ADVANCE - SCALE; }

struct Rgb {
    uint8_t r, g, b;
};
const Rgb INK{30, 30, 30}, GRID{228, 228, 228}, REF{110, 110, 110};
const Rgb TRAIN{PLOT_TRAIN_RGB[0], PLOT_TRAIN_RGB[1], PLOT_TRAIN_RGB[2]};
const Rgb VAL{PLOT_VAL_RGB[0], PLOT_VAL_RGB[1], PLOT_VAL_RGB[2]};
const Rgb PALETTE[10] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189},
                         {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};

struct Canvas {
    int w, h;
    std::vector<uint8_t> px;
    int clip[4];  // drawing is limited to x in [clip[0], clip[2]), y in [clip[1], clip[3])

    Canvas(int w, int h) : w(w), h(h), px((size_t)w * h * 3, 255), clip{0, 0, w, h} {}
    void fill(int x0, int y0, int x1, int y1, Rgb c) {  // the rectangle [x0, x1) x [y0, y1)
        for (int y = std::max(y0, clip[1]); y < std::min(y1, clip[3]); y++)
            for (int x = std::max(x0, clip[0]); x < std::min(x1, clip[2]); x++) {
                uint8_t* p = &px[((size_t)y * w + x) * 3];
                p[0] = c.r, p[1] = c.g, p[2] = c.b;
            }
    }
    // A line `thick` px wide; with dash > 0, dash px drawn and dash px left out in turn.
    void line(double x0, double y0, double x1, double y1, Rgb c, int thick = 2, int dash = 0) {
        int n = std::max(1, (int)std::ceil(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0))));
        for (int i = 0; i <= n; i++) {
            if (dash && (i / dash) % 2) continue;
            int x = (int)std::lround(x0 + (x1 - x0) * i / n - 0.5 * (thick - 1));
            int y = (int)std::lround(y0 + (y1 - y0) * i / n - 0.5 * (thick - 1));
            fill(x, y, x + thick, y + thick, c);
        }
    }
    void disc(double cx, double cy, double r, Rgb c) {
        for (int y = (int)std::floor(cy - r); y <= (int)std::ceil(cy + r); y++)
            for (int x = (int)std::floor(cx - r); x <= (int)std::ceil(cx + r); x++)
                if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= r * r) fill(x, y, x + 1, y + 1, c);
    }
    // Text with its top left at (x, y); vertical text reads upwards and starts at its bottom left (x, y).
    void text(int x, int y, const std::string& s, Rgb c, bool vertical = false) {
        for (size_t i = 0; i < s.size(); i++) {
            unsigned ch = (unsigned char)s[i];
            const char* g = FONT[(ch >= 32 && ch < 127 ? ch : '?') - 32];
            for (int row = 0; g[2 * row]; row++) {
                int bits = (int)std::strtol(std::string(g + 2 * row, 2).c_str(), nullptr, 16);
                for (int col = 0; col < 5; col++) {
                    if (!(bits >> (4 - col) & 1)) continue;
                    int along = (int)i * ADVANCE + col * SCALE, across = row * SCALE;
                    if (vertical) fill(x + across, y - along - SCALE, x + across + SCALE, y - along, c);
                    else fill(x + along, y + across, x + along + SCALE, y + across + SCALE, c);
                }
            }
        }
    }
};

// ---- Axes
struct Axis {
    double lo, hi;
    bool log;
    std::vector<double> ticks;
    std::vector<std::string> labels;
    double frac(double v) const { return log ? std::log(v / lo) / std::log(hi / lo) : (v - lo) / (hi - lo); }
};

// The smallest 1, 2 or 5 x 10^k that is at least x.
double nice_step(double x) {
    double p = std::pow(10.0, std::floor(std::log10(x)));
    for (double m : {1.0, 2.0, 5.0})
        if (m * p >= x * (1 - 1e-9)) return m * p;
    return 10 * p;
}

// A tick label to the precision that `step` needs; `mag` (the largest value on the axis) picks the form:
// plain, k/M/G/T from 10^4, or an exponent below 10^-3 and from 10^15.
std::string format_number(double v, double step, double mag) {
    if (v == 0) return "0";
    char buf[64];
    if (mag >= 1e15 || mag < 1e-3) {
        int dec = (int)std::floor(std::log10(std::fabs(v))) - (int)std::floor(std::log10(step) + 1e-9);
        snprintf(buf, sizeof(buf), "%.*e", std::clamp(dec, 0, 6), v);
        std::string mantissa(buf, std::strchr(buf, 'e'));  // 2.50e+15 -> 2.5e15
        if (mantissa.find('.') != std::string::npos) mantissa.erase(mantissa.find_last_not_of("0.") + 1);
        return mantissa + "e" + std::to_string(std::atoi(std::strchr(buf, 'e') + 1));
    }
    static const char* const SUFFIX[] = {"", "k", "M", "G", "T"};
    int k = mag >= 1e4 ? std::min(4, (int)std::floor(std::log10(mag)) / 3) : 0;
    double unit = std::pow(1000.0, k);
    int dec = -(int)std::floor(std::log10(step / unit) + 1e-9);
    snprintf(buf, sizeof(buf), "%.*f%s", std::clamp(dec, 0, 9), v / unit, SUFFIX[k]);
    return buf;
}

// Multiples of a 1-2-5 step inside [lo, hi]: at most max_ticks + 1 of them.
void linear_ticks(Axis& a, int max_ticks) {
    double step = nice_step((a.hi - a.lo) / max_ticks);
    for (double k = std::ceil(a.lo / step); k * step <= a.hi; k++) a.ticks.push_back(k * step + 0.0);  // no -0
    double mag = std::max(std::fabs(a.lo), std::fabs(a.hi));
    for (double t : a.ticks) a.labels.push_back(format_number(t, step, mag));
}

// An axis over the data range [lo, hi], padded a little so that no curve lies on the frame.
Axis make_axis(double lo, double hi, bool log, int max_ticks) {
    Axis a{lo, hi, log, {}, {}};
    if (log) {
        a.hi = std::clamp(a.hi, 1e-250, 1e300), a.lo = std::clamp(a.lo, a.hi * 1e-30, a.hi);  // finite, 30 decades
        if (a.hi < a.lo * 1.001) a.lo /= 1.5, a.hi *= 1.5;
        double pad = std::pow(a.hi / a.lo, 0.04);
        a.lo /= pad, a.hi *= pad;
        // Decades (every stride-th of many), else 1-2-5 per decade, else 1..9: the first that gives 3 ticks.
        int e0 = (int)std::floor(std::log10(a.lo)), e1 = (int)std::ceil(std::log10(a.hi));
        int stride = std::max(1, (e1 - e0 + max_ticks) / max_ticks);
        for (std::vector<int> mantissas : {std::vector<int>{1}, {1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
            std::vector<double> t;
            for (int e = e0; e <= e1; e++)
                for (int m : mantissas) {
                    double v = m * std::pow(10.0, e);
                    if (v >= a.lo && v <= a.hi && (mantissas.size() > 1 || (e % stride + stride) % stride == 0))
                        t.push_back(v);
                }
            if (t.size() >= 3 && (int)t.size() <= max_ticks + 1) {
                a.ticks = t;
                for (double v : t) a.labels.push_back(format_number(v, v, v));
                return a;
            }
        }
        linear_ticks(a, max_ticks);  // a range of less than about 3x
        return a;
    }
    if (hi - lo <= 1e-9 * std::max(std::fabs(lo), std::fabs(hi))) {
        double d = lo == 0 ? 1 : 0.1 * std::fabs(lo);
        a.lo -= d, a.hi += d;
    }
    double pad = 0.04 * (a.hi - a.lo);
    a.lo -= pad, a.hi += pad;
    linear_ticks(a, max_ticks);
    return a;
}

// ---- Panels
struct Series {
    std::string label;  // empty: not in the legend
    Rgb color;
    bool markers = false;
    std::vector<double> x{}, y{};
    void add(double px, double py) {
        if (std::isfinite(px) && std::isfinite(py)) x.push_back(px), y.push_back(py);
    }
};

struct Panel {
    std::string title, xlabel, ylabel, empty_note;
    bool log_y = false;
    std::vector<Series> series;
    double ref_y = NAN;  // a dashed horizontal line, in the legend as ref_label
    std::string ref_label{};
};

constexpr int LEGEND_ROW = 22, SWATCH = 28;

void draw_panel(Canvas& c, const Panel& p, int x0, int y0, int w, int h) {
    // The legend: entries flow into right-aligned rows under the title.
    struct Entry {
        std::string label;
        Rgb color;
        bool markers, dashed;
    };
    std::vector<Entry> entries;
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (const Series& s : p.series) {
        bool any = false;
        for (size_t i = 0; i < s.x.size(); i++) {
            if (p.log_y && s.y[i] <= 0) continue;
            xmin = std::min(xmin, s.x[i]), xmax = std::max(xmax, s.x[i]);
            ymin = std::min(ymin, s.y[i]), ymax = std::max(ymax, s.y[i]);
            any = true;
        }
        if (any && !s.label.empty()) entries.push_back({s.label, s.color, s.markers, false});
    }
    const bool empty = xmin > xmax;
    if (!empty && std::isfinite(p.ref_y)) {
        ymin = std::min(ymin, p.ref_y), ymax = std::max(ymax, p.ref_y);
        entries.push_back({p.ref_label, REF, false, true});
    }
    const int right = x0 + w - 24, legend_top = y0 + 12 + TEXT_H + 8;
    auto entry_w = [](const Entry& e) { return SWATCH + 8 + text_width(e.label) + 24; };
    std::vector<std::vector<Entry>> rows(1);
    int row_w = 0;
    for (const Entry& e : entries) {
        int ew = entry_w(e);
        if (row_w + ew > w - 74 && !rows.back().empty()) rows.emplace_back(), row_w = 0;
        rows.back().push_back(e), row_w += ew;
    }
    const int top = legend_top + (int)(entries.empty() ? 0 : rows.size()) * LEGEND_ROW + 6;
    const int bottom = y0 + h - 66;

    // Axes: the y ticks decide the left margin; x ticks are thinned until their labels fit.
    Axis ya{0, 1, false, {}, {}}, xa{0, 1, false, {}, {}};
    int label_w = 0;
    if (!empty) {
        ya = make_axis(ymin, ymax, p.log_y, std::max(3, (bottom - top) / 40));
        for (const std::string& s : ya.labels) label_w = std::max(label_w, text_width(s));
    }
    const int left = x0 + 12 + TEXT_H + 10 + label_w + 12;
    if (!empty) {
        for (int n = std::max(3, (right - left) / 80);; n--) {
            xa = make_axis(xmin, xmax, false, n);
            int widest = 0;
            for (const std::string& s : xa.labels) widest = std::max(widest, text_width(s));
            double gap = xa.ticks.size() > 1 ? (xa.ticks[1] - xa.ticks[0]) / (xa.hi - xa.lo) * (right - left) : w;
            if (widest + 16 <= gap || n <= 2) break;
        }
    }
    auto X = [&](double v) { return left + xa.frac(v) * (right - left); };
    auto Y = [&](double v) { return bottom - ya.frac(v) * (bottom - top); };

    // Title, axis labels, legend.
    int tx = x0 + (w - text_width(p.title)) / 2;
    c.text(tx, y0 + 12, p.title, INK), c.text(tx + 1, y0 + 12, p.title, INK);
    c.text((left + right - text_width(p.xlabel)) / 2, bottom + 40, p.xlabel, INK);
    const int yl = text_width(p.ylabel);  // centred on the frame, but kept under the title if the frame is short
    c.text(x0 + 12, std::min(std::max((top + bottom + yl) / 2, legend_top + yl), y0 + h - 8), p.ylabel, INK, true);
    for (size_t r = 0; r < rows.size(); r++) {
        int width = 0;
        for (const Entry& e : rows[r]) width += entry_w(e);
        int x = right - width + 24, y = legend_top + (int)r * LEGEND_ROW;
        for (const Entry& e : rows[r]) {
            c.line(x, y + 7, x + SWATCH, y + 7, e.color, 2, e.dashed ? 6 : 0);
            if (e.markers) c.disc(x + SWATCH / 2.0, y + 7.5, 4.5, e.color);
            c.text(x + SWATCH + 8, y, e.label, INK);
            x += entry_w(e);
        }
    }

    // Grid, ticks and their labels, the data clipped to the frame, then the frame.
    for (size_t i = 0; i < xa.ticks.size(); i++) {
        int x = (int)std::lround(X(xa.ticks[i]));
        c.fill(x, top, x + 1, bottom, GRID), c.fill(x, bottom, x + 1, bottom + 6, INK);
        int lw = text_width(xa.labels[i]);
        c.text(std::min(x - lw / 2, x0 + w - 4 - lw), bottom + 12, xa.labels[i], INK);
    }
    for (size_t i = 0; i < ya.ticks.size(); i++) {
        int y = (int)std::lround(Y(ya.ticks[i]));
        c.fill(left, y, right, y + 1, GRID), c.fill(left - 6, y, left, y + 1, INK);
        c.text(left - 12 - text_width(ya.labels[i]), y - 7, ya.labels[i], INK);
    }
    if (empty) c.text((left + right - text_width(p.empty_note)) / 2, (top + bottom) / 2 - 7, p.empty_note, INK);
    const int saved[4] = {c.clip[0], c.clip[1], c.clip[2], c.clip[3]};
    c.clip[0] = left + 1, c.clip[1] = top + 1, c.clip[2] = right, c.clip[3] = bottom;
    if (!empty && std::isfinite(p.ref_y)) c.line(left, Y(p.ref_y), right, Y(p.ref_y), REF, 2, 8);
    for (const Series& s : p.series) {
        double px = NAN, py = NAN;  // the previous point drawn
        size_t shown = 0;
        for (size_t i = 0; i < s.x.size(); i++) {
            if (p.log_y && s.y[i] <= 0) continue;
            double x = X(s.x[i]), y = Y(s.y[i]);
            if (shown++) c.line(px, py, x, y, s.color);
            px = x, py = y;
        }
        for (size_t i = 0; i < s.x.size() && (s.markers || shown == 1); i++)
            if (!p.log_y || s.y[i] > 0) c.disc(X(s.x[i]), Y(s.y[i]), 4.5, s.color);
    }
    std::copy(saved, saved + 4, c.clip);
    c.fill(left, top, right + 1, top + 1, INK), c.fill(left, bottom, right + 1, bottom + 1, INK);
    c.fill(left, top, left + 1, bottom + 1, INK), c.fill(right, top, right + 1, bottom + 1, INK);
}

// ---- The log
struct StepLine {
    double loss, val, tokens_per_s, tokens;
    std::vector<double> imbalance;
};

// JSON has no NaN or infinity, but C's printf writes nan and inf and Python's json NaN and Infinity: outside
// strings such words (and their sign) become null, which is skipped like an absent value.
std::string non_finite_to_null(const std::string& s) {
    std::string out;
    bool in_string = false;
    for (size_t i = 0; i < s.size(); i++) {
        if (in_string && s[i] == '\\' && i + 1 < s.size()) {
            out += s.substr(i++, 2);
            continue;
        }
        if (!in_string && std::isalpha((unsigned char)s[i])) {
            size_t j = i;
            while (j < s.size() && std::isalpha((unsigned char)s[j])) j++;
            std::string word = s.substr(i, j - i), lower = word;
            for (char& ch : lower) ch = (char)std::tolower((unsigned char)ch);
            bool non_finite = lower == "nan" || lower == "inf" || lower == "infinity";
            if (non_finite && !out.empty() && (out.back() == '-' || out.back() == '+')) out.pop_back();
            out += non_finite ? "null" : word;
            i = j - 1;
            continue;
        }
        if (s[i] == '"') in_string = !in_string;
        out += s[i];
    }
    return out;
}

// A number, or NaN when null, non-finite or absurdly large; anything else is an error naming `where`.
double as_number(const nlohmann::json& v, const std::string& what, const std::string& where) {
    if (v.is_null()) return NAN;
    if (!v.is_number()) throw std::runtime_error(where + ": \"" + what + "\" is not a number");
    double d = v.get<double>();
    return std::isfinite(d) && std::fabs(d) < 1e300 ? d : NAN;
}

double field(const nlohmann::json& j, const char* key, const std::string& where) {
    auto it = j.find(key);
    return it == j.end() ? NAN : as_number(*it, key, where);
}

// The step lines by step number; a later line of the same step (a resumed run) replaces the earlier one.
std::map<double, StepLine> read_log(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)))  // /dev/zero would never end
        throw std::runtime_error("the log " + path + " is a device, not a file");
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open the log " + path + ": " + std::strerror(errno));
    errno = 0;
    std::map<double, StepLine> steps;
    std::string line;
    for (long n = 1; std::getline(f, line); n++) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = path + " line " + std::to_string(n);
        nlohmann::json j = nlohmann::json::parse(non_finite_to_null(line), nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
            std::string start = line.substr(0, 40) + (line.size() > 40 ? "..." : "");
            for (char& ch : start) ch = std::isprint((unsigned char)ch) ? ch : '?';
            throw std::runtime_error(where + (j.is_discarded() ? ": malformed JSON: " : ": not a JSON object: ") + start);
        }
        if (!j.contains("step")) continue;
        double step = field(j, "step", where);
        if (std::isnan(step)) throw std::runtime_error(where + ": \"step\" is not a finite number");
        StepLine s{field(j, "loss_main", where), field(j, "val_loss", where), field(j, "tokens_per_s", where),
                   field(j, "tokens", where), {}};
        if (std::isnan(s.loss)) s.loss = field(j, "loss", where);
        auto imb = j.find("load_imbalance");
        if (imb != j.end() && !imb->is_null()) {
            if (!imb->is_array()) throw std::runtime_error(where + ": \"load_imbalance\" is not a list");
            for (const nlohmann::json& v : *imb) s.imbalance.push_back(as_number(v, "load_imbalance", where));
        }
        steps[step] = std::move(s);
    }
    if (f.bad() || !f.eof())
        throw std::runtime_error("cannot read the log " + path + (errno ? ": " + std::string(std::strerror(errno)) : ""));
    if (steps.empty()) throw std::runtime_error(path + ": no training steps (no JSON line with a \"step\")");
    return steps;
}

void write_png_atomically(const Canvas& c, const std::string& path) {
    std::string png;
    auto append = [](void* ctx, void* data, int size) { static_cast<std::string*>(ctx)->append((char*)data, size); };
    if (!stbi_write_png_to_func(append, &png, c.w, c.h, 3, c.px.data(), c.w * 3))
        throw std::runtime_error("cannot encode the PNG for " + path);
    write_file_atomic(path, png);
}

}  // namespace

void plot_training_log(const std::string& log_path, const std::string& png_path, const PlotOptions& opt) {
    if (opt.width < 1000 || opt.height < 700 || opt.width > 20000 || opt.height > 20000)
        throw std::runtime_error("the plot size must be between 1000x700 and 20000x20000, got " +
                                 std::to_string(opt.width) + "x" + std::to_string(opt.height));
    const std::map<double, StepLine> steps = read_log(log_path);
    const std::string scale = opt.log_scale ? " (log scale)" : "";
    Panel a{"(a) loss against steps" + scale, "step", "loss (nats)", "no loss values in the log", opt.log_scale,
            {{"train", TRAIN}, {"validation", VAL, true}}};
    Panel b = a;
    b.title = "(b) loss against tokens" + scale, b.xlabel = "tokens";
    Panel c{"(c) throughput", "step", "tokens/s", "no tokens_per_s values in the log", false, {{"train", PALETTE[2]}}};
    Panel d{"(d) expert load imbalance", "step", "max/mean load", "no load_imbalance values in the log", false, {},
            1.0, "balanced = 1"};
    size_t layers = 0;
    for (const auto& [step, s] : steps) layers = std::max(layers, s.imbalance.size());
    for (size_t l = 0; l < layers; l++) {  // beyond 10 layers a blue-to-orange ramp, 3 of them named
        double t = layers > 1 ? (double)l / (layers - 1) : 0;
        Rgb ramp{(uint8_t)(40 + 190 * t), (uint8_t)(70 + 40 * t), (uint8_t)(200 - 180 * t)};
        bool named = layers <= 10 || l == 0 || l == layers / 2 || l == layers - 1;
        d.series.push_back({named ? "MoE layer " + std::to_string(l + 1) : "", layers <= 10 ? PALETTE[l] : ramp});
    }
    for (const auto& [step, s] : steps) {
        a.series[0].add(step, s.loss), a.series[1].add(step, s.val);
        b.series[0].add(s.tokens, s.loss), b.series[1].add(s.tokens, s.val);
        c.series[0].add(step, s.tokens_per_s);
        for (size_t l = 0; l < s.imbalance.size(); l++) d.series[l].add(step, s.imbalance[l]);
    }
    Canvas canvas(opt.width, opt.height);
    const int hw = opt.width / 2, hh = opt.height / 2;
    draw_panel(canvas, a, 0, 0, hw, hh);
    draw_panel(canvas, b, hw, 0, opt.width - hw, hh);
    draw_panel(canvas, c, 0, hh, hw, opt.height - hh);
    draw_panel(canvas, d, hw, hh, opt.width - hw, opt.height - hh);
    write_png_atomically(canvas, png_path);
}
