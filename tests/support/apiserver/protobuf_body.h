// Kubernetes protobuf request bodies (Content-Type
// application/vnd.kubernetes.protobuf), as client-go's typed clients send
// them: helm's release Secrets and their DeleteOptions, kubectl's typed
// `create namespace|secret|configmap|serviceaccount`. A body is the 4-byte
// magic "k8s\0" and a runtime.Unknown message (typeMeta, raw, contentEncoding,
// contentType) whose `raw` holds the object's own message.
//
// decodeProtobufBody turns such a body into the JSON object a JSON client
// would have sent for the same Go object (empty strings and zero numbers
// left out, bytes as base64, apiVersion and kind from the envelope), for the
// kinds v1 Secret, ConfigMap, Namespace, ServiceAccount and (any group
// version's) DeleteOptions. Fields the stand-in does not keep (selfLink,
// timestamps, managedFields, statuses' conditions) and unknown field numbers
// are skipped. Pure function; safe from any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "tests/support/apiserver/api_status.h"

namespace tandem::testing {

struct ProtobufBody {
  nlohmann::json object;  // the decoded object, when `error` is empty
  // 400 BadRequest for a malformed body (the message says what is wrong and
  // at which byte); 415 UnsupportedMediaType for a kind not decoded here or
  // an encoded `raw` (the message names it and says JSON is accepted).
  std::optional<ApiError> error;
  bool ok() const { return !error.has_value(); }
};

ProtobufBody decodeProtobufBody(std::string_view body);

}  // namespace tandem::testing
