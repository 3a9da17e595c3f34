// The splice of a client's stream across decode agents (stream_splice.h):
// token ids remembered, the first stream's id kept, a chat continuation's
// role dropped, ids the client did not ask for removed with the chunks that
// then say nothing, a draining agent's hand-over event and an agent's error
// event kept from the client.
#include "operator/router/stream_splice.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/protocol/openai_protocol.h"

namespace tandem::router {
namespace {

using nlohmann::json;

std::string event(const json& chunk) { return "data: " + server::compactDump(chunk) + "\n\n"; }

json completionChunk(const std::string& id, const std::string& text, std::vector<int> ids,
                     const json& finish = nullptr) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", id == "cmpl-a" ? 100 : 200},
          {"model", "tiny"},
          {"choices",
           {{{"index", 0},
             {"text", text},
             {"logprobs", nullptr},
             {"finish_reason", finish},
             {"token_ids", ids}}}}};
}

TEST(StreamSplice, AnUndisturbedStreamGoesThroughByteForByte) {
  StreamSplice splice(/*chat=*/false, /*client_wants_ids=*/true);
  const std::string first = event(completionChunk("cmpl-a", "Once", {11}));
  EXPECT_EQ(splice.relay(first), first);
  EXPECT_EQ(splice.relay("data: [DONE]\n\n"), "data: [DONE]\n\n");
  EXPECT_TRUE(splice.done());
  EXPECT_EQ(splice.tokenIds(), (std::vector<int64_t>{11}));
}

// Keys keep the agent's order (a completion's top_logprobs best first), in
// a first stream and in a continuation, whose id the splice rewrites.
TEST(StreamSplice, KeysKeepTheirOrder) {
  StreamSplice splice(/*chat=*/false, /*client_wants_ids=*/true);
  auto chunk = [](const std::string& id) {
    return "data: {\"id\":\"" + id +
           "\",\"object\":\"text_completion\",\"created\":1,\"model\":\"tiny\","
           "\"choices\":[{\"index\":0,\"text\":\"x\",\"logprobs\":{\"tokens\":[\"x\"],"
           "\"top_logprobs\":[{\"x\":-0.1,\"b\":-2.5,\"a\":-3.0}]},"
           "\"finish_reason\":null,\"token_ids\":[5]}]}\n\n";
  };
  EXPECT_EQ(splice.relay(chunk("cmpl-a")), chunk("cmpl-a"));
  splice.beginContinuation();
  EXPECT_EQ(splice.relay(chunk("cmpl-b")), chunk("cmpl-a"));
}

TEST(StreamSplice, AContinuationKeepsTheFirstIdAndRemembersEveryToken) {
  StreamSplice splice(false, /*client_wants_ids=*/false, /*resumed=*/{7});
  json without_ids = completionChunk("cmpl-a", "Once", {11});
  without_ids["choices"][0].erase("token_ids");
  EXPECT_EQ(splice.relay(event(completionChunk("cmpl-a", "Once", {11}))), event(without_ids));
  // A token whose text is held back: nothing for a client without ids.
  EXPECT_EQ(splice.relay(event(completionChunk("cmpl-a", "", {12}))), "");
  splice.beginContinuation();
  const std::string moved = splice.relay(event(completionChunk("cmpl-b", " upon", {13})));
  const json chunk = json::parse(moved.substr(6));
  EXPECT_EQ(chunk["id"], "cmpl-a");
  EXPECT_EQ(chunk["created"], 100);
  EXPECT_FALSE(chunk["choices"][0].contains("token_ids"));
  EXPECT_EQ(chunk["choices"][0]["text"], " upon");
  EXPECT_EQ(splice.tokenIds(), (std::vector<int64_t>{7, 11, 12, 13}));
  EXPECT_EQ(splice.continuations(), 1);
  EXPECT_FALSE(splice.done());
}

TEST(StreamSplice, AChatContinuationDoesNotSayWhoSpeaksTwice) {
  auto chat = [](const std::string& id, const json& delta, std::vector<int> ids) {
    return json{{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", 5},
                {"model", "tiny"},
                {"choices",
                 {{{"index", 0},
                   {"delta", delta},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr},
                   {"token_ids", ids}}}}};
  };
  StreamSplice splice(/*chat=*/true, /*client_wants_ids=*/true);
  const std::string first = event(chat("chat-a", {{"role", "assistant"}, {"content", "Hi"}}, {1}));
  EXPECT_EQ(splice.relay(first), first);
  splice.beginContinuation();
  const json resumed = json::parse(
      splice.relay(event(chat("chat-b", {{"role", "assistant"}, {"content", " there"}}, {2})))
          .substr(6));
  EXPECT_EQ(resumed["choices"][0]["delta"], json({{"content", " there"}}));
  EXPECT_EQ(resumed["id"], "chat-a");
  // A role chunk with nothing else, for a client that wants no ids: dropped.
  StreamSplice quiet(true, false);
  EXPECT_FALSE(
      quiet.relay(event(chat("chat-a", {{"role", "assistant"}, {"content", "Hi"}}, {1}))).empty());
  quiet.beginContinuation();
  EXPECT_EQ(quiet.relay(event(chat("chat-b", {{"role", "assistant"}, {"content", ""}}, {2}))), "");
  EXPECT_EQ(quiet.tokenIds(), (std::vector<int64_t>{1, 2}));
}

