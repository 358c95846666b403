// y = x @ w.T in float32 for a few rows of x (decode: 1, verify: k + 1) with AVX2 + FMA, the weights
// in float32 or bfloat16 (widened exactly: half the bytes, the same products); MKL's sgemm
// (at::linear) for more rows than kRowsKernelMax (prompts), where the work is arithmetic, not reading.
//
// A decode or verify step reads every weight once for a handful of rows, so it runs at the speed
// of memory. Each weight row is read once for all rows of x (up to six per pass, x stays in L1),
// both cores take half the weight rows, and every output is the same 8-lane dot product whatever
// the number of rows: a row's result does not depend on the rows beside it.
#include <immintrin.h>

#include <algorithm>

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

// ROWS rows of x against COLS weight rows starting at n: ROWS * COLS dot products of length k.
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
    for (int c = 0; c < COLS; ++c) y[r * y_stride + n + c] = lane_sum(acc[r][c]);
}

// weight rows a tile takes for `rows` rows of x: sixteen registers hold rows x cols sums, cols weights and x
constexpr int tile_cols(int64_t rows) { return rows <= 2 ? 4 : 2; }

template <int ROWS, typename W>
void pass(const float* x, int64_t k, const W* w, float* y, int64_t n_out, int64_t begin, int64_t end) {
  constexpr int COLS = tile_cols(ROWS);
  int64_t n = begin;
  for (; n + COLS <= end; n += COLS) tile<ROWS, COLS, W>(x, k, w, k, y, n_out, n);
  for (; n < end; ++n) tile<ROWS, 1, W>(x, k, w, k, y, n_out, n);
}

// Weight rows [begin, end) against every row of x, in blocks of weight rows that each group of up
// to six rows of x passes over in turn: the weights stream from memory once. Up to
// kTileByTileRowsMax rows of x, a block is one tile of two weight rows, read from memory by the
// first group while the FMAs of the rest, on it from L1, keep the stream moving (a forward's
// projections for nine rows 21% faster than with blocks that stay in L2, where the later groups run
// with the memory idle); more rows of x than that, blocks of weight rows stay in L2.
template <typename W>
void rows_pass(int64_t rows, const float* x, int64_t k, const W* w, float* y, int64_t n_out,
               int64_t begin, int64_t end) {
  const int64_t block = rows > kMaxRowsPerPass && rows <= kTileByTileRowsMax
                            ? tile_cols(kMaxRowsPerPass)
                            : std::max<int64_t>(4, (256 * 1024 / 4) / k);
  for (int64_t n = begin; n < end; n += block) {
    const int64_t stop = std::min(n + block, end);
    for (int64_t r = 0; r < rows; r += kMaxRowsPerPass) {
      const float* xr = x + r * k;
      float* yr = y + r * n_out;
      switch (std::min(kMaxRowsPerPass, rows - r)) {
        case 1: pass<1>(xr, k, w, yr, n_out, n, stop); break;
        case 2: pass<2>(xr, k, w, yr, n_out, n, stop); break;
        case 3: pass<3>(xr, k, w, yr, n_out, n, stop); break;
        case 4: pass<4>(xr, k, w, yr, n_out, n, stop); break;
        case 5: pass<5>(xr, k, w, yr, n_out, n, stop); break;
        default: pass<6>(xr, k, w, yr, n_out, n, stop); break;
      }
    }
  }
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
  // grain: at least 64 weight rows a task, so a small matrix is not split into slivers
  if (w.scalar_type() == at::kBFloat16) {
    const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
    at::parallel_for(0, n_out, 64, [&](int64_t begin, int64_t end) { rows_pass(rows, xp, k, wp, yp, n_out, begin, end); });
  } else {
    const float* wp = w.data_ptr<float>();
    at::parallel_for(0, n_out, 64, [&](int64_t begin, int64_t end) { rows_pass(rows, xp, k, wp, yp, n_out, begin, end); });
  }
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

TORCH_LIBRARY_FRAGMENT(playground, m) { m.def("rows_linear(Tensor x, Tensor w) -> Tensor"); }
TORCH_LIBRARY_IMPL(playground, CPU, m) { m.impl("rows_linear", playground::rows_linear); }
