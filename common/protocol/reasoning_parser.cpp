#include "common/protocol/reasoning_parser.h"

#include "common/protocol/parser_registry.h"
#include "common/protocol/stream_text.h"

namespace tandem::protocol {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

std::optional<std::string> nonEmpty(std::string_view text) {
  if (text.empty()) return std::nullopt;
  return std::string(text);
}

std::string_view dropLeadingThinkStart(std::string_view text) {
  return startsWith(text, kThinkStart) ? text.substr(kThinkStart.size()) : text;
}

// Every parser and its name, in the order error messages list them.
constexpr ParserTable<ReasoningParserKind, 3> kParsers = {
    {ReasoningParserKind::kDeepSeekR1, "deepseek_r1"},
    {ReasoningParserKind::kQwen3, "qwen3"},
    {ReasoningParserKind::kOpenAiGptOss, "openai_gptoss"},
};

}  // namespace

const std::vector<std::string>& reasoningParserNames() {
  static const std::vector<std::string> kNames = parserNames(kParsers);
  return kNames;
}

const char* reasoningParserName(ReasoningParserKind kind) { return parserName(kParsers, kind); }

StatusOr<ReasoningParserKind> reasoningParserFromName(std::string_view name) {
  return parserFromName(kParsers, name, "reasoning parser", "--reasoning-parser");
}

ReasoningSplit parseReasoning(const ReasoningOptions& options, std::string_view text) {
  ReasoningSplit split;
  if (options.reasoning_ended_in_prompt) {
    split.content = nonEmpty(text);
    return split;
  }
  const bool opened = startsWith(text, kThinkStart);
  const std::string_view body = dropLeadingThinkStart(text);
  const size_t end = body.find(kThinkEnd);
  if (end == std::string_view::npos) {
    // An output that opened its reasoning is reasoning until it closes it.
    if (options.kind != ReasoningParserKind::kQwen3 || opened) {
      split.reasoning = nonEmpty(body);
    } else {
      split.content = nonEmpty(body);
    }
    return split;
  }
  split.reasoning = nonEmpty(body.substr(0, end));
  split.content = nonEmpty(body.substr(end + kThinkEnd.size()));
  return split;
}

bool reasoningEndedIn(std::string_view prompt) {
  const size_t start = prompt.rfind(kThinkStart);
  const size_t end = prompt.rfind(kThinkEnd);
  return end != std::string_view::npos && (start == std::string_view::npos || end > start);
}

ReasoningStream::ReasoningStream(const ReasoningOptions& options)
    : options_(options),
      state_(options.reasoning_ended_in_prompt ? State::kContent : State::kStart) {}

ReasoningPieces ReasoningStream::feed(std::string_view text) {
  ReasoningPieces out;
  held_.append(text);
  drain(out, /*at_end=*/false);
  return out;
}

ReasoningPieces ReasoningStream::finish() {
  ReasoningPieces out;
  drain(out, /*at_end=*/true);
  return out;
}

void ReasoningStream::drain(ReasoningPieces& out, bool at_end) {
  if (state_ == State::kStart) {
    // Whether the output opens with <think> is known once kThinkStart.size()
    // bytes arrived, or a byte differs, or the output ended.
    bool opened = false;
    if (startsWith(held_, kThinkStart)) {
      held_.erase(0, kThinkStart.size());
      opened = true;
    } else if (!at_end && startsWith(kThinkStart, held_)) {
      return;
    }
    // qwen3: an output that opened with <think> streams its reasoning as it
    // comes; one that did not is undecided until </think> or its end.
    state_ = options_.kind == ReasoningParserKind::kQwen3 && !opened ? State::kUndecided
                                                                     : State::kReasoning;
  }
  if (state_ == State::kUndecided) {
    const size_t end = held_.find(kThinkEnd);
    if (end != std::string::npos) {
      out.reasoning.append(held_, 0, end);
      held_.erase(0, end + kThinkEnd.size());
      state_ = State::kContent;
    } else if (at_end) {
      out.content.append(held_);
      held_.clear();
      return;
    } else {
      return;
    }
  }
  if (state_ == State::kReasoning) {
    const size_t end = held_.find(kThinkEnd);
    if (end != std::string::npos) {
      out.reasoning.append(held_, 0, end);
      held_.erase(0, end + kThinkEnd.size());
      state_ = State::kContent;
    } else {
      const size_t keep = at_end ? 0 : partialTagSuffix(held_, kThinkEnd);
      out.reasoning.append(held_, 0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
  }
  // kContent: everything after </think> is content as it comes.
  out.content.append(held_);
  held_.clear();
}

}  // namespace tandem::protocol
