#include "operator/router/policy.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "operator/router/anchor_policies.h"
#include "operator/router/default_routing_profile.h"

namespace tandem::router {
namespace {

// Weight of one observation in the learned per-path overheads.
constexpr double kOverheadLearningRate = 0.05;
// Each observation's weight in the after-hand-off fit decays by this.
constexpr double kHandoffForgetting = 0.98;

// Costs within this relative distance of the least are ties (they differ
// only by rounding of the same terms summed in another order).
constexpr double kTieTolerance = 1e-9;

// What the kv policy predicts for one agent, from the ledger, the polled
// load and the step-time model.
class TimeModel {
 public:
  TimeModel(const engine::StepProfile& profile, const DecisionInput& input)
      : profile_(profile), input_(input) {}

  // Seconds to prefill `uncached` tokens after `cached` ones, in one step.
  double prefillSeconds(int64_t uncached, int64_t cached) const {
    if (uncached <= 0) return 0;
    const double u = static_cast<double>(uncached);
    return profile_.scale *
           (profile_.base_s + profile_.prefill_token_s * u +
            profile_.prefill_context_s * u * static_cast<double>(cached + uncached));
  }

  // Seconds to move the blocks of `tokens` tokens of KV between agents:
  // what a simulated agent's hand-off takes.
  double transferSeconds(int64_t tokens) const {
    if (tokens <= 0) return 0;
    return engine::simulatedTransferSeconds(profile_, blocksOf(tokens, input_.block_size),
                                            input_.block_size);
  }

  // Wait before a new prefill on `agent` starts: the reserved uncached
  // tokens ahead of it (an agent batches queued prefills into its steps, so
  // they cost their tokens, not a step each), plus external requests, each
  // counted like this request's prompt.
  double queueSeconds(const AgentView& agent) const {
    const double tokens = static_cast<double>(agent.reserved_prefill_tokens) +
                          static_cast<double>(agent.external_requests * input_.num_prompt_tokens);
    return profile_.scale * profile_.prefill_token_s * tokens;
  }

  // A decode step on `agent` once this request runs there: its ITL. The
  // ledger's requests and KV, plus external requests each counted like
  // this one.
  double decodeStepSeconds(const AgentView& agent) const {
    const int64_t requests = agent.reserved_requests + agent.external_requests;
    const double context = static_cast<double>(agent.reserved_kv_tokens) +
                           static_cast<double>((agent.external_requests + 1) *
                                               (input_.num_prompt_tokens + input_.max_tokens));
    return profile_.scale *
           (profile_.base_s + profile_.decode_sequence_s * static_cast<double>(requests + 1) +
            profile_.context_token_s * context);
  }

 private:
  const engine::StepProfile& profile_;
  const DecisionInput& input_;
};

// Of the candidates with a cost, one of least cost; costs within
// kTieTolerance of the least are ties, one drawn uniformly with `random`.
// nullopt when there is no candidate.
std::optional<size_t> leastAtRandom(const std::vector<std::optional<double>>& costs,
                                    std::mt19937_64& random) {
  std::optional<double> least;
  for (const std::optional<double>& cost : costs) {
    if (cost && (!least || *cost < *least)) least = cost;
  }
  if (!least) return std::nullopt;
  const double bound = *least + kTieTolerance * std::max(1.0, std::abs(*least));
  std::vector<size_t> tied;
  for (size_t i = 0; i < costs.size(); ++i) {
    if (costs[i] && *costs[i] <= bound) tied.push_back(i);
  }
  return tied[std::uniform_int_distribution<size_t>(0, tied.size() - 1)(random)];
}

}  // namespace

engine::StepProfile defaultRoutingProfile() {
  // Llama-3.1-8B on one H100 (derived in docs/profiles.md): only the ratios
  // between the terms steer decisions. Read once from the profile file
  // compiled in; a build whose file does not parse fails its unit tests.
  static const engine::StepProfile profile = [] {
    auto parsed =
        engine::StepProfile::fromYamlText(kDefaultRoutingProfileYaml, kDefaultRoutingProfileOrigin);
    TANDEM_CHECK(parsed.isOk(), "the built-in routing profile: " + parsed.status().message());
    return *parsed;
  }();
  return profile;
}

std::optional<size_t> cheapestWithRandomTies(const std::vector<AgentView>& agents,
                                             const std::function<double(const AgentView&)>& cost,
                                             std::mt19937_64& random) {
  std::vector<std::optional<double>> costs(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i].healthy) costs[i] = cost(agents[i]);
  }
  return leastAtRandom(costs, random);
}

