#include "common/protocol/harmony.h"

#include <algorithm>

#include "common/protocol/stream_text.h"

namespace tandem::protocol {
namespace {

constexpr std::string_view kStartMarker = "<|start|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kConstrain = "<|constrain|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kCall = "<|call|>";
constexpr std::string_view kReturn = "<|return|>";
constexpr std::string_view kRecipient = "to=";
constexpr std::string_view kFunctions = "functions.";

// What may open a header where one is expected (the output's start, or
// between messages without their `<|start|>assistant`).
constexpr std::string_view kHeaderOpeners[] = {kChannel, kConstrain, kMessage, " to="};
// What ends a message body; `<|start|>` also begins the next message.
constexpr std::string_view kBodyEnds[] = {kEnd, kCall, kReturn, kStartMarker};
// The markers that end a message without beginning another.
constexpr std::string_view kMessageEnds[] = {kEnd, kCall, kReturn};

// Whether `text` is a proper prefix of one of `tags` (more bytes may make it
// one of them).
template <size_t N>
bool mayBecome(std::string_view text, const std::string_view (&tags)[N]) {
  return std::any_of(std::begin(tags), std::end(tags), [text](std::string_view tag) {
    return text.size() < tag.size() && startsWith(tag, text);
  });
}

template <size_t N>
bool startsWithOne(std::string_view text, const std::string_view (&tags)[N]) {
  return std::any_of(std::begin(tags), std::end(tags),
                     [text](std::string_view tag) { return startsWith(text, tag); });
}

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The white-space separated words of `text`.
std::vector<std::string_view> words(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && isSpace(text[i])) ++i;
    const size_t begin = i;
    while (i < text.size() && !isSpace(text[i])) ++i;
    if (i > begin) out.push_back(text.substr(begin, i - begin));
  }
  return out;
}

}  // namespace

HarmonyHeader parseHarmonyHeader(std::string_view header) {
  // Segments between the markers: before the first, the role (and perhaps
  // the recipient); after `<|channel|>`, the channel (then perhaps the
  // recipient and a content type); after `<|constrain|>`, the content type.
  HarmonyHeader parsed;
  enum class Segment { kRole, kChannel, kConstrain };
  Segment segment = Segment::kRole;
  size_t at = 0;
  while (true) {
    const size_t channel = header.find(kChannel, at);
    const size_t constrain = header.find(kConstrain, at);
    const size_t next = std::min(channel, constrain);
    const std::string_view text =
        header.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at);
    bool first = true;
    for (std::string_view word : words(text)) {
      if (startsWith(word, kRecipient)) {
        parsed.recipient = std::string(word.substr(kRecipient.size()));
      } else if (segment == Segment::kChannel && first) {
        parsed.channel = std::string(word);
      } else if (segment == Segment::kConstrain && first) {
        parsed.content_type = std::string(word);
      } else if (segment == Segment::kChannel && parsed.content_type.empty()) {
        parsed.content_type = std::string(word);  // `<|channel|>commentary json`
      }
      first = false;
    }
    if (next == std::string_view::npos) break;
    segment = next == channel ? Segment::kChannel : Segment::kConstrain;
    at = next + (next == channel ? kChannel.size() : kConstrain.size());
  }
  return parsed;
}

HarmonyPieces HarmonyStream::feed(std::string_view text) {
  HarmonyPieces out;
  held_.append(text);
  drain(out, /*at_end=*/false);
  return out;
}

HarmonyPieces HarmonyStream::finish() {
  HarmonyPieces out;
  drain(out, /*at_end=*/true);
  return out;
}

void HarmonyStream::beginBody(const HarmonyHeader& header) {
  message_text_ = false;
  call_ = HarmonyCall{};
  if (startsWith(header.recipient, kFunctions) && header.recipient.size() > kFunctions.size()) {
    part_ = Part::kCall;
    call_.name = header.recipient.substr(kFunctions.size());
    call_.content_type = header.content_type;
  } else if (header.channel == "analysis") {
    part_ = Part::kReasoning;
  } else if (!header.recipient.empty()) {
    part_ = Part::kDropped;
  } else {
    part_ = Part::kContent;
  }
  state_ = State::kBody;
}

