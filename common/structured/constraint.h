// A request's structured-output constraint, as the protocol parser reads it
// from a request body and the engine enforces it: its kind and its
// canonical text, compiled to a grammar (compileConstraint) and, bound to a
// vocabulary, cached by that text (ConstraintCache) so requests with the
// same schema share one compiled grammar and its mask caches.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/lru_map.h"
#include "common/status.h"
#include "common/structured/grammar.h"

namespace tandem::structured {

class CompiledGrammar;
class Matcher;
class Vocabulary;

enum class ConstraintKind : uint8_t {
  kJsonSchema,
  kJsonObject,
  kRegex,
  kChoice,
  kGrammar,
  kToolCalls,
};

// "json_schema", "json_object", "regex", "choice", "grammar", "tool_calls".
const char* constraintKindName(ConstraintKind kind);

struct Constraint {
  ConstraintKind kind = ConstraintKind::kJsonObject;
  // kJsonSchema: the schema as compact JSON, its key order kept (properties
  // are generated in that order); kRegex: the pattern; kChoice: a JSON array
  // of the choices; kGrammar: the GBNF text; kToolCalls: toolCallsSpec()
  // (tool_calls.h); kJsonObject: empty.
  std::string spec = {};
  // Not empty: the constraint applies after the output has written this
  // text (a reasoning model's "</think>"), free text before it
  // (afterText, grammar.h): a chat request with a reasoning parser whose
  // prompt left the reasoning open, as vLLM starts the grammar when the
  // reasoning ends.
  std::string after = {};

  bool operator==(const Constraint&) const = default;
};

// The grammar of a constraint; InvalidArgument / ResourceExhausted naming
// what in the spec is refused (a schema keyword and its JSON pointer, a
// regex construct and its offset, a grammar's line and column).
StatusOr<Grammar> compileConstraint(const Constraint& constraint);

// Compiled grammars for one vocabulary, least recently used dropped past
// `capacity` grammars or `max_bytes` of their memory (approxBytes: a
// 1,000-value enum's token classes take about 10 MB, and its requests grow
// its memo and masks; a grammar is counted again each time a request gets
// it, and every one when one is compiled), as vLLM bounds xgrammar's cache
// in bytes. The newest is always kept; a dropped grammar lives on while
// requests use it. Thread-safe.
class ConstraintCache {
 public:
  static constexpr int64_t kDefaultMaxBytes = int64_t{512} << 20;
  explicit ConstraintCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity = 64,
                           int64_t max_bytes = kDefaultMaxBytes);
  ~ConstraintCache();

  StatusOr<std::shared_ptr<CompiledGrammar>> get(const Constraint& constraint);
  const std::shared_ptr<const Vocabulary>& vocabulary() const { return vocabulary_; }
  // The entries held and their memory as last counted.
  size_t size();
  int64_t bytes();

 private:
  struct Entry {
    std::shared_ptr<CompiledGrammar> grammar;
    int64_t bytes = 0;  // as last counted
  };
  // entry.bytes (and bytes_) made what the grammar holds now.
  void recountLocked(Entry& entry);
  // Drops the least recently used past either bound, the newest kept.
  void evictLocked();
  std::shared_ptr<const Vocabulary> vocabulary_;
  size_t capacity_;
  int64_t max_bytes_;
  std::mutex mutex_;
  LruMap<std::string, Entry> entries_;  // by kind, after and spec
  int64_t bytes_ = 0;                   // of the entries
};

}  // namespace tandem::structured
