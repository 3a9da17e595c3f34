#include "agent/engine/simulation/step_profile.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

namespace tandem::engine {
namespace {

constexpr const char* kTopLevelKeys =
    "name, description, base_s, prefill_token_s, decode_sequence_s, context_token_s, "
    "prefill_context_s, kv_block_s, scale, kv_link_bytes_per_s, kv_link_latency_s, model";
constexpr const char* kModelKeys = "vocab_size, max_position_embeddings, kv_bytes_per_token";

// The shortest text that reads back to the same double.
std::string formatDouble(double value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string quoted(const std::string& text) {
  YAML::Emitter emitter;
  emitter << YAML::DoubleQuoted << text;
  return emitter.c_str();
}

std::string scalarText(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a list";
  return "nothing";
}

// A coefficient-like number: finite and at least `minimum` (or above it when
// `strict`).
Status readNumber(const YAML::Node& node, const std::string& origin, const std::string& key,
                  double minimum, bool strict, const char* unit, double& out) {
  const std::string accepted = std::string("a finite number ") + (strict ? "> " : ">= ") +
                               formatDouble(minimum) + " (" + unit + ")";
  double value = 0.0;
  bool parsed = false;
  if (node.IsScalar()) {
    try {
      value = node.as<double>();
      parsed = true;
    } catch (const YAML::Exception&) {
    }
  }
  if (!parsed || !std::isfinite(value) || value < minimum || (strict && value == minimum)) {
    return invalidArgument(origin + ": " + key + " must be " + accepted + ", got " +
                           scalarText(node));
  }
  out = value;
  return Status::ok();
}

Status readCount(const YAML::Node& node, const std::string& origin, const std::string& key,
                 int64_t& out) {
  int64_t value = 0;
  bool parsed = false;
  if (node.IsScalar()) {
    try {
      value = node.as<int64_t>();
      parsed = true;
    } catch (const YAML::Exception&) {
    }
  }
  if (!parsed || value < 1) {
    return invalidArgument(origin + ": " + key + " must be an integer >= 1, got " +
                           scalarText(node));
  }
  out = value;
  return Status::ok();
}

Status readText(const YAML::Node& node, const std::string& origin, const std::string& key,
                std::string& out) {
  if (!node.IsScalar()) {
    return invalidArgument(origin + ": " + key + " must be a string, got " + scalarText(node));
  }
  out = node.Scalar();
  return Status::ok();
}

Status readModel(const YAML::Node& node, const std::string& origin, SimulatedModelShape& model) {
  if (!node.IsMap()) {
    return invalidArgument(origin + ": model must be a mapping with keys " +
                           std::string(kModelKeys) + ", got " + scalarText(node));
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    const std::string path = "model." + key;
    Status status;
    if (key == "vocab_size") {
      status = readCount(entry.second, origin, path, model.vocab_size);
    } else if (key == "max_position_embeddings") {
      status = readCount(entry.second, origin, path, model.max_position_embeddings);
    } else if (key == "kv_bytes_per_token") {
      status = readCount(entry.second, origin, path, model.kv_bytes_per_token);
    } else {
      status = invalidArgument(origin + ": unknown key " + path + "; model accepts " +
                               std::string(kModelKeys));
    }
    if (!status.isOk()) return status;
  }
  return Status::ok();
}

// Least squares on the columns `columns` of `a` (column-major, unit-norm
// columns, m rows) by Householder QR. False when the columns are linearly
// dependent (to rounding) or fewer rows than columns.
bool solveLeastSquares(const std::vector<std::vector<double>>& a, const std::vector<int>& columns,
                       const std::vector<double>& b, std::vector<double>& solution) {
  const size_t m = b.size();
  const size_t k = columns.size();
  if (m < k) return false;
  std::vector<std::vector<double>> r(k);
  for (size_t j = 0; j < k; ++j) r[j] = a[columns[j]];
  std::vector<double> rhs = b;
  std::vector<double> diagonal(k);
  constexpr double kRankTolerance = 1e-10;  // columns have norm 1
  for (size_t j = 0; j < k; ++j) {
    double norm_sq = 0.0;
    for (size_t i = j; i < m; ++i) norm_sq += r[j][i] * r[j][i];
    const double norm = std::sqrt(norm_sq);
    if (norm <= kRankTolerance) return false;
    const double alpha = r[j][j] > 0 ? -norm : norm;
    // v = x - alpha e1, stored in place of column j below the diagonal.
    std::vector<double> v(r[j].begin() + static_cast<std::ptrdiff_t>(j), r[j].end());
    v[0] -= alpha;
    double v_sq = 0.0;
    for (double x : v) v_sq += x * x;
    diagonal[j] = alpha;
    if (v_sq == 0.0) continue;
    auto reflect = [&](std::vector<double>& column) {
      double dot = 0.0;
      for (size_t i = j; i < m; ++i) dot += v[i - j] * column[i];
      const double factor = 2.0 * dot / v_sq;
      for (size_t i = j; i < m; ++i) column[i] -= factor * v[i - j];
    };
    for (size_t c = j + 1; c < k; ++c) reflect(r[c]);
    reflect(rhs);
  }
  solution.assign(k, 0.0);
  for (size_t j = k; j-- > 0;) {
    double sum = rhs[j];
    for (size_t c = j + 1; c < k; ++c) sum -= r[c][j] * solution[c];
    solution[j] = sum / diagonal[j];
  }
  return true;
}

}  // namespace

double StepProfile::predict(const StepShape& shape) const {
  const auto features = stepFeatures(shape);
  const auto coefficients = stepCoefficients(*this);
  double seconds = 0.0;
  for (int i = 0; i < kNumStepFeatures; ++i) seconds += features[i] * coefficients[i];
  return std::max(0.0, seconds * scale);
}

StatusOr<StepProfile> StepProfile::fromYamlText(const std::string& text,
                                                const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return invalidArgument(origin + ": not valid YAML: " + e.what());
  }
  if (!root.IsMap()) {
    return invalidArgument(origin + ": a step profile must be a mapping with keys " +
                           std::string(kTopLevelKeys) + " (name required), got " +
                           scalarText(root));
  }
  StepProfile profile;
  bool has_name = false;
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node& value = entry.second;
    Status status;
    if (key == "name") {
      status = readText(value, origin, key, profile.name);
      has_name = true;
    } else if (key == "description") {
      status = readText(value, origin, key, profile.description);
    } else if (key == "base_s") {
      status = readNumber(value, origin, key, 0.0, false, "seconds", profile.base_s);
    } else if (key == "prefill_token_s") {
      status = readNumber(value, origin, key, 0.0, false, "seconds per prefill token",
                          profile.prefill_token_s);
    } else if (key == "decode_sequence_s") {
      status = readNumber(value, origin, key, 0.0, false, "seconds per decode sequence",
                          profile.decode_sequence_s);
    } else if (key == "context_token_s") {
      status = readNumber(value, origin, key, 0.0, false, "seconds per context token",
                          profile.context_token_s);
    } else if (key == "prefill_context_s") {
      status = readNumber(value, origin, key, 0.0, false,
                          "seconds per prefill token-position product", profile.prefill_context_s);
    } else if (key == "kv_block_s") {
      status = readNumber(value, origin, key, 0.0, false, "seconds per KV block read",
                          profile.kv_block_s);
    } else if (key == "scale") {
      status = readNumber(value, origin, key, 0.0, true, "a factor", profile.scale);
    } else if (key == "kv_link_bytes_per_s") {
      status = readNumber(value, origin, key, 0.0, false, "bytes per second; 0: not timed",
                          profile.kv_link_bytes_per_s);
    } else if (key == "kv_link_latency_s") {
      status = readNumber(value, origin, key, 0.0, false, "seconds per timed hand-off",
                          profile.kv_link_latency_s);
    } else if (key == "model") {
      status = readModel(value, origin, profile.model);
    } else {
      status = invalidArgument(origin + ": unknown key " + key + "; a step profile accepts " +
                               std::string(kTopLevelKeys));
    }
    if (!status.isOk()) return status;
  }
  if (!has_name || profile.name.empty()) {
    return invalidArgument(origin + ": name is required (a non-empty string naming the profile)");
  }
  return profile;
}

