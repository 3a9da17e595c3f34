// The agent's /v1/kv_transfer/* endpoints and the KV consumer facing bad or
// unauthenticated input, between real agent processes on loopback: a hold
// needs a signature when the agent has a KV secret (and the router signs
// its holds), holds are bounded and never keep a completion waiting, the
// held-blocks gauge counts each block once, a consumer on a non-loopback
// address needs a secret, remote_host is a host without a port, errors name
// the offending field, and bodies nested past the bound are refused.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/hmac.h"
#include "common/kv_auth.h"
#include "tests/support/router_cluster.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary
namespace kv_auth = ::tandem::kv_auth;
using ::tandem::prometheusSample;

constexpr char kHold[] = "/v1/kv_transfer/hold";

// The agent process's instance id (its /health), which a signed control
// request to it names.
std::string instanceOf(const Agent& agent) {
  auto res = agent.client()->Get("/health");
  if (!res) return "";
  return json::parse(res->body).value("instance_id", "");
}

json hold(const Agent& agent, const std::vector<int>& prompt, int* status) {
  return agent.post(kHold, {{"token_ids", prompt}}, status);
}

// The error's message contains `text` and its param is `param` (empty: null).
void expectError(const json& error, const std::string& text, const std::string& param) {
  ASSERT_TRUE(error.contains("error")) << error.dump();
  EXPECT_NE(error["error"]["message"].get<std::string>().find(text), std::string::npos)
      << error.dump();
  EXPECT_EQ(error["error"]["param"], param.empty() ? json(nullptr) : json(param)) << error.dump();
}

TEST(KvTransferAuth, HoldNeedsASignatureWhenTheAgentHasASecretAndPinsNothingWithout) {
  Agent lender({"--kv-transfer-config", ucxConfig("kv_both", {{"secret", "alpha"}})});
  const std::vector<int> prompt = randomPrompt(70, 71);  // 4 full blocks cached
  lender.post("/v1/completions", greedy(prompt, 1));
  const double free_before = lender.metric("tandem_kv_cache_free_blocks");
  auto refused = [&](const json& body, const std::string& text, const std::string& param) {
    int status = 0;
    json error = lender.post(kHold, body, &status);
    EXPECT_EQ(status, 403) << error.dump();
    expectError(error, text, param);
  };
  const json plain = {{"token_ids", prompt}};
  const std::string lender_id = instanceOf(lender);
  refused(plain, "kv_auth must be an object with timestamp, nonce and signature", "kv_auth");
  json wrong = plain;
  kv_auth::signRequest(wrong, lender_id, kHold, "beta");
  refused(wrong, "kv_auth.signature does not match", "kv_auth.signature");
  json altered = plain;
  kv_auth::signRequest(altered, lender_id, kHold, "alpha");
  altered["token_ids"][0] = 5;
  refused(altered, "kv_auth.signature does not match", "kv_auth.signature");
  json stale = plain;
  kv_auth::signRequest(stale, lender_id, kHold, "alpha", kv_auth::unixSeconds() - 600,
                       kv_auth::randomNonce());
  refused(stale, "s from this agent's clock", "kv_auth.timestamp");
  EXPECT_EQ(lender.metric("tandem_kv_transfer_failures_total", "reason=\"auth\""), 4);
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), 0);
  EXPECT_EQ(lender.metric("tandem_kv_cache_free_blocks"), free_before) << "nothing was pinned";

  json good = plain;
  kv_auth::signRequest(good, lender_id, kHold, "alpha");
  int status = 0;
  json lent = lender.post(kHold, good, &status);
  ASSERT_EQ(status, 200) << lent.dump();
  EXPECT_EQ(lent["num_tokens"], 64);
  refused(good, "kv_auth.nonce was used before", "kv_auth.nonce");  // a replay
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), 4);
  EXPECT_EQ(releaseOn(lender, lent["kv_transfer_params"])["released"], true);

  // Without a secret nothing is signed and holds are served as before.
  Agent open_lender({"--kv-transfer-config", ucxConfig("kv_both")});
  open_lender.post("/v1/completions", greedy(prompt, 1));
  lent = hold(open_lender, prompt, &status);
  ASSERT_EQ(status, 200) << lent.dump();
  EXPECT_EQ(releaseOn(open_lender, lent["kv_transfer_params"])["released"], true);
}