int64_t blocksOf(int64_t tokens, int32_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

int64_t heldTokens(const DecisionInput& input, const AgentView& agent) {
  return std::clamp<int64_t>(agent.leading_blocks * input.block_size, 0, input.num_prompt_tokens);
}

int64_t uncachedTokens(const DecisionInput& input, const AgentView& agent) {
  return input.num_prompt_tokens - heldTokens(input, agent);
}

double overlapRatio(const DecisionInput& input, const Decision& decision) {
  const int64_t full_blocks = input.num_prompt_tokens / input.block_size;
  if (full_blocks <= 0 || !decision.decode) return 0;
  int64_t held = input.decode[*decision.decode].leading_blocks;
  if (decision.prefill) held = std::max(held, input.prefill[*decision.prefill].leading_blocks);
  return static_cast<double>(std::min(held, full_blocks)) / static_cast<double>(full_blocks);
}

std::optional<size_t> Chooser::pick(const std::vector<AgentView>& agents, size_t& cursor) {
  std::vector<size_t> healthy;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i].healthy) healthy.push_back(i);
  }
  if (healthy.empty()) return std::nullopt;
  if (options_.policy == Policy::kRandom) {
    return healthy[std::uniform_int_distribution<size_t>(0, healthy.size() - 1)(random_)];
  }
  return healthy[cursor++ % healthy.size()];
}

