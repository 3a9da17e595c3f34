// A step-time profile: how long one engine step of a given model on a given
// accelerator takes, predicted from what the step holds. Simulated agents
// (`tandem-agent serve --simulate PROFILE`) wait this long instead of
// computing the forward pass; `tandem-bench calibrate` fits a profile's
// coefficients to real runs of the CPU engine.
//
// The model is linear in the step's features (so it can be fitted by least
// squares), with each coefficient in seconds per unit:
//
//   seconds = base_s
//           + prefill_token_s     * prefill_tokens
//           + decode_sequence_s   * decode_sequences
//           + context_token_s     * context_tokens
//           + prefill_context_s   * prefill_context_products
//           + kv_block_s          * kv_blocks_read
//
// all multiplied by `scale` (a test or what-if factor; 1 by default).
// base_s is what every step pays whatever it holds (for a decode-bound GPU
// step: reading every weight once); per-token and per-sequence terms are the
// linear GEMM and sampling costs; context terms are attention reads
// (decode: each sequence's context length; prefill: new tokens times the
// positions they attend over).
//
// YAML (every key optional except name; unknown keys are an error naming
// them):
//   name: llama3.1-8b-h100
//   description: free text (where the numbers come from)
//   base_s: 0.0052
//   prefill_token_s: 2.4e-5
//   decode_sequence_s: 6.0e-5
//   context_token_s: 1.5e-8
//   prefill_context_s: 2.0e-11
//   kv_block_s: 0.0
//   scale: 1.0
//   kv_link_bytes_per_s: 5.0e10   # P->D KV hand-off bandwidth; 0: not timed
//   kv_link_latency_s: 1.0e-5      # what every timed hand-off pays besides bytes
//   model:                         # the shape a simulated agent announces
//     vocab_size: 128256
//     max_position_embeddings: 131072
//     kv_bytes_per_token: 131072   # K and V of every layer, per token
//
// Pure data and functions; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::engine {

// What one engine step holds.
struct StepShape {
  int64_t prefill_tokens = 0;    // new tokens of sequences being prefilled (chunks included)
  int64_t decode_sequences = 0;  // sequences computing one new token after their prompt
  int64_t context_tokens = 0;    // sum over decode sequences of the positions attended
  // Sum over prefill chunks of num_tokens * (start + num_tokens): the
  // attention work of prefill, quadratic in the prompt.
  int64_t prefill_context_products = 0;
  int64_t kv_blocks_read = 0;  // blocks attention reads, over every sequence

  bool operator==(const StepShape&) const = default;
};

struct SimulatedModelShape {
  int64_t vocab_size = 128256;
  int64_t max_position_embeddings = 131072;
  int64_t kv_bytes_per_token = 131072;

  bool operator==(const SimulatedModelShape&) const = default;
};

struct StepProfile {
  std::string name;
  std::string description;
  double base_s = 0.0;
  double prefill_token_s = 0.0;
  double decode_sequence_s = 0.0;
  double context_token_s = 0.0;
  double prefill_context_s = 0.0;
  double kv_block_s = 0.0;
  double scale = 1.0;
  double kv_link_bytes_per_s = 0.0;  // 0: hand-offs are not timed by the profile
  double kv_link_latency_s = 0.0;    // added to every timed hand-off
  SimulatedModelShape model;

  // Seconds the step takes (>= 0).
  double predict(const StepShape& shape) const;

  // Parses the YAML above; errors name the file, the key and what is
  // accepted (coefficients are finite and >= 0, scale > 0).
  static StatusOr<StepProfile> fromYamlText(const std::string& text, const std::string& origin);
  static StatusOr<StepProfile> fromFile(const std::filesystem::path& path);
  // YAML text that fromYamlText reads back to an equal profile.
  std::string toYaml() const;

  bool operator==(const StepProfile&) const = default;
};

// Seconds a KV hand-off of `num_blocks` blocks of `block_size` tokens lasts
// on the profile's link (a simulated agent's read of another agent's blocks):
//   kv_link_latency_s + num_blocks * block_size * model.kv_bytes_per_token
//                       / kv_link_bytes_per_s
// 0 when the link is not timed (kv_link_bytes_per_s 0) or no block moves
// (num_blocks <= 0). `scale` does not apply: it scales steps, not the link.
double simulatedTransferSeconds(const StepProfile& profile, int64_t num_blocks, int64_t block_size);

// One sequence's part of a step: `num_tokens` new tokens at positions
// [start_position, start_position + num_tokens). A prefill chunk is part of
// a prompt (whole or chunked, after any cached prefix); a decode chunk is a
// sequence past its prompt computing its next token (num_tokens is 1).
struct StepChunk {
  int64_t start_position = 0;
  int64_t num_tokens = 0;
  bool is_prefill = false;
};

// The features of a step, defined once for the simulated engine and for
// `tandem-bench calibrate`:
//   prefill chunk: prefill_tokens += num_tokens;
//                  prefill_context_products += num_tokens * (start + num_tokens)
//   decode chunk:  decode_sequences += 1; context_tokens += start + num_tokens
//   every chunk:   kv_blocks_read += ceil((start + num_tokens) / block_size)
// block_size <= 0 counts no blocks.
StepShape stepShapeOf(std::span<const StepChunk> chunks, int64_t block_size);

// The fitted model's features and coefficients in one order: the constant
// (base_s, feature 1), prefill_tokens, decode_sequences, context_tokens,
// prefill_context_products, kv_blocks_read.
inline constexpr int kNumStepFeatures = 6;
std::array<double, kNumStepFeatures> stepFeatures(const StepShape& shape);
std::array<double, kNumStepFeatures> stepCoefficients(const StepProfile& profile);
void setStepCoefficients(StepProfile& profile, const std::array<double, kNumStepFeatures>& values);

// Non-negative least squares: x >= 0 minimising |A x - b|, A given by rows
// (each of the same width, at most 16 columns). Exact: every support set is
// solved by Householder QR on norm-scaled columns and the best feasible one
// kept, so for consistent data with a positive solution it returns that
// solution to rounding. Errors name what is wrong with the input.
StatusOr<std::vector<double>> solveNonNegativeLeastSquares(
    const std::vector<std::vector<double>>& rows, const std::vector<double>& targets);

// One timed step.
struct StepSample {
  StepShape shape;
  double seconds = 0.0;  // > 0
};

struct StepFit {
  StepProfile profile;             // `base` with fitted coefficients, scale 1
  std::vector<double> predicted;   // seconds, per sample
  double mean_relative_error = 0;  // mean over samples of |predicted - observed| / observed
  double max_relative_error = 0;
  double r_squared = 0;  // 1 - SS_res / SS_tot over seconds
};

// Fits the coefficients of `base` (name, description, link and model shape
// are kept) to the samples by non-negative least squares on relative error
// (each row weighted by 1 / observed seconds).
StatusOr<StepFit> fitStepProfile(std::span<const StepSample> samples, const StepProfile& base);

}  // namespace tandem::engine
