#pragma once

#include <ATen/core/Tensor.h>

namespace playground {

// rows_linear.cpp's kernel takes up to this many rows; more go to oneDNN's gemm (MKL's without oneDNN)
constexpr int64_t kRowsKernelMax = 64;

// the floats of one AVX2 register: a weight row's length must be a multiple of it
constexpr int64_t kLanes = 8;

// A GGUF block: 32 weights of one row. A row of k weights is k / 32 blocks, each Q4_1 (uint8 tensors
// [n, k / 32 * 20]: a float16 scale d and minimum m, then 16 bytes of 4-bit q; weight j is the low
// nibble of byte j, weight j + 16 its high one; w = d * q + m) or Q8_0 (int8 tensors [n, k / 32 * 34]:
// a float16 scale d, then 32 int8 q; w = d * q).
constexpr int64_t kBlockWeights = 32;
constexpr int64_t kQ4_1BlockBytes = 20;
constexpr int64_t kQ8_0BlockBytes = 34;

// the weights in a row of w: float32 or bfloat16 [n, k], Q4_1 uint8 or Q8_0 int8 blocks; 0 for
// another dtype or a row not made of whole blocks
int64_t weight_columns(const at::Tensor& w);

// y [rows, n] = x [rows, k] @ w [n, k].T; x and y float32, w float32, bfloat16 or GGUF blocks (above),
// all contiguous, k a multiple of kLanes (of kBlockWeights for blocks)
void linear_into(const at::Tensor& x, const at::Tensor& w, at::Tensor& y);

}  // namespace playground