StatusOr<StepProfile> StepProfile::fromFile(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return notFound("step profile " + path.string() + " cannot be read (a YAML file is expected)");
  }
  std::stringstream text;
  text << file.rdbuf();
  return fromYamlText(text.str(), path.string());
}

std::string StepProfile::toYaml() const {
  std::string out;
  auto line = [&out](const std::string& key, const std::string& value) {
    out += key + ": " + value + "\n";
  };
  line("name", quoted(name));
  line("description", quoted(description));
  line("base_s", formatDouble(base_s));
  line("prefill_token_s", formatDouble(prefill_token_s));
  line("decode_sequence_s", formatDouble(decode_sequence_s));
  line("context_token_s", formatDouble(context_token_s));
  line("prefill_context_s", formatDouble(prefill_context_s));
  line("kv_block_s", formatDouble(kv_block_s));
  line("scale", formatDouble(scale));
  line("kv_link_bytes_per_s", formatDouble(kv_link_bytes_per_s));
  line("kv_link_latency_s", formatDouble(kv_link_latency_s));
  out += "model:\n";
  line("  vocab_size", std::to_string(model.vocab_size));
  line("  max_position_embeddings", std::to_string(model.max_position_embeddings));
  line("  kv_bytes_per_token", std::to_string(model.kv_bytes_per_token));
  return out;
}