// A KV secret at a multi connector's top level secures its ucx member too:
// an unsigned handshake learns nothing (403) and a signed one is answered.
// Before, the member ran without the secret while the agent's control
// routes asked for signatures: a handshake gave anyone the memory key.
TEST(KvTransferAuth, AMultiConnectorsSecretSecuresItsUcxMember) {
  const json multi = {{"kv_connector", "multi"},
                      {"kv_role", "kv_both"},
                      {"kv_connector_extra_config",
                       {{"secret", "alpha"}, {"connectors", {{{"kv_connector", "ucx"}}}}}}};
  Agent agent({"--kv-transfer-config", multi.dump()});
  const std::string nonce = kv_auth::randomNonce();
  int status = 0;
  json answer = agent.post("/v1/kv_transfer/handshake", {{"nonce", nonce}}, &status);
  EXPECT_EQ(status, 403) << answer.dump();
  EXPECT_FALSE(answer.contains("remote_slab")) << answer.dump();
  const json signed_handshake = {
      {"nonce", nonce},
      {"signature", ::tandem::hmacSha256Hex("alpha", "tandem-kv-handshake-request/1\n" + nonce)}};
  answer = agent.post("/v1/kv_transfer/handshake", signed_handshake, &status);
  EXPECT_EQ(status, 200) << answer.dump();
}

// The KV routes skip the API key because the KV secret signs them: an agent
// with a key and a KV connector without a secret says at start that they
// are open; with a secret, or without a key, it says nothing.
TEST(KvTransferAuth, AnApiKeyWithoutAKvSecretIsWarnedOf) {
  const std::string warning = "the agent has an API key but its KV connector no shared secret";
  Agent open_kv({"--api-key", "sk-1", "--kv-transfer-config", ucxConfig("kv_both")});
  EXPECT_NE(open_kv.stderrText().find(warning), std::string::npos) << open_kv.stderrText();
  int status = 0;
  open_kv.post("/v1/kv_transfer/hold", {{"token_ids", randomPrompt(20, 73)}}, &status);
  EXPECT_EQ(status, 404) << "the hold is served without the key (nothing cached to hold)";
  Agent signed_kv(
      {"--api-key", "sk-1", "--kv-transfer-config", ucxConfig("kv_both", {{"secret", "alpha"}})});
  EXPECT_EQ(signed_kv.stderrText().find(warning), std::string::npos) << signed_kv.stderrText();
  Agent keyless({"--kv-transfer-config", ucxConfig("kv_both")});
  EXPECT_EQ(keyless.stderrText().find(warning), std::string::npos) << keyless.stderrText();
}

// A signed control request names the agent process it is for (its
// /health instance_id): a drain signed for one agent, sent to another that
// shares the secret, is refused naming kv_auth.agent and drains nothing;
// the agent it names takes it. Before, one captured drain drained every
// agent of the pool (and a restarted one again) within its 120 s.
TEST(KvTransferAuth, ASignedRequestIsAcceptedOnlyByTheAgentItNames) {
  const std::string config = ucxConfig("kv_both", {{"secret", "alpha"}});
  Agent named({"--kv-transfer-config", config});
  Agent other({"--kv-transfer-config", config});
  const std::string named_id = instanceOf(named);
  ASSERT_TRUE(kv_auth::isNonce(named_id)) << named_id;
  EXPECT_NE(instanceOf(other), named_id);
  json drain = json::object();
  kv_auth::signRequest(drain, named_id, "/admin/drain", "alpha");
  int status = 0;
  json answer = other.post("/admin/drain", drain, &status);
  EXPECT_EQ(status, 403) << answer.dump();
  expectError(answer, "kv_auth.agent names another agent", "kv_auth.agent");
  auto health = other.client()->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << "the other agent is not draining: " << health->body;
  named.process();  // it drains and exits
  answer = named.post("/admin/drain", drain, &status);
  EXPECT_EQ(status, 202) << answer.dump();
}

