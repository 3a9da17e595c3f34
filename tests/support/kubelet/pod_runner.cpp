#include "tests/support/kubelet/pod_runner.h"

#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include "tests/support/apiserver/object_service.h"
#include "tests/support/apiserver/yaml_json.h"

namespace tandem::testing {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr const char* kRunnerLabel = "dev.tandem.test.kubelet";
constexpr const char* kServiceAccountPath = "/var/run/secrets/kubernetes.io/serviceaccount";
constexpr int kBackOffStartS = 10;
constexpr int kBackOffMaxS = 300;

// The condition `type` of `pod`'s status is True.
bool conditionTrue(const json& pod, const std::string& type) {
  for (const json& condition : pod.value("status", json::object()).value("conditions", json())) {
    if (condition.value("type", "") == type) return condition.value("status", "") == "True";
  }
  return false;
}

// Kubernetes' $(VAR) expansion of command, args and env values: a defined
// variable is replaced, an undefined one is left as written, $$ is a $.
std::string expand(const std::string& text, const std::map<std::string, std::string>& env) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) {
      out.push_back(text[i]);
      continue;
    }
    if (text[i + 1] == '$') {
      out.push_back('$');
      ++i;
      continue;
    }
    const size_t close = text[i + 1] == '(' ? text.find(')', i + 2) : std::string::npos;
    if (close == std::string::npos) {
      out.push_back('$');
      continue;
    }
    const std::string name = text.substr(i + 2, close - i - 2);
    auto found = env.find(name);
    out += found != env.end() ? found->second : text.substr(i, close - i + 1);
    i = close;
  }
  return out;
}

void writeFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  ::chmod(path.c_str(), 0644);
}

// A directory every container user may enter (tests' own are 0700).
void makeOpenDirectory(const fs::path& path, mode_t mode = 0755) {
  fs::create_directories(path);
  ::chmod(path.c_str(), mode);
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The last 80 lines or 2,048 bytes of `log`, whichever is less (the kubelet's
// FallbackToLogsOnError message).
std::string logTail(const std::string& log) {
  std::string tail = log.size() > 2048 ? log.substr(log.size() - 2048) : log;
  size_t lines = 0;
  for (size_t i = tail.size(); i-- > 0;) {
    if (tail[i] == '\n' && i + 1 < tail.size() && ++lines == 80) return tail.substr(i + 1);
  }
  return tail;
}

std::string nowText() { return timestampOf(std::chrono::system_clock::now()); }

// An entry of a pod's containerStatuses or initContainerStatuses.
json containerStatus(const json& spec, bool ready, int restarts, const json& state,
                     const json& last_terminated) {
  json status = {{"name", spec.value("name", "")},
                 {"image", spec.value("image", "")},
                 {"ready", ready},
                 {"restartCount", restarts},
                 {"state", state},
                 {"lastState", json::object()}};
  if (!last_terminated.is_null()) status["lastState"] = {{"terminated", last_terminated}};
  return status;
}

}  // namespace

struct PodRunner::Pod {
  std::string ns;
  std::string name;
  std::string uid;
  std::string container;  // the podman container's name
  std::string ip;
  json spec;
  std::string start_time;
  // Not startable (an unknown claim): the pod stays Pending, unscheduled.
  std::string unschedulable;
  bool created = false;   // the container exists on the engine
  bool ever_ran = false;  // phase Running from then on
  bool running = false;
  std::string started_at;
  std::string exit_seen;  // the finish time of the last exit handled
  int restarts = 0;
  int back_off_s = kBackOffStartS;
  Clock::time_point next_attempt{};
  bool pull_failed = false;
  std::string waiting_reason = "ContainerCreating";
  std::string waiting_message;
  json last_terminated;
  bool ready = false;
  bool probe_passed_once = false;
  int probe_failures = 0;
  Clock::time_point next_probe{};
  json written;  // the status last written
  // Init containers, run one at a time to completion before the first
  // container: the index of the one running or next (their count once all
  // completed), the statuses of those completed, and the current one's.
  size_t init_index = 0;
  json init_done = json::array();
  std::string init_container;  // its podman name while it exists, else ""
  bool init_running = false;
  std::string init_started_at;
  int init_restarts = 0;
  json init_last_terminated;
};

PodRunner::PodRunner(ApiServer& api, PodRunnerOptions options)
    : api_(api), options_(std::move(options)) {
  label_ = std::to_string(::getpid()) + "-" + randomText("abcdefghijklmnopqrstuvwxyz", 6);
  makeOpenDirectory(options_.work_dir);
  reapStale();
  if (options_.proxy_services) {
    chain_ = "TNDM-SVC-" + label_;
    iptables({"-N", chain_});
    for (const char* from : {"OUTPUT", "PREROUTING"}) iptables({"-I", from, "-j", chain_});
  }
  thread_ = std::thread([this] { loop(); });
}

PodRunner::~PodRunner() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  thread_.join();
  for (const auto& [key, pod] : pods_) {
    if (pod->created) podman({"rm", "--force", "--time", "5", pod->container});
  }
  if (!chain_.empty()) {
    for (const char* from : {"OUTPUT", "PREROUTING"}) iptables({"-D", from, "-j", chain_});
    iptables({"-F", chain_});
    iptables({"-X", chain_});
  }
}

