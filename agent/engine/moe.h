// Routing of a mixture-of-experts layer (ModelConfig::num_experts): which
// experts each token goes to and with what weight, from the router's
// logits.
//
// Exactness: a row's choice and weights are a function of that row's
// logits alone, computed in one fixed order, so a token is routed alike
// alone, batched or chunked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::engine {

// How a mixture layer turns a row's router logits into experts and weights
// (ModelConfig's mixture fields).
struct Routing {
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  // The chosen weights divided by their sum (Mixtral always; Qwen3-MoE and
  // GLM-4.5 with norm_topk_prob).
  bool normalize = false;
  // DeepSeek-V3's routing (GLM-4.5): each expert's score is the sigmoid of
  // its logit; the choice ranks score + correction_bias[e] (the
  // checkpoint's e_score_correction_bias; nullptr: none) but the weights
  // are the scores alone. With groups > 1 the experts form `groups` equal
  // groups in index order, each ranked by the sum of its two best biased
  // scores, and only the best groups_chosen groups' experts may be chosen.
  // The weights, normalized or not, are multiplied by `scale`
  // (routed_scaling_factor).
  bool sigmoid = false;
  const float* correction_bias = nullptr;
  int64_t groups = 1;
  int64_t groups_chosen = 1;
  double scale = 1.0;
};

// One row's routing: `experts_per_token` expert indices in descending order
// of their rank (the logit; with sigmoid routing the biased score) — a tie
// goes to the smaller index, NaN loses to every number — and their weights.
// Softmax routing: the softmax over all experts' logits of the chosen ones
// (in double: the maximum subtracted, the sum taken in index order).
// Sigmoid routing: each chosen expert's score (the sigmoid in double,
// rounded to float as transformers' float32 sigmoid gives it). Either is
// divided by the chosen ones' sum when `normalize` (sigmoid: the sum plus
// 1e-20, as transformers and DeepSeek's reference add), multiplied by
// `scale`, and rounded to float once.
void routeRow(const float* logits, const Routing& routing, int32_t* experts, float* weights);

// The rows of a batch grouped by expert: for each expert in index order,
// the rows routed to it in row order with their weights. Built from
// routeRow's choices of each row; storage is reused between batches.
class ExpertAssignment {
 public:
  // logits: rows x num_experts.
  void route(const float* logits, int64_t rows, const Routing& routing);
  int64_t numExperts() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  // Expert e's rows are rows()[offset(e) .. offset(e + 1)), weights alike.
  int64_t offset(int64_t expert) const { return offsets_[static_cast<size_t>(expert)]; }
  const std::vector<int64_t>& rows() const { return rows_; }
  const std::vector<float>& weights() const { return weights_; }

 private:
  std::vector<int32_t> chosen_;  // rows x experts_per_token
  std::vector<float> chosen_weights_;
  std::vector<int64_t> offsets_;  // num_experts + 1
  std::vector<int64_t> rows_;
  std::vector<float> weights_;
  std::vector<int64_t> next_;  // the counting sort's next slot per expert
};

}  // namespace tandem::engine
