// One EAGLE-3 draft step in one call, float32 on the CPU: what drafter.py's Eagle3Drafter.step and
// the proposer's attention over the drafter cache do op by op (causal for a chain, a draft tree's
// mask for its rows), with the proposer's probes (the attention mass on the sink keys, and on the
// keys drafted in this round: a chain's last query's, a tree depth's mean over its rows). A draft
// depth is a token or a few through one layer: from Python its some 60 small operators cost more
// than its arithmetic.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <vector>

#include "attention.h"
#include "layer_ops.h"
#include "rows_linear.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace playground {
namespace {

// input norm, hidden norm, q, k, v, o, post-attention norm, gate, up, down, final norm
constexpr int64_t kWeights = 11;

// Mean over query rows and heads of the softmax mass on keys [0, sink) and [own_from, length),
// from their weights [rows_and_heads, length]
std::pair<double, double> probe_masses(const float* weights, int64_t rows_and_heads, int64_t length, int64_t sink,
                                       int64_t own_from) {
  double on_sink = 0, on_own = 0;
  for (int64_t i = 0; i < rows_and_heads; ++i) {
    const float* w = weights + i * length;
    on_sink += std::accumulate(w, w + std::min({sink, own_from, length}), 0.0);  // sinks are committed tokens
    on_own += std::accumulate(w + std::min(own_from, length), w + length, 0.0);
  }
  return {on_sink / rows_and_heads, on_own / rows_and_heads};
}

// The first step's hidden input from the target's features [T, n * Ht] (drafter.py's fuse): each of
// the n chunks through its RMSNorm where there are norms (EAGLE 3.1's fc_norm), then fc [H, n * Ht].
at::Tensor eagle_fuse(const at::Tensor& features_in, at::TensorList norms, const at::Tensor& fc, double eps) {
  TORCH_CHECK(features_in.scalar_type() == at::kFloat && features_in.dim() == 2 && fc.dim() == 2 &&
                  fc.is_contiguous() && (fc.scalar_type() == at::kFloat || fc.scalar_type() == at::kBFloat16) &&
                  features_in.size(1) == fc.size(1) && fc.size(1) % kLanes == 0,
              "eagle_fuse: float32 features [T, n * Ht] and a contiguous float32 or bfloat16 fc [H, n * Ht], "
              "n * Ht a multiple of ", kLanes);
  at::Tensor features = features_in.contiguous();
  const int64_t T = features.size(0), width = features.size(1), chunks = static_cast<int64_t>(norms.size());
  if (chunks > 0) {
    const int64_t chunk = width / chunks;
    TORCH_CHECK(chunk * chunks == width, "eagle_fuse: a norm for each of the n equal chunks");
    for (const at::Tensor& norm : norms)
      TORCH_CHECK(norm.scalar_type() == at::kFloat && norm.is_contiguous() && norm.numel() == chunk,
                  "eagle_fuse: each norm a contiguous float32 weight of its chunk's width");
    at::Tensor normed = at::empty({T, width}, features.options());
    const float* fp = features.data_ptr<float>();
    float* np = normed.data_ptr<float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < chunks; ++i)
        rms_norm(fp + t * width + i * chunk, norms[i].data_ptr<float>(), np + t * width + i * chunk, 1, chunk, eps);
    features = normed;
  }
  at::Tensor out = at::empty({T, fc.size(0)}, features.options());
  linear_into(features, fc, out);
  return out;
}