namespace {

// The pid a label or chain name "<prefix><pid>-<id>" was made by, or 0.
pid_t ownerPid(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return 0;
  const std::string rest = name.substr(prefix.size());
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string::npos) return 0;
  for (size_t i = 0; i < dash; ++i) {
    if (rest[i] < '0' || rest[i] > '9') return 0;
  }
  return static_cast<pid_t>(std::stol(rest.substr(0, dash)));
}

bool processGone(pid_t pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

// Containers and NAT chains left by runners whose process died without
// cleaning up (a test killed at its timeout) are removed.
void PodRunner::reapStale() {
  const CommandResult listed =
      podman({"ps", "--all", "--filter", std::string("label=") + kRunnerLabel, "--format",
              std::string("{{.Names}} {{index .Labels \"") + kRunnerLabel + "\"}}"});
  std::istringstream containers(listed.out);
  for (std::string name, label; containers >> name >> label;) {
    if (processGone(ownerPid(label, ""))) podman({"rm", "--force", "--time", "0", name});
  }
  if (!options_.proxy_services) return;
  std::istringstream rules(iptables({"-S"}).out);
  for (std::string line; std::getline(rules, line);) {
    if (line.rfind("-N ", 0) != 0) continue;
    const std::string chain = line.substr(3);
    if (!processGone(ownerPid(chain, "TNDM-SVC-"))) continue;
    for (const char* from : {"OUTPUT", "PREROUTING"}) iptables({"-D", from, "-j", chain});
    iptables({"-F", chain});
    iptables({"-X", chain});
  }
}

CommandResult PodRunner::iptables(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"iptables", "-w", "-t", "nat"};
  argv.insert(argv.end(), args.begin(), args.end());
  return runToEnd(argv, options_.work_dir / "iptables.err", std::chrono::seconds(30));
}

CommandResult PodRunner::podman(const std::vector<std::string>& args,
                                std::chrono::milliseconds timeout) const {
  std::vector<std::string> argv = {"podman"};
  argv.insert(argv.end(), args.begin(), args.end());
  static std::atomic<int> calls{0};
  return runToEnd(argv, options_.work_dir / ("podman-" + std::to_string(++calls) + ".err"), timeout,
                  options_.engine_env);
}

std::string PodRunner::containerOf(const std::string& ns, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = pods_.find(ns + "/" + name);
  return found != pods_.end() && found->second->created ? found->second->container : "";
}

std::string PodRunner::logs(const std::string& ns, const std::string& name) const {
  const std::string container = containerOf(ns, name);
  if (container.empty()) return "(pod " + ns + "/" + name + " has no container)";
  const CommandResult result = podman({"logs", container}, std::chrono::seconds(30));
  return result.out + result.err;
}

std::vector<std::string> PodRunner::containers() const {
  const CommandResult listed =
      podman({"ps", "--all", "--filter", std::string("label=") + kRunnerLabel + "=" + label_,
              "--format", "{{.Names}}"});
  std::vector<std::string> names;
  std::string line;
  for (char c : listed.out) {
    if (c != '\n') {
      line.push_back(c);
    } else if (!line.empty()) {
      names.push_back(line);
      line.clear();
    }
  }
  if (!line.empty()) names.push_back(line);
  return names;
}

void PodRunner::loop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    pass();
    syncEndpointSlices(api_);
    if (!chain_.empty()) syncServiceRules();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

void PodRunner::pass() {
  // Pods the API holds: new ones admitted, deleted ones stopped.
  std::set<std::string> present;
  for (const json& pod : api_.list("v1", "Pod", "")) {
    const json& metadata = pod.at("metadata");
    const std::string key = metadata.value("namespace", "") + "/" + metadata.value("name", "");
    present.insert(key);
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = pods_.find(key);
      // A pod replaced under the same name is a new pod.
      known = found != pods_.end() && found->second->uid == metadata.value("uid", "");
    }
    if (!known) admit(pod);
  }
  std::vector<std::unique_ptr<Pod>> gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = pods_.begin(); it != pods_.end();) {
      if (present.count(it->first) == 0) {
        gone.push_back(std::move(it->second));
        it = pods_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& pod : gone) stop(*pod);

  // The engine's view of this runner's containers.
  const CommandResult listed =
      podman({"ps", "--all", "--filter", std::string("label=") + kRunnerLabel + "=" + label_,
              "--format", "json"});
  std::map<std::string, json> by_name;
  if (listed.exit_status == 0) {
    const json containers = json::parse(listed.out, nullptr, false);
    if (containers.is_array()) {
      for (const json& container : containers) {
        for (const json& name : container.value("Names", json::array())) {
          by_name[name.get<std::string>()] = container;
        }
      }
    }
  }
  std::vector<Pod*> pods;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, pod] : pods_) pods.push_back(pod.get());
  }
  for (Pod* pod : pods) {
    if (pod->unschedulable.empty()) {
      auto found = by_name.find(pod->container);
      observe(*pod, found != by_name.end() ? &found->second : nullptr);
    }
    writeStatus(*pod);
  }
}

