// YAML documents (as kubectl apply and server-side apply send them, and as
// CRD files hold them) turned into JSON values: plain scalars become
// integers, numbers, booleans or null when they read as such, quoted ones
// stay strings. JSON text is YAML too. Errors throw std::runtime_error with
// yaml-cpp's message (line and column).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::testing {

nlohmann::json yamlToJson(const std::string& text);
// Every non-empty document of a multi-document stream.
std::vector<nlohmann::json> yamlDocumentsToJson(const std::string& text);

// Standard base64 (with padding), for kubeconfig data and continue tokens.
std::string base64Encode(const std::string& bytes);
// std::string() with `ok` false when `text` is not base64.
std::string base64Decode(const std::string& text, bool& ok);

}  // namespace tandem::testing