// The kv policy: every (prefill agent, decode agent) pair and every decode
// agent prefilling locally is priced in predicted seconds, and the least
// predicted end-to-end time wins:
//
//   TTFT = queue on the prefill side + prefill compute of what is not held
//          + KV moved (pull-back lend, hand-off) + one decode step
//   cost = TTFT + max_tokens x the decode agent's predicted step (its ITL)
//
// A held prefix is worth exactly the compute it saves minus the transfer it
// costs. Local prefill is a candidate only while the decode agent's step
// with that prefill in it stays within itl_target_s (its other requests'
// ITL) and, when one is configured, the uncached part is under
// disagg_threshold_tokens. Ties are random.
Decision Chooser::chooseKv(const DecisionInput& input) {
  const engine::StepProfile profile =
      options_.profile ? *options_.profile : defaultRoutingProfile();
  const TimeModel model(profile, input);
  const int64_t prompt = input.num_prompt_tokens;
  const double output_steps = static_cast<double>(std::max<int64_t>(1, input.max_tokens));

  struct Option {
    std::optional<size_t> prefill;
    size_t decode = 0;
    bool pull_back = false;
    std::optional<size_t> lending_prefill;
    std::optional<size_t> lending_decode;
    double prefill_s = 0;  // until the prefill agent answers (local: the TTFT)
    int64_t blocks_read = 0;
    double ttft = 0;
    double cost = 0;
  };
  // Each agent's own terms, once. Any agent may prefill: its queue and the
  // compute of what it does not hold.
  struct PrefillTerms {
    int64_t held = 0;
    double queue = 0;
    double compute = 0;  // of what it does not hold
  };
  auto prefillTermsOf = [&](const AgentView& agent) {
    PrefillTerms t;
    t.held = heldTokens(input, agent);
    t.queue = model.queueSeconds(agent);
    t.compute = model.prefillSeconds(prompt - t.held, t.held);
    return t;
  };
  std::vector<PrefillTerms> prefill_terms;
  prefill_terms.reserve(input.prefill.size());
  for (const AgentView& agent : input.prefill) prefill_terms.push_back(prefillTermsOf(agent));
  // A decode agent's queue and compute are those of a local prefill.
  struct DecodeTerms : PrefillTerms {
    double step = 0;          // its ITL with this request
    double link = 0;          // the link time of the blocks it reads in a hand-off
    int64_t blocks_read = 0;  // in a hand-off
  };
  std::vector<DecodeTerms> decode_terms;
  decode_terms.reserve(input.decode.size());
  for (const AgentView& agent : input.decode) {
    DecodeTerms t{prefillTermsOf(agent)};
    t.step = model.decodeStepSeconds(agent);
    t.link = model.transferSeconds(prompt - t.held);
    t.blocks_read = blocksOf(prompt, input.block_size) - t.held / input.block_size;
    decode_terms.push_back(t);
  }

  // The prefill agent holding the longest prefix: besides the decode agent,
  // the one agent worth reading a prefix from (a lend costs the lender
  // nothing but pinned blocks; the reader does the work).
  std::optional<size_t> best_holder;
  for (size_t p = 0; p < input.prefill.size(); ++p) {
    if (!input.prefill[p].healthy || prefill_terms[p].held == 0) continue;
    if (!best_holder || prefill_terms[p].held > prefill_terms[*best_holder].held) best_holder = p;
  }

  // The two decode agents holding the longest prefixes: a local prefill on
  // one may read from the other.
  std::optional<size_t> decode_holder, decode_runner_up;
  for (size_t d = 0; d < input.decode.size(); ++d) {
    if (!input.decode[d].healthy || decode_terms[d].held == 0) continue;
    if (!decode_holder || decode_terms[d].held > decode_terms[*decode_holder].held) {
      decode_runner_up = decode_holder;
      decode_holder = d;
    } else if (!decode_runner_up || decode_terms[d].held > decode_terms[*decode_runner_up].held) {
      decode_runner_up = d;
    }
  }

  // A lend from `lender` to an agent holding `reader_held` tokens: a
  // hand-off the other way, costing what a hand-off of those blocks is
  // learned to cost over the link's time; the reader then computes what the
  // lender does not hold. Its seconds, when at least pull_back_min_blocks are
  // read and that beats computing them (`compute`, lowered to the lender's).
  auto lendSeconds = [&](const PrefillTerms& lender, int64_t reader_held,
                         double& compute) -> std::optional<double> {
    if (!options_.pull_back ||
        (lender.held - reader_held) / input.block_size < options_.pull_back_min_blocks) {
      return std::nullopt;
    }
    const double transfer =
        model.transferSeconds(lender.held - reader_held) +
        learned_.afterHandoff(blocksOf(lender.held - reader_held, input.block_size));
    if (lender.compute + transfer >= compute) return std::nullopt;
    compute = lender.compute;
    return transfer;
  };

  // Compute an option performs delays the requests that queue behind it on
  // its agent; under load that is what recomputing a held prefix really
  // costs (more work, longer queues for everyone), so each second of
  // compute is charged once more per request queued on a prefill agent on
  // average. Idle, this is nothing and the cost is the request's own time.
  double queued = 0;
  int64_t healthy_prefill = 0;
  for (const AgentView& agent : input.prefill) {
    if (!agent.healthy) continue;
    queued += static_cast<double>(agent.reserved_requests + agent.external_requests);
    ++healthy_prefill;
  }
  const double work_weight =
      healthy_prefill > 0 ? queued / static_cast<double>(healthy_prefill) : 0;

  std::vector<Option> options;
  for (size_t d = 0; d < input.decode.size(); ++d) {
    const AgentView& decode = input.decode[d];
    if (!decode.healthy) continue;
    const DecodeTerms& dt = decode_terms[d];
    // A local prefill may read the longest prefix another agent holds.
    double local_compute = dt.compute;
    std::optional<double> local_lend;
    std::optional<size_t> local_lending_prefill, local_lending_decode;
    {
      const std::optional<size_t> other = decode_holder == d ? decode_runner_up : decode_holder;
      const bool decode_lends =
          other && (!best_holder || decode_terms[*other].held > prefill_terms[*best_holder].held);
      const PrefillTerms* lender = decode_lends  ? &decode_terms[*other]
                                   : best_holder ? &prefill_terms[*best_holder]
                                                 : nullptr;
      if (lender && (local_lend = lendSeconds(*lender, dt.held, local_compute))) {
        if (decode_lends) {
          local_lending_decode = other;
        } else {
          local_lending_prefill = best_holder;
        }
      }
    }
    const bool local_allowed = (!options_.disagg_threshold_tokens ||
                                prompt - dt.held < *options_.disagg_threshold_tokens) &&
                               dt.step + local_compute <= options_.itl_target_s;
    // The decode agent reads what it does not hold.
    const double handoff = dt.link + learned_.afterHandoff(dt.blocks_read);
    bool any_prefill = false;
    for (size_t p = 0; p < input.prefill.size(); ++p) {
      const AgentView& prefill = input.prefill[p];
      if (!prefill.healthy) continue;
      any_prefill = true;
      const PrefillTerms& pt = prefill_terms[p];
      double compute = pt.compute;
      double lend = 0;
      bool pull_back = false;
      std::optional<size_t> lending_prefill;
      // The lender: the decode agent, or the longest prefill holder when it
      // holds more (and is not this prefill agent).
      const PrefillTerms* lender = &dt;
      if (best_holder && *best_holder != p && prefill_terms[*best_holder].held > dt.held) {
        lending_prefill = best_holder;
        lender = &prefill_terms[*best_holder];
      }
      if (const std::optional<double> lent = lendSeconds(*lender, pt.held, compute)) {
        pull_back = true;
        lend = *lent;
      }
      Option option;
      option.prefill = p;
      option.decode = d;
      option.pull_back = pull_back;
      if (pull_back) {
        option.lending_prefill = lending_prefill;
        if (!lending_prefill) option.lending_decode = d;
      }
      option.prefill_s = pt.queue + compute + lend +
                         learned_.beforeHandoff(pull_back ? Path::kPullBack : Path::kDisaggregated);
      option.blocks_read = dt.blocks_read;
      option.ttft = option.prefill_s + handoff + dt.step;
      option.cost = option.ttft + output_steps * dt.step + work_weight * compute;
      options.push_back(option);
    }
    if (local_allowed || !any_prefill) {
      // Local prefills queue on the decode agent like a prefill agent's.
      Option option;
      option.decode = d;
      option.pull_back = local_lend.has_value();
      option.lending_prefill = local_lending_prefill;
      option.lending_decode = local_lending_decode;
      option.ttft = dt.queue + local_compute + local_lend.value_or(0.0) + dt.step +
                    learned_.beforeHandoff(Path::kLocalPrefill);
      option.prefill_s = option.ttft;
      option.cost = option.ttft + output_steps * dt.step + work_weight * local_compute;
      options.push_back(option);
    }
  }

  Decision decision;
  std::vector<std::optional<double>> costs;
  costs.reserve(options.size());
  for (const Option& option : options) costs.push_back(option.cost);
  const std::optional<size_t> pick = leastAtRandom(costs, random_);
  if (!pick) return decision;
  const Option& chosen = options[*pick];
  decision.decode = chosen.decode;
  decision.prefill = chosen.prefill;
  decision.kind = chosen.prefill ? Decision::Kind::kDisaggregated : Decision::Kind::kLocalPrefill;
  decision.pull_back = chosen.pull_back;
  decision.lending_prefill = chosen.lending_prefill;
  decision.lending_decode = chosen.lending_decode;
  decision.predicted_ttft_s = chosen.ttft;
  decision.predicted_prefill_s = chosen.prefill_s;
  decision.blocks_read = chosen.blocks_read;

  if (options_.explain) {
    auto candidate = [](const AgentView& agent) {
      CandidateCost c;
      c.agent = agent.name;
      c.leading_blocks = agent.leading_blocks;
      c.reserved_requests = agent.reserved_requests;
      c.external_requests = agent.external_requests;
      return c;
    };
    for (size_t p = 0; p < input.prefill.size(); ++p) {
      if (!input.prefill[p].healthy) continue;
      CandidateCost c = candidate(input.prefill[p]);
      c.prefill = true;
      c.queue_s = prefill_terms[p].queue;
      c.compute_s = prefill_terms[p].compute;
      c.cost = c.queue_s + c.compute_s;
      decision.candidates.push_back(std::move(c));
    }
    for (size_t d = 0; d < input.decode.size(); ++d) {
      if (!input.decode[d].healthy) continue;
      const DecodeTerms& t = decode_terms[d];
      CandidateCost c = candidate(input.decode[d]);
      c.queue_s = t.queue;
      c.compute_s = t.compute;
      c.transfer_s = t.link;
      c.step_s = t.step;
      c.cost = output_steps * c.step_s;
      decision.candidates.push_back(std::move(c));
    }
  }
  return decision;
}

