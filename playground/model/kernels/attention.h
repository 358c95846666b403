#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace playground {

// decoder_layers.cpp hands attention of more query rows than this (prompts) to PyTorch's
// scaled_dot_product_attention; the draft step's first pass over a prompt stays here
constexpr int64_t kAttentionRowsMax = 64;

// out [B * T, heads * head_dim] = softmax(q k^T / sqrt(head_dim)) v for the query rows
// q [B * T, heads * head_dim] (row b * T + t, heads side by side: what the o projection reads),
// over keys / values [B, kv_heads, capacity, head_dim] (grouped-query: a head reads kv head
// head / (heads / kv_heads)) at positions [0, start + T). Row (b, t) sees key j where
// mask [B or 1, 1, T, start + T] (bool) says so; without a mask, j <= start + t when causal, else
// every key. A row that sees no key gets zeros. Given row_weights [T - weights_from_row, num_heads,
// start + T], the softmax weights of batch 0's rows from weights_from_row on go there, row by row and
// head by head (zeros on the keys a row does not see).
void attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, at::Tensor& out, int64_t B,
            int64_t T, int64_t num_heads, int64_t start, const std::optional<at::Tensor>& mask, bool causal,
            float* row_weights = nullptr, int64_t weights_from_row = 0);

}  // namespace playground
