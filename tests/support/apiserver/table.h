// Server-side printing: the meta.k8s.io/v1 Table kubectl asks for (Accept:
// application/json;as=Table;v=v1;g=meta.k8s.io) from an object or a list,
// with a CRD's additionalPrinterColumns (JSONPath) or a built-in kind's
// usual columns; and the JSONPath subset printer columns use.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tests/support/apiserver/crd_info.h"

namespace tandem::testing {

// `object_or_list` is one object or a "...List" (anything with "items");
// `include_object` is the request's includeObject: "None" (rows' object is
// null), "Metadata" (the default: a PartialObjectMetadata) or "Object".
// Absent values are null cells; date columns hold the age ("5m") as of now.
nlohmann::json toTable(const nlohmann::json& object_or_list, const KindInfo& kind,
                       const std::string& include_object);

// ".spec.replicas", ".status.conditions[?(@.type==\"Ready\")].status",
// ".items[0].metadata.name", "{.metadata.labels['app.kubernetes.io/name']}": the
// value, or std::nullopt when absent or the path is not in the subset. A path
// that matches several values (".a[*].b") gives the first, as printer
// columns do.
std::optional<nlohmann::json> evalJsonPath(const nlohmann::json& object, const std::string& path);

// An age as the API server and kubectl print it: "45s", "5m3s", "3h", "2d4h", "3y".
std::string humanDuration(int64_t seconds);

}  // namespace tandem::testing
