#include "common/kv_auth.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "common/hmac.h"

namespace tandem::kv_auth {
namespace {

using nlohmann::json;

constexpr char kPath[] = "/v1/kv_transfer/hold";
constexpr int64_t kNow = 1700000000;
constexpr char kAgent[] = "0123456789abcdef0123456789abcdef";

json holdBody() { return {{"token_ids", {1, 2, 3}}, {"cache_salt", "s"}}; }

RequestVerifier verifierAt(const int64_t& now) {
  return RequestVerifier("alpha", kAgent, [&now] { return now; });
}

TEST(KvAuth, SignsTheDocumentedText) {
  json body = holdBody();
  signRequest(body, kAgent, kPath, "alpha", kNow, std::string(32, 'a'));
  EXPECT_EQ(body["kv_auth"]["agent"], kAgent);
  EXPECT_EQ(body["kv_auth"]["timestamp"], kNow);
  EXPECT_EQ(body["kv_auth"]["nonce"], std::string(32, 'a'));
  EXPECT_EQ(
      body["kv_auth"]["signature"],
      hmacSha256Hex("alpha", std::string("tandem-kv-request/2\n") + kAgent +
                                 "\n/v1/kv_transfer/hold\n1700000000\n" + std::string(32, 'a') +
                                 "\n{\"cache_salt\":\"s\",\"token_ids\":[1,2,3]}"));
}

TEST(KvAuth, AcceptsASignedRequestOnceAfterTextRoundTrip) {
  int64_t now = kNow;
  RequestVerifier verifier = verifierAt(now);
  json body = holdBody();
  signRequest(body, kAgent, kPath, "alpha", kNow - 30, std::string(32, 'b'));
  // What the agent verifies is the parsed text the router sent.
  const json received = json::parse(body.dump());
  EXPECT_TRUE(verifier.verify(kPath, received).isOk());
  Status replay = verifier.verify(kPath, received);
  EXPECT_EQ(replay.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(replay.message(), "kv_auth.nonce was used before: a signed request is accepted once");
}

TEST(KvAuth, RefusesMissingWrongAlteredStaleOrMisdirectedRequests) {
  int64_t now = kNow;
  RequestVerifier verifier = verifierAt(now);
  auto refusal = [&](const json& body, const std::string& path = kPath) {
    Status status = verifier.verify(path, body);
    EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status.message();
    return status.message();
  };
  EXPECT_EQ(
      refusal(holdBody())
          .rfind("kv_auth must be an object with timestamp, nonce and signature (the request is "
                 "not signed): this agent accepts KV control requests only when they are signed",
                 0),
      0u);
  json signed_body = holdBody();
  signRequest(signed_body, kAgent, kPath, "beta", kNow, std::string(32, 'c'));
  EXPECT_EQ(refusal(signed_body).rfind("kv_auth.signature does not match", 0), 0u);
  signRequest(signed_body, kAgent, kPath, "alpha", kNow, std::string(32, 'c'));
  json altered = signed_body;
  altered["token_ids"][0] = 9;
  EXPECT_EQ(refusal(altered).rfind("kv_auth.signature does not match", 0), 0u);
  EXPECT_EQ(refusal(signed_body, "/v1/kv_transfer/release").rfind("kv_auth.signature", 0), 0u);
  json no_signature = signed_body;
  no_signature["kv_auth"].erase("signature");
  EXPECT_EQ(refusal(no_signature).rfind("kv_auth.signature is missing", 0), 0u);
  json bad_nonce = signed_body;
  bad_nonce["kv_auth"]["nonce"] = "xyz";
  EXPECT_EQ(refusal(bad_nonce).rfind("kv_auth.nonce must be a string of 16 to 128 hex", 0), 0u);
  json bad_time = signed_body;
  bad_time["kv_auth"]["timestamp"] = "now";
  EXPECT_EQ(refusal(bad_time).rfind("kv_auth.timestamp must be an integer", 0), 0u);
  json stale = holdBody();
  signRequest(stale, kAgent, kPath, "alpha", kNow - kMaxClockSkewSeconds - 1, std::string(32, 'd'));
  EXPECT_EQ(refusal(stale).rfind("kv_auth.timestamp 1699999879 is more than 120 s", 0), 0u);
  json future = holdBody();
  signRequest(future, kAgent, kPath, "alpha", kNow + kMaxClockSkewSeconds + 1,
              std::string(32, 'd'));
  EXPECT_EQ(refusal(future).rfind("kv_auth.timestamp", 0), 0u);
  // Timestamps past int64, or near its end: outside the window, quoted as
  // sent (the signature, over a value the verifier cannot hold, is not the
  // reason given).
  for (const char* text : {"18446744073709551615", "9223372036854775807", "9223372036854775687"}) {
    json huge = holdBody();
    signRequest(huge, kAgent, kPath, "alpha", kNow, std::string(32, 'e'));
    huge["kv_auth"]["timestamp"] = json::parse(text);
    EXPECT_EQ(
        refusal(huge).rfind(std::string("kv_auth.timestamp ") + text + " is more than 120 s", 0),
        0u)
        << text;
  }
  EXPECT_TRUE(verifier.verify(kPath, signed_body).isOk());
}

// A signed request names the agent process it is for: another agent that
// shares the secret (or the same one restarted, with a new instance id)
// refuses it, naming the field, before its nonce is remembered; one whose
// name was changed after signing does not match the signature.
TEST(KvAuth, ARequestSignedForOneAgentIsRefusedByAnother) {
  int64_t now = kNow;
  RequestVerifier other("alpha", "fedcba9876543210fedcba9876543210", [&now] { return now; });
  RequestVerifier mine = verifierAt(now);
  json body = holdBody();
  signRequest(body, kAgent, kPath, "alpha", kNow, std::string(32, 'f'));
  const Status refused = other.verify(kPath, body);
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message().rfind(
                "kv_auth.agent names another agent: this agent's instance id is "
                "fedcba9876543210fedcba9876543210 (its GET /health gives it as instance_id)",
                0),
            0u)
      << refused.message();
  json renamed = body;
  renamed["kv_auth"]["agent"] = "fedcba9876543210fedcba9876543210";
  EXPECT_EQ(other.verify(kPath, renamed).message().rfind("kv_auth.signature does not match", 0),
            0u);
  json unnamed = body;
  unnamed["kv_auth"].erase("agent");
  EXPECT_EQ(mine.verify(kPath, unnamed).message().rfind("kv_auth.agent is missing", 0), 0u);
  EXPECT_TRUE(mine.verify(kPath, body).isOk());
  EXPECT_EQ(instanceId(), instanceId());
  EXPECT_TRUE(isNonce(instanceId()));
}

TEST(KvAuth, ForgetsNoncesOnlyOnceTheirTimestampLeftTheWindow) {
  int64_t now = kNow;
  RequestVerifier verifier = verifierAt(now);
  json body = holdBody();
  signRequest(body, kAgent, kPath, "alpha", kNow, std::string(32, 'e'));
  ASSERT_TRUE(verifier.verify(kPath, body).isOk());
  now = kNow + kMaxClockSkewSeconds;
  EXPECT_FALSE(verifier.verify(kPath, body).isOk()) << "still inside the window: remembered";
  now = kNow + kMaxClockSkewSeconds + 1;
  EXPECT_FALSE(verifier.verify(kPath, body).isOk()) << "outside the window: stale";
}

// A busy lender: 100,000 signed holds within one window are all accepted
// (65,536 were the bound before: about 270 a second; 503s past it) and
// each is still refused a second time; once their timestamps have left the
// window they are forgotten, the earliest first, and new ones are accepted.
TEST(KvAuth, RemembersManyNoncesWithinTheWindowAndForgetsThemByTimestamp) {
  int64_t now = kNow;
  RequestVerifier verifier = verifierAt(now);
  const json plain = holdBody();
  auto signedAt = [&](int64_t timestamp, int i) {
    json body = plain;
    char nonce[33];
    std::snprintf(nonce, sizeof nonce, "%032x", i);
    signRequest(body, kAgent, kPath, "alpha", timestamp, nonce);
    return body;
  };
  constexpr int kCount = 100000;
  for (int i = 0; i < kCount; ++i) {
    // Timestamps across the window, out of order.
    const int64_t timestamp = kNow - kMaxClockSkewSeconds + (i * 7919) % (2 * kMaxClockSkewSeconds);
    const Status status = verifier.verify(kPath, signedAt(timestamp, i));
    ASSERT_TRUE(status.isOk()) << i << ": " << status.message();
  }
  EXPECT_FALSE(verifier.verify(kPath, signedAt(kNow, 0)).isOk()) << "remembered";
  // Past the window of the earliest timestamps: those are stale anyway, and
  // a new request is accepted.
  now = kNow + 2 * kMaxClockSkewSeconds;
  EXPECT_TRUE(verifier.verify(kPath, signedAt(now, kCount)).isOk());
  const Status again = verifier.verify(kPath, signedAt(now - kMaxClockSkewSeconds, 1));
  EXPECT_EQ(again.isOk(), true) << "nonce 1's first use had left the window: " << again.message();
}

TEST(KvAuth, RandomNoncesAreAcceptedHex) {
  const std::string a = randomNonce(), b = randomNonce();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  int64_t now = unixSeconds();
  RequestVerifier verifier = verifierAt(now);
  json body = holdBody();
  signRequest(body, kAgent, kPath, "alpha");
  EXPECT_TRUE(verifier.verify(kPath, body).isOk());
}

}  // namespace
}  // namespace tandem::kv_auth
