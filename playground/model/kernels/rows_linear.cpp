// y = x @ w.T in float32 for a few rows of x (decode: 1, verify: k + 1), the weights in float32,
// bfloat16 (widened exactly: half the bytes, the same products) or a GGUF file's own Q4_1 / Q8_0
// blocks (a fifth or a quarter of float32's bytes); oneDNN's or MKL's gemm for more rows than
// kRowsKernelMax (prompts), where the work is arithmetic, not reading. Vectors are AVX-512's 16 floats
// where the kernels are built for it (the host has it), else AVX2's 8.
//
// Blocks are dequantized in registers, a vector of weights at a time, each weight computed as gguf's
// dequantize computes it (d * q is exact in float32; Q4_1's + m rounds once, as one FMA does). Q4_1's
// (the decoder layers) go into the same FMAs in the same order as float32 weights do: every output is
// bit for bit what the float32 kernel gives for the dequantized model. Q8_0's (the head) are summed in
// two chains, even and odd vectors, added at the end: only the order of the sums differs from float32's.
// Reading them costs arithmetic, not memory: a one-row forward is bound by the dequantizing (about five
// vector operations per vector of weights), which is why a vector twice as wide makes it faster.
//
// A decode or verify step reads every weight once for a handful of rows, so it runs at the speed
// of memory. Each weight row is read once for all rows of x (up to six per pass, x stays in L1),
// both cores take half the weight rows, and every output is the same dot product (kVecLanes lanes,
// then an 8-lane tail where k is not a multiple of them) whatever the number of rows: a row's result
// does not depend on the rows beside it.
//
// verify_argmax is the target's head at a greedy verify (a chain or a tree): the argmax of each
// row's logits, without the logits, scoring only the rows the verify can still need.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "layer_ops.h"
#include "rows_linear.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

