// A Llama decoder stack in one call, float32 on the CPU: what target.py's _layers does op by op.
//
// A decode step runs some 40 small operators a layer; from Python each costs more than its work
// (the norms, RoPE, SiLU and cache writes of one token are a few thousand flops). Here they are
// plain loops, the projections are rows_linear.cpp's kernel and attention is attention.cpp's (PyTorch's
// scaled_dot_product_attention for prompts).
#include <cmath>
#include <optional>
#include <vector>

#include "attention.h"
#include "layer_ops.h"
#include "rows_linear.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/library.h>

namespace playground {
namespace {

constexpr int64_t kWeightsPerLayer = 6;  // input norm, qkv, o, post-attention norm, gate_up, down

// h [B, T, H] through every layer; keys / values [layers, B, kv_heads, capacity, head_dim] get the
// new tokens at start..start+T. Returns h and the inputs of the tap layers.
std::vector<at::Tensor> decoder_layers(const at::Tensor& h_in, at::TensorList weights, const at::Tensor& cos_in,
                                       const at::Tensor& sin_in, const at::Tensor& keys, const at::Tensor& values,
                                       int64_t start, const std::optional<at::Tensor>& mask, bool is_causal,
                                       double eps, int64_t num_heads, at::IntArrayRef taps) {
  TORCH_CHECK(h_in.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat, "decoder_layers: float32 only");
  TORCH_CHECK(!weights.empty() && weights.size() % kWeightsPerLayer == 0, "decoder_layers: six weights a layer");
  const int64_t num_layers = weights.size() / kWeightsPerLayer;
  const int64_t B = h_in.size(0), T = h_in.size(1), H = h_in.size(2);
  const int64_t kv_heads = keys.size(2), capacity = keys.size(3), head_dim = keys.size(4);
  const int64_t rows = B * T, q_width = num_heads * head_dim, kv_width = kv_heads * head_dim;
  const int64_t inner = weights[4].size(0) / 2;
  TORCH_CHECK(keys.size(0) == num_layers && keys.size(1) == B && keys.is_contiguous() && values.is_contiguous(),
              "decoder_layers: the cache must be [layers, B, kv_heads, capacity, head_dim]");
  TORCH_CHECK(start >= 0 && start + T <= capacity, "KV cache overflow: ", start + T, " > ", capacity);
  TORCH_CHECK(h_in.dim() == 3 && values.sizes() == keys.sizes() && values.scalar_type() == at::kFloat &&
                  head_dim % 8 == 0 && num_heads % kv_heads == 0 && H % 8 == 0 && inner % 8 == 0 &&
                  cos_in.numel() == T * head_dim && sin_in.numel() == T * head_dim,
              "decoder_layers: h [B, T, H], equal key and value caches, head_dim a multiple of 8, cos / sin [T, head_dim]");
  for (const at::Tensor& w : weights)
    TORCH_CHECK(w.is_contiguous() && (w.scalar_type() == at::kFloat || weight_columns(w) > 0),
                "decoder_layers: contiguous weights, float32 (projections also bfloat16 or GGUF blocks)");
  const auto matrix = [](const at::Tensor& w, int64_t rows, int64_t cols) {
    return w.dim() == 2 && w.size(0) == rows && weight_columns(w) == cols;
  };
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const at::Tensor* w = &weights[layer * kWeightsPerLayer];
    TORCH_CHECK(w[0].numel() == H && w[3].numel() == H && matrix(w[1], q_width + 2 * kv_width, H) &&
                    matrix(w[2], H, q_width) && matrix(w[4], 2 * inner, H) && matrix(w[5], H, inner),
                "decoder_layers: layer ", layer, "'s weights must be: norm [H], qkv [q + 2 kv widths, H], o [H, q width], ",
                "norm [H], gate_up [2 inner, H], down [H, inner] (H = ", H, ")");
  }