// A router's late ask for a stream's hand-over (POST /admin/hand_over) is
// signed as /admin/drain is when the agent has a KV secret; its request_id
// must be a string of 1 to 512 characters, and an error names it. An id the
// agent does not run is accepted and changes nothing.
TEST(KvTransferAuth, AHandOverAskIsSignedAndNamesItsField) {
  constexpr char kHandOver[] = "/admin/hand_over";
  Agent agent({"--kv-transfer-config", ucxConfig("kv_both", {{"secret", "alpha"}})});
  int status = 0;
  json answer = agent.post(kHandOver, {{"request_id", "nobody"}}, &status);
  EXPECT_EQ(status, 403) << answer.dump();
  expectError(answer, "kv_auth must be an object with timestamp, nonce and signature", "kv_auth");
  const std::string id = instanceOf(agent);
  json signed_ask = {{"request_id", "nobody"}};
  kv_auth::signRequest(signed_ask, id, kHandOver, "alpha");
  answer = agent.post(kHandOver, signed_ask, &status);
  EXPECT_EQ(status, 202) << answer.dump();
  EXPECT_EQ(answer, json({{"asked", true}}));
  json drain_signed = {{"request_id", "nobody"}};
  kv_auth::signRequest(drain_signed, id, "/admin/drain", "alpha");
  answer = agent.post(kHandOver, drain_signed, &status);
  EXPECT_EQ(status, 403) << "a signature for another path: " << answer.dump();

  Agent open({"--kv-transfer-config", ucxConfig("kv_both")});
  for (const json& body : {json::object(), json({{"request_id", 5}}), json({{"request_id", ""}}),
                           json({{"request_id", std::string(513, 'x')}})}) {
    SCOPED_TRACE(body.dump().substr(0, 40));
    answer = open.post(kHandOver, body, &status);
    EXPECT_EQ(status, 400) << answer.dump();
    expectError(answer, "request_id must be the id of a stream this agent runs", "request_id");
  }
  answer = open.post(kHandOver, {{"request_id", "nobody"}, {"hand_over", "no"}}, &status);
  EXPECT_EQ(status, 400) << answer.dump();
  expectError(answer, "hand_over must be true", "hand_over");
  answer = open.post(kHandOver, {{"request_id", "nobody"}, {"hand_over", false}}, &status);
  EXPECT_EQ(status, 202) << "a withdrawal: " << answer.dump();
  answer = open.post(kHandOver, {{"request_id", "nobody"}}, &status);
  EXPECT_EQ(status, 202) << answer.dump();
  const std::vector<int> prompt = randomPrompt(20, 72);
  EXPECT_EQ(tokenIds(open.post("/v1/completions", greedy(prompt, 4))).size(), 4u);
}

TEST(KvTransferHolds, HoldsAreBoundedCountEachBlockOnceAndNeverKeepACompletionWaiting) {
  // 32 blocks: a hold lends at most 8, all holds together at most 16.
  Agent lender({"--num-blocks", "32", "--kv-transfer-config", ucxConfig("kv_both")});
  auto cache = [&](const std::vector<int>& prompt) {
    lender.post("/v1/completions", greedy(prompt, 1));
  };
  int status = 0;
  const std::vector<int> longer = randomPrompt(170, 80);  // 10 full blocks
  cache(longer);
  json lent = hold(lender, longer, &status);
  ASSERT_EQ(status, 200) << lent.dump();
  EXPECT_EQ(lent["num_tokens"], 8 * 16) << "the leading 8 blocks only";
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), 8);
  EXPECT_EQ(releaseOn(lender, lent["kv_transfer_params"])["released"], true);

  // Two holds of one prefix (7 blocks) pin its blocks once.
  const std::vector<int> a = randomPrompt(113, 81), b = randomPrompt(113, 82),
                         c = randomPrompt(113, 83);
  cache(a);
  const json a1 = hold(lender, a, &status)["kv_transfer_params"];
  ASSERT_EQ(status, 200);
  const json a2 = hold(lender, a, &status)["kv_transfer_params"];
  ASSERT_EQ(status, 200);
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), 7);
  cache(b);
  const json b1 = hold(lender, b, &status)["kv_transfer_params"];
  ASSERT_EQ(status, 200);
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), 14);
  // A third prefix would take the holds past 16 blocks: refused, naming the bound.
  cache(c);
  json error = hold(lender, c, &status);
  EXPECT_EQ(status, 503) << error.dump();
  expectError(error,
              "pull-back holds already pin 14 KV blocks of this agent; this hold would pin 7 "
              "more, past --kv-hold-max-total-blocks 16",
              "");
  EXPECT_EQ(lender.metric("tandem_kv_held_blocks"), 14);

  // A completion needing 17 of the 18 blocks the holds leave is answered
  // now, not when the holds time out (120 s).
  auto client = lender.client();
  client->set_read_timeout(30, 0);
  auto answered =
      client->Post("/v1/completions", greedy(randomPrompt(250, 84), 8).dump(), "application/json");
  ASSERT_TRUE(answered) << "no answer while holds pin blocks";
  EXPECT_EQ(answered->status, 200) << answered->body;
  for (const json& params : {a1, a2, b1}) {
    EXPECT_EQ(releaseOn(lender, params)["released"], true);
  }
  EXPECT_TRUE(eventually([&] { return lender.metric("tandem_kv_held_blocks") == 0; }));
}

