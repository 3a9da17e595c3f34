// The discovery documents of the test API server, built from the kinds it
// serves: /version, /api (APIVersions), /apis (APIGroupList) and the
// APIResourceList of each group-version (with status and scale
// subresources). Always the plain (unaggregated) form: kubectl asking for
// aggregated discovery falls back to these when the answer's Content-Type is
// plain application/json.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/apiserver/crd_info.h"

namespace tandem::testing {

nlohmann::json versionDocument();
nlohmann::json coreApiVersions();
nlohmann::json apiGroupList(const std::vector<KindInfo>& kinds);
// nullopt when no kind is served at `group`/`version` ("" group: core v1).
std::optional<nlohmann::json> apiResourceList(const std::vector<KindInfo>& kinds,
                                              const std::string& group, const std::string& version);
// One group (GET /apis/<group>), or nullopt when not served.
std::optional<nlohmann::json> apiGroup(const std::vector<KindInfo>& kinds,
                                       const std::string& group);

}  // namespace tandem::testing
