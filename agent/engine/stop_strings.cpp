#include "agent/engine/stop_strings.h"

#include <algorithm>

namespace tandem::engine {
namespace {

bool isUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; }

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings, bool include_stop)
    : include_stop_(include_stop) {
  for (std::string& text : stop_strings) {
    if (text.empty()) continue;
    Stop stop;
    stop.failure.assign(text.size(), 0);
    for (size_t i = 1, k = 0; i < text.size(); ++i) {
      while (k > 0 && text[i] != text[k]) k = stop.failure[k - 1];
      if (text[i] == text[k]) ++k;
      stop.failure[i] = k;
    }
    stop.text = std::move(text);
    stops_.push_back(std::move(stop));
  }
}

StopStringMatcher::Update StopStringMatcher::push(const std::string& piece, bool may_stop) {
  Update update;
  if (stopped_) {
    update.stopped = true;
    return update;
  }
  const size_t before = pending_.size();
  pending_ += piece;
  if (stops_.empty()) {
    update.text.swap(pending_);
    return update;
  }
  // Every occurrence ending in the new piece; the earliest starting wins (of
  // two starting there, the one listed first).
  size_t first = std::string::npos;
  const Stop* first_stop = nullptr;
  for (Stop& stop : stops_) {
    const size_t length = stop.text.size();
    for (size_t i = before; i < pending_.size(); ++i) {
      const char c = pending_[i];
      size_t k = stop.matched;
      while (k > 0 && stop.text[k] != c) k = stop.failure[k - 1];
      if (stop.text[k] == c) ++k;
      if (k == length) {
        const size_t at = i + 1 - length;
        if (may_stop && at < first) {
          first = at;
          first_stop = &stop;
        }
        k = stop.failure[k - 1];
      }
      stop.matched = k;
    }
  }
  if (first_stop != nullptr) {
    update.text = pending_.substr(0, include_stop_ ? first + first_stop->text.size() : first);
    matched_ = first_stop->text;
    pending_.clear();
    stopped_ = true;
    update.stopped = true;
    return update;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const Stop& stop : stops_) hold = std::max(hold, stop.matched);
  size_t release = pending_.size() - std::min(hold, pending_.size());
  // Never split a UTF-8 sequence between what is released and what is held.
  while (release > 0 && release < pending_.size() && isUtf8Continuation(pending_[release])) {
    --release;
  }
  update.text = pending_.substr(0, release);
  pending_.erase(0, release);
  return update;
}

std::string StopStringMatcher::finish() {
  std::string rest;
  if (!stopped_) rest.swap(pending_);
  pending_.clear();
  return rest;
}

}  // namespace tandem::engine
