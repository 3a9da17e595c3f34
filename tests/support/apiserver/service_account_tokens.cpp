#include "tests/support/apiserver/service_account_tokens.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

constexpr int64_t kDefaultExpirationSeconds = 3600;
constexpr int64_t kMinExpirationSeconds = 600;
constexpr int64_t kMaxExpirationSeconds = int64_t{1} << 32;
constexpr const char* kDefaultAudience = "https://kubernetes.default.svc.cluster.local";

std::string randomToken() {
  return "tandem-sa." +
         randomText("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", 48);
}

KindInfo tokenRequestKind() {
  KindInfo kind;
  kind.group = "authentication.k8s.io";
  kind.version = "v1";
  kind.kind = "TokenRequest";
  kind.plural = "tokenrequests";
  kind.builtin = true;
  return kind;
}

KindInfo serviceAccountKind() {
  KindInfo kind;
  kind.version = "v1";
  kind.kind = "ServiceAccount";
  kind.plural = "serviceaccounts";
  kind.builtin = true;
  return kind;
}

}  // namespace

std::string serviceAccountUserName(const std::string& ns, const std::string& name) {
  return "system:serviceaccount:" + ns + ":" + name;
}

ApiResult ServiceAccountTokens::createToken(const std::string& ns, const std::string& name,
                                            const std::string& content_type,
                                            const std::string& body) {
  Json spec = Json::object();
  if (content_type.find("json") != std::string::npos && !body.empty()) {
    try {
      Json request = Json::parse(body);
      if (request.contains("spec") && request["spec"].is_object()) spec = request["spec"];
    } catch (const std::exception& error) {
      return ApiResult::failure(
          badRequest(std::string("the request body is not valid JSON: ") + error.what()));
    }
  }
  int64_t expiration = kDefaultExpirationSeconds;
  if (spec.contains("expirationSeconds") && !spec["expirationSeconds"].is_null()) {
    if (!spec["expirationSeconds"].is_number_integer()) {
      return ApiResult::failure(invalid(tokenRequestKind(), name, "spec.expirationSeconds",
                                        "Invalid value: " + spec["expirationSeconds"].dump() +
                                            ": must be a whole number of seconds"));
    }
    expiration = spec["expirationSeconds"].get<int64_t>();
    if (expiration < kMinExpirationSeconds) {
      return ApiResult::failure(invalid(tokenRequestKind(), name, "spec.expirationSeconds",
                                        "Invalid value: " + std::to_string(expiration) +
                                            ": may not specify a duration less than 10 minutes"));
    }
    if (expiration > kMaxExpirationSeconds) {
      return ApiResult::failure(
          invalid(tokenRequestKind(), name, "spec.expirationSeconds",
                  "Invalid value: " + std::to_string(expiration) +
                      ": may not specify a duration larger than 2^32 seconds"));
    }
  }
  Json audiences = spec.value("audiences", Json::array());
  if (!audiences.is_array() || audiences.empty()) audiences = Json::array({kDefaultAudience});

  std::optional<Json> account = store_.get("/serviceaccounts", ns, name);
  if (!account) return ApiResult::failure(notFound(serviceAccountKind(), name));
  const auto now = std::chrono::system_clock::now();
  Grant grant{ns, name, (*account)["metadata"].value("uid", ""),
              now + std::chrono::seconds(expiration)};
  const std::string token = randomToken();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    grants_[token] = grant;
  }
  Json answer = {
      {"kind", "TokenRequest"},
      {"apiVersion", "authentication.k8s.io/v1"},
      {"metadata", {{"name", name}, {"namespace", ns}, {"creationTimestamp", timestampOf(now)}}},
      {"spec",
       {{"audiences", audiences}, {"expirationSeconds", expiration}, {"boundObjectRef", nullptr}}},
      {"status", {{"token", token}, {"expirationTimestamp", timestampOf(grant.expires)}}}};
  return ApiResult{201, answer, std::nullopt, {}};
}

bool ServiceAccountTokens::issued(const std::string& token) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return grants_.count(token) > 0;
}

std::optional<UserInfo> ServiceAccountTokens::authenticate(const std::string& token) const {
  Grant grant;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = grants_.find(token);
    if (it == grants_.end()) return std::nullopt;
    grant = it->second;
  }
  if (std::chrono::system_clock::now() >= grant.expires) return std::nullopt;
  std::optional<Json> account = store_.get("/serviceaccounts", grant.ns, grant.name);
  if (!account || (*account)["metadata"].value("uid", "") != grant.uid) return std::nullopt;
  UserInfo user;
  user.name = serviceAccountUserName(grant.ns, grant.name);
  user.groups = {"system:serviceaccounts", "system:serviceaccounts:" + grant.ns,
                 "system:authenticated"};
  user.superuser = false;
  user.token = token;
  return user;
}

}  // namespace tandem::testing