void LearnedCosts::observeBeforeHandoff(Path path, double residual_s) {
  if (!std::isfinite(residual_s)) return;
  const size_t i = static_cast<size_t>(path);
  const double weight = std::max(kOverheadLearningRate, 1.0 / static_cast<double>(++observed_[i]));
  stage_[i] = std::max(0.0, stage_[i] + weight * residual_s);
}

void LearnedCosts::observeAfterHandoff(int64_t blocks_read, double residual_s) {
  if (!std::isfinite(residual_s)) return;
  const double x = static_cast<double>(blocks_read);
  const double y = afterHandoff(blocks_read) + residual_s;  // all that is unmodelled
  w_ = kHandoffForgetting * w_ + 1;
  x_ = kHandoffForgetting * x_ + x;
  y_ = kHandoffForgetting * y_ + y;
  xx_ = kHandoffForgetting * xx_ + x * x;
  xy_ = kHandoffForgetting * xy_ + x * y;
  const double spread = w_ * xx_ - x_ * x_;
  slope_ =
      spread > 1e-9 * std::max(1.0, w_ * xx_) ? std::max(0.0, (w_ * xy_ - x_ * y_) / spread) : 0.0;
  intercept_ = std::max(0.0, (y_ - slope_ * x_) / w_);
}

void Chooser::observe(const Decision& decision, double observed_prefill_s, double observed_ttft_s) {
  if (options_.policy != Policy::kKv || !options_.learn || decision.predicted_ttft_s <= 0) return;
  const Path path = pathOf(decision);
  if (path == Path::kLocalPrefill) {
    learned_.observeBeforeHandoff(path, observed_ttft_s - decision.predicted_ttft_s);
    return;
  }
  if (observed_prefill_s < 0) return;
  learned_.observeBeforeHandoff(path, observed_prefill_s - decision.predicted_prefill_s);
  learned_.observeAfterHandoff(decision.blocks_read,
                               (observed_ttft_s - observed_prefill_s) -
                                   (decision.predicted_ttft_s - decision.predicted_prefill_s));
}

