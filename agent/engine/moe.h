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

// One row's routing: `experts_per_token` expert indices in descending order
// of their logit (a tie goes to the smaller index; NaN loses to every
// number) and their weights, the softmax over all experts' logits of the
// chosen ones (in double: the maximum subtracted, the sum taken in index
// order), divided by their sum when `normalize` (Mixtral always; Qwen3-MoE
// with norm_topk_prob), rounded to float once.
void routeRow(const float* logits, int64_t num_experts, int64_t experts_per_token, bool normalize,
              int32_t* experts, float* weights);

// The rows of a batch grouped by expert: for each expert in index order,
// the rows routed to it in row order with their weights. Built from
// routeRow's choices of each row; storage is reused between batches.
class ExpertAssignment {
 public:
  // logits: rows x num_experts.
  void route(const float* logits, int64_t rows, int64_t num_experts, int64_t experts_per_token,
             bool normalize);
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
