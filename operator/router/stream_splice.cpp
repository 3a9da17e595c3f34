#include "operator/router/stream_splice.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/protocol/openai_protocol.h"

namespace tandem::router {

bool cutByItsAgent(const nlohmann::json& choices) {
  return choices.is_array() &&
         std::any_of(choices.begin(), choices.end(), [](const nlohmann::json& choice) {
           return choice.is_object() && choice.value("finish_reason", nlohmann::json()) == "abort";
         });
}

using json = nlohmann::ordered_json;  // a chunk is relayed with its keys in order

StreamSplice::StreamSplice(bool chat, bool client_wants_ids, std::vector<int64_t> resumed)
    : chat_(chat), client_wants_ids_(client_wants_ids), ids_(std::move(resumed)) {}

void StreamSplice::beginContinuation() {
  first_of_continuation_ = true;
  handed_over_ = false;
  hand_over_params_ = nullptr;
  upstream_error_.clear();
  ++continuations_;
}

std::string StreamSplice::relay(std::string_view event) {
  // After its error event a failed part says no more to the client: its
  // usage chunk counts part of the answer, and its [DONE] ends nothing.
  if (!upstream_error_.empty()) return "";
  constexpr std::string_view kData = "data: ";
  std::string_view payload = event;
  while (!payload.empty() && (payload.back() == '\n' || payload.back() == '\r')) {
    payload.remove_suffix(1);
  }
  if (!payload.starts_with(kData)) {  // a comment or another field: as sent
    events_sent_ = true;
    return std::string(event);
  }
  payload.remove_prefix(kData.size());
  if (payload == "[DONE]") {
    done_ = true;
    events_sent_ = true;
    return std::string(event);
  }
  json chunk = json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (chunk.is_object() && chunk.contains("error")) {
    const json& error = chunk["error"];
    // The request's own fault (its constraint proved too ambiguous, say):
    // every agent would answer the same, so the client gets it as sent and
    // the stream ends with it.
    if (error.is_object() && error.contains("type") && error["type"] == "invalid_request_error") {
      events_sent_ = true;
      return std::string(event);
    }
    upstream_error_ = error.is_object() && error.contains("message") && error["message"].is_string()
                          ? error["message"].get<std::string>()
                          : std::string(payload);
    if (upstream_error_.empty()) upstream_error_ = std::string(payload);
    return "";
  }
  if (!chunk.is_object()) {
    events_sent_ = true;
    return std::string(event);
  }
  if (auto hand_over = chunk.find("tandem_handover"); hand_over != chunk.end()) {
    handed_over_ = true;
    if (hand_over->is_object()) hand_over_params_ = hand_over->value("kv_transfer_params", json());
    if (!hand_over_params_.is_object()) hand_over_params_ = nullptr;
    return "";
  }
  if (id_.empty() && chunk.contains("id") && chunk["id"].is_string()) {
    id_ = chunk["id"].get<std::string>();
    created_ = chunk.value("created", int64_t{0});
  } else if (!id_.empty()) {
    chunk["id"] = id_;
    if (chunk.contains("created")) chunk["created"] = created_;
  }
  const bool continuation_start = first_of_continuation_;
  first_of_continuation_ = false;
  json* choices =
      chunk.contains("choices") && chunk["choices"].is_array() ? &chunk["choices"] : nullptr;
  if (choices != nullptr && !choices->empty()) {
    json& choice = (*choices)[0];
    // A cut answer: an error, kept from the client, which the router moves
    // like one (the tokens of this chunk, if any, are generated again where
    // it resumes).
    if (cutByItsAgent(*choices)) {
      upstream_error_ = "the agent stopped before the answer's end (finish_reason abort)";
      return "";
    }
    if (auto ids = choice.find("token_ids"); ids != choice.end() && ids->is_array()) {
      for (const json& id : *ids) {
        if (id.is_number_integer()) ids_.push_back(id.get<int64_t>());
      }
      if (!client_wants_ids_) choice.erase("token_ids");
    }
    if (chat_ && continuation_start && events_sent_ && choice.contains("delta")) {
      // The resumed agent's first chunk says who speaks, which the client
      // was told already; an empty content is only what that chunk adds.
      json& delta = choice["delta"];
      delta.erase("role");
      if (delta.contains("content") && delta["content"] == "") delta.erase("content");
    }
    // A chunk left with nothing for the client is dropped, as the agent
    // drops one when token ids are not asked for.
    const bool finished = choice.contains("finish_reason") && !choice["finish_reason"].is_null();
    finished_ = finished_ || finished;
    const bool logprobs = choice.contains("logprobs") && !choice["logprobs"].is_null();
    const bool text = chat_ ? (choice.contains("delta") && !choice["delta"].empty())
                            : !choice.value("text", std::string()).empty();
    if (!finished && !logprobs && !text && !choice.contains("token_ids")) return "";
  }
  events_sent_ = true;
  return std::string(kData) + server::compactDump(chunk) + "\n\n";
}

}  // namespace tandem::router