// hidden, embeds [T, H]; keys / values the drafter cache [1, 1, kv_heads, capacity, head_dim], the
// new positions written at start..start+T. Attention is causal and the probes are the last row's;
// with a mask [T, start + T] (a draft tree's rows), it says which keys each row sees and the probes
// are the mean of every row's. Returns (normed output, h_pre, sink mass, own mass).
std::tuple<at::Tensor, at::Tensor, double, double> eagle_step(
    const at::Tensor& hidden_in, const at::Tensor& embeds_in, at::TensorList w, const at::Tensor& cos_in,
    const at::Tensor& sin_in, const at::Tensor& keys_in, const at::Tensor& values_in, int64_t start, double eps,
    int64_t num_heads, int64_t sink_tokens, int64_t committed_end, const std::optional<at::Tensor>& mask) {
  TORCH_CHECK(w.size() == kWeights, "eagle_step: eleven weights");
  TORCH_CHECK(hidden_in.scalar_type() == at::kFloat && embeds_in.scalar_type() == at::kFloat &&
                  keys_in.scalar_type() == at::kFloat && values_in.scalar_type() == at::kFloat, "eagle_step: float32 only");
  TORCH_CHECK(keys_in.dim() == 5 && keys_in.size(0) == 1 && keys_in.size(1) == 1 && keys_in.is_contiguous() &&
                  values_in.is_contiguous() && values_in.sizes() == keys_in.sizes(),
              "eagle_step: the caches must be [1, 1, kv_heads, capacity, head_dim]");
  TORCH_CHECK(hidden_in.dim() == 2 && embeds_in.sizes() == hidden_in.sizes(), "eagle_step: hidden and embeds [T, H]");
  const at::Tensor hidden = hidden_in.contiguous(), embeds = embeds_in.contiguous();
  const int64_t T = hidden.size(0), H = hidden.size(1);
  const int64_t kv_heads = keys_in.size(2), capacity = keys_in.size(3), head_dim = keys_in.size(4);
  const int64_t q_width = num_heads * head_dim, kv_width = kv_heads * head_dim, inner = w[7].size(0);
  const int64_t length = start + T;
  TORCH_CHECK(head_dim % 8 == 0 && num_heads % kv_heads == 0 && start >= 0,
              "eagle_step: head_dim a multiple of 8, the heads a multiple of the kv heads, start >= 0");
  const auto norm = [&](int i) { return w[i].scalar_type() == at::kFloat && w[i].is_contiguous() && w[i].numel() == H; };
  const auto matrix = [&](int i, int64_t rows, int64_t cols) {
    return w[i].dim() == 2 && w[i].size(0) == rows && w[i].size(1) == cols && w[i].is_contiguous() &&
           (w[i].scalar_type() == at::kFloat || w[i].scalar_type() == at::kBFloat16);
  };
  TORCH_CHECK(norm(0) && norm(1) && norm(6) && norm(10) && matrix(2, q_width, 2 * H) && matrix(3, kv_width, 2 * H) &&
                  matrix(4, kv_width, 2 * H) && matrix(5, H, q_width) && matrix(7, inner, H) && matrix(8, inner, H) &&
                  matrix(9, H, inner) && H % 8 == 0 && inner % 8 == 0,
              "eagle_step: the weights must be the drafter's, in order: norms [H], q [heads*head_dim, 2H], k and v ",
              "[kv_heads*head_dim, 2H], o [H, heads*head_dim], gate and up [inner, H], down [H, inner] (H = ", H, ")");
  TORCH_CHECK(cos_in.numel() == T * head_dim && sin_in.numel() == T * head_dim, "eagle_step: cos / sin [T, head_dim]");
  TORCH_CHECK(length <= capacity, "KV cache overflow: ", length, " > ", capacity);
  TORCH_CHECK(!mask.has_value() || (mask->dim() == 2 && mask->size(0) == T && mask->size(1) == length),
              "eagle_step: the mask must be [T, start + T]");

  const auto options = hidden.options();
  at::Tensor both = at::empty({T, 2 * H}, options), normed = at::empty({T, H}, options);
  at::Tensor q_lin = at::empty({T, q_width}, options), k_lin = at::empty({T, kv_width}, options);
  at::Tensor v_lin = at::empty({T, kv_width}, options), q = at::empty({T, q_width}, options);
  at::Tensor attended = at::empty({T, q_width}, options), projected = at::empty({T, H}, options);
  at::Tensor h = at::empty({T, H}, options), gate = at::empty({T, inner}, options);
  at::Tensor up = at::empty({T, inner}, options), activated = at::empty({T, inner}, options);
  at::Tensor out = at::empty({T, H}, options);
  const float *hp_in = hidden.data_ptr<float>(), *ep = embeds.data_ptr<float>();
  float *bp = both.data_ptr<float>(), *np = normed.data_ptr<float>(), *hp = h.data_ptr<float>();
  float *pp = projected.data_ptr<float>(), *qp = q.data_ptr<float>();
  const at::Tensor cos = cos_in.contiguous().view({T, head_dim}), sin = sin_in.contiguous().view({T, head_dim});

  // attention over cat(norm(embeds), hidden_norm(hidden)), 2H wide
  rms_norm(ep, w[0].data_ptr<float>(), np, T, H, eps);
  for (int64_t t = 0; t < T; ++t) std::copy_n(np + t * H, H, bp + t * 2 * H);
  rms_norm(hp_in, w[1].data_ptr<float>(), np, T, H, eps);
  for (int64_t t = 0; t < T; ++t) std::copy_n(np + t * H, H, bp + t * 2 * H + H);
  linear_into(both, w[2], q_lin);
  linear_into(both, w[3], k_lin);
  linear_into(both, w[4], v_lin);
  const at::Tensor keys = keys_in[0], values = values_in[0];  // [1, kv_heads, capacity, head_dim]
  float *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float *c = cos.data_ptr<float>() + t * head_dim, *s = sin.data_ptr<float>() + t * head_dim;
    for (int64_t head = 0; head < num_heads; ++head)
      rope(q_lin.data_ptr<float>() + t * q_width + head * head_dim, c, s, qp + t * q_width + head * head_dim, head_dim);
    for (int64_t g = 0; g < kv_heads; ++g) {
      const int64_t slot = (g * capacity + start + t) * head_dim;
      rope(k_lin.data_ptr<float>() + t * kv_width + g * head_dim, c, s, kp + slot, head_dim);
      std::copy_n(v_lin.data_ptr<float>() + t * kv_width + g * head_dim, head_dim, vp + slot);
    }
  }
  const int64_t weighed_from = mask.has_value() ? 0 : T - 1;
  std::vector<float> row_weights((T - weighed_from) * num_heads * length);
  attend(q, keys, values, attended, 1, T, num_heads, start,
         mask.has_value() ? std::optional<at::Tensor>(mask->reshape({1, 1, T, length})) : std::nullopt,
         /*causal=*/!mask.has_value(), row_weights.data(), weighed_from);
  const auto [sink, own] = probe_masses(row_weights.data(), (T - weighed_from) * num_heads, length, sink_tokens,
                                        committed_end);
  linear_into(attended, w[5], projected);
  for (int64_t i = 0; i < T * H; ++i) hp[i] = hp_in[i] + pp[i];

  rms_norm(hp, w[6].data_ptr<float>(), np, T, H, eps);
  linear_into(normed, w[7], gate);
  linear_into(normed, w[8], up);
  silu_mul(gate.data_ptr<float>(), up.data_ptr<float>(), activated.data_ptr<float>(), T * inner);
  linear_into(activated, w[9], projected);
  for (int64_t i = 0; i < T * H; ++i) hp[i] += pp[i];  // h_pre
  rms_norm(hp, w[10].data_ptr<float>(), out.data_ptr<float>(), T, H, eps);
  return {out, h, sink, own};
}