TEST(StreamSplice, AHandOverEventIsKeptFromTheClientUntilTheContinuation) {
  StreamSplice splice(/*chat=*/false, /*client_wants_ids=*/false);
  EXPECT_NE(splice.relay(event(completionChunk("cmpl-a", "Once", {11}))), "");
  const json params = {{"remote_block_ids", {3, 4}}, {"remote_num_tokens", 32}};
  EXPECT_EQ(splice.relay(event({{"tandem_handover", {{"kv_transfer_params", params}}}})), "");
  EXPECT_TRUE(splice.handedOver());
  EXPECT_EQ(splice.handOverParams(), params);
  EXPECT_FALSE(splice.done());
  EXPECT_EQ(splice.tokenIds(), (std::vector<int64_t>{11}));
  splice.beginContinuation();
  EXPECT_FALSE(splice.handedOver());
  EXPECT_TRUE(splice.handOverParams().is_null());
  // Nothing held (a request handed over before its first block): no params.
  EXPECT_EQ(splice.relay(event({{"tandem_handover", {{"kv_transfer_params", nullptr}}}})), "");
  EXPECT_TRUE(splice.handedOver());
  EXPECT_TRUE(splice.handOverParams().is_null());
}

TEST(StreamSplice, AnAgentsErrorEventIsKeptForTheRouterAndOtherLinesPassAsSent) {
  StreamSplice splice(false, false);
  EXPECT_EQ(splice.relay(": keep-alive\n\n"), ": keep-alive\n\n");
  EXPECT_EQ(splice.relay("data: {\"error\":{\"message\":\"boom\"}}\n\n"), "");
  EXPECT_EQ(splice.upstreamError(), "boom");
  EXPECT_EQ(splice.relay("data: [DONE]\n\n"), "") << "the failed part's end is not the answer's";
  EXPECT_FALSE(splice.done());
  splice.beginContinuation();
  EXPECT_EQ(splice.upstreamError(), "");
  EXPECT_EQ(splice.relay("data: {\"error\":\"odd\"}\n\n"), "");
  EXPECT_EQ(splice.upstreamError(), "{\"error\":\"odd\"}") << "no message: the event itself";
}

// After its error event, nothing of a failed part reaches the client: its
// usage chunk counts part of the answer (the client gets one usage chunk,
// the answer's), and a comment after it is the dead part's too; nor does it
// count as an event sent (a chat continuation must still say who speaks).
TEST(StreamSplice, AFailedPartsUsageChunkAndLaterEventsAreNotRelayed) {
  StreamSplice splice(/*chat=*/true, false);
  EXPECT_EQ(splice.relay("data: {\"error\":{\"message\":\"KV blocks failed to load\"}}\n\n"), "");
  const json usage = {{"id", "chatcmpl-a"},
                      {"object", "chat.completion.chunk"},
                      {"choices", json::array()},
                      {"usage", {{"prompt_tokens", 9}, {"completion_tokens", 0}}}};
  EXPECT_EQ(splice.relay(event(usage)), "");
  EXPECT_EQ(splice.relay(": keep-alive\n\n"), "");
  EXPECT_EQ(splice.relay("data: [DONE]\n\n"), "");
  EXPECT_FALSE(splice.eventsSent());
  EXPECT_FALSE(splice.done());
}

// A chunk with a finish_reason completes the answer: finished() says so
// (the router then ends the stream itself if its agent breaks before [DONE]).
TEST(StreamSplice, AChunkWithAFinishReasonFinishesTheAnswer) {
  StreamSplice splice(false, true);
  splice.relay(event(completionChunk("cmpl-a", "Once", {11})));
  EXPECT_FALSE(splice.finished());
  splice.relay(event(completionChunk("cmpl-a", " upon", {12}, "length")));
  EXPECT_TRUE(splice.finished());
  EXPECT_FALSE(splice.done());
}

// A chunk with finish_reason abort (its agent stopped at its shutdown
// deadline) is an error kept for the router: the answer is not finished,
// its tokens are not counted (the resuming agent generates them again), and
// the agent's [DONE] after it does not reach the client.
TEST(StreamSplice, AnAbortedChunkIsAnErrorKeptForTheRouter) {
  StreamSplice splice(false, true);
  EXPECT_NE(splice.relay(event(completionChunk("cmpl-a", "Once", {11}))), "");
  EXPECT_EQ(splice.relay(event(completionChunk("cmpl-a", " upon", {12}, "abort"))), "");
  EXPECT_FALSE(splice.finished());
  EXPECT_NE(splice.upstreamError().find("finish_reason abort"), std::string::npos);
  EXPECT_EQ(splice.tokenIds(), std::vector<int64_t>{11});
  EXPECT_EQ(splice.relay("data: [DONE]\n\n"), "");
  EXPECT_FALSE(splice.done());
}

// An error the request itself caused (invalid_request_error: its constraint
// cannot be followed) would be the same on any agent: it reaches the client
// as sent, and so does the end of the answer.
TEST(StreamSplice, AnErrorOfTheRequestsOwnGoesToTheClient) {
  StreamSplice splice(false, false);
  const std::string error =
      "data: {\"error\":{\"message\":\"structured_outputs.regex: too ambiguous\","
      "\"type\":\"invalid_request_error\",\"param\":\"structured_outputs.regex\"}}\n\n";
  EXPECT_EQ(splice.relay(error), error);
  EXPECT_EQ(splice.upstreamError(), "");
  EXPECT_EQ(splice.relay("data: [DONE]\n\n"), "data: [DONE]\n\n");
  EXPECT_TRUE(splice.done());
}

}  // namespace
}  // namespace tandem::router