Decision Chooser::choose(const DecisionInput& input) {
  Decision decision;
  switch (options_.policy) {
    case Policy::kKv:
      decision = chooseKv(input);
      break;
    case Policy::kDynamo:
      decision = chooseDynamo(input, options_, random_);
      break;
    case Policy::kLlmD:
      decision = chooseLlmD(input, options_, random_);
      break;
    case Policy::kSglang:
      decision = chooseSglang(input, options_, random_);
      break;
    case Policy::kRoundRobin:
    case Policy::kRandom:
      decision.decode = pick(input.decode, decode_cursor_);
      if (!decision.decode) return decision;
      decision.prefill = pick(input.prefill, prefill_cursor_);
      decision.kind =
          decision.prefill ? Decision::Kind::kDisaggregated : Decision::Kind::kLocalPrefill;
      break;
  }
  if (decision.decode) {
    decision.overlap_ratio = overlapRatio(input, decision);
    // Affinity: the chosen agents hold the longest prefix any agent holds;
    // spilled: another agent held a longer one.
    int64_t longest = 0;
    for (const auto* agents : {&input.prefill, &input.decode}) {
      for (const AgentView& agent : *agents) {
        if (agent.healthy) longest = std::max(longest, agent.leading_blocks);
      }
    }
    int64_t used = input.decode[*decision.decode].leading_blocks;
    if (decision.prefill) used = std::max(used, input.prefill[*decision.prefill].leading_blocks);
    decision.affinity = used > 0 && used == longest;
    decision.spilled = used < longest;
  }
  return decision;
}

}  // namespace tandem::router
