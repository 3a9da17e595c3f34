// A client's stream kept whole across decode agents: when the agent serving
// a streamed completion fails, the router sends the request to another with
// `resume_token_ids` (the tokens the answer already has; docs/api.md) and
// splices that agent's stream onto the client's. StreamSplice is the pure
// part: it relays complete SSE events, remembers every token id the answer
// has (the upstream is asked for token_ids whatever the client asked), and
// rewrites what a continuation must not show: its own `id` and `created`
// (the first stream's are kept), a chat continuation's repeated `role`, and
// the token ids a client did not ask for — dropping a chunk that is then
// empty, as the agent itself does. A draining agent's hand-over event
// ({"tandem_handover": ...}: the stream goes on elsewhere, from the blocks
// it holds) and an agent's error event (with what follows it: its usage
// chunk and [DONE]) are kept for the router, which moves the stream or ends
// it; never relayed. So is a chunk with finish_reason abort (the agent
// stopped before the answer's end: its shutdown deadline), taken for an
// error event. Bytes of a relayed event are
// the agent's serialization (compactDump) of the rewritten chunk; an undisturbed stream goes
// through unchanged. Not thread-safe: one per request.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::router {

// Whether an agent's `choices` (a stream chunk's, or a whole answer's) hold
// one that ended with finish_reason abort: an agent ends an answer so, its
// client still there, only when it stops before the end (its shutdown
// deadline): the answer was cut short.
bool cutByItsAgent(const nlohmann::json& choices);

class StreamSplice {
 public:
  // `resumed`: token ids the client's own request resumed from (its
  // resume_token_ids), which the answer starts with.
  StreamSplice(bool chat, bool client_wants_ids, std::vector<int64_t> resumed = {});

  // One complete SSE event from the current upstream, with its terminating
  // blank line; returns what the client gets ("" for nothing).
  std::string relay(std::string_view event);
  // The next events come from another agent resuming the answer.
  void beginContinuation();
  // Whether the current upstream handed the stream over (its agent drains),
  // and the kv_transfer_params of the blocks it holds for the next agent
  // (null: none). beginContinuation() clears both.
  bool handedOver() const { return handed_over_; }
  const nlohmann::json& handOverParams() const { return hand_over_params_; }
  // The message of the current upstream's error event ("" if none; the
  // event's bytes when it has no message). beginContinuation() clears it.
  const std::string& upstreamError() const { return upstream_error_; }

  // Every token id the answer has: the client's resumed ones, then each
  // relayed chunk's.
  const std::vector<int64_t>& tokenIds() const { return ids_; }
  // Whether the client has received an event (then a chat continuation's
  // role chunk is not its first).
  bool eventsSent() const { return events_sent_; }
  // Whether the upstream's [DONE] went through (the answer is complete).
  bool done() const { return done_; }
  // Whether a chunk ending a choice (a finish_reason) went through: the
  // answer is complete but for its usage chunk and [DONE].
  bool finished() const { return finished_; }
  int continuations() const { return continuations_; }

 private:
  bool chat_;
  bool client_wants_ids_;
  std::vector<int64_t> ids_;
  std::string id_;        // the first stream's "id", once seen
  int64_t created_ = -1;  // and its "created"
  bool events_sent_ = false;
  bool first_of_continuation_ = false;
  bool done_ = false;
  bool finished_ = false;
  int continuations_ = 0;
  bool handed_over_ = false;
  nlohmann::json hand_over_params_;
  std::string upstream_error_;
};

}  // namespace tandem::router