void PodRunner::admit(const json& object) {
  auto pod = std::make_unique<Pod>();
  const json& metadata = object.at("metadata");
  pod->ns = metadata.value("namespace", "");
  pod->name = metadata.value("name", "");
  pod->uid = metadata.value("uid", "");
  pod->spec = object.value("spec", json::object());
  pod->start_time = nowText();
  pod->container = "k8s_" + pod->ns + "_" + pod->name + "_" + label_;
  // Volumes the scheduler must find: every claim bound.
  for (const json& volume : pod->spec.value("volumes", json::array())) {
    if (!volume.contains("persistentVolumeClaim")) continue;
    const std::string claim = volume["persistentVolumeClaim"].value("claimName", "");
    if (options_.claims.count(claim) == 0) {
      pod->unschedulable =
          "0/1 nodes are available: persistentvolumeclaim \"" + claim + "\" not found.";
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (pod->unschedulable.empty()) {
    pod->ip = options_.ip_prefix + std::to_string(next_ip_++);
  }
  pods_[pod->ns + "/" + pod->name] = std::move(pod);
}

namespace {

// A Secret's or ConfigMap's data as plain bytes per key; nullopt when it does not exist.
std::optional<std::map<std::string, std::string>> keyedData(ApiServer& api, const std::string& kind,
                                                            const std::string& ns,
                                                            const std::string& name) {
  std::optional<json> object = api.get("v1", kind, ns, name);
  if (!object) return std::nullopt;
  std::map<std::string, std::string> data;
  const json plain = object->value("data", json::object());
  for (const auto& [key, value] : plain.items()) {
    if (kind == "Secret") {
      bool ok = true;
      data[key] = base64Decode(value.get<std::string>(), ok);
    } else {
      data[key] = value.get<std::string>();
    }
  }
  if (kind == "ConfigMap") {
    const json binary = object->value("binaryData", json::object());
    for (const auto& [key, value] : binary.items()) {
      bool ok = true;
      data[key] = base64Decode(value.get<std::string>(), ok);
    }
  }
  return data;
}

std::string lowerKindName(const std::string& kind) {
  return kind == "Secret" ? "secret" : "configmap";
}

}  // namespace

bool PodRunner::start(Pod& pod, const json& container, const std::string& name) {
  const json& spec = pod.spec;
  const std::string image = container.value("image", "");
  auto fail = [&](const std::string& reason, const std::string& message) {
    pod.waiting_reason = reason;
    pod.waiting_message = message;
    pod.next_attempt = Clock::now() + std::chrono::seconds(pod.back_off_s);
    pod.back_off_s = std::min(pod.back_off_s * 2, kBackOffMaxS);
    return false;
  };

  // ---- environment ----
  std::map<std::string, std::string> env;
  std::vector<std::pair<std::string, std::string>> ordered;
  auto set = [&](const std::string& name, const std::string& value) {
    if (env.count(name) == 0) ordered.emplace_back(name, value);
    env[name] = value;
    for (auto& entry : ordered) {
      if (entry.first == name) entry.second = value;
    }
  };
  set("KUBERNETES_SERVICE_HOST", options_.api_host);
  set("KUBERNETES_SERVICE_PORT", std::to_string(options_.api_port));
  set("KUBERNETES_SERVICE_PORT_HTTPS", std::to_string(options_.api_port));
  for (const json& source : container.value("envFrom", json::array())) {
    const bool secret = source.contains("secretRef");
    const json& ref = secret ? source["secretRef"] : source.value("configMapRef", json::object());
    const std::string kind = secret ? "Secret" : "ConfigMap";
    auto data = keyedData(api_, kind, pod.ns, ref.value("name", ""));
    if (!data) {
      if (ref.value("optional", false)) continue;
      return fail("CreateContainerConfigError",
                  lowerKindName(kind) + " \"" + ref.value("name", "") + "\" not found");
    }
    for (const auto& [key, value] : *data) set(source.value("prefix", "") + key, value);
  }
  for (const json& variable : container.value("env", json::array())) {
    const std::string name = variable.value("name", "");
    if (variable.contains("value")) {
      set(name, expand(variable["value"].get<std::string>(), env));
      continue;
    }
    const json from = variable.value("valueFrom", json::object());
    if (from.contains("fieldRef")) {
      const std::string path = from["fieldRef"].value("fieldPath", "");
      std::map<std::string, std::string> fields = {
          {"metadata.name", pod.name},
          {"metadata.namespace", pod.ns},
          {"metadata.uid", pod.uid},
          {"spec.nodeName", options_.node_name},
          {"spec.serviceAccountName", spec.value("serviceAccountName", "default")},
          {"status.podIP", pod.ip},
          {"status.hostIP", options_.host_ip}};
      auto field = fields.find(path);
      if (field == fields.end()) {
        return fail("CreateContainerConfigError", "env " + name + ": fieldPath " + path +
                                                      " is not supported by the test kubelet");
      }
      set(name, field->second);
      continue;
    }
    const bool secret = from.contains("secretKeyRef");
    if (secret || from.contains("configMapKeyRef")) {
      const json& ref = secret ? from["secretKeyRef"] : from["configMapKeyRef"];
      const std::string kind = secret ? "Secret" : "ConfigMap";
      const std::string object = ref.value("name", "");
      const std::string key = ref.value("key", "");
      auto data = keyedData(api_, kind, pod.ns, object);
      if (!data || data->count(key) == 0) {
        if (ref.value("optional", false)) continue;
        return fail("CreateContainerConfigError",
                    !data
                        ? lowerKindName(kind) + " \"" + object + "\" not found"
                        : "couldn't find key " + key + " in " + kind + " " + pod.ns + "/" + object);
      }
      set(name, data->at(key));
      continue;
    }
    return fail("CreateContainerConfigError",
                "env " + name + ": this valueFrom is not supported by the test kubelet");
  }

  // ---- volumes ----
  const fs::path pod_dir = options_.work_dir / "pods" / pod.uid;
  makeOpenDirectory(pod_dir);
  std::map<std::string, json> volumes;
  for (const json& volume : spec.value("volumes", json::array())) {
    volumes[volume.value("name", "")] = volume;
  }
  std::vector<std::string> mounts;
  for (const json& mount : container.value("volumeMounts", json::array())) {
    const std::string volume_name = mount.value("name", "");
    const std::string path = mount.value("mountPath", "");
    bool read_only = mount.value("readOnly", false);
    auto found = volumes.find(volume_name);
    if (found == volumes.end()) {
      return fail("CreateContainerConfigError",
                  "volumeMount " + volume_name + ": no volume of that name in the pod");
    }
    const json& volume = found->second;
    fs::path source;
    if (volume.contains("emptyDir")) {
      if (volume["emptyDir"].value("medium", "") == "Memory") {
        mounts.push_back("--mount=type=tmpfs,destination=" + path + ",tmpfs-mode=1777");
        continue;
      }
      source = pod_dir / "volumes" / volume_name;
      makeOpenDirectory(source, 0777);
    } else if (volume.contains("hostPath")) {
      source = volume["hostPath"].value("path", "");
    } else if (volume.contains("persistentVolumeClaim")) {
      source = options_.claims.at(volume["persistentVolumeClaim"].value("claimName", ""));
      read_only = read_only || volume["persistentVolumeClaim"].value("readOnly", false);
    } else if (volume.contains("secret") || volume.contains("configMap")) {
      const bool secret = volume.contains("secret");
      const json& ref = secret ? volume["secret"] : volume["configMap"];
      const std::string object = ref.value(secret ? "secretName" : "name", "");
      auto data = keyedData(api_, secret ? "Secret" : "ConfigMap", pod.ns, object);
      if (!data) {
        return fail("ContainerCreating",
                    "MountVolume.SetUp failed for volume \"" + volume_name +
                        "\" : " + lowerKindName(secret ? "Secret" : "ConfigMap") + " \"" + object +
                        "\" not found");
      }
      source = pod_dir / "volumes" / volume_name;
      makeOpenDirectory(source);
      for (const auto& [key, bytes] : *data) writeFile(source / key, bytes);
      read_only = true;
    } else {
      return fail("CreateContainerConfigError",
                  "volume " + volume_name +
                      ": this volume type is not supported by the test "
                      "kubelet");
    }
    if (mount.contains("subPath")) {
      // The kubelet creates a missing subPath on the volume.
      source /= mount["subPath"].get<std::string>();
      if (!fs::exists(source)) makeOpenDirectory(source);
    }
    mounts.push_back("--volume=" + source.string() + ":" + path + (read_only ? ":ro" : ""));
  }
  if (spec.value("automountServiceAccountToken", true)) {
    const std::string account = spec.value("serviceAccountName", "default");
    if (account == "default" && !api_.get("v1", "ServiceAccount", pod.ns, account)) {
      // The ServiceAccount controller's: every namespace has "default".
      api_.put({{"apiVersion", "v1"},
                {"kind", "ServiceAccount"},
                {"metadata", {{"name", "default"}, {"namespace", pod.ns}}}});
    }
    const std::string token = api_.serviceAccountToken(pod.ns, account);
    if (token.empty()) {
      return fail("CreateContainerConfigError", "serviceaccount \"" + account + "\" not found");
    }
    const fs::path account_dir = pod_dir / "serviceaccount";
    makeOpenDirectory(account_dir);
    writeFile(account_dir / "token", token);
    writeFile(account_dir / "ca.crt", options_.ca_certificate);
    writeFile(account_dir / "namespace", pod.ns);
    mounts.push_back("--volume=" + account_dir.string() + ":" + kServiceAccountPath + ":ro");
  }

  // ---- the container ----
  std::vector<std::string> args = {"run",        "--detach",
                                   "--name",     name,
                                   "--hostname", pod.name,
                                   "--network",  options_.network,
                                   "--ip",       pod.ip,
                                   "--label",    std::string(kRunnerLabel) + "=" + label_,
                                   "--label",    "io.kubernetes.pod.name=" + pod.name,
                                   "--label",    "io.kubernetes.pod.namespace=" + pod.ns};
  const std::string policy = container.value("imagePullPolicy", "IfNotPresent");
  args.push_back(policy == "Always"  ? "--pull=always"
                 : policy == "Never" ? "--pull=never"
                                     : "--pull=missing");
  json security = spec.value("securityContext", json::object());
  const json container_security = container.value("securityContext", json::object());
  for (const auto& [key, value] : container_security.items()) {
    security[key] = value;
  }
  // The kubelet refuses a non-root policy it can see broken before the
  // start (an image running as root by name is not looked at here).
  if (security.value("runAsNonRoot", false) && security.value("runAsUser", int64_t{-1}) == 0) {
    return fail("CreateContainerConfigError",
                "container's runAsUser breaks non-root policy (pod: \"" + pod.name + "_" + pod.ns +
                    "(" + pod.uid + ")\", container: " + container.value("name", "") + ")");
  }
  // RuntimeDefault (and no profile) is podman's default seccomp filter, the
  // same lineage as containerd's and CRI-O's; Unconfined turns it off.
  const json seccomp = security.value("seccompProfile", json::object());
  if (seccomp.value("type", "") == "Unconfined")
    args.push_back("--security-opt=seccomp=unconfined");
  if (security.contains("runAsUser")) {
    std::string user = std::to_string(security["runAsUser"].get<int64_t>());
    if (security.contains("runAsGroup")) {
      user += ":" + std::to_string(security["runAsGroup"].get<int64_t>());
    }
    args.push_back("--user=" + user);
  }
  if (security.value("readOnlyRootFilesystem", false)) args.push_back("--read-only");
  if (security.contains("allowPrivilegeEscalation") &&
      !security["allowPrivilegeEscalation"].get<bool>()) {
    args.push_back("--security-opt=no-new-privileges");
  }
  const json capabilities = security.value("capabilities", json::object());
  for (const json& cap : capabilities.value("drop", json::array())) {
    args.push_back("--cap-drop=" + cap.get<std::string>());
  }
  for (const json& cap : capabilities.value("add", json::array())) {
    args.push_back("--cap-add=" + cap.get<std::string>());
  }
  for (const auto& [name, value] : ordered) args.push_back("--env=" + name + "=" + value);
  args.insert(args.end(), mounts.begin(), mounts.end());
  if (container.contains("command")) {
    json entrypoint = json::array();
    for (const json& part : container["command"]) {
      entrypoint.push_back(expand(part.get<std::string>(), env));
    }
    args.push_back("--entrypoint=" + entrypoint.dump());
  }
  args.push_back(image);
  for (const json& part : container.value("args", json::array())) {
    args.push_back(expand(part.get<std::string>(), env));
  }
  podman({"rm", "--force", name});
  const CommandResult run = podman(args, std::chrono::minutes(5));
  if (run.exit_status != 0) {
    const std::string error = trimmed(run.err);
    const std::string message =
        error.substr(error.rfind('\n') == std::string::npos ? 0 : error.rfind('\n') + 1);
    const bool pull = error.find("pull") != std::string::npos ||
                      error.find("image not known") != std::string::npos ||
                      error.find("initializing source") != std::string::npos ||
                      error.find("manifest unknown") != std::string::npos;
    if (pull) {
      // The first failure is ErrImagePull; while backing off, ImagePullBackOff.
      fail(pod.pull_failed ? "ImagePullBackOff" : "ErrImagePull",
           pod.pull_failed ? "Back-off pulling image \"" + image + "\"" : message);
      pod.pull_failed = true;
    } else {
      fail("RunContainerError", message);
    }
    return false;
  }
  pod.pull_failed = false;
  pod.waiting_reason.clear();
  pod.waiting_message.clear();
  return true;
}

// A container exited: the pod waits CrashLoopBackOff for the back-off, in
// the kubelet's words, and the next back-off doubles.
void crashLoopBackOff(PodRunner::Pod& pod, const std::string& container, Clock::time_point now) {
  pod.waiting_reason = "CrashLoopBackOff";
  pod.waiting_message = "back-off " + std::to_string(pod.back_off_s) +
                        "s restarting failed container=" + container + " pod=" + pod.name + "_" +
                        pod.ns + "(" + pod.uid + ")";
  pod.next_attempt = now + std::chrono::seconds(pod.back_off_s);
  pod.back_off_s = std::min(pod.back_off_s * 2, kBackOffMaxS);
}

void PodRunner::observeInit(Pod& pod, const json& init) {
  const Clock::time_point now = Clock::now();
  const std::string name = pod.container + "_init" + std::to_string(pod.init_index);
  if (pod.init_container.empty()) {
    if (now < pod.next_attempt) return;
    if (!start(pod, init, name)) return;
    pod.init_container = name;
    pod.init_started_at = nowText();
    return;
  }
  const CommandResult inspected =
      podman({"inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name});
  std::istringstream fields(inspected.out);
  std::string state;
  int exit_code = 0;
  fields >> state >> exit_code;
  pod.init_running = state == "running";
  if (state != "exited" && state != "stopped") return;
  json terminated = {{"exitCode", exit_code},
                     {"reason", exit_code == 0 ? "Completed" : "Error"},
                     {"startedAt", pod.init_started_at},
                     {"finishedAt", nowText()}};
  if (exit_code != 0 && init.value("terminationMessagePolicy", "File") == "FallbackToLogsOnError") {
    const CommandResult log = podman({"logs", name}, std::chrono::seconds(30));
    terminated["message"] = logTail(log.out + log.err);
  }
  podman({"rm", "--force", name});
  pod.init_container.clear();
  pod.init_running = false;
  if (exit_code == 0) {
    pod.init_done.push_back(containerStatus(
        init, true, pod.init_restarts, {{"terminated", terminated}}, pod.init_last_terminated));
    ++pod.init_index;
    pod.init_restarts = 0;
    pod.init_last_terminated = nullptr;
    pod.back_off_s = kBackOffStartS;
    pod.next_attempt = now;
    pod.waiting_reason = "PodInitializing";
    pod.waiting_message.clear();
    return;
  }
  // A failed init container is run again after the back-off, as the kubelet does.
  pod.init_last_terminated = terminated;
  ++pod.init_restarts;
  crashLoopBackOff(pod, init.value("name", ""), now);
}

void PodRunner::observe(Pod& pod, const json* container) {
  const Clock::time_point now = Clock::now();
  const json inits = pod.spec.value("initContainers", json::array());
  if (pod.init_index < inits.size()) {
    observeInit(pod, inits[pod.init_index]);
    return;
  }
  if (!pod.created) {
    if (now >= pod.next_attempt &&
        start(pod, pod.spec.value("containers", json::array()).at(0), pod.container)) {
      pod.created = true;
    }
    return;
  }
  if (container == nullptr) return;  // created a moment ago: not listed yet
  const std::string state = container->value("State", "");
  if (state == "running") {
    if (!pod.running) {
      pod.running = true;
      pod.ever_ran = true;
      pod.started_at = nowText();
      pod.waiting_reason.clear();
      pod.waiting_message.clear();
      pod.probe_passed_once = false;
      pod.probe_failures = 0;
      pod.next_probe = now;
    }
    probe(pod);
    return;
  }
  if (state != "exited" && state != "stopped") return;
  // An exit not handled yet: counted, kept as lastState, restarted after back-off.
  const std::string finished = container->value("StartedAt", json()).dump() + "/" +
                               container->value("ExitedAt", json()).dump();
  if (pod.exit_seen != finished) {
    pod.exit_seen = finished;
    const int exit_code = container->value("ExitCode", 0);
    const json container_spec = pod.spec.value("containers", json::array()).at(0);
    json terminated = {{"exitCode", exit_code},
                       {"reason", exit_code == 0 ? "Completed" : "Error"},
                       {"startedAt", pod.started_at},
                       {"finishedAt", nowText()}};
    if (exit_code != 0 &&
        container_spec.value("terminationMessagePolicy", "File") == "FallbackToLogsOnError") {
      const CommandResult log = podman({"logs", pod.container}, std::chrono::seconds(30));
      terminated["message"] = logTail(log.out + log.err);
    }
    pod.last_terminated = terminated;
    pod.running = false;
    pod.ready = false;
    if (pod.ever_ran) ++pod.restarts;
    crashLoopBackOff(pod, container_spec.value("name", ""), now);
    return;
  }
  if (now >= pod.next_attempt) {
    const CommandResult started = podman({"start", pod.container});
    if (started.exit_status != 0) pod.waiting_message = trimmed(started.err);
  }
}

void PodRunner::probe(Pod& pod) {
  const Clock::time_point now = Clock::now();
  const json container = pod.spec.value("containers", json::array()).at(0);
  if (!container.contains("readinessProbe")) {
    pod.ready = true;
    return;
  }
  if (now < pod.next_probe) return;
  const json probe = container["readinessProbe"];
  const json get = probe.value("httpGet", json::object());
  int port = 0;
  const json& wanted = get.value("port", json(0));
  if (wanted.is_number_integer()) {
    port = wanted.get<int>();
  } else {
    for (const json& declared : container.value("ports", json::array())) {
      if (declared.value("name", "") == wanted.get<std::string>()) {
        port = declared.value("containerPort", 0);
      }
    }
  }
  httplib::Client client(pod.ip, port);
  client.set_connection_timeout(1, 0);
  client.set_read_timeout(probe.value("timeoutSeconds", 1), 0);
  auto answer = client.Get(get.value("path", "/"));
  const bool passed = answer && answer->status >= 200 && answer->status < 400;
  if (passed) {
    pod.probe_failures = 0;
    pod.ready = true;
    pod.probe_passed_once = true;
  } else if (++pod.probe_failures >= probe.value("failureThreshold", 3) || !pod.probe_passed_once) {
    pod.ready = false;
  }
  // Until it first passes, every pass (so tests do not wait out a period).
  pod.next_probe =
      pod.probe_passed_once ? now + std::chrono::seconds(probe.value("periodSeconds", 10)) : now;
}

void PodRunner::writeStatus(Pod& pod) {
  const json container_spec = pod.spec.value("containers", json::array()).at(0);
  json status;
  if (!pod.unschedulable.empty()) {
    status = {{"phase", "Pending"},
              {"conditions", json::array({{{"type", "PodScheduled"},
                                           {"status", "False"},
                                           {"reason", "Unschedulable"},
                                           {"message", pod.unschedulable}}})}};
  } else {
    auto condition = [](const char* type, bool value) {
      return json{{"type", type}, {"status", value ? "True" : "False"}};
    };
    // running since `started_at`, else waiting with the pod's reason.
    auto stateOf = [&](bool running, const std::string& started_at) -> json {
      if (running) return {{"running", {{"startedAt", started_at}}}};
      json waiting = {{"reason", pod.waiting_reason}};
      if (!pod.waiting_message.empty()) waiting["message"] = pod.waiting_message;
      return {{"waiting", waiting}};
    };
    const json inits = pod.spec.value("initContainers", json::array());
    const bool initialized = pod.init_index >= inits.size();
    const json state = !initialized && !pod.running
                           ? json{{"waiting", {{"reason", "PodInitializing"}}}}
                           : stateOf(pod.running, pod.started_at);
    json container_status =
        containerStatus(container_spec, pod.ready, pod.restarts, state, pod.last_terminated);
    container_status["started"] = pod.running;
    json init_statuses = pod.init_done;
    if (!initialized) {
      init_statuses.push_back(containerStatus(inits[pod.init_index], false, pod.init_restarts,
                                              stateOf(pod.init_running, pod.init_started_at),
                                              pod.init_last_terminated));
      for (size_t i = pod.init_index + 1; i < inits.size(); ++i) {
        init_statuses.push_back(containerStatus(
            inits[i], false, 0, {{"waiting", {{"reason", "PodInitializing"}}}}, nullptr));
      }
    }
    status = {
        {"phase", pod.ever_ran ? "Running" : "Pending"},
        {"hostIP", options_.host_ip},
        {"podIP", pod.ip},
        {"podIPs", json::array({{{"ip", pod.ip}}})},
        {"startTime", pod.start_time},
        {"conditions",
         json::array({condition("PodScheduled", true), condition("Initialized", initialized),
                      condition("ContainersReady", pod.ready), condition("Ready", pod.ready)})},
        {"containerStatuses", json::array({container_status})}};
    if (!inits.empty()) status["initContainerStatuses"] = init_statuses;
  }
  if (status == pod.written) return;
  std::optional<json> current = api_.get("v1", "Pod", pod.ns, pod.name);
  if (!current || current->at("metadata").value("uid", "") != pod.uid) return;
  // Transition times change only with the condition's status.
  json updated = *current;
  json stamped = status;
  for (json& condition : stamped["conditions"]) {
    std::string since = nowText();
    for (const json& old :
         current->value("status", json::object()).value("conditions", json::array())) {
      if (old.value("type", "") == condition.value("type", "") &&
          old.value("status", "") == condition.value("status", "")) {
        since = old.value("lastTransitionTime", since);
      }
    }
    condition["lastTransitionTime"] = since;
  }
  updated["status"] = stamped;
  if (api_.updatePodStatus(updated)) pod.written = status;
}

void PodRunner::stop(const Pod& pod) {
  if (!pod.init_container.empty()) podman({"rm", "--force", pod.init_container});
  if (!pod.created) return;
  const int64_t grace = pod.spec.value("terminationGracePeriodSeconds", int64_t{30});
  podman({"rm", "--force", "--time", std::to_string(grace), pod.container},
         std::chrono::seconds(grace + 60));
}

void PodRunner::syncEndpointSlices(ApiServer& api) {
  for (const json& service : api.list("v1", "Service", "")) {
    const json& metadata = service.at("metadata");
    const std::string ns = metadata.value("namespace", "");
    const std::string name = metadata.value("name", "");
    const json selector = service.value("spec", json::object()).value("selector", json::object());
    if (selector.empty()) continue;  // endpoints kept by hand
    std::vector<json> selected;
    for (const json& pod : api.list("v1", "Pod", ns)) {
      const json labels = pod.at("metadata").value("labels", json::object());
      bool match = true;
      for (const auto& [key, value] : selector.items()) {
        match = match && labels.value(key, "") == value.get<std::string>();
      }
      const std::string ip = pod.value("status", json::object()).value("podIP", "");
      if (match && !ip.empty()) selected.push_back(pod);
    }
    std::sort(selected.begin(), selected.end(), [](const json& a, const json& b) {
      return a["metadata"].value("name", "") < b["metadata"].value("name", "");
    });
    json endpoints = json::array();
    for (const json& pod : selected) {
      const bool ready = conditionTrue(pod, "Ready");
      endpoints.push_back(
          {{"addresses", json::array({pod["status"].value("podIP", "")})},
           {"conditions", {{"ready", ready}, {"serving", ready}, {"terminating", false}}},
           {"nodeName", pod["spec"].value("nodeName", "node-0")},
           {"targetRef",
            {{"kind", "Pod"},
             {"namespace", ns},
             {"name", pod["metadata"].value("name", "")},
             {"uid", pod["metadata"].value("uid", "")}}}});
    }
    // Ports: a named targetPort is the selected pods' container port of that name.
    json ports = json::array();
    for (const json& port : service.value("spec", json::object()).value("ports", json::array())) {
      const json target = port.value("targetPort", port.value("port", json(0)));
      int number = target.is_number_integer() ? target.get<int>() : 0;
      if (!target.is_number_integer()) {
        for (const json& pod : selected) {
          for (const json& container : pod["spec"].value("containers", json::array())) {
            for (const json& declared : container.value("ports", json::array())) {
              if (declared.value("name", "") == target.get<std::string>()) {
                number = declared.value("containerPort", 0);
              }
            }
          }
        }
      }
      if (number == 0) continue;
      json entry = {{"port", number}, {"protocol", port.value("protocol", "TCP")}};
      if (port.contains("name")) entry["name"] = port["name"];
      ports.push_back(entry);
    }
    const std::string slice_name = endpointSliceName(service);
    std::optional<json> existing = api.get("discovery.k8s.io/v1", "EndpointSlice", ns, slice_name);
    // As Kubernetes' EndpointSlice controller: the Service's labels, then
    // the reserved ones.
    json slice_labels = metadata.value("labels", json::object());
    slice_labels["kubernetes.io/service-name"] = name;
    slice_labels["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io";
    if (existing && existing->value("endpoints", json::array()) == endpoints &&
        existing->value("ports", json::array()) == ports &&
        existing->at("metadata").value("labels", json::object()) == slice_labels) {
      continue;
    }
    json slice = {{"apiVersion", "discovery.k8s.io/v1"},
                  {"kind", "EndpointSlice"},
                  {"metadata",
                   {{"name", slice_name},
                    {"namespace", ns},
                    {"labels", slice_labels},
                    {"ownerReferences", json::array({{{"apiVersion", "v1"},
                                                      {"kind", "Service"},
                                                      {"name", name},
                                                      {"uid", metadata.value("uid", "")},
                                                      {"controller", true},
                                                      {"blockOwnerDeletion", true}}})}}},
                  {"addressType", "IPv4"},
                  {"endpoints", endpoints},
                  {"ports", ports}};
    api.put(slice);
  }
}

}  // namespace tandem::testing

namespace tandem::testing {

std::string PodRunner::endpointSliceName(const json& service) {
  const json& metadata = service.at("metadata");
  return metadata.value("name", "") + "-" +
         std::to_string(std::hash<std::string>{}(metadata.value("uid", "")) % 100000);
}

// kube-proxy's iptables rules for traffic to a Service: per port, the i-th
// of n ready endpoints taken with probability 1/(n-i), the last always.
void PodRunner::syncServiceRules() {
  std::string rules = "*nat\n:" + chain_ + " - [0:0]\n";
  for (const json& service : api_.list("v1", "Service", "")) {
    const json spec = service.value("spec", json::object());
    const std::string cluster_ip = spec.value("clusterIP", "");
    if (cluster_ip.empty() || cluster_ip == "None") continue;
    std::optional<json> slice =
        api_.get("discovery.k8s.io/v1", "EndpointSlice", service["metadata"].value("namespace", ""),
                 endpointSliceName(service));
    if (!slice) continue;
    std::vector<std::string> ready;
    for (const json& endpoint : slice->value("endpoints", json::array())) {
      if (endpoint.value("conditions", json::object()).value("ready", false)) {
        ready.push_back(endpoint["addresses"][0].get<std::string>());
      }
    }
    for (const json& port : spec.value("ports", json::array())) {
      int target = 0;
      for (const json& slice_port : slice->value("ports", json::array())) {
        if (slice_port.value("name", "") == port.value("name", "")) {
          target = slice_port.value("port", 0);
        }
      }
      if (target == 0) continue;
      const std::string match = "-A " + chain_ + " -d " + cluster_ip +
                                "/32 -p tcp -m tcp --dport " +
                                std::to_string(port.value("port", 0));
      for (size_t i = 0; i < ready.size(); ++i) {
        std::string rule = match;
        if (i + 1 < ready.size()) {
          rule += " -m statistic --mode random --probability " +
                  std::to_string(1.0 / static_cast<double>(ready.size() - i));
        }
        rules +=
            rule + " -j DNAT --to-destination " + ready[i] + ":" + std::to_string(target) + "\n";
      }
    }
  }
  rules += "COMMIT\n";
  if (rules == rules_) return;
  const fs::path file = options_.work_dir / "service-rules";
  writeFile(file, rules);
  const CommandResult restored =
      runToEnd({"iptables-restore", "-w", "--noflush", file.string()},
               options_.work_dir / "iptables-restore.err", std::chrono::seconds(30));
  if (restored.exit_status == 0) rules_ = rules;
}

}  // namespace tandem::testing