namespace playground {
namespace {

constexpr int64_t kMaxRowsPerPass = 6;
constexpr int64_t kTileByTileRowsMax = 24;  // beyond, x's rows outgrow L1 and L2: 25 rows gained nothing
constexpr int64_t kAhead = 4096;  // floats: 16 KiB (4 KiB left the six-row verify 7% slower here)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// bfloat16 is float32's upper half: widened exactly, so the products are float32's own
inline __m256 load8(const uint16_t* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

// The vector the weight kernels compute in: Vec holds kVecLanes floats
#ifdef __AVX512F__
using Vec = __m512;
constexpr int64_t kVecLanes = 16;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset(float v) { return _mm512_set1_ps(v); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload(const uint16_t* p) {
  const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
// kVecLanes bytes from p, as floats: unsigned (Q4_1's nibble pairs) or signed (Q8_0's q)
inline __m512i widen_bytes(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512i widen_signed_bytes(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512i low_nibbles(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi32(0x0F)); }
inline __m512i high_nibbles(__m512i v) { return _mm512_srli_epi32(v, 4); }
inline Vec to_floats(__m512i v) { return _mm512_cvtepi32_ps(v); }
inline void keep_in_register(Vec& v) { asm("" : "+v"(v)); }
// the upper eight lanes added to the lower eight, then those eight summed as lane_sum sums them
inline float vsum(Vec v) {
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return lane_sum(_mm256_add_ps(_mm512_castps512_ps256(v), high));
}
#else
using Vec = __m256;
constexpr int64_t kVecLanes = 8;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset(float v) { return _mm256_set1_ps(v); }
inline Vec vload(const float* p) { return load8(p); }
inline Vec vload(const uint16_t* p) { return load8(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline __m256i widen_bytes(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i widen_signed_bytes(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i low_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi32(0x0F)); }
inline __m256i high_nibbles(__m256i v) { return _mm256_srli_epi32(v, 4); }
inline Vec to_floats(__m256i v) { return _mm256_cvtepi32_ps(v); }
inline void keep_in_register(Vec& v) { asm("" : "+x"(v)); }
inline float vsum(Vec v) { return lane_sum(v); }
#endif
static_assert(kVecLanes % kLanes == 0 && kBlockWeights % kVecLanes == 0, "a vector is whole 8-lane halves and a block whole vectors");
constexpr int64_t kFloatsPerLine = 16;  // a 64-byte cache line

// ROWS rows of x against COLS weight rows starting at n: ROWS * COLS dot products of length k,
// written from y (row 0's output for weight row n) on.
template <int ROWS, int COLS, typename W>
inline void tile(const float* x, int64_t x_stride, const W* w, int64_t k, float* y, int64_t y_stride,
                 int64_t n) {
  Vec acc[ROWS][COLS];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = vzero();
  const W* wn = w + n * k;
  const int64_t whole = k - k % kVecLanes;
  for (int64_t i = 0; i < whole; i += kVecLanes) {
    if constexpr (COLS > 1)  // the weights a few tiles on: their memory latency hides behind this tile's work
      for (int64_t l = 0; l < COLS * kVecLanes / kFloatsPerLine; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(wn + kAhead + COLS * i + kFloatsPerLine * l), _MM_HINT_T0);
    Vec wv[COLS];
    for (int c = 0; c < COLS; ++c) wv[c] = vload(wn + c * k + i);
    for (int r = 0; r < ROWS; ++r) {
      Vec xv = vload(x + r * x_stride + i);
      keep_in_register(xv);  // GCC would fold the load into each FMA: six rows' loads then outrun the FMAs
      for (int c = 0; c < COLS; ++c) acc[r][c] = vfma(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) {
      float sum = vsum(acc[r][c]);
      if (whole < k)  // an 8-lane tail (k is a multiple of 8)
        sum += lane_sum(_mm256_mul_ps(_mm256_loadu_ps(x + r * x_stride + whole), load8(wn + c * k + whole)));
      y[r * y_stride + c] = sum;
    }
}

// weight rows a tile takes for `rows` rows of x: sixteen registers hold rows x cols sums, cols weights and x
constexpr int tile_cols(int64_t rows) { return rows <= 2 ? 4 : 2; }

// f(std::integral_constant<int, rows>{}) for 1 to kMaxRowsPerPass rows: a pass's row count is a template argument
template <typename F>
void with_row_count(int64_t rows, F&& f) {
  switch (rows) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    default: return f(std::integral_constant<int, kMaxRowsPerPass>{});
  }
}

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
      with_row_count(std::min(kMaxRowsPerPass, rows - r),
                     [&](auto count) { pass<count()>(xr, k, w, yr, y_stride, first, n, stop); });
    }
  }
}

inline float half_at(const uint8_t* p) {
  uint16_t half;
  std::memcpy(&half, p, sizeof half);
  return _cvtsh_ss(half);
}

// A GGUF block type: Q::Block(bytes).group(g) is weights kVecLanes * g .. of the block (g < kGroups),
// each as gguf's dequantize computes it; a block holds little in registers, so that tiles of several
// weight rows keep their sums in registers too
constexpr int kGroups = kBlockWeights / kVecLanes;

struct Q4_1 {  // weights 0-15: the 16 bytes' low nibbles; 16-31: their high ones
  static constexpr int64_t kBytes = kQ4_1BlockBytes;
  static constexpr int kFewRowsCols = 2;
  static constexpr int kChains = 1;
  struct Block {
    const uint8_t* q;
    Vec d, m;
    Block() = default;
    explicit Block(const uint8_t* bytes) : q(bytes + 4), d(vset(half_at(bytes))), m(vset(half_at(bytes + 2))) {}
    Vec group(int g) const {  // d * q + m: d * q is exact, + m rounds once
      const auto bytes = widen_bytes(q + kVecLanes * g % 16);
      return vfma(to_floats(kVecLanes * g < 16 ? low_nibbles(bytes) : high_nibbles(bytes)), d, m);
    }
  };
};

struct Q8_0 {
  static constexpr int64_t kBytes = kQ8_0BlockBytes;
  static constexpr int kFewRowsCols = 1;
  // a row at a time leaves one chain of dependent FMAs per row of x, waiting on the FMA's latency: two
  // chains made the head's one-row pass 1.3 ms instead of 1.9 on an AVX2 EPYC (six rows: no change).
  // Q4_1's two rows in flight already give two; a second chain each changed nothing measurable there
  static constexpr int kChains = 2;
  struct Block {
    const uint8_t* q;
    Vec d;
    Block() = default;
    explicit Block(const uint8_t* bytes) : q(bytes + 2), d(vset(half_at(bytes))) {}
    Vec group(int g) const { return vmul(to_floats(widen_signed_bytes(q + kVecLanes * g)), d); }  // d * q, exact
  };
};

// A matrix of blocks of type Q, row by row
template <typename Q>
struct BlockRows {
  const uint8_t* data;
  int64_t row_bytes;
  const uint8_t* row(int64_t n) const { return data + n * row_bytes; }
  void dequantize(int64_t n, int64_t k, float* out) const {
    const uint8_t* block = row(n);
    for (int64_t i = 0; i < k; i += kBlockWeights, block += Q::kBytes) {
      const typename Q::Block weights(block);
      for (int g = 0; g < kGroups; ++g) vstore(out + i + kVecLanes * g, weights.group(g));
    }
  }
};

// ROWS rows of x against COLS weight rows of blocks from n on, dequantized in registers: the same
// FMAs as tile<ROWS, COLS> over the dequantized rows, in Q::kChains sums (vector j into sum j % kChains)
template <int ROWS, int COLS, typename Q>
inline void block_tile(const float* x, int64_t x_stride, const BlockRows<Q>& w, int64_t k, float* y, int64_t y_stride,
                       int64_t n) {
  constexpr int CHAINS = Q::kChains;
  static_assert(kGroups % CHAINS == 0, "a block's vectors go to the chains in turn");
  Vec acc[CHAINS][ROWS][COLS];
  for (int h = 0; h < CHAINS; ++h)
    for (int r = 0; r < ROWS; ++r)
      for (int c = 0; c < COLS; ++c) acc[h][r][c] = vzero();
  const uint8_t* block = w.row(n);
  for (int64_t i = 0; i < k; i += kBlockWeights, block += Q::kBytes) {
    typename Q::Block blocks[COLS];
    for (int c = 0; c < COLS; ++c) blocks[c] = typename Q::Block(block + c * w.row_bytes);
    for (int g = 0; g < kGroups; ++g) {
      Vec wv[COLS];
      for (int c = 0; c < COLS; ++c) wv[c] = blocks[c].group(g);
      for (int r = 0; r < ROWS; ++r) {
        const Vec xv = vload(x + r * x_stride + i + kVecLanes * g);
        for (int c = 0; c < COLS; ++c) acc[g % CHAINS][r][c] = vfma(xv, wv[c], acc[g % CHAINS][r][c]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) {
      Vec sum = acc[0][r][c];
      for (int h = 1; h < CHAINS; ++h) sum = vadd(sum, acc[h][r][c]);
      y[r * y_stride + c] = vsum(sum);
    }
}

// weight rows a block tile takes for `rows` rows of x: a sum per row, and for one or two rows of x two
// Q4_1 rows in flight (three or four spill the blocks' registers); Q8_0 rows one at a time (two made the
// head's one-row pass 1.4-1.9x slower on an AVX-512 EPYC)
template <typename Q>
constexpr int block_tile_cols(int64_t rows) { return rows <= 2 ? Q::kFewRowsCols : 1; }

template <int ROWS, typename Q>
void block_pass(const float* x, int64_t k, const BlockRows<Q>& w, float* y, int64_t y_stride, int64_t first,
                int64_t begin, int64_t end) {
  constexpr int COLS = block_tile_cols<Q>(ROWS);
  int64_t n = begin;
  for (; n + COLS <= end; n += COLS) block_tile<ROWS, COLS>(x, k, w, k, y + n - first, y_stride, n);
  for (; n < end; ++n) block_tile<ROWS, 1>(x, k, w, k, y + n - first, y_stride, n);
}

constexpr int64_t kBlockChunkBytes = 16 * 1024;  // float32 bytes of the weight rows more than six rows of x share

// rows_pass over blocks: each weight row dequantized once for up to six rows of x; more rows of x,
// every group of six passes over a few weight rows in turn, the later groups reading them from L1.
template <typename Q>
void rows_pass(int64_t rows, const float* x, int64_t k, const BlockRows<Q>& w, float* y, int64_t y_stride,
               int64_t first, int64_t begin, int64_t end) {
  const auto group = [&](int64_t group_rows, const float* xg, float* yg, int64_t from, int64_t to) {
    with_row_count(group_rows, [&](auto count) { block_pass<count()>(xg, k, w, yg, y_stride, first, from, to); });
  };
  if (rows <= kMaxRowsPerPass) return group(rows, x, y, begin, end);
  const int64_t chunk = std::max<int64_t>(2, kBlockChunkBytes / (4 * k));
  for (int64_t n = begin; n < end; n += chunk)
    for (int64_t r = 0; r < rows; r += kMaxRowsPerPass)
      group(std::min(kMaxRowsPerPass, rows - r), x + r * k, y + r * y_stride, n, std::min(n + chunk, end));
}

// x [k] . weight row n
template <typename W>
float row_dot(const float* x, int64_t k, const W* w, int64_t n) {
  float y;
  tile<1, 1>(x, k, w, k, &y, 0, n);
  return y;
}

template <typename Q>
float row_dot(const float* x, int64_t k, const BlockRows<Q>& w, int64_t n) {
  float y;
  block_tile<1, 1>(x, k, w, k, &y, 0, n);
  return y;
}

// f(the weights' data: float32, bfloat16's raw halves, or BlockRows)
template <typename F>
void with_weights(const at::Tensor& w, F&& f) {
  switch (w.scalar_type()) {
    case at::kBFloat16: f(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>())); break;
    case at::kByte: f(BlockRows<Q4_1>{w.data_ptr<uint8_t>(), w.size(1)}); break;
    case at::kChar: f(BlockRows<Q8_0>{reinterpret_cast<const uint8_t*>(w.data_ptr<int8_t>()), w.size(1)}); break;
    default: f(w.data_ptr<float>());
  }
}

// w as a float32 matrix [n, k]: itself, bfloat16 widened, blocks dequantized
at::Tensor as_float(const at::Tensor& w, int64_t k) {
  if (w.scalar_type() == at::kFloat) return w;
  if (w.scalar_type() == at::kBFloat16) return w.to(at::kFloat);
  at::Tensor out = at::empty({w.size(0), k}, at::TensorOptions().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  with_weights(w, [&](const auto& wp) {
    if constexpr (!std::is_pointer_v<std::decay_t<decltype(wp)>>)
      at::parallel_for(0, w.size(0), 64, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) wp.dequantize(n, k, op + n * k);
      });
  });
  return out;
}

// grain: at least 64 weight rows a task, so a small matrix is not split into slivers
constexpr int64_t kWeightRowsGrain = 64;

// The highest score so far and its id, as torch.argmax: the first of equal maxima, and a NaN above
// every number (the first NaN)
struct Best {
  float score = -std::numeric_limits<float>::infinity();
  int64_t id = std::numeric_limits<int64_t>::max();
  bool beaten_by(float other, int64_t other_id) const {
    if (std::isnan(other)) return !std::isnan(score) || other_id < id;
    if (std::isnan(score)) return false;
    return other > score || (other == score && other_id < id);
  }
};

// Rows a verify still needs, one bit each; a rejected draft clears its row's and its descendants'
using RowSet = uint64_t;
static_assert(kRowsKernelMax <= 64, "verify_argmax keeps a row's bit in a RowSet");
constexpr RowSet bit(int64_t row) { return RowSet{1} << row; }

constexpr int64_t kScoredBeforeLooking = 256;  // weight rows a core scores before it looks at what they say

// The target's head at a greedy verify: x [rows, k] holds the final states of the last committed
// token (row 0) and of the drafts, draft i at row i + 1 with the token tokens[i] and its parent's
// row parents[i] (the row before it for a chain; a tree's parent node). The target's greedy token
// after row r is the argmax of its scores against every row of w [vocab, k]; a draft is accepted
// when it is its parent's, and row r is needed only while every draft on its path may be. Once a
// core sees a score beat draft i's under its parent, the draft's row and its descendants are no
// longer scored: most verifies reject early, so most of the head's multiply-adds for later rows are
// never done, and no logits are written. Each score is linear_into's own (every output the same dot
// product whatever the tile) and ties go to the first id, as torch.argmax: each argmax returned is
// exactly the logits'. Returns the argmax of every row still needed, -1 for the others.
at::Tensor verify_argmax(const at::Tensor& x_in, const at::Tensor& w, at::IntArrayRef tokens, at::IntArrayRef parents) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() == 2 && x_in.size(0) >= 1 &&
                  x_in.size(0) <= kRowsKernelMax && weight_columns(w) > 0 && w.is_contiguous() &&
                  x_in.size(1) == weight_columns(w) && x_in.size(1) % kLanes == 0,
              "verify_argmax: float32 x [1 to ", kRowsKernelMax, " rows, k], a contiguous float32, bfloat16 or GGUF-block "
              "w [vocab, k], k a multiple of ", kLanes);
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0), k = x.size(1), vocab = w.size(0);
  TORCH_CHECK(static_cast<int64_t>(tokens.size()) == rows - 1 && static_cast<int64_t>(parents.size()) == rows - 1,
              "verify_argmax: a token and a parent for each row but the first");
  for (int64_t i = 0; i < rows - 1; ++i) {
    TORCH_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "verify_argmax: token ", tokens[i], " out of range");
    TORCH_CHECK(parents[i] >= 0 && parents[i] <= i, "verify_argmax: a draft's parent is a row before it");
  }
  const float* xp = x.data_ptr<float>();
  std::vector<float> token_score(rows, 0.0f);  // row r's draft scored under its parent (r >= 1)
  std::vector<Best> best(rows);
  std::atomic<RowSet> needed{rows == std::numeric_limits<RowSet>::digits ? ~RowSet{0} : bit(rows) - 1};
  std::mutex merging;
  with_weights(w, [&](const auto& wp) {
    for (int64_t r = 1; r < rows; ++r) token_score[r] = row_dot(xp + parents[r - 1] * k, k, wp, tokens[r - 1]);
    at::parallel_for(0, vocab, kWeightRowsGrain, [&](int64_t begin, int64_t end) {
      std::vector<Best> mine(rows);
      std::vector<float> gathered(rows * k), scores(rows * kScoredBeforeLooking);
      std::vector<int64_t> order;  // the rows gathered, ascending
      RowSet gathered_set = 0;
      for (int64_t b = begin; b < end; b += kScoredBeforeLooking) {
        const int64_t stop = std::min(b + kScoredBeforeLooking, end);
        RowSet live = needed.load();
        if (live != gathered_set) {
          order.clear();
          for (int64_t r = 0; r < rows; ++r)
            if (live & bit(r)) {
              std::copy_n(xp + r * k, k, gathered.data() + order.size() * k);
              order.push_back(r);
            }
          gathered_set = live;
        }
        rows_pass(static_cast<int64_t>(order.size()), gathered.data(), k, wp, scores.data(), kScoredBeforeLooking, b, b, stop);
        for (size_t j = 0; j < order.size(); ++j) {
          const float* row = scores.data() + j * kScoredBeforeLooking;
          Best& found = mine[order[j]];
          for (int64_t n = b; n < stop; ++n)
            if (found.beaten_by(row[n - b], n)) found = {row[n - b], n};
        }
        RowSet rejected = 0;
        for (int64_t r = 1; r < rows; ++r) {  // parents before children: a rejection reaches every descendant
          const int64_t parent = parents[r - 1];
          if ((live & bit(r)) && (!(live & bit(parent)) ||
                                  Best{token_score[r], tokens[r - 1]}.beaten_by(mine[parent].score, mine[parent].id))) {
            live &= ~bit(r);
            rejected |= bit(r);
          }
        }
        if (rejected) needed.fetch_and(~rejected);
      }
      const std::lock_guard<std::mutex> hold(merging);
      for (int64_t r = 0; r < rows; ++r)
        if (best[r].beaten_by(mine[r].score, mine[r].id)) best[r] = mine[r];
    });
  });
  // a row still needed was scored by every core against all of its weight rows
  const RowSet live = needed.load();
  at::Tensor argmax = at::empty({rows}, at::TensorOptions().dtype(at::kLong));
  for (int64_t r = 0; r < rows; ++r) argmax.data_ptr<int64_t>()[r] = (live & bit(r)) ? best[r].id : -1;
  return argmax;
}

// PyTorch's oneDNN linear on a plain weight (the op its packed linears call), where PyTorch has oneDNN
const std::optional<c10::OperatorHandle>& onednn_linear() {
  static const std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  return op;
}

// Many rows (a prompt) are arithmetic, not reading: oneDNN's gemm takes them (2.3x MKL's sgemm for a
// prompt's projections on an AVX-512 EPYC), else MKL's sgemm.
void many_rows_into(const at::Tensor& x, const at::Tensor& w_in, at::Tensor& y) {
  const at::Tensor w = as_float(w_in, x.size(1));
  if (onednn_linear() && at::globalContext().userEnabledMkldnn()) {
    torch::jit::Stack stack{x.contiguous(), w, c10::IValue(), std::string("none"), c10::List<std::optional<at::Scalar>>(),
                            c10::IValue()};
    onednn_linear()->callBoxed(&stack);
    y.copy_(stack.front().toTensor());
    return;
  }
  at::linear_out(y, x, w);
}

}  // namespace

int64_t weight_columns(const at::Tensor& w) {
  if (w.dim() != 2) return 0;
  const auto whole_blocks = [&](int64_t block_bytes) {
    return w.size(1) % block_bytes == 0 ? w.size(1) / block_bytes * kBlockWeights : 0;
  };
  switch (w.scalar_type()) {
    case at::kFloat:
    case at::kBFloat16: return w.size(1);
    case at::kByte: return whole_blocks(kQ4_1BlockBytes);
    case at::kChar: return whole_blocks(kQ8_0BlockBytes);
    default: return 0;
  }
}

void linear_into(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  const int64_t rows = x.size(0), k = x.size(1), n_out = w.size(0);
  if (rows > kRowsKernelMax) {
    many_rows_into(x, w, y);
    return;
  }
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  with_weights(w, [&](const auto& wp) {
    at::parallel_for(0, n_out, kWeightRowsGrain,
                     [&](int64_t begin, int64_t end) { rows_pass(rows, xp, k, wp, yp, n_out, 0, begin, end); });
  });
}

namespace {

at::Tensor rows_linear(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight_columns(w) > 0 && w.is_contiguous(),
              "rows_linear: float32 x; w a contiguous float32 or bfloat16 [n, k] matrix, or GGUF blocks [n, bytes]");
  const int64_t k = weight_columns(w);
  TORCH_CHECK(x.size(-1) == k && k % kLanes == 0, "rows_linear: x's last dimension must be w's, a multiple of ", kLanes);
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
  m.def("verify_argmax(Tensor x, Tensor w, int[] tokens, int[] parents) -> Tensor");
}
TORCH_LIBRARY_IMPL(playground, CPU, m) {
  m.impl("rows_linear", playground::rows_linear);
  m.impl("verify_argmax", playground::verify_argmax);
}