TEST(KvTransferStart, ConsumerOnANonLoopbackAddressNeedsASecret) {
  TempDir logs("tandem-kv-consumer");
  auto start = [&](std::vector<std::string> extra) {
    return startOnAllAddresses(logs.path(), ucxConfig("kv_consumer"), extra);
  };
  auto refused = start({});
  EXPECT_EQ(refused->wait(std::chrono::seconds(30)), 1);
  EXPECT_NE(refused->stderrText().find(
                "a KV consumer listening on 0.0.0.0 lets any client make it connect to any host "
                "and port: set a shared secret (kv_connector_extra_config.secret or "
                "TANDEM_KV_SECRET), or pass --insecure-kv"),
            std::string::npos)
      << refused->stderrText();
  auto insecure = start({"--insecure-kv"});
  EXPECT_FALSE(insecure->waitForLine("listening on ", std::chrono::seconds(60)).empty())
      << insecure->stderrText();
  ::setenv("TANDEM_KV_SECRET", "gamma", 1);
  auto secured = start({});
  ::unsetenv("TANDEM_KV_SECRET");
  EXPECT_FALSE(secured->waitForLine("listening on ", std::chrono::seconds(60)).empty())
      << secured->stderrText();
}

TEST(KvTransferParams, RemoteHostIsAHostWithoutAPort) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  const std::vector<int> prompt = randomPrompt(75, 85);
  const json params = prefillOn(prefiller, prompt);
  const std::string port = std::to_string(prefiller.port());
  for (const std::string& bad :
       {"127.0.0.1:" + port, std::string("localhost:80"), std::string(""), std::string("a b"),
        std::string("host/path"), std::string("user@127.0.0.1"), std::string("host\n"),
        std::string("[::1]:80"), std::string("[::1"), std::string("1:2")}) {
    SCOPED_TRACE(json(bad).dump());
    json forged = params;
    forged["remote_host"] = bad;
    int status = 0;
    json error = decodeOn(decoder, prompt, forged, 8, &status);
    EXPECT_EQ(status, 400) << error.dump();
    expectError(error,
                "kv_transfer_params.remote_host must be a host name or IP address without a port "
                "(a host name or IPv4 address: letters, digits, '.', '-', '_'; an IPv6 address, "
                "bare or in brackets)",
                "kv_transfer_params.remote_host");
  }
  // IPv6 addresses are hosts, bare or in brackets: accepted (the producer
  // does not listen there, so the prompt is recomputed).
  for (const char* ipv6 : {"::1", "[::1]"}) {
    json moved = params;
    moved["remote_host"] = ipv6;
    int status = 0;
    json answer = decodeOn(decoder, prompt, moved, 4, &status);
    EXPECT_EQ(status, 200) << ipv6 << ": " << answer.dump();
  }
  EXPECT_EQ(releaseOn(prefiller, params)["released"], true);
}

