#include "operator/k8s/watch_stream.h"

#include <utility>

#include "common/json_parse.h"

namespace tandem::k8s {
namespace {

// A line longer than this without a newline is not a watch stream.
constexpr size_t kMaxLineBytes = size_t{256} << 20;

bool isBlank(const std::string& text) {
  return text.find_first_not_of(" \t\r\n") == std::string::npos;
}

std::string stringField(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

HttpWatchStream::HttpWatchStream(std::unique_ptr<HttpStream> stream, std::string description)
    : stream_(std::move(stream)), description_(std::move(description)) {}

void HttpWatchStream::cancel() { stream_->cancel(); }

Result<std::optional<WatchEvent>> HttpWatchStream::next() {
  while (true) {
    if (stream_->cancelled()) return std::optional<WatchEvent>();
    const auto newline = pending_.find('\n');
    if (newline != std::string::npos) {
      std::string line = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      if (isBlank(line)) continue;
      return parseLine(line);
    }
    if (ended_) {
      if (isBlank(pending_)) return std::optional<WatchEvent>();
      std::string line = std::move(pending_);
      pending_.clear();
      return parseLine(line);
    }
    if (pending_.size() > kMaxLineBytes) {
      return ApiError{
          0, "BadResponse",
          description_ + ": a watch event longer than " + std::to_string(kMaxLineBytes) + " bytes"};
    }
    auto more = stream_->readSome(pending_);
    if (!more.isOk()) {
      if (stream_->cancelled()) return std::optional<WatchEvent>();
      return more.error();
    }
    if (!more.value()) ended_ = true;
  }
}

Result<std::optional<WatchEvent>> HttpWatchStream::parseLine(const std::string& line) const {
  JsonParseError parse_error;
  auto parsed = parseJson(line, parse_error);
  if (!parsed || !parsed->is_object() || !parsed->contains("type") ||
      !(*parsed)["type"].is_string() || !parsed->contains("object")) {
    std::string detail = parsed ? "not a {\"type\", \"object\"} event" : parse_error.detail;
    return ApiError{
        0, "BadResponse",
        description_ + ": a watch event is not valid: " + detail + ": " + line.substr(0, 200)};
  }
  WatchEvent event{(*parsed)["type"].get<std::string>(), std::move((*parsed)["object"])};
  if (event.type == "ERROR" && event.object.is_object()) {
    const auto code = event.object.find("code");
    if (code != event.object.end() && code->is_number_integer() && code->get<int64_t>() == 410) {
      const std::string reason = stringField(event.object, "reason");
      const std::string message = stringField(event.object, "message");
      return ApiError{
          410, reason == "Gone" ? reason : "Expired",
          message.empty() ? description_ + ": the watch's resourceVersion is too old" : message};
    }
  }
  return std::optional<WatchEvent>(std::move(event));
}

}  // namespace tandem::k8s
