// Whether a live object already has everything the controller wants of it.
//
// The API server adds defaults (a probe's timeoutSeconds, a container's
// terminationMessagePath, a Service's clusterIPs) and metadata of its own, so
// "equal" means: every field of the desired object is present in the live
// one with the same value. Objects compare key by key (extra live keys are
// fine), lists element by element with equal lengths, and a desired number
// equals a live string that spells it (the API writes quantities as
// strings: `nvidia.com/gpu: 1` comes back as "1"). Under `resources.limits`
// and `resources.requests`, and an emptyDir's `sizeLimit`, quantities
// compare by value, since the API server stores them in canonical form
// ("0.5" → "500m", "1024Mi" → "1Gi"). A desired field with a zero value
// ("", false, 0, null, [] or {}) equals an absent live one: the API server
// leaves out the omitempty fields it holds zero (a desired `hostNetwork:
// false` against a live `true` still differs).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tandem::controller {

bool isSubset(const nlohmann::json& desired, const nlohmann::json& live);

// The path of the first desired field the live object lacks or differs in
// ("spec.template.spec.containers[0].args"), or "" when isSubset; for logs.
std::string firstDifference(const nlohmann::json& desired, const nlohmann::json& live);

}  // namespace tandem::controller
