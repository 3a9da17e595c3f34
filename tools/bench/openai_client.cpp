#include "tools/bench/openai_client.h"

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;

constexpr size_t kErrorBodyBytes = 4096;  // of a non-200 response body

void configureClient(httplib::Client& client, double read_timeout_s) {
  const auto read_timeout = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::duration<double>(read_timeout_s));
  client.set_read_timeout(read_timeout);
  client.set_connection_timeout(std::chrono::seconds(30));
  client.set_keep_alive(false);
}

}  // namespace

double secondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string checkedBaseUrl(const std::string& url, const std::string& option) {
  std::string base = url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  const size_t scheme_end = base.find("://");
  if (scheme_end == std::string::npos || base.find('/', scheme_end + 3) != std::string::npos) {
    throw Error(option +
                " must be scheme://host[:port] with no path, such as http://127.0.0.1:8000, "
                "got \"" +
                url + "\"");
  }
  return base;
}

std::vector<ServedModel> listModels(const std::string& base_url, double read_timeout_s) {
  httplib::Client client(base_url);
  configureClient(client, read_timeout_s);
  auto result = client.Get("/v1/models");
  if (!result) {
    throw Error("cannot list models at " + base_url +
                "/v1/models: " + httplib::to_string(result.error()));
  }
  if (result->status != 200) {
    throw Error("GET " + base_url + "/v1/models answered HTTP " + std::to_string(result->status) +
                ": " + result->body.substr(0, 200));
  }
  json body = json::parse(result->body, nullptr, false);
  std::vector<ServedModel> models;
  if (body.is_object() && body.contains("data") && body["data"].is_array()) {
    for (const json& entry : body["data"]) {
      if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_string()) continue;
      ServedModel model{entry["id"].get<std::string>(), std::nullopt};
      if (entry.contains("max_model_len") && entry["max_model_len"].is_number_integer()) {
        model.max_model_len = entry["max_model_len"].get<int64_t>();
      }
      models.push_back(std::move(model));
    }
  }
  return models;
}

