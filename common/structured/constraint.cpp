#include "common/structured/constraint.h"

#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "common/structured/gbnf.h"
#include "common/structured/json_schema.h"
#include "common/structured/matcher.h"
#include "common/structured/regex_grammar.h"
#include "common/structured/tool_calls.h"

namespace tandem::structured {

const char* constraintKindName(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonSchema:
      return "json_schema";
    case ConstraintKind::kJsonObject:
      return "json_object";
    case ConstraintKind::kRegex:
      return "regex";
    case ConstraintKind::kChoice:
      return "choice";
    case ConstraintKind::kGrammar:
      return "grammar";
    case ConstraintKind::kToolCalls:
      return "tool_calls";
  }
  return "unknown";
}

namespace {

StatusOr<Grammar> choiceGrammar(const std::string& spec) {
  const auto choices = nlohmann::json::parse(spec, nullptr, /*allow_exceptions=*/false);
  if (!choices.is_array() || choices.empty()) {
    return invalidArgument("choice must be a non-empty array of strings");
  }
  std::vector<Expr> options;
  for (const auto& choice : choices) {
    if (!choice.is_string() || choice.get<std::string>().empty()) {
      return invalidArgument("choice must be a non-empty array of non-empty strings");
    }
    options.push_back(literal(choice.get<std::string>()));
  }
  GrammarBuilder builder;
  return builder.build(builder.add("root", alt(std::move(options))));
}

}  // namespace

namespace {

StatusOr<Grammar> compileSpec(const Constraint& constraint) {
  switch (constraint.kind) {
    case ConstraintKind::kJsonSchema: {
      JsonParseError error;
      const auto schema = parseOrderedJson(constraint.spec, error);
      if (!schema) return invalidArgument("the JSON schema is not valid JSON");
      return compileJsonSchema(*schema);
    }
    case ConstraintKind::kJsonObject:
      return anyJsonObjectGrammar();
    case ConstraintKind::kRegex:
      return compileRegex(constraint.spec);
    case ConstraintKind::kChoice:
      return choiceGrammar(constraint.spec);
    case ConstraintKind::kGrammar:
      return compileGbnf(constraint.spec);
    case ConstraintKind::kToolCalls: {
      JsonParseError error;
      const auto spec = parseOrderedJson(constraint.spec, error);
      if (!spec) return invalidArgument("the tool calls' spec is not valid JSON");
      return compileToolCalls(*spec);
    }
  }
  return invalidArgument("unknown structured output kind");
}

}  // namespace

StatusOr<Grammar> compileConstraint(const Constraint& constraint) {
  StatusOr<Grammar> grammar = compileSpec(constraint);
  if (!grammar.isOk() || constraint.after.empty()) return grammar;
  return afterText(*grammar, constraint.after);
}

ConstraintCache::ConstraintCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity,
                                 int64_t max_bytes)
    : vocabulary_(std::move(vocabulary)),
      capacity_(std::max<size_t>(capacity, 1)),
      max_bytes_(max_bytes) {}

ConstraintCache::~ConstraintCache() = default;

size_t ConstraintCache::size() {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

int64_t ConstraintCache::bytes() {
  std::lock_guard lock(mutex_);
  return bytes_;
}

StatusOr<std::shared_ptr<CompiledGrammar>> ConstraintCache::get(const Constraint& constraint) {
  std::string key = std::string(constraintKindName(constraint.kind)) + '\n' + constraint.after +
                    '\n' + constraint.spec;
  {
    std::lock_guard lock(mutex_);
    if (Entry* found = entries_.find(key)) {
      // Its last requests may have grown it (their memo and masks).
      recountLocked(*found);
      std::shared_ptr<CompiledGrammar> grammar = found->grammar;
      evictLocked();
      return grammar;
    }
  }
  // Compiled outside the lock: a large schema does not hold up the others.
  StatusOr<Grammar> grammar = compileConstraint(constraint);
  if (!grammar.isOk()) return grammar.status();
  auto compiled = std::make_shared<CompiledGrammar>(std::move(grammar).value(), vocabulary_);
  std::lock_guard lock(mutex_);
  if (Entry* found = entries_.find(key)) return found->grammar;
  entries_.put(key, Entry{compiled, 0});
  // Every grammar as it is now: requests grew some since they were counted.
  entries_.forEach([this](const std::string&, Entry& entry) { recountLocked(entry); });
  evictLocked();
  return compiled;
}

void ConstraintCache::recountLocked(Entry& entry) {
  const int64_t bytes = entry.grammar->approxBytes();
  bytes_ += bytes - entry.bytes;
  entry.bytes = bytes;
}

void ConstraintCache::evictLocked() {
  while (entries_.size() > 1 && (entries_.size() > capacity_ || bytes_ > max_bytes_)) {
    bytes_ -= entries_.oldest().second.bytes;
    entries_.popOldest();
  }
}

}  // namespace tandem::structured
