// Signed control requests to an agent's /v1/kv_transfer/* endpoints: the
// router (or a peer) that shares the agents' KV secret signs the JSON body
// it posts; the agent checks the signature before acting on it. Used by the
// agent (tandem_kv) and the router (tandem_router), hence here.
//
// A signed body carries one more member, "kv_auth":
//   {"agent": "<the agent's instance id>", "timestamp": <Unix seconds>,
//    "nonce": "<16 to 128 hex characters>",
//    "signature": "<HMAC-SHA256, lower-case hex>"}
// and the signature covers the agent process it is for (its instance id,
// which its GET /health gives), the endpoint's path, the timestamp, the
// nonce and the rest of the body as compact JSON with sorted keys
// (nlohmann's dump of the parsed value, which both sides compute the same
// way):
//   "tandem-kv-request/2\n<agent>\n<path>\n<timestamp>\n<nonce>\n<body without kv_auth>"
// A request is accepted by the agent process it names, within
// kMaxClockSkewSeconds of its clock, and only once: the verifier remembers
// the nonces it accepted until their timestamps leave the window, so a
// captured request cannot be replayed, to it or to another agent sharing
// the secret (nor to it once restarted: a new process has a new id).
//
// Thread-safety: the free functions are; RequestVerifier is (one mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/status.h"

namespace tandem::kv_auth {

// The body member that carries the signature.
inline constexpr char kAuthField[] = "kv_auth";
// How far a request's timestamp may be from the agent's clock, either way.
inline constexpr int64_t kMaxClockSkewSeconds = 120;
// Accepted nonces remembered at once (each as a 16-byte digest, forgotten
// when its timestamp leaves the window): about 4,400 signed requests a
// second sustained; past this, requests are refused until the oldest leave
// the window.
inline constexpr size_t kMaxRememberedNonces = 1 << 20;

// This process's instance id: 32 random hex characters made at first use.
// An agent accepts only the signed requests that name it.
const std::string& instanceId();

// The signed text of a request for the agent process `agent` to `path`
// (e.g. "/v1/kv_transfer/hold") whose body, without kv_auth, is `body`.
std::string requestCanonical(std::string_view agent, std::string_view path, int64_t timestamp,
                             std::string_view nonce, const nlohmann::json& body);

// Adds kv_auth to `body` (an object): for the agent whose instance id is
// `agent`, signed with `secret` at `timestamp` with `nonce`. Deterministic;
// the overload below uses the clock and a random nonce.
void signRequest(nlohmann::json& body, std::string_view agent, std::string_view path,
                 std::string_view secret, int64_t timestamp, std::string_view nonce);
void signRequest(nlohmann::json& body, std::string_view agent, std::string_view path,
                 std::string_view secret);

// Seconds since the Unix epoch (the timestamps' clock).
int64_t unixSeconds();
// Nonces (here and in the KV handshake): 32 random hex characters are made;
// 16 to 128 hex characters are accepted.
inline constexpr size_t kMinNonceChars = 16;
inline constexpr size_t kMaxNonceChars = 128;
std::string randomNonce();
bool isNonce(std::string_view text);
// A shared secret for a cluster that has none of its own: 64 random hex
// characters (256 bits).
std::string randomSecret();

// Checks signed requests with one secret (non-empty).
class RequestVerifier {
 public:
  // Accepts requests for the agent whose instance id is `agent` (this
  // process's: instanceId()). `clock` gives Unix seconds (tests inject one);
  // empty: unixSeconds.
  RequestVerifier(std::string secret, std::string agent, std::function<int64_t()> clock = {});

  // OK when `body` carries a kv_auth for this agent signed with the secret
  // over `path` and the rest of the body, its timestamp is within
  // kMaxClockSkewSeconds and its nonce was not accepted before. Otherwise PermissionDenied whose
  // message begins with the offending field ("kv_auth.signature is
  // missing: ..."), or Unavailable when too many nonces are remembered.
  Status verify(std::string_view path, const nlohmann::json& body);

 private:
  // An accepted nonce's xxh3-128 digest (the nonces come from callers that
  // proved they hold the secret, so collisions are chance alone).
  struct NonceDigest {
    uint64_t low = 0;
    uint64_t high = 0;
    bool operator==(const NonceDigest&) const = default;
  };
  struct DigestHash {
    size_t operator()(const NonceDigest& d) const { return static_cast<size_t>(d.low); }
  };

  std::string secret_;
  std::string agent_;
  std::function<int64_t()> clock_;
  std::mutex mutex_;
  std::unordered_set<NonceDigest, DigestHash> seen_;
  // The same nonces by their requests' timestamps: those leaving the window
  // are forgotten without looking at the rest.
  std::map<int64_t, std::vector<NonceDigest>> by_timestamp_;
};

}  // namespace tandem::kv_auth