void HarmonyStream::emit(std::string_view text, HarmonyPieces& out) {
  if (text.empty()) return;
  switch (part_) {
    case Part::kReasoning:
      if (!message_text_ && reasoning_text_) out.reasoning += '\n';
      out.reasoning.append(text);
      reasoning_text_ = true;
      break;
    case Part::kContent:
      if (!message_text_ && content_text_) out.content += '\n';
      out.content.append(text);
      content_text_ = true;
      break;
    case Part::kCall:
      call_.arguments.append(text);
      break;
    case Part::kDropped:
      break;
  }
  message_text_ = true;
}

void HarmonyStream::endMessage(HarmonyPieces& out) {
  if (part_ == Part::kCall) out.calls.push_back(std::move(call_));
  call_ = HarmonyCall{};
  part_ = Part::kContent;
  message_text_ = false;
  state_ = State::kBetween;
}

void HarmonyStream::drain(HarmonyPieces& out, bool at_end) {
  while (true) {
    switch (state_) {
      case State::kStart:
      case State::kBetween: {
        if (held_.empty()) return;
        if (state_ == State::kBetween && startsWith(held_, kStartMarker)) {
          held_.erase(0, kStartMarker.size());
          header_.clear();
          state_ = State::kHeader;
          continue;
        }
        if (startsWithOne(held_, kHeaderOpeners)) {
          header_.clear();
          state_ = State::kHeader;
          continue;
        }
        // A stop marker kept in the text (include_stop_str_in_output) after
        // an `<|end|>`: nothing to add.
        if (state_ == State::kBetween && startsWithOne(held_, kMessageEnds)) {
          held_.erase(0, held_.find("|>") + 2);
          continue;
        }
        if (!at_end && (mayBecome(held_, kHeaderOpeners) ||
                        (state_ == State::kBetween && mayBecome(held_, kBodyEnds)))) {
          return;
        }
        beginBody(HarmonyHeader{});  // text outside the format: content
        continue;
      }
      case State::kHeader: {
        const size_t message = held_.find(kMessage);
        if (message != std::string::npos) {
          header_.append(held_, 0, message);
          held_.erase(0, message + kMessage.size());
          beginBody(parseHarmonyHeader(header_));
          header_.clear();
          continue;
        }
        if (at_end) {  // the output ended inside a header: no message text
          held_.clear();
          header_.clear();
          return;
        }
        const size_t keep = partialTagSuffix(held_, kMessage);
        header_.append(held_, 0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case State::kBody: {
        size_t end = std::string::npos;
        std::string_view marker;
        for (std::string_view candidate : kBodyEnds) {
          const size_t at = held_.find(candidate);
          if (at < end) {
            end = at;
            marker = candidate;
          }
        }
        if (end != std::string::npos) {
          emit(std::string_view(held_).substr(0, end), out);
          endMessage(out);
          held_.erase(0, end + marker.size());
          if (marker == kStartMarker) {
            header_.clear();
            state_ = State::kHeader;
          }
          continue;
        }
        size_t keep = 0;
        if (!at_end) {
          for (std::string_view candidate : kBodyEnds) {
            keep = std::max(keep, partialTagSuffix(held_, candidate));
          }
        }
        emit(std::string_view(held_).substr(0, held_.size() - keep), out);
        held_.erase(0, held_.size() - keep);
        if (at_end) endMessage(out);
        return;
      }
    }
  }
}

HarmonyPieces parseHarmony(std::string_view text) {
  HarmonyStream stream;
  HarmonyPieces out = stream.feed(text);
  HarmonyPieces rest = stream.finish();
  out.reasoning += rest.reasoning;
  out.content += rest.content;
  for (HarmonyCall& call : rest.calls) out.calls.push_back(std::move(call));
  return out;
}

}  // namespace tandem::protocol
