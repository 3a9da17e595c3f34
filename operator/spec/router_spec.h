// Reading a Router document's spec, internal to tandem_spec: cluster_spec.cpp
// parses the document's apiVersion, kind and metadata and hands the spec here.
// Throws tandem::Error naming the field, as every reader in spec_reader.h does.
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>

#include "operator/spec/cluster_spec.h"
#include "operator/spec/spec_reader.h"

namespace tandem::spec {

// A Router's spec (absent: every field default). Its name is context.name.
// Whether prefill/decode agent lists are allowed is the caller's to check.
RouterSpec readRouter(const std::optional<YAML::Node>& node, const DocumentContext& context);

}  // namespace tandem::spec
