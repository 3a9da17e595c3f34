// OpenAI's harmony response format (gpt-oss): a chat turn's output is a
// sequence of messages
//
//   <|start|>assistant{header}<|message|>{text}<|end|>
//
// where the header names a channel (`<|channel|>analysis`, `commentary` or
// `final`), optionally a recipient (` to=functions.get_weather`, before or
// after the channel) and a content type (`<|constrain|>json`, or a bare word
// after the channel: `<|channel|>commentary json`). The chat template ends the
// prompt with `<|start|>assistant`, so the output opens inside the first
// header: `<|channel|>analysis<|message|>...`. A message ends at `<|end|>`,
// at `<|call|>` (a tool call: generation stops) or at `<|return|>` (the
// answer is over: generation stops); the two stop tokens are not part of the
// output text unless include_stop_str_in_output, so the end of the output
// ends the last message too. A `<|start|>` inside a body also ends the
// message (the next one begins).
//
// What each message becomes (vLLM's openai_gptoss reasoning parser and
// openai tool-call parser, which read the same messages from token ids):
//   - recipient `functions.NAME` (any channel): a call of NAME whose
//     arguments are the body (HarmonyCall; the chat layer decides whether
//     calls are reported);
//   - channel `analysis`: reasoning;
//   - another recipient (gpt-oss's built-in `browser.*`, `python`): dropped,
//     as vLLM's chat completions drop them;
//   - `final`, `commentary` (a preamble shown to the user), no channel, or a
//     channel we do not know: content (vLLM drops unknown channels; we keep
//     their text rather than lose it).
// Reasoning messages are joined with "\n", content messages too (empty ones
// skipped), as vLLM joins them.
//
// Output that does not open with a header (its first bytes are not
// `<|channel|>`, `<|constrain|>`, `<|message|>` or ` to=`), and text between
// messages that is not `<|start|>`, is content: a model that does not follow
// the format, or a structured output constrained from the first token,
// loses nothing. A header the output ends inside (no `<|message|>`) is
// dropped: it is not text of any message.
//
// The markers are matched as text, so the output must be decoded with its
// special tokens (skip_special_tokens false; the chat API sets it for these
// requests). Plain text that spells a marker (the model writing
// "<|end|>" as ordinary tokens) reads as the marker: vLLM reads token ids and
// would not.
//
// Streaming: HarmonyStream is fed the output in arbitrary byte pieces and
// hands back the reasoning and content decided so far and every call whose
// message has ended; the concatenation of everything it hands back equals
// parseHarmony() on the whole text (parseHarmony is one feed and finish). It
// holds back a header until `<|message|>` and, in a body, a possibly partial
// marker at the end.
//
// Thread-safety: parseHarmony is pure; a HarmonyStream belongs to one request.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::protocol {

// A message addressed to `functions.NAME`.
struct HarmonyCall {
  std::string name;          // NAME, without "functions."
  std::string content_type;  // "json", "" when the header gives none
  std::string arguments;     // the body as written
};

// Text and calls decided by one feed() or finish() call; any may be empty.
struct HarmonyPieces {
  std::string reasoning;
  std::string content;
  std::vector<HarmonyCall> calls;
};

// The header's fields, parsed from its text (between `<|start|>`, or the
// output's start, and `<|message|>`).
struct HarmonyHeader {
  std::string channel;       // "" when none
  std::string recipient;     // "" when none
  std::string content_type;  // "" when none
};
HarmonyHeader parseHarmonyHeader(std::string_view header);

class HarmonyStream {
 public:
  HarmonyPieces feed(std::string_view text);
  // The output has ended: ends the last message. Feeding after finish() is
  // a caller bug.
  HarmonyPieces finish();

 private:
  enum class State { kStart, kHeader, kBody, kBetween };
  enum class Part { kReasoning, kContent, kCall, kDropped };

  void drain(HarmonyPieces& out, bool at_end);
  void beginBody(const HarmonyHeader& header);
  void emit(std::string_view text, HarmonyPieces& out);
  void endMessage(HarmonyPieces& out);

  State state_ = State::kStart;
  std::string held_;    // bytes not yet decided
  std::string header_;  // the current header so far
  Part part_ = Part::kContent;
  HarmonyCall call_;             // the current message's, when part_ is kCall
  bool message_text_ = false;    // the current message has emitted text
  bool reasoning_text_ = false;  // some earlier message emitted reasoning
  bool content_text_ = false;    // some earlier message emitted content
};

HarmonyPieces parseHarmony(std::string_view text);

}  // namespace tandem::protocol
