#include "tests/support/apiserver/pod_security.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>

namespace tandem::testing {
namespace {

using Json = nlohmann::json;
using Violation = std::optional<PodSecurityViolation>;

// --- Reading the pod's JSON as the plugin reads the typed PodSpec ---

// The member `key` of `object`, or null when `object` is no object or the
// member is absent or null (Go's nil pointer).
const Json& member(const Json& object, const char* key) {
  static const Json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

bool present(const Json& object, const char* key) { return !member(object, key).is_null(); }

bool isTrue(const Json& object, const char* key) {
  const Json& value = member(object, key);
  return value.is_boolean() && value.get<bool>();
}

bool isFalse(const Json& object, const char* key) {
  const Json& value = member(object, key);
  return value.is_boolean() && !value.get<bool>();
}

std::string text(const Json& object, const char* key) {
  const Json& value = member(object, key);
  return value.is_string() ? value.get<std::string>() : "";
}

std::optional<int64_t> integer(const Json& object, const char* key) {
  const Json& value = member(object, key);
  if (!value.is_number()) return std::nullopt;
  return value.get<int64_t>();
}

const Json& items(const Json& object, const char* key) {
  static const Json kEmpty = Json::array();
  const Json& value = member(object, key);
  return value.is_array() ? value : kEmpty;
}

// initContainers, containers, ephemeralContainers: the plugin's visitContainers order.
std::vector<const Json*> containersOf(const Json& spec) {
  std::vector<const Json*> containers;
  for (const char* list : {"initContainers", "containers", "ephemeralContainers"}) {
    for (const Json& container : items(spec, list)) containers.push_back(&container);
  }
  return containers;
}

const Json& securityContext(const Json& container_or_spec) {
  return member(container_or_spec, "securityContext");
}

// --- The plugin's wording helpers (policy/helpers.go) ---

std::string joinQuote(const std::vector<std::string>& values) {
  if (values.empty()) return "";
  std::string out = "\"";
  for (size_t i = 0; i < values.size(); ++i) out += (i == 0 ? "" : "\", \"") + values[i];
  return out + "\"";
}

std::string joinQuote(const std::set<std::string>& values) {
  return joinQuote(std::vector<std::string>(values.begin(), values.end()));
}

std::string pluralize(const std::string& singular, const std::string& plural, size_t count) {
  return count == 1 ? singular : plural;
}

std::string join(const std::vector<std::string>& values, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i == 0 ? "" : separator) + values[i];
  return out;
}

// Go's %q of a string (strconv.Quote) for the printable ASCII and control
// characters annotation values can hold; other bytes are kept as they are.
std::string goQuote(const std::string& value) {
  std::string out = "\"";
  for (char c : value) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\x%02x", static_cast<unsigned char>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// "container \"a\"" / "containers \"a\", \"b\"".
std::string containerList(const std::vector<std::string>& names) {
  return pluralize("container", "containers", names.size()) + " " + joinQuote(names);
}

// A pod in a user namespace (hostUsers: false): procMount, runAsNonRoot and
// runAsUser are relaxed for it (v1.35).
bool userNamespacePod(const Json& spec) { return isFalse(spec, "hostUsers"); }

bool windowsPod(const Json& spec) { return text(member(spec, "os"), "name") == "windows"; }

// --- Baseline checks (policy/check_*.go) ---

// Who sets securityContext.<field> (a profile with a "type") to a type
// `allowed` refuses: "pod" and/or "container(s) ..." as setters, and the
// refused types. The AppArmor and the baseline seccomp checks read their
// profiles alike.
struct RefusedProfiles {
  std::vector<std::string> setters;
  std::set<std::string> types;
};
RefusedProfiles refusedProfileTypes(const Json& spec, const char* field,
                                    bool (*allowed)(const std::string&)) {
  RefusedProfiles refused;
  const Json& pod_profile = member(securityContext(spec), field);
  if (!pod_profile.is_null() && !allowed(text(pod_profile, "type"))) {
    refused.setters.push_back("pod");
    refused.types.insert(text(pod_profile, "type"));
  }
  std::vector<std::string> bad_containers;
  for (const Json* container : containersOf(spec)) {
    const Json& profile = member(securityContext(*container), field);
    if (!profile.is_null() && !allowed(text(profile, "type"))) {
      bad_containers.push_back(text(*container, "name"));
      refused.types.insert(text(profile, "type"));
    }
  }
  if (!bad_containers.empty()) refused.setters.push_back(containerList(bad_containers));
  return refused;
}

bool allowedAppArmorType(const std::string& type) {
  return type == "RuntimeDefault" || type == "Localhost";
}

bool allowedAppArmorAnnotation(const std::string& value) {
  return value.empty() || value == "runtime/default" || value.rfind("localhost/", 0) == 0;
}

// check_appArmorProfile.go (v1.0).
Violation appArmorProfile(const Json& metadata, const Json& spec) {
  auto [bad_setters, bad_values] =
      refusedProfileTypes(spec, "appArmorProfile", allowedAppArmorType);
  std::vector<std::string> forbidden_annotations;
  const Json& annotations = member(metadata, "annotations");
  if (annotations.is_object()) {
    static const std::string kPrefix = "container.apparmor.security.beta.kubernetes.io/";
    for (const auto& [key, value] : annotations.items()) {
      if (!value.is_string() || key.rfind(kPrefix, 0) != 0) continue;
      if (!allowedAppArmorAnnotation(value.get<std::string>())) {
        forbidden_annotations.push_back(key + "=" + goQuote(value.get<std::string>()));
      }
    }
  }
  std::vector<std::string> bad_value_list(bad_values.begin(), bad_values.end());
  if (!forbidden_annotations.empty()) {
    std::sort(forbidden_annotations.begin(), forbidden_annotations.end());
    bad_value_list.insert(bad_value_list.end(), forbidden_annotations.begin(),
                          forbidden_annotations.end());
    bad_setters.push_back(pluralize("annotation", "annotations", forbidden_annotations.size()));
  }
  if (bad_setters.empty()) return std::nullopt;
  return PodSecurityViolation{
      pluralize("forbidden AppArmor profile", "forbidden AppArmor profiles", bad_value_list.size()),
      join(bad_setters, " and ") + " must not set AppArmor profile type to " +
          joinQuote(bad_value_list)};
}

// check_capabilities_baseline.go (v1.0).
Violation capabilitiesBaseline(const Json&, const Json& spec) {
  static const std::set<std::string> kAllowed = {
      "AUDIT_WRITE",      "CHOWN",   "DAC_OVERRIDE", "FOWNER",  "FSETID", "KILL",      "MKNOD",
      "NET_BIND_SERVICE", "SETFCAP", "SETGID",       "SETPCAP", "SETUID", "SYS_CHROOT"};
  std::vector<std::string> bad_containers;
  std::set<std::string> non_default;
  for (const Json* container : containersOf(spec)) {
    const Json& capabilities = member(securityContext(*container), "capabilities");
    if (capabilities.is_null()) continue;
    bool valid = true;
    for (const Json& capability : items(capabilities, "add")) {
      std::string name = capability.is_string() ? capability.get<std::string>() : "";
      if (kAllowed.count(name) == 0) {
        valid = false;
        non_default.insert(name);
      }
    }
    if (!valid) bad_containers.push_back(text(*container, "name"));
  }
  if (bad_containers.empty()) return std::nullopt;
  return PodSecurityViolation{"non-default capabilities",
                              containerList(bad_containers) + " must not include " +
                                  joinQuote(non_default) + " in securityContext.capabilities.add"};
}

// check_hostNamespaces.go (v1.0).
Violation hostNamespaces(const Json&, const Json& spec) {
  std::vector<std::string> shared;
  if (isTrue(spec, "hostNetwork")) shared.push_back("hostNetwork=true");
  if (isTrue(spec, "hostPID")) shared.push_back("hostPID=true");
  if (isTrue(spec, "hostIPC")) shared.push_back("hostIPC=true");
  if (shared.empty()) return std::nullopt;
  return PodSecurityViolation{"host namespaces", join(shared, ", ")};
}

// check_hostPathVolumes.go (v1.0).
Violation hostPathVolumes(const Json&, const Json& spec) {
  std::vector<std::string> host_volumes;
  for (const Json& volume : items(spec, "volumes")) {
    if (present(volume, "hostPath")) host_volumes.push_back(text(volume, "name"));
  }
  if (host_volumes.empty()) return std::nullopt;
  return PodSecurityViolation{
      "hostPath volumes",
      pluralize("volume", "volumes", host_volumes.size()) + " " + joinQuote(host_volumes)};
}

// check_hostPorts.go (v1.0). The ports are sorted as text, as the plugin's string set is.
Violation hostPorts(const Json&, const Json& spec) {
  std::vector<std::string> bad_containers;
  std::set<std::string> ports;
  for (const Json* container : containersOf(spec)) {
    bool valid = true;
    for (const Json& port : items(*container, "ports")) {
      std::optional<int64_t> host_port = integer(port, "hostPort");
      if (host_port && *host_port != 0) {
        valid = false;
        ports.insert(std::to_string(*host_port));
      }
    }
    if (!valid) bad_containers.push_back(text(*container, "name"));
  }
  if (bad_containers.empty()) return std::nullopt;
  return PodSecurityViolation{"hostPort",
                              containerList(bad_containers) + " " +
                                  pluralize("uses", "use", bad_containers.size()) + " " +
                                  pluralize("hostPort", "hostPorts", ports.size()) + " " +
                                  join(std::vector<std::string>(ports.begin(), ports.end()), ", ")};
}

// The non-empty hosts of a probe or lifecycle handler (httpGet, tcpSocket).
void collectHosts(const Json& handler, std::set<std::string>& hosts, bool& found) {
  if (handler.is_null()) return;
  for (const char* kind : {"httpGet", "tcpSocket"}) {
    std::string host = text(member(handler, kind), "host");
    if (!host.empty()) {
      hosts.insert(host);
      found = true;
    }
  }
}

// check_hostProbesAndhostLifecycle.go (v1.34). Containers are listed sorted, as a set.
Violation hostProbesAndHostLifecycle(const Json&, const Json& spec) {
  std::set<std::string> bad_containers;
  std::set<std::string> hosts;
  for (const Json* container : containersOf(spec)) {
    bool found = false;
    for (const char* probe : {"livenessProbe", "readinessProbe", "startupProbe"}) {
      collectHosts(member(*container, probe), hosts, found);
    }
    const Json& lifecycle = member(*container, "lifecycle");
    for (const char* hook : {"postStart", "preStop"}) {
      collectHosts(member(lifecycle, hook), hosts, found);
    }
    if (found) bad_containers.insert(text(*container, "name"));
  }
  if (bad_containers.empty()) return std::nullopt;
  return PodSecurityViolation{
      "probe or lifecycle host",
      pluralize("container", "containers", bad_containers.size()) + " " +
          joinQuote(bad_containers) + " " + pluralize("uses", "use", bad_containers.size()) + " " +
          pluralize("probe or lifecycle host", "probe or lifecycle hosts", hosts.size()) + " " +
          joinQuote(hosts)};
}

// check_privileged.go (v1.0).
Violation privileged(const Json&, const Json& spec) {
  std::vector<std::string> bad_containers;
  for (const Json* container : containersOf(spec)) {
    if (isTrue(securityContext(*container), "privileged")) {
      bad_containers.push_back(text(*container, "name"));
    }
  }
  if (bad_containers.empty()) return std::nullopt;
  return PodSecurityViolation{"privileged", containerList(bad_containers) +
                                                " must not set securityContext.privileged=true"};
}

// check_procMount_baseline.go (procMount_1_0): any value but "Default".
Violation procMountAny(const Json&, const Json& spec) {
  std::vector<std::string> bad_containers;
  std::set<std::string> types;
  for (const Json* container : containersOf(spec)) {
    const Json& proc_mount = member(securityContext(*container), "procMount");
    if (proc_mount.is_null()) continue;
    std::string type = proc_mount.is_string() ? proc_mount.get<std::string>() : "";
    if (type != "Default") {
      bad_containers.push_back(text(*container, "name"));
      types.insert(type);
    }
  }
  if (bad_containers.empty()) return std::nullopt;
  return PodSecurityViolation{"procMount", containerList(bad_containers) +
                                               " must not set securityContext.procMount to " +
                                               joinQuote(types)};
}

// check_procMount_baseline.go (v1.35): pods in a user namespace may set any.
Violation procMountBaseline(const Json& metadata, const Json& spec) {
  if (userNamespacePod(spec)) return std::nullopt;
  return procMountAny(metadata, spec);
}

// check_seLinuxOptions.go (v1.31).
Violation seLinuxOptions(const Json&, const Json& spec) {
  static const std::set<std::string> kAllowedTypes = {"", "container_t", "container_init_t",
                                                      "container_kvm_t", "container_engine_t"};
  std::vector<std::string> bad_setters;
  std::set<std::string> bad_types;
  bool set_user = false;
  bool set_role = false;
  auto valid = [&](const Json& options) {
    bool ok = true;
    std::string type = text(options, "type");
    if (kAllowedTypes.count(type) == 0) {
      ok = false;
      bad_types.insert(type);
    }
    if (!text(options, "user").empty()) {
      ok = false;
      set_user = true;
    }
    if (!text(options, "role").empty()) {
      ok = false;
      set_role = true;
    }
    return ok;
  };
  const Json& pod_options = member(securityContext(spec), "seLinuxOptions");
  if (!pod_options.is_null() && !valid(pod_options)) bad_setters.push_back("pod");
  std::vector<std::string> bad_containers;
  for (const Json* container : containersOf(spec)) {
    const Json& options = member(securityContext(*container), "seLinuxOptions");
    if (!options.is_null() && !valid(options)) bad_containers.push_back(text(*container, "name"));
  }
  if (!bad_containers.empty()) bad_setters.push_back(containerList(bad_containers));
  if (bad_setters.empty()) return std::nullopt;
  std::vector<std::string> bad_data;
  if (!bad_types.empty()) {
    bad_data.push_back(pluralize("type", "types", bad_types.size()) + " " + joinQuote(bad_types));
  }
  if (set_user) bad_data.push_back("user may not be set");
  if (set_role) bad_data.push_back("role may not be set");
  return PodSecurityViolation{
      "seLinuxOptions",
      join(bad_setters, " and ") +
          " set forbidden securityContext.seLinuxOptions: " + join(bad_data, "; ")};
}

bool validSeccompType(const std::string& type) {
  return type == "Localhost" || type == "RuntimeDefault";
}

// check_seccompProfile_baseline.go (v1.19): if set, RuntimeDefault or Localhost.
Violation seccompProfileBaseline(const Json&, const Json& spec) {
  const auto [bad_setters, bad_values] =
      refusedProfileTypes(spec, "seccompProfile", validSeccompType);
  if (bad_setters.empty()) return std::nullopt;
  return PodSecurityViolation{"seccompProfile",
                              join(bad_setters, " and ") +
                                  " must not set securityContext.seccompProfile.type to " +
                                  joinQuote(bad_values)};
}

// check_sysctls.go (v1.37): the namespaced, isolated sysctls only.
Violation sysctls(const Json&, const Json& spec) {
  static const std::set<std::string> kAllowed = {"kernel.shm_rmid_forced",
                                                 "net.ipv4.ip_local_port_range",
                                                 "net.ipv4.tcp_syncookies",
                                                 "net.ipv4.ping_group_range",
                                                 "net.ipv4.ip_unprivileged_port_start",
                                                 "net.ipv4.ip_local_reserved_ports",
                                                 "net.ipv4.tcp_keepalive_time",
                                                 "net.ipv4.tcp_fin_timeout",
                                                 "net.ipv4.tcp_keepalive_intvl",
                                                 "net.ipv4.tcp_keepalive_probes",
                                                 "net.ipv4.tcp_rmem",
                                                 "net.ipv4.tcp_wmem",
                                                 "net.ipv4.tcp_slow_start_after_idle",
                                                 "net.ipv4.tcp_notsent_lowat"};
  std::vector<std::string> forbidden;
  for (const Json& sysctl : items(securityContext(spec), "sysctls")) {
    std::string name = text(sysctl, "name");
    if (kAllowed.count(name) == 0) forbidden.push_back(name);
  }
  if (forbidden.empty()) return std::nullopt;
  return PodSecurityViolation{"forbidden sysctls", join(forbidden, ", ")};
}

// check_windowsHostProcess.go (v1.0).
Violation windowsHostProcess(const Json&, const Json& spec) {
  std::vector<std::string> bad_containers;
  for (const Json* container : containersOf(spec)) {
    if (isTrue(member(securityContext(*container), "windowsOptions"), "hostProcess")) {
      bad_containers.push_back(text(*container, "name"));
    }
  }
  std::vector<std::string> setters;
  if (isTrue(member(securityContext(spec), "windowsOptions"), "hostProcess")) {
    setters.push_back("pod");
  }
  if (!bad_containers.empty()) setters.push_back(containerList(bad_containers));
  if (setters.empty()) return std::nullopt;
  return PodSecurityViolation{
      "hostProcess",
      join(setters, " and ") + " must not set securityContext.windowsOptions.hostProcess=true"};
}

// --- Restricted checks ---

// check_allowPrivilegeEscalation.go (v1.25): must be false, except on Windows.
Violation allowPrivilegeEscalation(const Json&, const Json& spec) {
  if (windowsPod(spec)) return std::nullopt;
  std::vector<std::string> bad_containers;
  for (const Json* container : containersOf(spec)) {
    if (!isFalse(securityContext(*container), "allowPrivilegeEscalation")) {
      bad_containers.push_back(text(*container, "name"));
    }
  }
  if (bad_containers.empty()) return std::nullopt;
  return PodSecurityViolation{
      "allowPrivilegeEscalation != false",
      containerList(bad_containers) + " must set securityContext.allowPrivilegeEscalation=false"};
}

// check_capabilities_restricted.go (v1.25): drop ALL, add NET_BIND_SERVICE at most.
Violation capabilitiesRestricted(const Json&, const Json& spec) {
  if (windowsPod(spec)) return std::nullopt;
  std::vector<std::string> missing_drop_all;
  std::vector<std::string> adding_forbidden;
  std::set<std::string> forbidden;
  for (const Json* container : containersOf(spec)) {
    const std::string name = text(*container, "name");
    const Json& capabilities = member(securityContext(*container), "capabilities");
    if (capabilities.is_null()) {
      missing_drop_all.push_back(name);
      continue;
    }
    const Json& drop = items(capabilities, "drop");
    if (std::find(drop.begin(), drop.end(), Json("ALL")) == drop.end()) {
      missing_drop_all.push_back(name);
    }
    bool added_forbidden = false;
    for (const Json& capability : items(capabilities, "add")) {
      std::string added = capability.is_string() ? capability.get<std::string>() : "";
      if (added != "NET_BIND_SERVICE") {
        added_forbidden = true;
        forbidden.insert(added);
      }
    }
    if (added_forbidden) adding_forbidden.push_back(name);
  }
  std::vector<std::string> details;
  if (!missing_drop_all.empty()) {
    details.push_back(containerList(missing_drop_all) +
                      " must set securityContext.capabilities.drop=[\"ALL\"]");
  }
  if (!adding_forbidden.empty()) {
    details.push_back(containerList(adding_forbidden) + " must not include " +
                      joinQuote(forbidden) + " in securityContext.capabilities.add");
  }
  if (details.empty()) return std::nullopt;
  return PodSecurityViolation{"unrestricted capabilities", join(details, "; ")};
}

// check_restrictedVolumes.go (v1.0). The allowed inline sources, then the
// restricted ones in the order the plugin tests them.
Violation restrictedVolumes(const Json&, const Json& spec) {
  static const char* const kAllowed[] = {"configMap", "csi",   "downwardAPI",           "emptyDir",
                                         "ephemeral", "image", "persistentVolumeClaim", "projected",
                                         "secret"};
  static const char* const kRestricted[] = {"hostPath",
                                            "gcePersistentDisk",
                                            "awsElasticBlockStore",
                                            "gitRepo",
                                            "nfs",
                                            "iscsi",
                                            "glusterfs",
                                            "rbd",
                                            "flexVolume",
                                            "cinder",
                                            "cephfs",
                                            "flocker",
                                            "fc",
                                            "azureFile",
                                            "vsphereVolume",
                                            "quobyte",
                                            "azureDisk",
                                            "photonPersistentDisk",
                                            "portworxVolume",
                                            "scaleIO",
                                            "storageos"};
  std::vector<std::string> bad_volumes;
  std::set<std::string> bad_types;
  for (const Json& volume : items(spec, "volumes")) {
    bool allowed = std::any_of(std::begin(kAllowed), std::end(kAllowed),
                               [&](const char* type) { return present(volume, type); });
    if (allowed) continue;
    auto restricted = std::find_if(std::begin(kRestricted), std::end(kRestricted),
                                   [&](const char* type) { return present(volume, type); });
    // No source the API knows: it defaults the volume to an emptyDir.
    if (restricted == std::end(kRestricted)) continue;
    bad_volumes.push_back(text(volume, "name"));
    bad_types.insert(*restricted);
  }
  if (bad_volumes.empty()) return std::nullopt;
  return PodSecurityViolation{
      "restricted volume types",
      pluralize("volume", "volumes", bad_volumes.size()) + " " + joinQuote(bad_volumes) + " " +
          pluralize("uses", "use", bad_volumes.size()) + " " +
          pluralize("restricted volume type", "restricted volume types", bad_types.size()) + " " +
          joinQuote(bad_types)};
}

// check_runAsNonRoot.go (v1.35): true on the pod or on every container.
Violation runAsNonRoot(const Json&, const Json& spec) {
  if (userNamespacePod(spec)) return std::nullopt;
  std::vector<std::string> bad_setters;
  bool pod_non_root = false;
  const Json& pod_context = securityContext(spec);
  if (isFalse(pod_context, "runAsNonRoot")) {
    bad_setters.push_back("pod");
  } else if (isTrue(pod_context, "runAsNonRoot")) {
    pod_non_root = true;
  }
  std::vector<std::string> explicitly_bad;
  std::vector<std::string> implicitly_bad;
  for (const Json* container : containersOf(spec)) {
    const Json& context = securityContext(*container);
    if (member(context, "runAsNonRoot").is_boolean()) {
      if (isFalse(context, "runAsNonRoot")) explicitly_bad.push_back(text(*container, "name"));
    } else if (!pod_non_root) {
      implicitly_bad.push_back(text(*container, "name"));
    }
  }
  if (!explicitly_bad.empty()) bad_setters.push_back(containerList(explicitly_bad));
  if (!bad_setters.empty()) {
    return PodSecurityViolation{
        "runAsNonRoot != true",
        join(bad_setters, " and ") + " must not set securityContext.runAsNonRoot=false"};
  }
  if (!implicitly_bad.empty()) {
    return PodSecurityViolation{
        "runAsNonRoot != true",
        "pod or " + containerList(implicitly_bad) + " must set securityContext.runAsNonRoot=true"};
  }
  return std::nullopt;
}

// check_runAsUser.go (v1.35): not 0, unless in a user namespace.
Violation runAsUser(const Json&, const Json& spec) {
  if (userNamespacePod(spec)) return std::nullopt;
  std::vector<std::string> bad_setters;
  if (integer(securityContext(spec), "runAsUser") == 0) bad_setters.push_back("pod");
  std::vector<std::string> bad_containers;
  for (const Json* container : containersOf(spec)) {
    if (integer(securityContext(*container), "runAsUser") == 0) {
      bad_containers.push_back(text(*container, "name"));
    }
  }
  if (!bad_containers.empty()) bad_setters.push_back(containerList(bad_containers));
  if (bad_setters.empty()) return std::nullopt;
  return PodSecurityViolation{"runAsUser=0",
                              join(bad_setters, " and ") + " must not set runAsUser=0"};
}

// check_seccompProfile_restricted.go (v1.25): RuntimeDefault or Localhost
// on the pod or on every container, except on Windows.
Violation seccompProfileRestricted(const Json&, const Json& spec) {
  if (windowsPod(spec)) return std::nullopt;
  std::vector<std::string> bad_setters;
  std::set<std::string> bad_values;
  bool pod_set = false;
  const Json& pod_profile = member(securityContext(spec), "seccompProfile");
  if (!pod_profile.is_null()) {
    if (!validSeccompType(text(pod_profile, "type"))) {
      bad_setters.push_back("pod");
      bad_values.insert(text(pod_profile, "type"));
    } else {
      pod_set = true;
    }
  }
  std::vector<std::string> explicitly_bad;
  std::vector<std::string> implicitly_bad;
  for (const Json* container : containersOf(spec)) {
    const Json& profile = member(securityContext(*container), "seccompProfile");
    if (!profile.is_null()) {
      if (!validSeccompType(text(profile, "type"))) {
        explicitly_bad.push_back(text(*container, "name"));
        bad_values.insert(text(profile, "type"));
      }
    } else if (!pod_set) {
      implicitly_bad.push_back(text(*container, "name"));
    }
  }
  if (!explicitly_bad.empty()) bad_setters.push_back(containerList(explicitly_bad));
  if (!bad_setters.empty()) {
    return PodSecurityViolation{"seccompProfile",
                                join(bad_setters, " and ") +
                                    " must not set securityContext.seccompProfile.type to " +
                                    joinQuote(bad_values)};
  }
  if (!implicitly_bad.empty()) {
    return PodSecurityViolation{
        "seccompProfile",
        "pod or " + containerList(implicitly_bad) +
            " must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\""};
  }
  return std::nullopt;
}

// --- The registry (policy/registry.go) ---

struct Check {
  const char* id;
  bool restricted;        // a check of the restricted level (else baseline)
  const char* overrides;  // the baseline check this restricted one replaces, or nullptr
  Violation (*run)(const Json& metadata, const Json& spec);
};

// As the plugin orders them: baseline check IDs sorted (byte order), then
// restricted check IDs sorted.
const Check kChecks[] = {
    {"appArmorProfile", false, nullptr, appArmorProfile},
    {"capabilities_baseline", false, nullptr, capabilitiesBaseline},
    {"hostNamespaces", false, nullptr, hostNamespaces},
    {"hostPathVolumes", false, nullptr, hostPathVolumes},
    {"hostPorts", false, nullptr, hostPorts},
    {"hostProbesAndHostLifecycle", false, nullptr, hostProbesAndHostLifecycle},
    {"privileged", false, nullptr, privileged},
    {"procMount", false, nullptr, procMountBaseline},
    {"seLinuxOptions", false, nullptr, seLinuxOptions},
    {"seccompProfile_baseline", false, nullptr, seccompProfileBaseline},
    {"sysctls", false, nullptr, sysctls},
    {"windowsHostProcess", false, nullptr, windowsHostProcess},
    {"allowPrivilegeEscalation", true, nullptr, allowPrivilegeEscalation},
    {"capabilities_restricted", true, "capabilities_baseline", capabilitiesRestricted},
    {"procMount_restricted", true, "procMount", procMountAny},
    {"restrictedVolumes", true, "hostPathVolumes", restrictedVolumes},
    {"runAsNonRoot", true, nullptr, runAsNonRoot},
    {"runAsUser", true, nullptr, runAsUser},
    {"seccompProfile_restricted", true, "seccompProfile_baseline", seccompProfileRestricted},
};

bool overridden(const char* id) {
  for (const Check& check : kChecks) {
    if (check.overrides != nullptr && std::string(check.overrides) == id) return true;
  }
  return false;
}

// --- Namespace labels (api/helpers.go) ---

bool validLevel(const std::string& level) {
  return level == kPodSecurityPrivileged || level == kPodSecurityBaseline ||
         level == kPodSecurityRestricted;
}

// "latest" or "v1.<minor>" without leading zeros.
bool validVersion(const std::string& version) {
  if (version == "latest") return true;
  if (version.rfind("v1.", 0) != 0 || version.size() == 3) return false;
  const std::string minor = version.substr(3);
  if (minor.size() > 1 && minor[0] == '0') return false;
  return minor.size() <= 9 &&
         std::all_of(minor.begin(), minor.end(), [](char c) { return c >= '0' && c <= '9'; });
}

int strictness(const std::string& level) {
  if (level == kPodSecurityRestricted) return 2;
  if (level == kPodSecurityBaseline) return 1;
  return 0;
}

const Json& labelsOf(const Json& object) { return member(member(object, "metadata"), "labels"); }

std::optional<std::string> label(const Json& labels, const char* key) {
  const Json& value = member(labels, key);
  if (!value.is_string()) return std::nullopt;
  return value.get<std::string>();
}

std::string metadataName(const Json& object) { return text(member(object, "metadata"), "name"); }

std::vector<std::string> warningsFor(const PodSecurityPolicy& policy, const Json& metadata,
                                     const Json& spec) {
  if (policy.warn.level == kPodSecurityPrivileged) return {};
  std::vector<PodSecurityViolation> violations =
      podSecurityViolations(spec, policy.warn.level, metadata);
  if (violations.empty()) return {};
  return {"would " + podSecurityViolationText(policy.warn.text(), violations)};
}

}  // namespace

std::vector<PodSecurityViolation> podSecurityViolations(const Json& pod_spec,
                                                        const std::string& level,
                                                        const Json& pod_metadata) {
  if (level == kPodSecurityPrivileged) return {};
  const bool restricted = level != kPodSecurityBaseline;
  const Json spec = pod_spec.is_object() ? pod_spec : Json::object();
  std::vector<PodSecurityViolation> violations;
  for (const Check& check : kChecks) {
    if (check.restricted && !restricted) continue;
    if (!check.restricted && restricted && overridden(check.id)) continue;
    if (Violation violation = check.run(pod_metadata, spec)) violations.push_back(*violation);
  }
  return violations;
}

PodSecurityPolicy podSecurityPolicy(const std::optional<Json>& namespace_object) {
  PodSecurityPolicy policy;
  if (!namespace_object) return policy;
  const Json& labels = labelsOf(*namespace_object);
  bool has_enforce_level = false;
  if (std::optional<std::string> level = label(labels, kPodSecurityEnforceLabel)) {
    has_enforce_level = validLevel(*level);
    policy.enforce.level = has_enforce_level ? *level : kPodSecurityRestricted;
  }
  if (std::optional<std::string> version = label(labels, kPodSecurityEnforceVersionLabel)) {
    policy.enforce.version = validVersion(*version) ? *version : "latest";
  }
  std::optional<std::string> warn_level = label(labels, kPodSecurityWarnLabel);
  if (warn_level) {
    // Warn fails open.
    policy.warn.level = validLevel(*warn_level) ? *warn_level : kPodSecurityPrivileged;
  }
  std::optional<std::string> warn_version = label(labels, kPodSecurityWarnVersionLabel);
  if (warn_version) policy.warn.version = validVersion(*warn_version) ? *warn_version : "latest";
  if (!warn_level && has_enforce_level &&
      strictness(policy.enforce.level) > strictness(policy.warn.level)) {
    policy.warn.level = policy.enforce.level;
    if (!warn_version) policy.warn.version = policy.enforce.version;
  }
  return policy;
}

std::string podSecurityEnforceLevel(const std::optional<Json>& namespace_object) {
  return podSecurityPolicy(namespace_object).enforce.level;
}

std::vector<std::pair<std::string, std::string>> podSecurityLabelErrors(
    const Json& namespace_object) {
  static const std::string kLevels = "privileged, baseline, restricted";
  const Json& labels = labelsOf(namespace_object);
  std::vector<std::pair<std::string, std::string>> errors;
  for (const char* suffix :
       {"enforce", "enforce-version", "audit", "audit-version", "warn", "warn-version"}) {
    const std::string key = std::string("pod-security.kubernetes.io/") + suffix;
    std::optional<std::string> value = label(labels, key.c_str());
    if (!value) continue;
    const bool version = std::string(suffix).find("-version") != std::string::npos;
    if (version ? validVersion(*value) : validLevel(*value)) continue;
    errors.emplace_back(
        "metadata.labels[" + key + "]",
        "Invalid value: " + goQuote(*value) + ": " +
            (version ? "must be \"latest\" or \"v1.x\"" : "must be one of " + kLevels));
  }
  return errors;
}

std::string podSecurityViolationText(const std::string& level_version,
                                     const std::vector<PodSecurityViolation>& violations) {
  std::string out = "violates PodSecurity \"" + level_version + "\": ";
  for (size_t i = 0; i < violations.size(); ++i) {
    if (i > 0) out += ", ";
    out += violations[i].reason.empty() ? "unknown forbidden reason" : violations[i].reason;
    if (!violations[i].detail.empty()) out += " (" + violations[i].detail + ")";
  }
  return out;
}

std::string podSecurityForbiddenMessage(const std::string& pod_name, const std::string& level,
                                        const std::vector<PodSecurityViolation>& violations,
                                        const std::string& version) {
  return "pods \"" + pod_name +
         "\" is forbidden: " + podSecurityViolationText(level + ":" + version, violations);
}

PodSecurityDecision admitPod(const Json& pod, const std::optional<Json>& namespace_object) {
  PodSecurityDecision decision;
  const PodSecurityPolicy policy = podSecurityPolicy(namespace_object);
  const Json& metadata = member(pod, "metadata");
  const Json& spec = member(pod, "spec");
  std::vector<PodSecurityViolation> violations =
      podSecurityViolations(spec, policy.enforce.level, metadata);
  if (!violations.empty()) {
    // As apierrors.NewForbidden for the resource "pods" (core group: no group).
    const std::string name = metadataName(pod);
    Json details = {{"name", name}, {"kind", "pods"}};
    decision.error = ApiError{
        403, "Forbidden",
        podSecurityForbiddenMessage(name, policy.enforce.level, violations, policy.enforce.version),
        details};
    return decision;
  }
  decision.warnings = warningsFor(policy, metadata, spec);
  return decision;
}

std::vector<std::string> podTemplateWarnings(const Json& pod_template,
                                             const std::optional<Json>& namespace_object) {
  if (pod_template.is_null()) return {};
  return warningsFor(podSecurityPolicy(namespace_object), member(pod_template, "metadata"),
                     member(pod_template, "spec"));
}

bool isSignificantPodUpdate(const Json& pod, const Json& old_pod) {
  const Json& spec = member(pod, "spec");
  const Json& old_spec = member(old_pod, "spec");
  for (const char* list : {"containers", "initContainers"}) {
    const Json& containers = items(spec, list);
    const Json& old_containers = items(old_spec, list);
    if (containers.size() != old_containers.size()) return true;
    for (size_t i = 0; i < containers.size(); ++i) {
      if (text(containers[i], "image") != text(old_containers[i], "image")) return true;
    }
  }
  for (const Json& container : items(spec, "ephemeralContainers")) {
    const Json* old_container = nullptr;
    for (const Json& candidate : items(old_spec, "ephemeralContainers")) {
      if (text(candidate, "name") == text(container, "name")) {
        old_container = &candidate;
        break;
      }
    }
    if (old_container == nullptr) return true;
    if (text(container, "image") != text(*old_container, "image")) return true;
  }
  return false;
}

std::vector<std::string> namespaceUpdateWarnings(const Json& namespace_object,
                                                 const Json& old_namespace_object,
                                                 const std::vector<Json>& pods) {
  const PodSecurityLevelVersion enforce = podSecurityPolicy(namespace_object).enforce;
  const PodSecurityLevelVersion old_enforce = podSecurityPolicy(old_namespace_object).enforce;
  // As the plugin: no dry run when nothing changed, when the level is
  // privileged, or when it was relaxed at the same version.
  if (enforce == old_enforce || enforce.level == kPodSecurityPrivileged) return {};
  if (enforce.version == old_enforce.version &&
      strictness(enforce.level) <= strictness(old_enforce.level)) {
    return {};
  }
  // Each distinct set of reasons: the lexically first pod name and the count.
  std::map<std::string, std::pair<std::string, size_t>> by_reasons;
  for (const Json& pod : pods) {
    std::vector<PodSecurityViolation> violations =
        podSecurityViolations(member(pod, "spec"), enforce.level, member(pod, "metadata"));
    if (violations.empty()) continue;
    std::string reasons;
    for (const PodSecurityViolation& violation : violations) {
      reasons += (reasons.empty() ? "" : ", ") + violation.reason;
    }
    auto [entry, added] = by_reasons.try_emplace(reasons, metadataName(pod), 0);
    if (!added && metadataName(pod) < entry->second.first) entry->second.first = metadataName(pod);
    ++entry->second.second;
  }
  if (by_reasons.empty()) return {};
  std::vector<std::string> pod_warnings;
  for (const auto& [reasons, first_and_count] : by_reasons) {
    const auto& [first, count] = first_and_count;
    std::string who = first;
    if (count == 2) who += " (and 1 other pod)";
    if (count > 2) who += " (and " + std::to_string(count - 1) + " other pods)";
    pod_warnings.push_back(who + ": " + reasons);
  }
  std::sort(pod_warnings.begin(), pod_warnings.end());
  std::vector<std::string> warnings = {
      "existing pods in namespace \"" + metadataName(namespace_object) +
      "\" violate the new PodSecurity enforce level \"" + enforce.text() + "\""};
  warnings.insert(warnings.end(), pod_warnings.begin(), pod_warnings.end());
  return warnings;
}

}  // namespace tandem::testing
