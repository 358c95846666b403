// y = x @ w.T in float32 for a few rows of x (decode: 1, verify: k + 1) with AVX2 + FMA, the weights
// in float32 or bfloat16 (widened exactly: half the bytes, the same products); MKL's sgemm
// (at::linear) for more rows than kRowsKernelMax (prompts), where the work is arithmetic, not reading.
//
// A decode or verify step reads every weight once for a handful of rows, so it runs at the speed
// of memory. Each weight row is read once for all rows of x (up to six per pass, x stays in L1),
// both cores take half the weight rows, and every output is the same 8-lane dot product whatever
// the number of rows: a row's result does not depend on the rows beside it.
//
// greedy_accept is the target's head at a greedy verify: the argmax of each row's logits, without
// the logits, scoring only the rows the drafts accepted so far still need.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <tuple>
#include <vector>

#include "layer_ops.h"
#include "rows_linear.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

namespace playground {
namespace {

constexpr int64_t kLanes = 8;
constexpr int64_t kMaxRowsPerPass = 6;
constexpr int64_t kTileByTileRowsMax = 24;  // beyond, x's rows outgrow L1 and L2: 25 rows gained nothing
constexpr int64_t kAhead = 4096;  // floats: 16 KiB (4 KiB left the six-row verify 7% slower here)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// bfloat16 is float32's upper half: widened exactly, so the products are float32's own
inline __m256 load8(const uint16_t* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

// ROWS rows of x against COLS weight rows starting at n: ROWS * COLS dot products of length k,
// written from y (row 0's output for weight row n) on.
template <int ROWS, int COLS, typename W>
inline void tile(const float* x, int64_t x_stride, const W* w, int64_t k, float* y, int64_t y_stride,
                 int64_t n) {
  __m256 acc[ROWS][COLS];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = _mm256_setzero_ps();
  const W* wn = w + n * k;
  for (int64_t i = 0; i < k; i += kLanes) {
    if constexpr (COLS > 1)  // the weights a few tiles on: their memory latency hides behind this tile's work
      for (int c = 0; c < COLS; c += 2) _mm_prefetch(reinterpret_cast<const char*>(wn + kAhead + COLS * i + 8 * c), _MM_HINT_T0);
    __m256 wv[COLS];
    for (int c = 0; c < COLS; ++c) wv[c] = load8(wn + c * k + i);
    for (int r = 0; r < ROWS; ++r) {
      __m256 xv = _mm256_loadu_ps(x + r * x_stride + i);
      asm("" : "+x"(xv));  // keeps x in a register: GCC folds its load into each FMA, six rows' loads then outrun the FMAs
      for (int c = 0; c < COLS; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) y[r * y_stride + c] = lane_sum(acc[r][c]);
}

// weight rows a tile takes for `rows` rows of x: sixteen registers hold rows x cols sums, cols weights and x
constexpr int tile_cols(int64_t rows) { return rows <= 2 ? 4 : 2; }

// y holds the outputs of weight rows first.. (row r's at y + r * y_stride)
template <int ROWS, typename W>
void pass(const float* x, int64_t k, const W* w, float* y, int64_t y_stride, int64_t first, int64_t begin,
          int64_t end) {
  constexpr int COLS = tile_cols(ROWS);
  int64_t n = begin;
  for (; n + COLS <= end; n += COLS) tile<ROWS, COLS, W>(x, k, w, k, y + n - first, y_stride, n);
  for (; n < end; ++n) tile<ROWS, 1, W>(x, k, w, k, y + n - first, y_stride, n);
}

// Weight rows [begin, end) against every row of x, in blocks of weight rows that each group of up
// to six rows of x passes over in turn: the weights stream from memory once. Up to
// kTileByTileRowsMax rows of x, a block is one tile of two weight rows, read from memory by the
// first group while the FMAs of the rest, on it from L1, keep the stream moving (a forward's
// projections for nine rows 21% faster than with blocks that stay in L2, where the later groups run
// with the memory idle); more rows of x than that, blocks of weight rows stay in L2.
template <typename W>
void rows_pass(int64_t rows, const float* x, int64_t k, const W* w, float* y, int64_t y_stride, int64_t first,
               int64_t begin, int64_t end) {
  const int64_t block = rows > kMaxRowsPerPass && rows <= kTileByTileRowsMax
                            ? tile_cols(kMaxRowsPerPass)
                            : std::max<int64_t>(4, (256 * 1024 / 4) / k);
  for (int64_t n = begin; n < end; n += block) {
    const int64_t stop = std::min(n + block, end);
    for (int64_t r = 0; r < rows; r += kMaxRowsPerPass) {
      const float* xr = x + r * k;
      float* yr = y + r * y_stride;
      switch (std::min(kMaxRowsPerPass, rows - r)) {
        case 1: pass<1>(xr, k, w, yr, y_stride, first, n, stop); break;
        case 2: pass<2>(xr, k, w, yr, y_stride, first, n, stop); break;
        case 3: pass<3>(xr, k, w, yr, y_stride, first, n, stop); break;
        case 4: pass<4>(xr, k, w, yr, y_stride, first, n, stop); break;
        case 5: pass<5>(xr, k, w, yr, y_stride, first, n, stop); break;
        default: pass<6>(xr, k, w, yr, y_stride, first, n, stop); break;
      }
    }
  }
}

// f(the weights' data as float32 or as bfloat16's raw halves)
template <typename F>
void with_weights(const at::Tensor& w, F&& f) {
  if (w.scalar_type() == at::kBFloat16)
    f(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()));
  else
    f(w.data_ptr<float>());
}

// grain: at least 64 weight rows a task, so a small matrix is not split into slivers
constexpr int64_t kWeightRowsGrain = 64;

// The highest score so far and its id: the first of equal maxima, as torch.argmax
struct Best {
  float score = -std::numeric_limits<float>::infinity();
  int64_t id = std::numeric_limits<int64_t>::max();
  bool beaten_by(float other, int64_t other_id) const {
    return other > score || (other == score && other_id < id);
  }
};

// Rows 0..live-1 are still needed; a rejected draft lowers it, never raises it
void lower(std::atomic<int64_t>& live, int64_t rows) {
  int64_t now = live.load();
  while (rows < now && !live.compare_exchange_weak(now, rows)) {}
}

constexpr int64_t kScoredBeforeLooking = 256;  // weight rows a core scores before it looks at what they say

// The target's greedy verify of a chain, sampling.verify_greedy without materialising the logits:
// row r of x [1 + drafts, k] scores every row of the head w [vocab, k], its argmax is the target's
// token after r accepted drafts, and drafts[r] is accepted if it is that argmax. Once a core sees a
// score that beats drafts[r]'s, the rows after r are no longer needed and no longer scored: most
// verifies reject a draft early, so most of the head's multiply-adds for the later rows are never
// done. Each score is linear_into's own (every output the same dot product whatever the tile), so
// every argmax still needed is exactly the logits' argmax. Returns (drafts accepted, the token after).
std::tuple<int64_t, int64_t> greedy_accept(const at::Tensor& x_in, const at::Tensor& w, at::IntArrayRef drafts) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() == 2 && x_in.size(0) <= kRowsKernelMax &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16) && w.dim() == 2 &&
                  w.is_contiguous() && x_in.size(1) == w.size(1) && w.size(1) % kLanes == 0,
              "greedy_accept: float32 x [rows <= 64, k], a contiguous float32 or bfloat16 w [vocab, k], k a multiple of 8");
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0), k = w.size(1), vocab = w.size(0);
  TORCH_CHECK(static_cast<int64_t>(drafts.size()) == rows - 1, "greedy_accept: a draft for each row but the last");
  for (const int64_t id : drafts) TORCH_CHECK(id >= 0 && id < vocab, "greedy_accept: draft id ", id, " out of range");
  const float* xp = x.data_ptr<float>();
  std::vector<float> draft_score(drafts.size());
  std::vector<Best> best(rows);
  std::atomic<int64_t> live{rows};
  std::mutex merging;
  with_weights(w, [&](const auto* wp) {
    for (size_t r = 0; r < drafts.size(); ++r) tile<1, 1>(xp + r * k, k, wp, k, &draft_score[r], 0, drafts[r]);
    at::parallel_for(0, vocab, kWeightRowsGrain, [&](int64_t begin, int64_t end) {
      std::vector<Best> mine(rows);
      std::vector<float> scores(rows * kScoredBeforeLooking);
      for (int64_t b = begin; b < end; b += kScoredBeforeLooking) {
        const int64_t stop = std::min(b + kScoredBeforeLooking, end);
        int64_t needed = live.load();
        rows_pass(needed, xp, k, wp, scores.data(), kScoredBeforeLooking, b, b, stop);
        for (int64_t r = 0; r < needed; ++r) {
          const float* row = scores.data() + r * kScoredBeforeLooking;
          for (int64_t n = b; n < stop; ++n)
            if (mine[r].beaten_by(row[n - b], n)) mine[r] = {row[n - b], n};
          if (r < rows - 1 && Best{draft_score[r], drafts[r]}.beaten_by(mine[r].score, mine[r].id)) {
            lower(live, r + 1);
            needed = r + 1;
          }
        }
      }
      const std::lock_guard<std::mutex> hold(merging);
      for (int64_t r = 0; r < rows; ++r)
        if (best[r].beaten_by(mine[r].score, mine[r].id)) best[r] = mine[r];
    });
  });
  // rows below `live` were scored against every weight row; the accepted drafts and the row after them are among them
  int64_t accepted = 0;
  while (accepted < rows - 1 && best[accepted].id == drafts[accepted]) ++accepted;
  TORCH_INTERNAL_ASSERT(accepted < live.load());
  return {accepted, best[accepted].id};
}

}  // namespace

