#pragma once
// The small per-token pieces of a Llama layer, shared by the kernels.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace playground {

// The index of the largest of x[0, n) as torch.argmax gives it: the first NaN if there is one, else the
// first of equal maxima (std::max_element alone would pass over a NaN)
inline int64_t argmax_first(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// the mean of x's squares, n floats, summed in double
inline double mean_square(const float* x, int64_t n) {
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += double(x[i]) * x[i];
  return squares / n;
}

// out = weight * x / rms(x), row by row (LlamaRMSNorm in float32)
inline void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t width, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * width;
    const float scale = float(1.0 / std::sqrt(mean_square(xr, width) + eps));
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

// exp of eight floats (Cephes' expf: a degree-5 polynomial after reducing by powers of two, within
// two ulp of std::exp); below -87.3, zero (exp(-inf) of a masked key included)
inline __m256 exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i power = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(power)));
}

// x[j] = exp(x[j] - shift) for j in [0, n), in place; returns their sum (a softmax's denominator)
inline float exp_shifted(float* x, int64_t n, float shift) {
  const __m256 shift8 = _mm256_set1_ps(shift);
  __m256 total = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), shift8));
    _mm256_storeu_ps(x + j, p);
    total = _mm256_add_ps(total, p);
  }
  if (j < n) {  // the last n mod 8 in a lane buffer, the lanes past n exp(-inf) = 0
    alignas(32) float lanes[8];
    std::fill_n(lanes, 8, -INFINITY);
    std::copy(x + j, x + n, lanes);
    const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(lanes), shift8));
    _mm256_store_ps(lanes, p);
    std::copy_n(lanes, n - j, x + j);
    total = _mm256_add_ps(total, p);
  }
  return lane_sum(total);
}

// out = silu(gate) * up, elementwise (Llama's MLP between its projections)
inline void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace playground
