// A small deterministic random number generator (SplitMix64) whose whole state is one integer, so checkpoints
// can save it and a resumed run draws the same numbers. Normal samples use Box-Muller.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed = 1) : state(seed) {}
    uint64_t next_u64() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // uniform in [0, 1) with 24 random bits
    float uniform() { return (next_u64() >> 40) * (1.0f / 16777216.0f); }
    float normal() {
        double u1 = ((next_u64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
        double u2 = (next_u64() >> 11) * (1.0 / 9007199254740992.0);
        return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
};

// FNV-1a: folds the bytes of text into h (start from 1469598103934665603 for the standard hash).
inline uint64_t fnv1a(const std::string& text, uint64_t h) {
    for (char ch : text) h = (h ^ (uint8_t)ch) * 0x100000001B3ull;
    return h;
}