void linear_into(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  const int64_t rows = x.size(0), k = w.size(1), n_out = w.size(0);
  if (rows > kRowsKernelMax) {
    at::linear_out(y, x, w.scalar_type() == at::kFloat ? w : w.to(at::kFloat));
    return;
  }
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  with_weights(w, [&](const auto* wp) {
    at::parallel_for(0, n_out, kWeightRowsGrain,
                     [&](int64_t begin, int64_t end) { rows_pass(rows, xp, k, wp, yp, n_out, 0, begin, end); });
  });
}

namespace {

at::Tensor rows_linear(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "rows_linear: float32 x, float32 or bfloat16 w only");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "rows_linear: w must be a contiguous [n, k] matrix");
  const int64_t k = w.size(1);
  TORCH_CHECK(x.size(-1) == k && k % kLanes == 0, "rows_linear: x's last dimension must be w's, a multiple of 8");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  at::Tensor xs = x.reshape({-1, k}).contiguous();
  at::Tensor y = at::empty({xs.size(0), w.size(0)}, x.options());
  linear_into(xs, w, y);
  return y.view(shape);
}

}  // namespace
}  // namespace playground

TORCH_LIBRARY_FRAGMENT(playground, m) {
  m.def("rows_linear(Tensor x, Tensor w) -> Tensor");
  m.def("greedy_accept(Tensor x, Tensor w, int[] drafts) -> (int, int)");
}
TORCH_LIBRARY_IMPL(playground, CPU, m) {
  m.impl("rows_linear", playground::rows_linear);
  m.impl("greedy_accept", playground::greedy_accept);
}
