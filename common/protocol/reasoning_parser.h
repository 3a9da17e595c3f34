// Reasoning parsers: split a reasoning model's output text into the
// reasoning (`reasoning_content` in a chat completion) and the answer
// (`content`), as vLLM's `--reasoning-parser` does. Chosen per server by name.
//
//   deepseek_r1  DeepSeek-R1, QwQ. The `<think>` that opens the reasoning may
//                be in the prompt, so the output starts inside it: everything
//                up to the first `</think>` is reasoning, everything after it
//                content. Without `</think>` (thinking cut short) all of the
//                output is reasoning. A `<think>` at the very start of the
//                output is dropped; anywhere else it is kept as text.
//   qwen3        Qwen3. An output that opens with `<think>` is reasoning
//                up to the first `</think>` (all of it without one: thinking
//                cut short), content after it. Otherwise reasoning only when
//                `</think>` appears: the text before it is reasoning, the
//                text after it content; without `</think>` all of the output
//                is content: this is Qwen3 with enable_thinking=false.
//
//   openai_gptoss  gpt-oss: the output is in OpenAI's harmony format, read
//                by the harmony parser (harmony.h; chat_output.h runs it in
//                place of the functions here, which treat it as deepseek_r1).
//
// Empty reasoning or empty content is reported as absent (nullopt), never "".
// Tags are matched byte for byte; nothing else (white space after
// `</think>` included) is changed.
//
// When the prompt already closed the reasoning (the chat template put
// `<think></think>` in the prompt, e.g. enable_thinking=false),
// `reasoning_ended_in_prompt` makes both parsers report all output as
// content; qwen3 then streams without holding anything back.
//
// Streaming: ReasoningStream is fed the output in arbitrary byte pieces and
// hands back the reasoning and content text that is decided so far; the
// concatenation of everything it hands back equals parseReasoning() on the
// whole text. It holds back a possibly partial tag. qwen3, for an output that
// did not open with `<think>`, cannot know whether text is reasoning before
// `</think>` appears or the output ends, so it holds back all text until one
// of the two (a prompt that closed the reasoning, reasoning_ended_in_prompt,
// avoids that delay). deepseek_r1, and qwen3 after a leading `<think>`, hold
// back only a possibly partial tag.
//
// reasoning_ended_in_prompt is read from the rendered prompt, as vLLM reads
// it from the prompt's tokens (reasoningEndedIn): whatever a request's
// chat_template_kwargs say, what counts is whether the template closed the
// reasoning.
//
// Thread-safety: the free functions are pure; a ReasoningStream belongs to
// one request and is not shared between threads.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem::protocol {

enum class ReasoningParserKind { kDeepSeekR1, kQwen3, kOpenAiGptOss };

// Accepted names, in the order error messages list them.
const std::vector<std::string>& reasoningParserNames();
// "deepseek_r1" / "qwen3" / "openai_gptoss".
const char* reasoningParserName(ReasoningParserKind kind);
// The parser of that name, or InvalidArgument naming the accepted names:
// `unknown reasoning parser "x" (--reasoning-parser); accepted: deepseek_r1, qwen3, openai_gptoss`.
StatusOr<ReasoningParserKind> reasoningParserFromName(std::string_view name);

struct ReasoningOptions {
  ReasoningParserKind kind = ReasoningParserKind::kDeepSeekR1;
  bool reasoning_ended_in_prompt = false;
};

struct ReasoningSplit {
  std::optional<std::string> reasoning;  // nullopt when empty
  std::optional<std::string> content;    // nullopt when empty
};

ReasoningSplit parseReasoning(const ReasoningOptions& options, std::string_view text);

// Whether a rendered prompt leaves the reasoning closed: its last think tag
// is `</think>` (Qwen3's template with enable_thinking=false ends the prompt
// with `<think>\n\n</think>\n\n`); false when it has none or ends inside an
// opened `<think>` (DeepSeek-R1's templates open it whatever the kwargs).
bool reasoningEndedIn(std::string_view prompt);

// Text decided by one feed() or finish() call; either may be empty.
struct ReasoningPieces {
  std::string reasoning;
  std::string content;
};

class ReasoningStream {
 public:
  explicit ReasoningStream(const ReasoningOptions& options);

  ReasoningPieces feed(std::string_view text);
  // The output has ended: hands back everything still held. Feeding after
  // finish() is a caller bug.
  ReasoningPieces finish();

 private:
  enum class State { kStart, kUndecided, kReasoning, kContent };

  // Moves as much of held_ as is decided into `out`.
  void drain(ReasoningPieces& out, bool at_end);

  ReasoningOptions options_;
  State state_;
  std::string held_;
};

}  // namespace tandem::protocol
