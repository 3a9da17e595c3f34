#include "common/protocol/chat_template.h"

#include <optional>
#include <string>

namespace tandem::server {
namespace {

// The ChatML template as Qwen and many fine-tunes write it; the generated
// test models carry exactly this text.
constexpr std::string_view kChatMlTemplate =
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";

bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

void replaceAll(std::string& text, std::string_view from, std::string_view to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

// Reads the tag body starting at source[pos] up to its closing delimiter
// ("%}" or "}}", optionally preceded by '-' or '+'). Whitespace outside string
// literals is dropped, literals are re-quoted with single quotes, and adjacent
// literals joined by '+' are folded into one. On success sets `pos` past the
// delimiter and `strip_after` when the delimiter asked to strip whitespace.
std::optional<std::string> readTagBody(std::string_view source, char close, size_t& pos,
                                       bool& strip_after) {
  std::string body;
  size_t last_literal_end = std::string::npos;  // body size right after the last literal
  while (pos < source.size()) {
    const char c = source[pos];
    const bool closes_here = pos + 1 < source.size() && c == close && source[pos + 1] == '}';
    const bool strip_closes_here = (c == '-' || c == '+') && pos + 2 < source.size() &&
                                   source[pos + 1] == close && source[pos + 2] == '}';
    if (closes_here || strip_closes_here) {
      strip_after = strip_closes_here && c == '-';
      pos += strip_closes_here ? 3 : 2;
      replaceAll(body, "message.role", "message['role']");
      replaceAll(body, "message.content", "message['content']");
      return body;
    }
    if (c == '\'' || c == '"') {
      size_t end = pos + 1;
      while (end < source.size() && source[end] != c) end += source[end] == '\\' ? 2 : 1;
      if (end >= source.size()) return std::nullopt;  // unterminated literal
      const std::string_view raw = source.substr(pos + 1, end - pos - 1);
      if (last_literal_end != std::string::npos && body.size() == last_literal_end + 1 &&
          body.back() == '+') {
        body.resize(body.size() - 2);  // drop the previous closing quote and the '+'
      } else {
        body += '\'';
      }
      body += raw;
      body += '\'';
      last_literal_end = body.size();
      pos = end + 1;
      continue;
    }
    if (!isSpace(c)) body += c;
    ++pos;
  }
  return std::nullopt;  // unterminated tag
}

// The template reduced to what decides its output under Hugging Face's Jinja
// settings (trim_blocks, lstrip_blocks, keep_trailing_newline=False): literal
// text after whitespace control, and tag bodies without insignificant
// spelling differences. nullopt when the template cannot be read.
std::optional<std::string> canonicalForm(std::string_view source) {
  if (source.ends_with('\n')) source.remove_suffix(1);
  std::string out;
  std::string text;  // literal text since the last tag
  auto flushText = [&] {
    if (text.empty()) return;
    out += '\x01';  // marks literal text; never part of a tag body
    out += text;
    out += '\x01';
    text.clear();
  };
  bool strip_leading = false;  // the previous tag ended with '-'
  bool trim_newline = false;   // the previous tag was a block or comment (trim_blocks)
  size_t pos = 0;
  while (pos < source.size()) {
    const char c = source[pos];
    const bool opens_tag =
        c == '{' && pos + 1 < source.size() &&
        (source[pos + 1] == '%' || source[pos + 1] == '{' || source[pos + 1] == '#');
    if (!opens_tag) {
      if (strip_leading && isSpace(c)) {
        ++pos;
        continue;
      }
      strip_leading = false;
      if (trim_newline) {
        trim_newline = false;
        if (c == '\n') {
          ++pos;
          continue;
        }
        if (c == '\r' && pos + 1 < source.size() && source[pos + 1] == '\n') {
          pos += 2;
          continue;
        }
      }
      text += c;
      ++pos;
      continue;
    }
    const char kind = source[pos + 1];
    const size_t tag_start = pos;
    pos += 2;
    const bool strip_before = pos < source.size() && source[pos] == '-';
    const bool keep_before = pos < source.size() && source[pos] == '+';
    if (strip_before || keep_before) ++pos;
    if (strip_before) {
      while (!text.empty() && isSpace(text.back())) text.pop_back();
    } else if (kind != '{' && !keep_before) {
      // lstrip_blocks: spaces and tabs between the start of the line and a
      // block or comment tag are dropped.
      size_t begin = tag_start;
      while (begin > 0 && (source[begin - 1] == ' ' || source[begin - 1] == '\t')) --begin;
      if (begin == 0 || source[begin - 1] == '\n') {
        size_t count = tag_start - begin;
        while (count > 0 && !text.empty() && (text.back() == ' ' || text.back() == '\t')) {
          text.pop_back();
          --count;
        }
      }
    }
    bool strip_after = false;
    if (kind == '#') {
      const size_t end = source.find("#}", pos);
      if (end == std::string_view::npos) return std::nullopt;
      strip_after = end > pos && source[end - 1] == '-';
      pos = end + 2;
    } else {
      const auto body = readTagBody(source, kind == '%' ? '%' : '}', pos, strip_after);
      if (!body) return std::nullopt;
      flushText();
      out += kind == '%' ? "{%" : "{{";
      out += *body;
      out += kind == '%' ? "%}" : "}}";
    }
    strip_leading = strip_after;
    trim_newline = !strip_after && kind != '{';
  }
  flushText();
  return out;
}

}  // namespace

bool isChatMlTemplate(std::string_view chat_template) {
  static const std::optional<std::string> kCanonicalChatMl = canonicalForm(kChatMlTemplate);
  const auto form = canonicalForm(chat_template);
  return form.has_value() && form == kCanonicalChatMl;
}

StatusOr<std::string> renderChatTemplate(std::string_view chat_template,
                                         std::span<const ChatMessage> messages,
                                         const ChatTemplateOptions& options) {
  if (chat_template.empty()) {
    return failedPrecondition(
        "this model has no chat template (tokenizer_config.json has no chat_template); use "
        "/v1/completions with a prompt instead");
  }
  if (!isChatMlTemplate(chat_template)) {
    return failedPrecondition("chat template of this model is not supported yet (only ChatML)");
  }
  if (messages.empty()) return invalidArgument("messages must not be empty");
  if (options.add_generation_prompt && options.continue_final_message) {
    return invalidArgument(
        "add_generation_prompt and continue_final_message cannot both be true; set "
        "add_generation_prompt to false to continue the final message");
  }
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    prompt += "<|im_start|>";
    prompt += messages[i].role;
    prompt += '\n';
    prompt += messages[i].content;
    if (options.continue_final_message && i + 1 == messages.size()) break;
    prompt += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) prompt += "<|im_start|>assistant\n";
  return prompt;
}

}  // namespace tandem::server