std::optional<std::string> fetchText(const std::string& base_url, const std::string& path,
                                     double read_timeout_s) {
  try {
    httplib::Client client(base_url);
    configureClient(client, read_timeout_s);
    auto result = client.Get(path);
    if (!result || result->status != 200) return std::nullopt;
    return result->body;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

SseReader::SseReader(std::function<void(const std::string&)> on_event)
    : on_event_(std::move(on_event)) {}

void SseReader::feed(const char* bytes, size_t size) {
  pending_.append(bytes, size);
  size_t line_start = 0;
  for (size_t newline; (newline = pending_.find('\n', line_start)) != std::string::npos;
       line_start = newline + 1) {
    std::string_view line(pending_.data() + line_start, newline - line_start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      if (has_data_) on_event_(data_);
      data_.clear();
      has_data_ = false;
    } else if (line.starts_with("data:")) {
      line.remove_prefix(5);
      if (line.starts_with(' ')) line.remove_prefix(1);
      if (has_data_) data_ += '\n';
      data_.append(line);
      has_data_ = true;
    }
    // Other fields (event:, id:, retry:) and comments carry nothing we measure.
  }
  pending_.erase(0, line_start);
}

StreamedCompletion streamCompletion(const std::string& base_url, const std::string& body,
                                    double read_timeout_s, Clock::time_point start,
                                    StreamProgress* progress) {
  StreamedCompletion record;
  try {
    httplib::Client client(base_url);
    configureClient(client, read_timeout_s);

    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
    request.body = body;

    int status = 0;
    std::string error_body;
    std::string event_error;
    bool saw_done = false;
    bool saw_usage = false;
    Clock::time_point now{}, done_at{}, last_bytes{};
    std::vector<Clock::time_point> token_chunks;

    SseReader reader([&](const std::string& data) {
      if (data == "[DONE]") {
        saw_done = true;
        done_at = now;
        return;
      }
      json event = json::parse(data, nullptr, false);
      if (!event.is_object()) {
        if (event_error.empty()) event_error = "malformed stream event: " + data.substr(0, 200);
        return;
      }
      if (auto error = event.find("error"); error != event.end()) {
        if (event_error.empty()) {
          const bool has_message =
              error->is_object() && error->contains("message") && (*error)["message"].is_string();
          event_error = "error event: " +
                        (has_message ? (*error)["message"].get<std::string>() : error->dump());
        }
        return;
      }
      if (auto choices = event.find("choices");
          choices != event.end() && choices->is_array() && !choices->empty()) {
        const json& choice = (*choices)[0];
        const bool has_text = choice.contains("text") && choice["text"].is_string() &&
                              !choice["text"].get_ref<const std::string&>().empty();
        bool has_token_ids = false;
        if (auto ids = choice.find("token_ids"); ids != choice.end() && ids->is_array()) {
          for (const json& id : *ids) {
            if (id.is_number_integer()) record.token_ids.push_back(id.get<int32_t>());
          }
          has_token_ids = !ids->empty();
          if (progress != nullptr) progress->tokens += static_cast<int64_t>(ids->size());
        }
        // The finishing chunk carries the last token even when its text is
        // empty (held back, or an incomplete UTF-8 sequence).
        const bool finishing =
            choice.contains("finish_reason") && !choice["finish_reason"].is_null();
        if (has_text || has_token_ids || finishing) token_chunks.push_back(now);
      }
      if (auto usage = event.find("usage"); usage != event.end() && usage->is_object()) {
        record.prompt_tokens = usage->value("prompt_tokens", int64_t{0});
        record.completion_tokens = usage->value("completion_tokens", int64_t{0});
        if (auto details = usage->find("prompt_tokens_details");
            details != usage->end() && details->is_object()) {
          if (auto cached = details->find("cached_tokens");
              cached != details->end() && cached->is_number_integer()) {
            record.cached_tokens = cached->get<int64_t>();
          }
        }
        saw_usage = true;
      }
    });

    request.response_handler = [&](const httplib::Response& response) {
      status = response.status;
      if (progress != nullptr) {
        std::lock_guard<std::mutex> lock(progress->mutex);
        progress->decode_agent = response.get_header_value("x-tandem-decode-agent");
      }
      return true;
    };
    request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      now = Clock::now();
      last_bytes = now;
      if (status != 200) {
        error_body.append(
            data, std::min(size, kErrorBodyBytes - std::min(kErrorBodyBytes, error_body.size())));
      } else {
        reader.feed(data, size);
      }
      return true;
    };

    const Clock::time_point sent = Clock::now();
    last_bytes = sent;
    record.send_s = secondsBetween(start, sent);
    httplib::Result result = client.send(request);
    const Clock::time_point ended = Clock::now();
    record.end_s = secondsBetween(start, ended);
    record.idle_s = secondsBetween(last_bytes, ended);
    record.http_status = status;
    record.saw_done = saw_done;
    record.error_event = !event_error.empty();
    record.transport_error = result.error() != httplib::Error::Success;

    if (status != 0 && status != 200) {
      json error = json::parse(error_body, nullptr, false);
      std::string message = error_body;
      if (error.is_object() && error.contains("error") && error["error"].is_object() &&
          error["error"].contains("message") && error["error"]["message"].is_string()) {
        message = error["error"]["message"].get<std::string>();
        record.error_body_json = true;
      }
      record.error = "HTTP " + std::to_string(status) + ": " + message;
    } else if (result.error() != httplib::Error::Success) {
      record.error = (status == 0 ? "request failed: " : "stream cut off: ") +
                     httplib::to_string(result.error());
    } else if (!event_error.empty()) {
      record.error = event_error;
    } else if (!saw_done) {
      record.error = "stream ended without data: [DONE]";
    } else if (!saw_usage) {
      record.error = "stream ended without a usage chunk";
    } else if (token_chunks.empty()) {
      record.error = "stream carried no tokens";
    } else {
      record.success = true;
      record.ttft_s = secondsBetween(sent, token_chunks.front());
      record.e2el_s = secondsBetween(sent, done_at);
      for (size_t i = 1; i < token_chunks.size(); ++i) {
        record.itl_s.push_back(secondsBetween(token_chunks[i - 1], token_chunks[i]));
      }
    }
  } catch (const std::exception& e) {
    record.success = false;
    record.transport_error = true;
    record.error = std::string("request failed: ") + e.what();
  }
  return record;
}

}  // namespace tandem::bench