double simulatedTransferSeconds(const StepProfile& profile, int64_t num_blocks,
                                int64_t block_size) {
  if (!(profile.kv_link_bytes_per_s > 0) || num_blocks <= 0 || block_size <= 0) return 0.0;
  const double bytes = static_cast<double>(num_blocks) * static_cast<double>(block_size) *
                       static_cast<double>(profile.model.kv_bytes_per_token);
  return profile.kv_link_latency_s + bytes / profile.kv_link_bytes_per_s;
}

StepShape stepShapeOf(std::span<const StepChunk> chunks, int64_t block_size) {
  StepShape shape;
  for (const StepChunk& chunk : chunks) {
    const int64_t tokens = std::max<int64_t>(0, chunk.num_tokens);
    const int64_t end = std::max<int64_t>(0, chunk.start_position) + tokens;
    if (chunk.is_prefill) {
      shape.prefill_tokens += tokens;
      shape.prefill_context_products += tokens * end;
    } else {
      shape.decode_sequences += 1;
      shape.context_tokens += end;
    }
    if (block_size > 0) shape.kv_blocks_read += (end + block_size - 1) / block_size;
  }
  return shape;
}

std::array<double, kNumStepFeatures> stepFeatures(const StepShape& shape) {
  return {1.0,
          static_cast<double>(shape.prefill_tokens),
          static_cast<double>(shape.decode_sequences),
          static_cast<double>(shape.context_tokens),
          static_cast<double>(shape.prefill_context_products),
          static_cast<double>(shape.kv_blocks_read)};
}

std::array<double, kNumStepFeatures> stepCoefficients(const StepProfile& profile) {
  return {profile.base_s,          profile.prefill_token_s,   profile.decode_sequence_s,
          profile.context_token_s, profile.prefill_context_s, profile.kv_block_s};
}

void setStepCoefficients(StepProfile& profile, const std::array<double, kNumStepFeatures>& values) {
  profile.base_s = values[0];
  profile.prefill_token_s = values[1];
  profile.decode_sequence_s = values[2];
  profile.context_token_s = values[3];
  profile.prefill_context_s = values[4];
  profile.kv_block_s = values[5];
}

