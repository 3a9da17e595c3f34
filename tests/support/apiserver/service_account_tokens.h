// Service-account tokens of the test API server, issued as the real API
// issues bound tokens: POST /api/v1/namespaces/NS/serviceaccounts/NAME/token
// (a TokenRequest, authentication.k8s.io/v1; what `kubectl create token`
// sends) answers 201 with a new opaque token, or 404 when the ServiceAccount
// does not exist. A request bearing the token is made by
// "system:serviceaccount:NS:NAME" in the groups system:serviceaccounts,
// system:serviceaccounts:NS and system:authenticated, until it expires
// (spec.expirationSeconds, default one hour, at least ten minutes) or its
// ServiceAccount is deleted (a new one of the same name does not revive it).
//
// The tokens are random strings, not signed JWTs; a protobuf TokenRequest
// body (kubectl sends one) is not decoded, so its spec gets the defaults.
// Thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/apiserver/object_service.h"
#include "tests/support/apiserver/store.h"
#include "tests/support/apiserver/user_info.h"

namespace tandem::testing {

// The user name of a ServiceAccount: "system:serviceaccount:NS:NAME".
std::string serviceAccountUserName(const std::string& ns, const std::string& name);

class ServiceAccountTokens {
 public:
  explicit ServiceAccountTokens(const Store& store) : store_(store) {}

  // Answers a TokenRequest for ServiceAccount `name` in `ns`; `content_type`
  // and `body` as sent (a JSON body's spec is honoured).
  ApiResult createToken(const std::string& ns, const std::string& name,
                        const std::string& content_type, const std::string& body);
  // Whether `token` was issued here (valid or not).
  bool issued(const std::string& token) const;
  // The service-account user of an issued token that is still valid.
  std::optional<UserInfo> authenticate(const std::string& token) const;

 private:
  struct Grant {
    std::string ns;
    std::string name;
    std::string uid;  // of the ServiceAccount the token is bound to
    std::chrono::system_clock::time_point expires;
  };

  const Store& store_;
  mutable std::mutex mutex_;
  std::map<std::string, Grant> grants_;  // by token
};

}  // namespace tandem::testing
