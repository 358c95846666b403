// Attention of a few query rows (decode: 1, verify: k + 1, a draft tree) over the KV cache in float32
// with AVX2 + FMA. PyTorch's CPU flash attention is built for long query blocks: for one query row
// over 300 keys it took 44 us a layer against 24 here, for six rows 101 against 77 (30 layers a
// forward).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention.h"
#include "layer_ops.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace playground {
namespace {

// scores[j] = q . keys[j] * scale for j in [0, n), four keys at a time with q read once for them
void scores_of(const float* q, const float* keys, int64_t n, int64_t head_dim, float scale, float* scores) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* k = keys + j * head_dim;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < head_dim; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + head_dim + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * head_dim + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * head_dim + d), a3);
    }
    scores[j] = lane_sum(a0) * scale;
    scores[j + 1] = lane_sum(a1) * scale;
    scores[j + 2] = lane_sum(a2) * scale;
    scores[j + 3] = lane_sum(a3) * scale;
  }
  for (; j < n; ++j) scores[j] = dot(q, keys + j * head_dim, head_dim) * scale;
}

// out [LANES * 8] = scale * sum_i weights[i] values[i], the values' columns [0, LANES * 8) (rows
// `stride` apart): LANES independent sums, so the adds do not wait on each other
template <int LANES>
inline void weighted_sum(const float* weights, const float* values, int64_t n, int64_t stride, float scale,
                         float* out) {
  __m256 acc[LANES];
  for (int c = 0; c < LANES; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const __m256 w = _mm256_set1_ps(weights[i]);
    for (int c = 0; c < LANES; ++c) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values + i * stride + 8 * c), acc[c]);
  }
  for (int c = 0; c < LANES; ++c) _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(acc[c], _mm256_set1_ps(scale)));
}

// One query row of one head: out = sum_j softmax(scores)_j values[j] over the keys it sees. scores
// ends holding exp(score - max), the weights before their sum, which it returns (0: it sees no key).
float attend_row(const float* q, const float* keys, const float* values, int64_t length, int64_t head_dim,
                 const bool* visible, float* scores, float* out) {
  scores_of(q, keys, length, head_dim, 1.0f / std::sqrt(float(head_dim)), scores);
  float top = -INFINITY;
  for (int64_t j = 0; j < length; ++j) {
    if (visible != nullptr && !visible[j]) scores[j] = -INFINITY;
    top = std::max(top, scores[j]);
  }
  std::fill_n(out, head_dim, 0.0f);
  if (top == -INFINITY) return 0.0f;
  const float total = exp_shifted(scores, length, top);
  for (int64_t d = 0; d < head_dim; d += 64) {
    switch (std::min<int64_t>(64, head_dim - d) / 8) {
      case 1: weighted_sum<1>(scores, values + d, length, head_dim, 1.0f / total, out + d); break;
      case 2: weighted_sum<2>(scores, values + d, length, head_dim, 1.0f / total, out + d); break;
      case 3: weighted_sum<3>(scores, values + d, length, head_dim, 1.0f / total, out + d); break;
      case 4: weighted_sum<4>(scores, values + d, length, head_dim, 1.0f / total, out + d); break;
      case 5: weighted_sum<5>(scores, values + d, length, head_dim, 1.0f / total, out + d); break;
      case 6: weighted_sum<6>(scores, values + d, length, head_dim, 1.0f / total, out + d); break;
      case 7: weighted_sum<7>(scores, values + d, length, head_dim, 1.0f / total, out + d); break;
      default: weighted_sum<8>(scores, values + d, length, head_dim, 1.0f / total, out + d); break;
    }
  }
  return total;
}

}  // namespace

void attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, at::Tensor& out, int64_t B,
            int64_t T, int64_t num_heads, int64_t start, const std::optional<at::Tensor>& mask, bool causal,
            float* last_row_weights) {
  const int64_t kv_heads = keys.size(1), capacity = keys.size(2), head_dim = keys.size(3);
  const int64_t length = start + T, q_width = num_heads * head_dim, group = num_heads / kv_heads;
  const float *qp = q.data_ptr<float>(), *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::Tensor visible;
  int64_t mask_batches = 0;
  if (mask.has_value()) {
    TORCH_CHECK(mask->dim() == 4 && mask->size(2) == T && mask->size(3) == length && (mask->size(0) == 1 || mask->size(0) == B),
                "attention: the mask must be [B or 1, 1, T, start + T]");
    visible = mask->to(at::kBool).contiguous();
    mask_batches = visible.size(0);
  }
  const bool* mp = mask.has_value() ? visible.data_ptr<bool>() : nullptr;
  at::parallel_for(0, B * num_heads * T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(length);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (num_heads * T), head = task / T % num_heads, t = task % T;
      const int64_t cache_offset = (b * kv_heads + head / group) * capacity * head_dim;
      const int64_t seen = mp == nullptr && causal ? start + t + 1 : length;
      const bool* row_mask = mp == nullptr ? nullptr : mp + ((mask_batches == 1 ? 0 : b) * T + t) * length;
      const float total = attend_row(qp + (b * T + t) * q_width + head * head_dim, kp + cache_offset,
                                     vp + cache_offset, seen, head_dim, row_mask, scores.data(),
                                     op + (b * T + t) * q_width + head * head_dim);
      if (last_row_weights != nullptr && b == 0 && t == T - 1) {
        float* weights = last_row_weights + head * length;
        std::fill_n(weights, length, 0.0f);
        if (total > 0)
          for (int64_t j = 0; j < seen; ++j) weights[j] = scores[j] / total;
      }
    }
  });
}

namespace {

// The op for tests: q [B, heads, T, head_dim], keys / values [B, kv_heads, capacity, head_dim];
// returns [B, heads, T, head_dim] as scaled_dot_product_attention over keys [:, :, :start + T] would.
at::Tensor cache_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, int64_t start,
                           const std::optional<at::Tensor>& mask, bool is_causal) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat,
              "cache_attention: float32 only");
  const int64_t B = q.size(0), heads = q.size(1), T = q.size(2), head_dim = q.size(3);
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.size(3) == head_dim && head_dim % 8 == 0 &&
                  heads % keys.size(1) == 0 && start + T <= keys.size(2),
              "cache_attention: contiguous [B, kv_heads, capacity, head_dim] caches, head_dim a multiple of 8");
  const at::Tensor rows = q.transpose(1, 2).contiguous().view({B * T, heads * head_dim});
  at::Tensor out = at::empty({B * T, heads * head_dim}, q.options());
  attend(rows, keys, values, out, B, T, heads, start, mask, is_causal);
  return out.view({B, T, heads, head_dim}).transpose(1, 2);
}

}  // namespace
}  // namespace playground

TORCH_LIBRARY_FRAGMENT(playground, m) {
  m.def("cache_attention(Tensor q, Tensor keys, Tensor values, int start, Tensor? mask, bool is_causal) -> Tensor");
}
TORCH_LIBRARY_IMPL(playground, CPU, m) { m.impl("cache_attention", playground::cache_attention); }
