// RoPE on interleaved pairs (x[2i], x[2i+1]), the released DeepSeek weights' pairing, with YaRN (docs/design.md §1.1):
//   out[2i] = m (x0 cos a - x1 sin a),  out[2i+1] = m (x0 sin a + x1 cos a),  a = pos * inv_freq[i]
// inv_freq[i] = theta^(-2i/r). YaRN (factor f > 1) interpolates the low frequencies by 1/f along a ramp between the
// correction dims of beta_fast and beta_slow, sets m, and scales the softmax by mscale(f, mscale_all_dim)^2.
// MOE_HD, so the CPU reference and the CUDA kernels compute the same angles.
#pragma once
#include <cmath>

#include "config.h"
#include "host_device.h"

MOE_HD inline double yarn_mscale(double factor, double mscale) {
    return factor <= 1.0 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

// The dimension index at which a rotation of wavelength 2 pi * max_pos / rotations starts (YaRN's correction dim).
MOE_HD inline double yarn_correction_dim(double rotations, int dim, double theta, int max_pos) {
    return dim * log(max_pos / (rotations * 2.0 * M_PI)) / (2.0 * log(theta));
}

// inv_freq of pair i (0 <= i < rope_dim / 2).
MOE_HD inline double rope_inv_freq(const Config& c, int i) {
    const int r = c.qk_rope_head_dim;
    double extrapolated = pow((double)c.rope_theta, -2.0 * i / r);
    if (c.yarn_factor <= 1.0f) return extrapolated;
    double low = floor(yarn_correction_dim(c.yarn_beta_fast, r, c.rope_theta, c.yarn_original_max_position));
    double high = ceil(yarn_correction_dim(c.yarn_beta_slow, r, c.rope_theta, c.yarn_original_max_position));
    low = fmax(low, 0.0);
    high = fmin(high, r - 1.0);
    if (low == high) high += 0.001;
    double ramp = fmin(fmax((i - low) / (high - low), 0.0), 1.0);
    double extrapolation_weight = 1.0 - ramp;
    return extrapolated / c.yarn_factor * ramp + extrapolated * extrapolation_weight;
}

// The factor m applied to cos and sin.
MOE_HD inline double rope_magnitude(const Config& c) {
    return yarn_mscale(c.yarn_factor, c.yarn_mscale) / yarn_mscale(c.yarn_factor, c.yarn_mscale_all_dim);
}

// 1/sqrt(qk head dim), times mscale^2 under YaRN.
MOE_HD inline float attention_softmax_scale(const Config& c) {
    double m = yarn_mscale(c.yarn_factor, c.yarn_mscale_all_dim);
    return (float)(m * m / sqrt((double)(c.qk_nope_head_dim + c.qk_rope_head_dim)));
}
