// Pod Security Admission for the test API server: the built-in admission
// plugin (k8s.io/pod-security-admission) that enforces the Pod Security
// Standards by namespace label, with the real plugin's checks, their order
// and their wording, so that a test sees what a cluster would answer:
//   pods "web-0" is forbidden: violates PodSecurity "restricted:latest":
//   allowPrivilegeEscalation != false (container "app" must set
//   securityContext.allowPrivilegeEscalation=false), ...
//
// Modelled: the "baseline" and "restricted" checks as the plugin's "latest"
// version evaluates them (policy/check_*.go; appArmorProfile,
// capabilities, hostNamespaces, hostPath volumes, hostPorts, probe and
// lifecycle hosts, privileged, procMount, seLinuxOptions, seccompProfile,
// sysctls, Windows hostProcess, allowPrivilegeEscalation, restricted volume
// types, runAsNonRoot, runAsUser, with the user-namespace (hostUsers: false)
// and Windows (spec.os.name) relaxations); the namespace labels
// pod-security.kubernetes.io/{enforce,enforce-version,warn,warn-version}
// read as the plugin reads them (no label: privileged; an invalid level:
// restricted for enforce, privileged for warn; an invalid version: latest),
// and invalid values of all six labels refused on Namespace writes; the
// "would violate PodSecurity" warnings of the warn level for pods and pod
// templates, and of a namespace update that tightens its enforce level.
//
// Differs from the real plugin: every version ("v1.25", ...) is evaluated
// with the latest checks (the message still names the version asked for);
// "latest" is the plugin's newest rule set (sysctls allowed as of v1.37),
// not capped at a cluster's own version; the audit mode, exemptions
// (namespaces, users, runtime classes) and the deprecated seccomp
// annotations (checked by versions before v1.19 only) are not modelled; a
// volume is classified by the keys its JSON has (one with no source is the
// emptyDir the API server defaults it to).
//
// All functions are pure and thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/apiserver/api_status.h"

namespace tandem::testing {

inline constexpr char kPodSecurityPrivileged[] = "privileged";
inline constexpr char kPodSecurityBaseline[] = "baseline";
inline constexpr char kPodSecurityRestricted[] = "restricted";
inline constexpr char kPodSecurityEnforceLabel[] = "pod-security.kubernetes.io/enforce";
inline constexpr char kPodSecurityEnforceVersionLabel[] =
    "pod-security.kubernetes.io/enforce-version";
inline constexpr char kPodSecurityWarnLabel[] = "pod-security.kubernetes.io/warn";
inline constexpr char kPodSecurityWarnVersionLabel[] = "pod-security.kubernetes.io/warn-version";

// One failed check, worded as the plugin's forbidReason and forbidDetail.
struct PodSecurityViolation {
  std::string reason;  // "host namespaces"
  std::string detail;  // "hostNetwork=true, hostPID=true"

  bool operator==(const PodSecurityViolation&) const = default;
};

// The checks `pod_spec` (a PodSpec) fails at `level` ("privileged": none;
// "baseline"; "restricted"; anything else is evaluated as restricted, as
// the plugin does), in the plugin's order: the baseline checks by ID, then
// the restricted ones. `pod_metadata` (ObjectMeta) is read for the
// AppArmor annotations only.
std::vector<PodSecurityViolation> podSecurityViolations(
    const nlohmann::json& pod_spec, const std::string& level,
    const nlohmann::json& pod_metadata = nlohmann::json::object());

// A level and the version of the checks asked for ("latest" or "v1.<minor>").
struct PodSecurityLevelVersion {
  std::string level = kPodSecurityPrivileged;
  std::string version = "latest";

  std::string text() const { return level + ":" + version; }  // "restricted:latest"
  bool operator==(const PodSecurityLevelVersion&) const = default;
};

// What a namespace's labels ask for (the defaults: privileged:latest). A
// warn level is defaulted to the enforce level when only the latter is set
// (validly) and is stricter.
struct PodSecurityPolicy {
  PodSecurityLevelVersion enforce;
  PodSecurityLevelVersion warn;
};

// The policy of a Namespace object (nullopt: no namespace, no labels).
PodSecurityPolicy podSecurityPolicy(const std::optional<nlohmann::json>& namespace_object);
// Its enforce level: "privileged" without the label, "restricted" for a
// value that is not a level.
std::string podSecurityEnforceLevel(const std::optional<nlohmann::json>& namespace_object);

// The invalid pod-security.kubernetes.io labels of a Namespace object, as
// (field, detail) for invalidFields:
//   ("metadata.labels[pod-security.kubernetes.io/enforce]",
//    "Invalid value: \"strict\": must be one of privileged, baseline, restricted")
std::vector<std::pair<std::string, std::string>> podSecurityLabelErrors(
    const nlohmann::json& namespace_object);

// "violates PodSecurity "<level>:<version>": reason (detail), reason, ..."
// (a detail is left out with its parentheses when empty).
std::string podSecurityViolationText(const std::string& level_version,
                                     const std::vector<PodSecurityViolation>& violations);
// The message of the 403 answer refusing pod `pod_name`:
//   pods "NAME" is forbidden: violates PodSecurity "restricted:latest": ...
std::string podSecurityForbiddenMessage(const std::string& pod_name, const std::string& level,
                                        const std::vector<PodSecurityViolation>& violations,
                                        const std::string& version = "latest");

// The plugin's answer to a pod create (or significant update): a 403
// Forbidden error when the enforce level refuses it; otherwise the
// warnings of the warn level ("would violate PodSecurity ...").
struct PodSecurityDecision {
  std::optional<ApiError> error;
  std::vector<std::string> warnings;
};
PodSecurityDecision admitPod(const nlohmann::json& pod,
                             const std::optional<nlohmann::json>& namespace_object);
// Pod controllers (Deployments) are never refused; their pod template gets
// the warn level's warnings.
std::vector<std::string> podTemplateWarnings(const nlohmann::json& pod_template,
                                             const std::optional<nlohmann::json>& namespace_object);
// Whether a pod update is evaluated at all: the plugin skips updates that
// change no container image and add no container.
bool isSignificantPodUpdate(const nlohmann::json& pod, const nlohmann::json& old_pod);
// The warnings of a Namespace update that tightens its enforce level, for
// the pods already in it (which stay): "existing pods in namespace "ns"
// violate the new PodSecurity enforce level "restricted:latest"", then one
// line per distinct set of reasons ("web-0 (and 2 other pods): privileged").
std::vector<std::string> namespaceUpdateWarnings(const nlohmann::json& namespace_object,
                                                 const nlohmann::json& old_namespace_object,
                                                 const std::vector<nlohmann::json>& pods);

}  // namespace tandem::testing
