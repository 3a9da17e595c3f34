// What the API server does with a CustomResourceDefinition's structural
// schema (openAPIV3Schema) on every write of a custom object: fill in
// `default` values, find (and prune) fields the schema does not know, and
// validate types, required fields, bounds, lengths, enums and patterns. The root's
// apiVersion, kind and metadata are always known and never validated here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace tandem::testing {

// Sets absent properties that have a `default`, at every level whose parent exists.
void applySchemaDefaults(nlohmann::json& object, const nlohmann::json& schema);

// Paths ("spec.foo", "spec.items[0].bar") of fields the schema does not
// declare (x-kubernetes-preserve-unknown-fields allows anything below it).
// With `prune`, they are also removed from `object`.
std::vector<std::string> unknownSchemaFields(nlohmann::json& object, const nlohmann::json& schema,
                                             bool prune);

// (field, detail) pairs, worded as the real server words them, e.g.
// ("spec.replicas", "Invalid value: -1: spec.replicas in body should be greater than or equal to
// 0").
std::vector<std::pair<std::string, std::string>> validateAgainstSchema(
    const nlohmann::json& object, const nlohmann::json& schema);

// The `pattern`s of a CRD's schema that are not regular expressions, as
// (field under `path`, detail): the server refuses such a CRD.
std::vector<std::pair<std::string, std::string>> invalidSchemaPatterns(const nlohmann::json& schema,
                                                                       const std::string& path);

}  // namespace tandem::testing
