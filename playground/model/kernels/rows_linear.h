#pragma once

#include <ATen/core/Tensor.h>

namespace playground {

// rows_linear.cpp's kernel takes up to this many rows; more go to oneDNN's gemm (MKL's without oneDNN)
constexpr int64_t kRowsKernelMax = 64;

// the floats of one AVX2 register: a weight row's length must be a multiple of it
constexpr int64_t kLanes = 8;

// y [rows, n] = x [rows, k] @ w [n, k].T; x and y float32, w float32 or bfloat16, all contiguous, k a
// multiple of kLanes
void linear_into(const at::Tensor& x, const at::Tensor& w, at::Tensor& y);

}  // namespace playground