// A greedy chain of k drafts in one call: what the proposer's propose does depth by depth at
// temperature 0. The first step runs over the T pending positions start..start+T (hidden, ids
// [T]), each later one over the draft before it at position start + T + depth - 1; cos / sin hold
// the rows of positions start..start+T+k-2. Each depth's draft is the head's argmax (the first
// of equal logits, as torch.argmax), mapped to the target's vocabulary by draft_to_target, with
// its softmax probability. Returns the drafts [k] (target ids), their probabilities, the sink
// and own-draft masses and the RMS of the state fed into each depth, [k] each.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> eagle_chain(
    const at::Tensor& hidden_in, const at::Tensor& ids, const at::Tensor& embedding, at::TensorList w,
    const at::Tensor& head, const at::Tensor& draft_to_target, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& keys, const at::Tensor& values, int64_t start, int64_t k, double eps, int64_t num_heads,
    int64_t sink_tokens, bool norm_output) {
  TORCH_CHECK(embedding.scalar_type() == at::kFloat && embedding.is_contiguous() && head.is_contiguous() &&
                  ids.scalar_type() == at::kLong && draft_to_target.scalar_type() == at::kLong,
              "eagle_chain: a contiguous float32 embedding, a contiguous head, int64 ids");
  const int64_t T = hidden_in.size(0), H = hidden_in.size(1), end = start + T, draft_vocab = head.size(0);
  TORCH_CHECK(k >= 1 && cos.size(0) == T + k - 1 && sin.size(0) == T + k - 1 && ids.numel() == T,
              "eagle_chain: cos / sin need a row for each of the T + k - 1 positions");
  TORCH_CHECK(embedding.dim() == 2 && embedding.size(1) == H && head.dim() == 2 && head.size(1) == H &&
                  draft_to_target.numel() == draft_vocab && draft_to_target.is_contiguous(),
              "eagle_chain: embedding [vocab, H], head [draft_vocab, H], a target id for each draft id");
  const int64_t vocab = embedding.size(0);
  const at::Tensor id_list = ids.contiguous();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(id_list.data_ptr<int64_t>()[t] >= 0 && id_list.data_ptr<int64_t>()[t] < vocab,
                "eagle_chain: token ", id_list.data_ptr<int64_t>()[t], " is not in the embedding's ", vocab);
  const auto dopts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor drafts = at::empty({k}, ids.options()), probs = at::empty({k}, dopts), sinks = at::empty({k}, dopts);
  at::Tensor owns = at::empty({k}, dopts), rms = at::empty({k}, dopts);
  at::Tensor logits = at::empty({1, draft_vocab}, hidden_in.options());
  const int64_t* to_target = draft_to_target.data_ptr<int64_t>();
  const float* table = embedding.data_ptr<float>();
  at::Tensor hidden = hidden_in.contiguous(), embeds = at::empty({T, H}, hidden_in.options());
  for (int64_t t = 0; t < T; ++t) std::copy_n(table + id_list.data_ptr<int64_t>()[t] * H, H, embeds.data_ptr<float>() + t * H);
  for (int64_t depth = 0; depth < k; ++depth) {
    const float* last = hidden.data_ptr<float>() + (hidden.size(0) - 1) * H;
    rms.data_ptr<double>()[depth] = std::sqrt(mean_square(last, H));
    const int64_t first = depth == 0 ? 0 : T + depth - 1, rows = depth == 0 ? T : 1;
    auto [normed, h_pre, sink, own] = eagle_step(hidden, embeds, w, cos.narrow(0, first, rows), sin.narrow(0, first, rows),
                                                 keys, values, depth == 0 ? start : end + depth - 1, eps, num_heads,
                                                 sink_tokens, end, std::nullopt);
    const at::Tensor normed_last = normed.narrow(0, rows - 1, 1);
    linear_into(normed_last, head, logits);
    float* l = logits.data_ptr<float>();
    const int64_t best = argmax_first(l, draft_vocab);
    TORCH_CHECK(to_target[best] >= 0 && to_target[best] < vocab, "eagle_chain: draft ", best, " maps outside the vocabulary");
    const double total = exp_shifted(l, draft_vocab, l[best]);  // the logits are spent: exps in their place
    drafts.data_ptr<int64_t>()[depth] = to_target[best];
    probs.data_ptr<double>()[depth] = 1.0 / total;
    sinks.data_ptr<double>()[depth] = sink;
    owns.data_ptr<double>()[depth] = own;
    hidden = (norm_output ? normed : h_pre).narrow(0, rows - 1, 1).contiguous();
    embeds = embedding.narrow(0, to_target[best], 1);
  }
  return {drafts, probs, sinks, owns, rms};
}

}  // namespace
}  // namespace playground

TORCH_LIBRARY_FRAGMENT(playground, m) {
  m.def("eagle_fuse(Tensor features, Tensor[] norms, Tensor fc, float eps) -> Tensor");
  m.def("eagle_step(Tensor hidden, Tensor embeds, Tensor[] weights, Tensor cos, Tensor sin, Tensor(a!) keys, "
        "Tensor(b!) values, int start, float eps, int num_heads, int sink_tokens, "
        "int committed_end, Tensor? mask) -> (Tensor, Tensor, float, float)");
  m.def("eagle_chain(Tensor hidden, Tensor ids, Tensor embedding, Tensor[] weights, Tensor head, "
        "Tensor draft_to_target, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, int start, int k, "
        "float eps, int num_heads, int sink_tokens, bool norm_output) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(playground, CPU, m) {
  m.impl("eagle_fuse", playground::eagle_fuse);
  m.impl("eagle_step", playground::eagle_step);
  m.impl("eagle_chain", playground::eagle_chain);
}
