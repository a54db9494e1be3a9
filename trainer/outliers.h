// Loss spikes, in the manner of llm.c's outlier detector: the mean m and standard deviation s of the last WINDOW
// values of a series (the loss, the gradient norm), and a new value's z = (x - m) / s against them. A training step
// whose loss or norm lies OUTLIER_Z deviations above its recent past is reported (trainer/run.cpp log_step), and
// with --skip-spikes Z one Z deviations above is not applied. A slow divergence has no spike: the mean of the last
// WINDOW losses rising DIVERGENCE_NATS above the lowest such mean of the run is reported too.
#pragma once
#include <cmath>
#include <deque>

constexpr int OUTLIER_WINDOW = 128;
constexpr double OUTLIER_Z = 5.0;
constexpr double DIVERGENCE_NATS = 1.0;

class OutlierDetector {
public:
    struct Score {
        double z = NAN, mean = NAN, deviation = NAN;  // NaN until the window is full (z also when s is about 0)
        double rise = NAN;                             // mean - the lowest mean of the windows before
    };
    // x against the WINDOW values before it (two passes over them); then x joins them, and the oldest leaves.
    Score update(double x) {
        Score s;
        if ((int)values_.size() == OUTLIER_WINDOW) {
            double sum = 0.0, squares = 0.0;
            for (double v : values_) sum += v;
            s.mean = sum / OUTLIER_WINDOW;
            for (double v : values_) squares += (v - s.mean) * (v - s.mean);
            s.deviation = std::sqrt(squares / OUTLIER_WINDOW);
            if (s.deviation > 1e-9 * std::fabs(s.mean)) s.z = (x - s.mean) / s.deviation;  // not roundoff of 0
            lowest_mean_ = std::fmin(lowest_mean_, s.mean);
            s.rise = s.mean - lowest_mean_;
            values_.pop_front();
        }
        values_.push_back(x);
        return s;
    }

private:
    std::deque<double> values_;
    double lowest_mean_ = INFINITY;
};