StatusOr<std::vector<double>> solveNonNegativeLeastSquares(
    const std::vector<std::vector<double>>& rows, const std::vector<double>& targets) {
  constexpr size_t kMaxColumns = 16;
  if (rows.empty()) return invalidArgument("least squares needs at least one row, got none");
  if (rows.size() != targets.size()) {
    return invalidArgument("least squares needs one target per row, got " +
                           std::to_string(rows.size()) + " rows and " +
                           std::to_string(targets.size()) + " targets");
  }
  const size_t n = rows[0].size();
  if (n == 0 || n > kMaxColumns) {
    return invalidArgument("least squares takes 1 to 16 columns, got " + std::to_string(n));
  }
  const size_t m = rows.size();
  // Column-major copy, each column scaled to norm 1 so that features of very
  // different magnitudes are solved to the same relative accuracy.
  std::vector<std::vector<double>> columns(n, std::vector<double>(m));
  std::vector<double> norms(n, 0.0);
  for (size_t i = 0; i < m; ++i) {
    if (rows[i].size() != n) {
      return invalidArgument("least squares rows must all have " + std::to_string(n) +
                             " columns; row " + std::to_string(i) + " has " +
                             std::to_string(rows[i].size()));
    }
    if (!std::isfinite(targets[i])) {
      return invalidArgument("least squares target " + std::to_string(i) + " is not finite");
    }
    for (size_t j = 0; j < n; ++j) {
      if (!std::isfinite(rows[i][j])) {
        return invalidArgument("least squares row " + std::to_string(i) + " column " +
                               std::to_string(j) + " is not finite");
      }
      columns[j][i] = rows[i][j];
      norms[j] += rows[i][j] * rows[i][j];
    }
  }
  for (size_t j = 0; j < n; ++j) {
    norms[j] = std::sqrt(norms[j]);
    if (norms[j] > 0) {
      for (double& x : columns[j]) x /= norms[j];
    }
  }
  auto residual = [&](const std::vector<double>& x) {
    double sum = 0.0;
    for (size_t i = 0; i < m; ++i) {
      double r = -targets[i];
      for (size_t j = 0; j < n; ++j) r += rows[i][j] * x[j];
      sum += r * r;
    }
    return sum;
  };
  // The solution's support S is a set where unconstrained least squares
  // gives non-negative values, and it is the best such set; with at most 16
  // columns every set can be tried.
  std::vector<double> best(n, 0.0);
  double best_residual = residual(best);
  std::vector<int> support;
  std::vector<double> scaled, candidate(n);
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    support.clear();
    bool usable = true;
    for (size_t j = 0; j < n; ++j) {
      if ((mask >> j) & 1u) {
        if (norms[j] == 0) usable = false;
        support.push_back(static_cast<int>(j));
      }
    }
    if (!usable || !solveLeastSquares(columns, support, targets, scaled)) continue;
    if (std::any_of(scaled.begin(), scaled.end(), [](double x) { return x < 0; })) continue;
    std::fill(candidate.begin(), candidate.end(), 0.0);
    for (size_t s = 0; s < support.size(); ++s) {
      candidate[support[s]] = scaled[s] / norms[support[s]];
    }
    const double candidate_residual = residual(candidate);
    if (candidate_residual < best_residual) {
      best_residual = candidate_residual;
      best = candidate;
    }
  }
  return best;
}

StatusOr<StepFit> fitStepProfile(std::span<const StepSample> samples, const StepProfile& base) {
  if (samples.empty()) return invalidArgument("a profile fit needs at least one timed step");
  std::vector<std::vector<double>> rows;
  std::vector<double> targets;
  rows.reserve(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const double seconds = samples[i].seconds;
    if (!std::isfinite(seconds) || seconds <= 0) {
      return invalidArgument("timed step " + std::to_string(i) +
                             " must take a finite number of seconds > 0, got " +
                             formatDouble(seconds));
    }
    const auto features = stepFeatures(samples[i].shape);
    std::vector<double> row(features.begin(), features.end());
    for (double& x : row) x /= seconds;
    rows.push_back(std::move(row));
    targets.push_back(1.0);
  }
  auto solved = solveNonNegativeLeastSquares(rows, targets);
  if (!solved.isOk()) return solved.status();
  StepFit fit;
  fit.profile = base;
  fit.profile.scale = 1.0;
  std::array<double, kNumStepFeatures> values{};
  std::copy(solved->begin(), solved->end(), values.begin());
  setStepCoefficients(fit.profile, values);

  double mean = 0.0;
  for (const StepSample& sample : samples) mean += sample.seconds;
  mean /= static_cast<double>(samples.size());
  double ss_res = 0.0, ss_tot = 0.0, relative_sum = 0.0;
  for (const StepSample& sample : samples) {
    const double predicted = fit.profile.predict(sample.shape);
    fit.predicted.push_back(predicted);
    const double relative = std::abs(predicted - sample.seconds) / sample.seconds;
    relative_sum += relative;
    fit.max_relative_error = std::max(fit.max_relative_error, relative);
    ss_res += (predicted - sample.seconds) * (predicted - sample.seconds);
    ss_tot += (sample.seconds - mean) * (sample.seconds - mean);
  }
  fit.mean_relative_error = relative_sum / static_cast<double>(samples.size());
  fit.r_squared = ss_tot > 0 ? 1.0 - ss_res / ss_tot : (ss_res == 0 ? 1.0 : 0.0);
  return fit;
}

}  // namespace tandem::engine
