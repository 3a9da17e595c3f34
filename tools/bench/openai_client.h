// The client side of an OpenAI-compatible server, for tandem-bench's load
// generators: the base URL, the model list, a Server-Sent Events reader, and
// one timed streaming completion. Every call opens its own connection, so
// threads may call these functions concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tandem::bench {

using Clock = std::chrono::steady_clock;

double secondsBetween(Clock::time_point from, Clock::time_point to);

// `url` without trailing slashes when it is scheme://host[:port]. A path would
// be silently dropped by the HTTP client, so it is refused: throws
// tandem::Error naming `option` (such as "--url").
std::string checkedBaseUrl(const std::string& url, const std::string& option);

struct ServedModel {
  std::string id;
  std::optional<int64_t> max_model_len;
};

// The models GET /v1/models lists; throws tandem::Error when the server
// cannot be asked or does not answer 200.
std::vector<ServedModel> listModels(const std::string& base_url, double read_timeout_s);

// The body of GET base_url + path when it answers 200; nullopt on any failure.
std::optional<std::string> fetchText(const std::string& base_url, const std::string& path,
                                     double read_timeout_s);

// Splits a Server-Sent Events byte stream into the data of each event. Lines
// may end in \n or \r\n; an event ends at a blank line; multi-line data is
// joined with \n as the SSE spec says.
class SseReader {
 public:
  explicit SseReader(std::function<void(const std::string&)> on_event);

  void feed(const char* bytes, size_t size);

 private:
  std::function<void(const std::string&)> on_event_;
  std::string pending_;
  std::string data_;
  bool has_data_ = false;
};

// What one streaming completion measured. Times in seconds; latencies relative to send.
struct StreamedCompletion {
  bool success = false;
  std::string error;
  double send_s = 0.0;  // since the start of the run
  double end_s = 0.0;   // since the start of the run: the last bytes, or the failure
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // usage.prompt_tokens_details.cached_tokens, when the server reports it.
  std::optional<int64_t> cached_tokens;
  // choices[0].token_ids of every chunk in order (servers send them with
  // "return_token_ids": true).
  std::vector<int32_t> token_ids;
  double ttft_s = 0.0;
  double e2el_s = 0.0;
  std::vector<double> itl_s;  // gaps between consecutive token chunks
  // How it ended, for telling failures apart (the chaos and soak programs):
  int http_status = 0;           // 0: no response line came
  bool error_body_json = false;  // a non-200 answer with an OpenAI JSON error body
  bool error_event = false;      // the stream carried an error event
  bool saw_done = false;         // the stream carried data: [DONE]
  bool transport_error = false;  // the connection failed, timed out or was cut
  double idle_s = 0.0;           // from the last bytes received (or the send) to the end

  // Zero for one-token outputs, which have no time per output token.
  double tpotSeconds() const {
    return completion_tokens > 1 ? (e2el_s - ttft_s) / static_cast<double>(completion_tokens - 1)
                                 : 0.0;
  }
};

// POSTs `body` (a JSON request with "stream": true and
// "stream_options": {"include_usage": true}) to base_url + /v1/completions
// and times the stream: the send, every chunk carrying tokens (text, token
// ids or a finish_reason), and data: [DONE]. Never throws: a connection
// error, a non-200 status, an error event, malformed event JSON, a stream cut
// off or one ending without [DONE], the usage chunk or any token comes back
// with success false and the reason.
// What a stream has received so far, readable while it runs.
struct StreamProgress {
  std::atomic<int64_t> tokens{0};
  std::mutex mutex;
  std::string decode_agent;  // the router's x-tandem-decode-agent header, once answered
};
StreamedCompletion streamCompletion(const std::string& base_url, const std::string& body,
                                    double read_timeout_s, Clock::time_point start,
                                    StreamProgress* progress = nullptr);

}  // namespace tandem::bench