  const auto options = h_in.options();
  at::Tensor h = h_in.contiguous().clone().view({rows, H});
  at::Tensor normed = at::empty({rows, H}, options);
  at::Tensor qkv = at::empty({rows, q_width + 2 * kv_width}, options);
  at::Tensor q = at::empty({rows, q_width}, options);
  at::Tensor attended = at::empty({rows, q_width}, options);
  at::Tensor projected = at::empty({rows, H}, options);
  at::Tensor gate_up = at::empty({rows, 2 * inner}, options);
  at::Tensor activated = at::empty({rows, inner}, options);
  const at::Tensor cos = cos_in.contiguous().view({T, head_dim}), sin = sin_in.contiguous().view({T, head_dim});
  float *hp = h.data_ptr<float>(), *np = normed.data_ptr<float>(), *qkvp = qkv.data_ptr<float>();
  float *qp = q.data_ptr<float>(), *pp = projected.data_ptr<float>();
  float *gup = gate_up.data_ptr<float>(), *actp = activated.data_ptr<float>();
  const float *cosp = cos.data_ptr<float>(), *sinp = sin.data_ptr<float>();
  std::vector<at::Tensor> out{h.view({B, T, H})};

  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const at::Tensor* w = weights.data() + layer * kWeightsPerLayer;
    if (std::find(taps.begin(), taps.end(), layer) != taps.end()) out.push_back(h.view({B, T, H}).clone());

    rms_norm(hp, w[0].data_ptr<float>(), np, rows, H, eps);
    linear_into(normed, w[1], qkv);
    at::Tensor layer_keys = keys[layer], layer_values = values[layer];
    float *kp = layer_keys.data_ptr<float>(), *vp = layer_values.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const float* row = qkvp + (b * T + t) * (q_width + 2 * kv_width);
        const float *c = cosp + t * head_dim, *s = sinp + t * head_dim;
        for (int64_t head = 0; head < num_heads; ++head)
          rope(row + head * head_dim, c, s, qp + (b * T + t) * q_width + head * head_dim, head_dim);
        for (int64_t g = 0; g < kv_heads; ++g) {
          const int64_t slot = ((b * kv_heads + g) * capacity + start + t) * head_dim;
          rope(row + q_width + g * head_dim, c, s, kp + slot, head_dim);
          std::copy_n(row + q_width + kv_width + g * head_dim, head_dim, vp + slot);
        }
      }
    if (T <= kAttentionRowsMax) {
      attend(q, layer_keys, layer_values, attended, B, T, num_heads, start, mask, is_causal);
    } else {
      const at::Tensor context = at::scaled_dot_product_attention(
          q.view({B, T, num_heads, head_dim}).transpose(1, 2), layer_keys.narrow(2, 0, start + T),
          layer_values.narrow(2, 0, start + T), mask, 0.0, is_causal, std::nullopt, /*enable_gqa=*/true);
      attended.view({B, T, num_heads, head_dim}).copy_(context.transpose(1, 2));
    }
    linear_into(attended, w[2], projected);
    for (int64_t i = 0; i < rows * H; ++i) hp[i] += pp[i];

    rms_norm(hp, w[3].data_ptr<float>(), np, rows, H, eps);
    linear_into(normed, w[4], gate_up);
    for (int64_t r = 0; r < rows; ++r)
      silu_mul(gup + r * 2 * inner, gup + r * 2 * inner + inner, actp + r * inner, inner);
    linear_into(activated, w[5], projected);
    for (int64_t i = 0; i < rows * H; ++i) hp[i] += pp[i];
  }
  return out;
}

}  // namespace
}  // namespace playground

TORCH_LIBRARY_FRAGMENT(playground, m) {
  m.def("decoder_layers(Tensor h, Tensor[] weights, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
        "int start, Tensor? mask, bool is_causal, float eps, int num_heads, int[] taps) -> Tensor[]");
}
TORCH_LIBRARY_IMPL(playground, CPU, m) { m.impl("decoder_layers", playground::decoder_layers); }
