#include "common/kv_auth.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>

#include "common/hmac.h"

namespace tandem::kv_auth {
namespace {

using nlohmann::json;

Status denied(const std::string& message) { return permissionDenied(message); }

}  // namespace

const std::string& instanceId() {
  static const std::string id = randomNonce();
  return id;
}

std::string requestCanonical(std::string_view agent, std::string_view path, int64_t timestamp,
                             std::string_view nonce, const json& body) {
  json rest = body;
  if (rest.is_object()) rest.erase(kAuthField);
  return "tandem-kv-request/2\n" + std::string(agent) + "\n" + std::string(path) + "\n" +
         std::to_string(timestamp) + "\n" + std::string(nonce) + "\n" +
         rest.dump(-1, ' ', false, json::error_handler_t::replace);
}

void signRequest(json& body, std::string_view agent, std::string_view path, std::string_view secret,
                 int64_t timestamp, std::string_view nonce) {
  const std::string signature =
      hmacSha256Hex(secret, requestCanonical(agent, path, timestamp, nonce, body));
  body[kAuthField] = {{"agent", std::string(agent)},
                      {"timestamp", timestamp},
                      {"nonce", std::string(nonce)},
                      {"signature", signature}};
}

void signRequest(json& body, std::string_view agent, std::string_view path,
                 std::string_view secret) {
  signRequest(body, agent, path, secret, unixSeconds(), randomNonce());
}

int64_t unixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string randomNonce() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device random;
  std::string nonce;
  for (int i = 0; i < 4; ++i) {
    uint32_t word = random();
    for (int j = 0; j < 8; ++j, word >>= 4) nonce.push_back(kHex[word & 15]);
  }
  return nonce;
}

std::string randomSecret() { return randomNonce() + randomNonce(); }

bool isNonce(std::string_view text) {
  return text.size() >= kMinNonceChars && text.size() <= kMaxNonceChars &&
         std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

RequestVerifier::RequestVerifier(std::string secret, std::string agent,
                                 std::function<int64_t()> clock)
    : secret_(std::move(secret)),
      agent_(std::move(agent)),
      clock_(clock ? std::move(clock) : unixSeconds) {}

Status RequestVerifier::verify(std::string_view path, const json& body) {
  const std::string field = kAuthField;
  const std::string why =
      ": this agent accepts KV control requests only when they are signed with its shared KV "
      "secret (docs/kv-transfer.md, \"Signed control requests\")";
  auto auth = body.is_object() ? body.find(kAuthField) : body.end();
  if (!body.is_object() || auth == body.end() || !auth->is_object()) {
    return denied(field + " must be an object with timestamp, nonce and signature (" +
                  (auth == body.end() ? "the request is not signed"
                                      : std::string("got ") + auth->type_name()) +
                  ")" + why);
  }
  auto timestamp = auth->find("timestamp");
  if (timestamp == auth->end() || !timestamp->is_number_integer()) {
    return denied(field + ".timestamp must be an integer number of Unix seconds" + why);
  }
  auto nonce = auth->find("nonce");
  if (nonce == auth->end() || !nonce->is_string() ||
      !isNonce(nonce->get_ref<const std::string&>())) {
    return denied(field + ".nonce must be a string of " + std::to_string(kMinNonceChars) + " to " +
                  std::to_string(kMaxNonceChars) + " hex characters" + why);
  }
  auto signature = auth->find("signature");
  if (signature == auth->end() || !signature->is_string()) {
    return denied(field + ".signature is missing" + why);
  }
  auto agent = auth->find("agent");
  if (agent == auth->end() || !agent->is_string() ||
      agent->get_ref<const std::string&>() != agent_) {
    return denied(field + ".agent " +
                  (agent == auth->end() ? "is missing" : "names another agent") +
                  ": this agent's instance id is " + agent_ +
                  " (its GET /health gives it as instance_id); a signed request is for one "
                  "agent process, and one for another agent, or for an earlier run of this one, "
                  "is refused");
  }
  // The window first: it is checked on the value sent (a timestamp past
  // int64 is outside it), and says more than a signature that, over such a
  // timestamp, could not match anyway.
  const bool beyond =
      timestamp->is_number_unsigned() &&
      timestamp->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const int64_t when = beyond ? std::numeric_limits<int64_t>::max() : timestamp->get<int64_t>();
  const int64_t now = clock_();
  if (beyond || when < now - kMaxClockSkewSeconds || when > now + kMaxClockSkewSeconds) {
    return denied(field + ".timestamp " + timestamp->dump() + " is more than " +
                  std::to_string(kMaxClockSkewSeconds) + " s from this agent's clock (" +
                  std::to_string(now) + "): a request is accepted only within that window");
  }
  const std::string& nonce_text = nonce->get_ref<const std::string&>();
  if (!constantTimeEquals(
          signature->get_ref<const std::string&>(),
          hmacSha256Hex(secret_, requestCanonical(agent_, path, when, nonce_text, body)))) {
    return denied(field +
                  ".signature does not match: the request was not signed with this agent's KV "
                  "secret, or was altered");
  }
  const XXH128_hash_t hash = XXH3_128bits(nonce_text.data(), nonce_text.size());
  const NonceDigest digest{hash.low64, hash.high64};
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = by_timestamp_.begin();
       it != by_timestamp_.end() && it->first < now - kMaxClockSkewSeconds;
       it = by_timestamp_.erase(it)) {
    for (const NonceDigest& old : it->second) seen_.erase(old);
  }
  if (seen_.count(digest) != 0) {
    return denied(field + ".nonce was used before: a signed request is accepted once");
  }
  if (seen_.size() >= kMaxRememberedNonces) {
    return unavailable("more than " + std::to_string(kMaxRememberedNonces) +
                       " signed KV control requests within " +
                       std::to_string(2 * kMaxClockSkewSeconds) + " s; retry later");
  }
  seen_.insert(digest);
  by_timestamp_[when].push_back(digest);
  return Status::ok();
}

}  // namespace tandem::kv_auth
