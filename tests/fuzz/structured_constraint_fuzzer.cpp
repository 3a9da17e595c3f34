// Fuzzes the structured-output compilers and the matcher: the first byte
// picks the constraint kind (JSON schema, regex, choice, GBNF grammar), the
// rest is its text. compileConstraint returns a grammar or a Status (an
// exception, a crash or a sanitizer report is a finding). An accepted
// grammar runs over a small byte vocabulary: a seeded walk of up to 64
// tokens where every token the mask allows is accepted by the matcher and
// every token it leaves out is refused (while the grammar's work stays under
// a budget; then only the picked token is checked, and past a larger one the
// walk ends), and an output that can end is a sentence of the grammar.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/structured/constraint.h"
#include "common/structured/matcher.h"

namespace {

using namespace tandem::structured;

std::shared_ptr<const Vocabulary> testVocabulary() {
  static const std::shared_ptr<const Vocabulary> vocabulary = [] {
    std::vector<std::string> tokens{""};
    for (int c = 0x20; c < 0x7F; ++c) tokens.emplace_back(1, static_cast<char>(c));
    for (const char* piece : {"{\"", "\":", "\",", "\"}", "true", "null", "12", "ab", "\xC3\xA9",
                              "\xC3", "\xA9", "\n", "\\\"", "[1", "]}", "a\"", "},"}) {
      tokens.emplace_back(piece);
    }
    return std::make_shared<const Vocabulary>(std::move(tokens), 192);
  }();
  return vocabulary;
}

}  // namespace

// Expansion steps past which the walk stops probing every token, and past
// which it stops: each step of a very ambiguous grammar may cost the
// matcher's bounds (1,000,000 steps for a mask, as many for a move), and 64
// such steps under the sanitizers would take a minute.
constexpr int64_t kProbeVisits = 1'000'000;
constexpr int64_t kWalkVisits = 4'000'000;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  static constexpr ConstraintKind kKinds[] = {ConstraintKind::kJsonSchema, ConstraintKind::kRegex,
                                              ConstraintKind::kChoice, ConstraintKind::kGrammar};
  Constraint constraint;
  constraint.kind = kKinds[data[0] % 4];
  constraint.spec.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  tandem::StatusOr<Grammar> grammar = compileConstraint(constraint);
  if (!grammar.isOk()) {
    if (grammar.status().message().empty()) std::abort();
    return 0;
  }
  const Grammar copy = *grammar;
  auto vocabulary = testVocabulary();
  auto compiled = std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocabulary);
  Matcher matcher(compiled);
  std::vector<uint64_t> mask(static_cast<size_t>(vocabulary->maskWords()));
  std::string text;
  uint32_t seed = data[0];
  for (int step = 0; step < 64 && !matcher.finished() && !matcher.overflowed() &&
                     compiled->stats().visits < kWalkVisits;
       ++step) {
    matcher.fillMask(mask);
    std::vector<tandem::TokenId> allowed;
    // Every token probed while the grammar's work stays under a fixed
    // budget; past it (a very ambiguous grammar, where each probe is a
    // costly move) the walk goes on checking only the token it picks.
    const bool probe_all = compiled->stats().visits < kProbeVisits;
    for (tandem::TokenId id = 0; id < vocabulary->size(); ++id) {
      const bool in_mask = (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u;
      if (probe_all) {
        Matcher probe = matcher;
        if (probe.accept(id) != in_mask && !probe.overflowed()) std::abort();
      }
      if (in_mask) allowed.push_back(id);
    }
    if (allowed.empty()) break;
    seed = seed * 1103515245u + 12345u;
    const tandem::TokenId pick = allowed[(seed >> 8) % allowed.size()];
    // Allowed by the mask, refused only when the move past its bounds (the
    // whole frontier's expansion) overflows the matcher.
    if (!matcher.accept(pick)) {
      if (!matcher.overflowed()) std::abort();
      break;
    }
    text += vocabulary->bytes(pick);
  }
  if (matcher.canEnd() && !matcher.overflowed() && !grammarAccepts(copy, text)) std::abort();
  return 0;
}
