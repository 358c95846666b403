// Attention of query rows over the KV cache (decode: 1, verify: k + 1, a draft tree, and the draft
// step's first pass over a prompt) in float32 with AVX2 + FMA, keys and values read in AVX-512's
// 16-float vectors where the kernels are built for it. PyTorch's CPU flash attention is built for
// long query blocks: for one query row over 300 keys it took 44 us a layer against 24 here, for six rows 101 against 77 (30 layers a
// forward). The queries of a kv head read each block of its keys and values together: a six-row
// verify over 2,000 keys spent 16 ms of its forward in attention, against 26 with each query
// reading every key alone.
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

// lane c of the result: the sum of v[c]'s eight lanes (a tree of horizontal adds: 7 of them for eight
// sums, where eight lane_sum calls take 24 shuffles and adds)
inline __m256 lane_sums(const __m256* v) {
  const __m256 pairs01 = _mm256_hadd_ps(v[0], v[1]), pairs23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 pairs45 = _mm256_hadd_ps(v[4], v[5]), pairs67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 low = _mm256_hadd_ps(pairs01, pairs23), high = _mm256_hadd_ps(pairs45, pairs67);
  return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
}

// The vectors keys and values are read in: AVX-512's sixteen floats where the kernels are built for it
// and head_dim is a multiple of them (with_floats), else AVX2's eight. eight_lanes: a sum's lanes folded
// into eight (a 16-float vector's halves added)
struct Floats8 {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V broadcast(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static __m256 eight_lanes(V v) { return v; }
};
#ifdef __AVX512F__
struct Floats16 {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V broadcast(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static __m256 eight_lanes(V v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
};
#endif

// body(F{}) with F the vectors a head of head_dim floats is read in
template <typename Body>
inline void with_floats(int64_t head_dim, Body body) {
#ifdef __AVX512F__
  if (head_dim % Floats16::kLanes == 0) return body(Floats16{});
#endif
  body(Floats8{});
}

// sums[c] (eight lanes) = q . k[c], k[c] the c-th of eight keys head_dim floats apart: q read once for
// them, eight independent sums keep both FMA units busy
template <typename F>
inline void eight_key_sums(const float* q, const float* k, int64_t head_dim, __m256* sums) {
  typename F::V acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = F::zero();
  for (int64_t d = 0; d < head_dim; d += F::kLanes) {
    const typename F::V qv = F::load(q + d);
    for (int c = 0; c < 8; ++c) acc[c] = F::fma(qv, F::load(k + c * head_dim + d), acc[c]);
  }
  for (int c = 0; c < 8; ++c) sums[c] = F::eight_lanes(acc[c]);
}

// scores[j] = q . keys[j] * scale for j in [0, n), eight keys at a time
void scores_of(const float* q, const float* keys, int64_t n, int64_t head_dim, float scale, float* scores) {
  const __m256 scale8 = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 sums[8];
    with_floats(head_dim, [&](auto floats) { eight_key_sums<decltype(floats)>(q, keys + j * head_dim, head_dim, sums); });
    _mm256_storeu_ps(scores + j, _mm256_mul_ps(lane_sums(sums), scale8));
  }
  for (; j < n; ++j) scores[j] = dot(q, keys + j * head_dim, head_dim) * scale;
}

// The largest of scores [0, n), the ones `visible` (if any) hides set to -inf first
float masked_max(float* scores, const bool* visible, int64_t n) {
  if (visible != nullptr)
    for (int64_t j = 0; j < n; ++j) scores[j] = visible[j] ? scores[j] : -INFINITY;
  __m256 top8 = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(scores + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top8);
  float top = *std::max_element(lanes, lanes + 8);
  for (; j < n; ++j) top = std::max(top, scores[j]);
  return top;
}

// acc [LANES * F::kLanes] += sum_i weights[i] values[i], the values' columns [0, LANES * F::kLanes) (rows
// `stride` apart): LANES independent sums, so the adds do not wait on each other
template <typename F, int LANES>
inline void weighted_sum(const float* weights, const float* values, int64_t n, int64_t stride, float* acc) {
  typename F::V sums[LANES];
  for (int c = 0; c < LANES; ++c) sums[c] = F::load(acc + F::kLanes * c);
  for (int64_t i = 0; i < n; ++i) {
    const typename F::V w = F::broadcast(weights[i]);
    for (int c = 0; c < LANES; ++c) sums[c] = F::fma(w, F::load(values + i * stride + F::kLanes * c), sums[c]);
  }
  for (int c = 0; c < LANES; ++c) F::store(acc + F::kLanes * c, sums[c]);
}

// acc [head_dim] += sum_i weights[i] values[i], eight vectors of columns at a time
template <typename F>
void weighted_columns(const float* weights, const float* values, int64_t n, int64_t head_dim, float* acc) {
  for (int64_t d = 0; d < head_dim; d += 8 * F::kLanes) {
    switch (std::min<int64_t>(8 * F::kLanes, head_dim - d) / F::kLanes) {
      case 1: weighted_sum<F, 1>(weights, values + d, n, head_dim, acc + d); break;
      case 2: weighted_sum<F, 2>(weights, values + d, n, head_dim, acc + d); break;
      case 3: weighted_sum<F, 3>(weights, values + d, n, head_dim, acc + d); break;
      case 4: weighted_sum<F, 4>(weights, values + d, n, head_dim, acc + d); break;
      case 5: weighted_sum<F, 5>(weights, values + d, n, head_dim, acc + d); break;
      case 6: weighted_sum<F, 6>(weights, values + d, n, head_dim, acc + d); break;
      case 7: weighted_sum<F, 7>(weights, values + d, n, head_dim, acc + d); break;
      default: weighted_sum<F, 8>(weights, values + d, n, head_dim, acc + d); break;
    }
  }
}

void weighted_rows(const float* weights, const float* values, int64_t n, int64_t head_dim, float* acc) {
  with_floats(head_dim, [&](auto floats) { weighted_columns<decltype(floats)>(weights, values, n, head_dim, acc); });
}

// One query row of one head, over the first `seen` keys of its kv head where `visible` (if any)
// says so. scores ends holding exp(score - max), the weights before `total`, their sum (0: it
// sees no key); out is first their weighted sum of values, then that over total. Given `weights`
// (length keys), the softmax's weights go there, zeros on the keys the row does not see.
struct Query {
  const float* q;
  float* out;
  int64_t seen;
  const bool* visible;
  float* scores;
  float* weights;
  float total;
};

// Keys a block: 16 KiB of keys or values at head_dim 64, in L1 while every query of the block's kv
// head reads it (a verify's six rows of three heads read each key once from L2, not 18 times)
constexpr int64_t kKeysPerBlock = 64;

// Queries a pass at the most: a verify's six rows of three heads in one; a prompt's rows (the draft
// step's first pass) in passes, so the scores they hold stay 32 rows of keys
constexpr int64_t kQueriesAtOnce = 32;

// The queries of one kv head. Every score and every output is the arithmetic of one query alone:
// blocks change which query reads a key when, not a sum's order.
void attend_queries(Query* queries, int64_t count, const float* keys, const float* values, int64_t head_dim,
                    int64_t length) {
  const float scale = 1.0f / std::sqrt(float(head_dim));
  int64_t longest = 0;
  for (Query* x = queries; x < queries + count; ++x) longest = std::max(longest, x->seen);
  for (int64_t j = 0; j < longest; j += kKeysPerBlock)
    for (Query* x = queries; x < queries + count; ++x)
      if (x->seen > j)
        scores_of(x->q, keys + j * head_dim, std::min(kKeysPerBlock, x->seen - j), head_dim, scale, x->scores + j);
  for (Query* x = queries; x < queries + count; ++x) {
    const float top = masked_max(x->scores, x->visible, x->seen);
    std::fill_n(x->out, head_dim, 0.0f);
    x->total = top == -INFINITY ? 0.0f : exp_shifted(x->scores, x->seen, top);
  }
  for (int64_t j = 0; j < longest; j += kKeysPerBlock)
    for (Query* x = queries; x < queries + count; ++x)
      if (x->total > 0 && x->seen > j)
        weighted_rows(x->scores + j, values + j * head_dim, std::min(kKeysPerBlock, x->seen - j), head_dim, x->out);
  for (Query* x = queries; x < queries + count; ++x) {
    if (x->weights != nullptr) std::fill_n(x->weights, length, 0.0f);
    if (x->total == 0) continue;
    const __m256 inverse = _mm256_set1_ps(1.0f / x->total);
    for (int64_t d = 0; d < head_dim; d += 8)
      _mm256_storeu_ps(x->out + d, _mm256_mul_ps(_mm256_loadu_ps(x->out + d), inverse));
    if (x->weights != nullptr)
      for (int64_t j = 0; j < x->seen; ++j) x->weights[j] = x->scores[j] / x->total;
  }
}

}  // namespace

void attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, at::Tensor& out, int64_t B,
            int64_t T, int64_t num_heads, int64_t start, const std::optional<at::Tensor>& mask, bool causal,
            float* row_weights, int64_t weights_from_row) {
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
  // a task is one query row of one head, in the order (b, kv head, row, head of the group): a
  // thread's tasks of one kv head run together, up to kQueriesAtOnce, sharing its keys and values
  const int64_t per_kv_head = T * group;
  at::parallel_for(0, B * kv_heads * per_kv_head, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(std::min(end - begin, kQueriesAtOnce) * length);
    std::vector<Query> queries;
    for (int64_t first = begin; first < end;) {
      const int64_t b = first / (kv_heads * per_kv_head), g = first / per_kv_head % kv_heads;
      const int64_t last = std::min({end, (first / per_kv_head + 1) * per_kv_head, first + kQueriesAtOnce});
      queries.clear();
      for (int64_t task = first; task < last; ++task) {
        const int64_t t = task % per_kv_head / group, head = g * group + task % group;
        const bool weighed = row_weights != nullptr && b == 0 && t >= weights_from_row;
        queries.push_back({qp + (b * T + t) * q_width + head * head_dim, op + (b * T + t) * q_width + head * head_dim,
                           mp == nullptr && causal ? start + t + 1 : length,
                           mp == nullptr ? nullptr : mp + ((mask_batches == 1 ? 0 : b) * T + t) * length,
                           scores.data() + (task - first) * length,
                           weighed ? row_weights + ((t - weights_from_row) * num_heads + head) * length : nullptr, 0.0f});
      }
      const int64_t cache_offset = (b * kv_heads + g) * capacity * head_dim;
      attend_queries(queries.data(), queries.size(), kp + cache_offset, vp + cache_offset, head_dim, length);
      first = last;
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