TEST(KvTransferParams, ReleaseErrorsNameTheOffendingField) {
  const json secret = {{"secret", "alpha"}};
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", secret)});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", secret)});
  const std::vector<int> prompt = randomPrompt(75, 86);
  const json params = prefillOn(prefiller, prompt);
  auto release = [&](const json& body, int expected, const std::string& text,
                     const std::string& param) {
    int status = 0;
    json error = prefiller.post("/v1/kv_transfer/release", body, &status);
    EXPECT_EQ(status, expected) << error.dump();
    expectError(error, text, param);
  };
  json bad_id = params;
  bad_id["transfer_id"] = 5;
  release({{"kv_transfer_params", bad_id}}, 400, "kv_transfer_params.transfer_id must be a string",
          "kv_transfer_params.transfer_id");
  json bad_port = params;
  bad_port["remote_port"] = 0;
  release({{"kv_transfer_params", bad_port}}, 400, "kv_transfer_params.remote_port must be",
          "kv_transfer_params.remote_port");
  json forged = params;
  forged["signature"] = std::string(64, '0');
  release({{"kv_transfer_params", forged}}, 403, "kv_transfer_params.signature does not match",
          "kv_transfer_params.signature");
  release({{"kv_transfer_params", 3}}, 400, "kv_transfer_params must be", "kv_transfer_params");
  // A completion's kv_transfer_params are named the same way.
  int status = 0;
  json error = decodeOn(decoder, prompt, bad_port, 8, &status);
  EXPECT_EQ(status, 400) << error.dump();
  expectError(error, "kv_transfer_params.remote_port must be", "kv_transfer_params.remote_port");

  EXPECT_EQ(releaseOn(prefiller, params)["released"], true);
  release({{"kv_transfer_params", params}}, 404, "no blocks are held for it",
          "kv_transfer_params.transfer_id");
}

TEST(KvTransferParams, BodiesNestedPastTheBoundAreRefused) {
  Agent lender({"--kv-transfer-config", ucxConfig("kv_both")});
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  const std::string nonce(32, 'a');
  for (const auto& [path, body] :
       {std::pair<std::string, std::string>{kHold, R"({"token_ids":[1,2],"x":)" + deep + "}"},
        {"/v1/kv_transfer/handshake", R"({"nonce":")" + nonce + R"(","x":)" + deep + "}"},
        {"/v1/kv_transfer/release", R"({"kv_transfer_params":{"x":)" + deep + "}}"}}) {
    SCOPED_TRACE(path);
    auto res = lender.client()->Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    EXPECT_NE(res->body.find("nests arrays and objects deeper than 128 levels"), std::string::npos)
        << res->body;
  }
}

// The router signs its pull-back holds with the agents' secret: a
// conversation's second turn reads the first from the decode agent.
class KvTransferRouter : public RouterCluster {};

TEST_F(KvTransferRouter, TheRouterSignsItsHoldsWithTheAgentsSecret) {
  RouterClusterOptions options;
  options.kv_config = ucxConfig("kv_both", {{"secret", "alpha"}});
  options.kv_secret = "alpha";
  // What the first turn's transfer took on a loaded machine must not price
  // the second turn's pull-back out.
  options.learn_costs = false;
  startCluster(options);
  auto post = [&](const json& body, std::string* decision) {
    auto res = client_->Post("/v1/completions", body.dump(), "application/json");
    if (!res) return json();
    *decision = res->get_header_value("x-tandem-decision");
    EXPECT_EQ(res->status, 200) << res->body;
    return json::parse(res->body, nullptr, false);
  };
  std::string decision;
  std::vector<int> conversation = randomPrompt(70, 87);
  const std::vector<int> reply = tokenIds(post(greedy(conversation, 70), &decision));
  ASSERT_EQ(decision, "disaggregated");
  conversation.insert(conversation.end(), reply.begin(), reply.end());
  const std::vector<int> question = randomPrompt(40, 88);
  conversation.insert(conversation.end(), question.begin(), question.end());
  ASSERT_TRUE(eventually([&] {
    return prometheusSample(routerMetrics(), "tandem_router_index_blocks", "agent=\"decode-0\"")
                   .value_or(0) >= 8 &&
           prometheusSample(routerMetrics(), "tandem_router_agent_requests", "agent=\"decode-0\"")
                   .value_or(1) == 0;
  }));
  Agent colocated;
  EXPECT_EQ(tokenIds(post(greedy(conversation, 8), &decision)),
            tokenIds(colocated.post("/v1/completions", greedy(conversation, 8))));
  EXPECT_EQ(decision, "pull_back");
  EXPECT_GE(prefill_[0]->metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4)
      << "the prefill agent read the blocks the decode agent lent on the signed hold";
  EXPECT_EQ(decode_[0]->metric("tandem_kv_transfer_failures_total", "reason=\"auth\""), 0);
  for (Agent* agent : agents()) {
    EXPECT_TRUE(eventually([&] { return agent->metric("tandem_kv_held_blocks") == 0; }));
  }
}

}  // namespace
