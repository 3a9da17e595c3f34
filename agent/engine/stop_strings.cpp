#include "agent/engine/stop_strings.h"

#include <algorithm>

namespace tandem::engine {
namespace {

bool isUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; }

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings, bool include_stop)
    : stop_strings_(std::move(stop_strings)), include_stop_(include_stop) {
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
  for (const auto& stop : stop_strings_) max_stop_length_ = std::max(max_stop_length_, stop.size());
}

StopStringMatcher::Update StopStringMatcher::push(const std::string& piece, bool may_stop) {
  Update update;
  if (stopped_) {
    update.stopped = true;
    return update;
  }
  const size_t before = pending_.size();
  pending_ += piece;
  if (stop_strings_.empty()) {
    update.text.swap(pending_);
    return update;
  }
  // The earliest stop string occurrence ending in the new piece wins (of two
  // starting there, the one listed first).
  size_t first = std::string::npos;
  const std::string* first_stop = nullptr;
  if (may_stop && !piece.empty()) {
    for (const auto& stop : stop_strings_) {
      const size_t from = before + 1 >= stop.size() ? before + 1 - stop.size() : 0;
      const size_t at = pending_.find(stop, from);
      if (at < first) {
        first = at;
        first_stop = &stop;
      }
    }
  }
  if (first_stop != nullptr) {
    update.text = pending_.substr(0, include_stop_ ? first + first_stop->size() : first);
    matched_ = *first_stop;
    pending_.clear();
    stopped_ = true;
    update.stopped = true;
    return update;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  const size_t max_hold = std::min(pending_.size(), max_stop_length_ - 1);
  for (size_t length = max_hold; length > 0; --length) {
    const std::string_view tail(pending_.data() + pending_.size() - length, length);
    const bool is_prefix = std::any_of(
        stop_strings_.begin(), stop_strings_.end(),
        [&](const std::string& stop) { return stop.size() > length && stop.starts_with(tail); });
    if (is_prefix) {
      hold = length;
      break;
    }
  }
  size_t release = pending_.size() - hold;
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
