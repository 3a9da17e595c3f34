// Who made a request to the test API server, as its authentication decided:
// the user name and groups RBAC matches subjects against, and whether RBAC
// is consulted for it at all.
//
// Superusers (never checked): every user that is not a service account, that
// is a plain bearer token (the token is the user name, as writeKubeconfig
// writes it), a client certificate's CN, or "anonymous" where no credentials
// are required. Service-account users come from tokens the server issued
// (TokenRequest) and are checked when RBAC is on.
#pragma once

#include <string>
#include <vector>

namespace tandem::testing {

struct UserInfo {
  std::string name;
  std::vector<std::string> groups;
  bool superuser = true;
  std::string token;  // the bearer token presented ("" for certificates and anonymous)
};

}  // namespace tandem::testing
