#pragma once
// The small per-token pieces of a Llama layer, shared by the kernels.

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace playground {

// out = weight * x / rms(x), row by row (LlamaRMSNorm in float32)
inline void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t width, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * width;
    double squares = 0;
    for (int64_t i = 0; i < width; ++i) squares += double(xr[i]) * xr[i];
    const float scale = float(1.0 / std::sqrt(squares / width + eps));
    for (int64_t i = 0; i < width; ++i) out[r * width + i] = weight[i] * (xr[i] * scale);
  }
}

// Llama's rotate-half RoPE of one head's vector at one position: out = x * cos + rotate_half(x) * sin
inline void rope(const float* x, const float* cos, const float* sin, float* out, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = x[i] * cos[i] - x[i + half] * sin[i];
    out[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
  }
}

// the sum of eight lanes
inline float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// the dot product of a and b, n floats, in eight lanes
inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float total = lane_sum(acc);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// out = silu(gate) * up, elementwise (Llama's MLP between its projections)
inline void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace playground
