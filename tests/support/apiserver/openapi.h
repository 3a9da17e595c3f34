// The OpenAPI documents kubectl reads (/openapi/v2 as JSON, /openapi/v3 and
// /openapi/v3/<group-version>), built from the kinds the server knows, enough
// for kubectl apply/create/scale/patch/get and its field validation.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tests/support/apiserver/crd_info.h"

namespace tandem::testing {

struct HttpAnswer {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// The answer to GET `path` (without the query) when it is an OpenAPI path;
// std::nullopt otherwise. `accept` is the request's Accept header.
std::optional<HttpAnswer> openApiAnswer(const std::string& path, const std::string& accept,
                                        const std::vector<KindInfo>& kinds);

}  // namespace tandem::testing
