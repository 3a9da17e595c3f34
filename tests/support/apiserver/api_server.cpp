#include "tests/support/apiserver/api_server.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tests/support/apiserver/http_server.h"
#include "tests/support/apiserver/request_router.h"
#include "tests/support/apiserver/test_pki.h"
#include "tests/support/apiserver/yaml_json.h"

namespace tandem::testing {
namespace {

std::string readFile(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot read " + path.string());
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

class ApiServer::Impl {
 public:
  explicit Impl(ApiServerOptions options) : state(std::move(options)) {
    if (state.options.tls) state.pki = generateTestPki(state.options.certificate_ips);
    state.service.setDeploymentHook(
        [this](const nlohmann::json& deployment) { state.deployments.onSpecChange(deployment); });
    state.service.put(
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "default"}}}});
    http = std::make_unique<HttpServer>(
        [this](const HttpRequest& request, ResponseWriter& writer) {
          handleRequest(state, request, writer);
        },
        state.options.tls ? &state.pki : nullptr,
        [this](const HttpRequest& request) { logRequest(state, request); },
        state.options.listen_address);
  }

  ~Impl() {
    state.stopping = true;
    state.store.closeWatches();
    http->setStalled(false);
    http->stop();
  }

  ServerState state;
  std::unique_ptr<HttpServer> http;
};

ApiServer::ApiServer(ApiServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

ApiServer::~ApiServer() = default;

int ApiServer::port() const { return impl_->http->port(); }

std::string ApiServer::url() const {
  return std::string(impl_->state.options.tls ? "https" : "http") +
         "://127.0.0.1:" + std::to_string(port());
}

const TestPki& ApiServer::pki() const { return impl_->state.pki; }

std::filesystem::path ApiServer::writeKubeconfig(const std::filesystem::path& path,
                                                 const std::string& token,
                                                 const std::string& ns) const {
  nlohmann::json cluster = {{"server", url()}};
  if (impl_->state.options.tls) {
    cluster["certificate-authority-data"] = base64Encode(impl_->state.pki.ca_certificate);
  }
  nlohmann::json user = nlohmann::json::object();
  if (!token.empty()) user["token"] = token;
  nlohmann::json config = {
      {"apiVersion", "v1"},
      {"kind", "Config"},
      {"clusters", nlohmann::json::array({{{"name", "test"}, {"cluster", cluster}}})},
      {"users", nlohmann::json::array({{{"name", "test-user"}, {"user", user}}})},
      {"contexts",
       nlohmann::json::array(
           {{{"name", "test"},
             {"context", {{"cluster", "test"}, {"user", "test-user"}, {"namespace", ns}}}}})},
      {"current-context", "test"},
      {"preferences", nlohmann::json::object()}};
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream file(path, std::ios::trunc);
  // JSON is valid YAML, and every kubeconfig reader accepts it.
  file << config.dump(2) << "\n";
  if (!file) throw std::runtime_error("cannot write " + path.string());
  return path;
}

void ApiServer::registerCrds(const std::filesystem::path& file_or_directory) {
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(file_or_directory)) {
    for (const auto& entry : std::filesystem::directory_iterator(file_or_directory)) {
      std::string extension = entry.path().extension().string();
      if (extension == ".yaml" || extension == ".yml" || extension == ".json") {
        files.push_back(entry.path());
      }
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(file_or_directory);
  }
  for (const auto& file : files) {
    for (const nlohmann::json& document : yamlDocumentsToJson(readFile(file))) {
      if (document.value("kind", "") != "CustomResourceDefinition") continue;
      impl_->state.service.put(document);
    }
  }
}

std::optional<nlohmann::json> ApiServer::get(const std::string& api_version,
                                             const std::string& kind, const std::string& ns,
                                             const std::string& name) const {
  std::optional<KindInfo> info = impl_->state.registry.byKind(api_version, kind);
  if (!info) return std::nullopt;
  return impl_->state.store.get(resourceKey(*info), info->namespaced ? ns : "", name);
}

std::vector<nlohmann::json> ApiServer::list(const std::string& api_version, const std::string& kind,
                                            const std::string& ns) const {
  std::optional<KindInfo> info = impl_->state.registry.byKind(api_version, kind);
  if (!info) return {};
  return impl_->state.store.list(resourceKey(*info), info->namespaced ? ns : "").items;
}

nlohmann::json ApiServer::put(const nlohmann::json& object) {
  return impl_->state.service.put(object);
}

void ApiServer::remove(const std::string& api_version, const std::string& kind,
                       const std::string& ns, const std::string& name) {
  std::optional<KindInfo> info = impl_->state.registry.byKind(api_version, kind);
  if (!info) return;
  impl_->state.service.remove(*info, ns, name, nullptr, false);
}

void ApiServer::setTokens(std::vector<std::string> tokens) {
  std::lock_guard<std::mutex> lock(impl_->state.mutex);
  impl_->state.tokens = std::move(tokens);
}

std::map<std::string, uint64_t> ApiServer::writesByUser() const {
  std::lock_guard<std::mutex> lock(impl_->state.mutex);
  return impl_->state.writes_by_user;
}

uint64_t ApiServer::writesBy(const std::string& user) const {
  std::lock_guard<std::mutex> lock(impl_->state.mutex);
  auto it = impl_->state.writes_by_user.find(user);
  return it == impl_->state.writes_by_user.end() ? 0 : it->second;
}

std::vector<std::string> ApiServer::requestLog() const {
  std::lock_guard<std::mutex> lock(impl_->state.mutex);
  return impl_->state.request_log;
}

std::vector<RequestRecord> ApiServer::answeredRequests() const {
  std::lock_guard<std::mutex> lock(impl_->state.mutex);
  return impl_->state.answered;
}

void ApiServer::injectConflicts(int count, const std::string& kind) {
  impl_->state.service.injectConflicts(count, kind);
}

void ApiServer::compactHistory() { impl_->state.store.compact(); }

void ApiServer::closeWatches() { impl_->state.store.closeWatches(); }

void ApiServer::injectWatchesGone(int count) { impl_->state.watches_gone = count; }

void ApiServer::restartEmpty() { impl_->state.store.clear(); }

void ApiServer::setStalled(bool stalled) { impl_->http->setStalled(stalled); }

void ApiServer::setDeploymentControllerAuto(bool ready) { impl_->state.deployments.setAuto(ready); }

void ApiServer::setSchedulableReplicas(const std::string& ns, const std::string& deployment,
                                       std::optional<int64_t> pods) {
  impl_->state.deployments.setSchedulableReplicas(ns, deployment, pods);
}

void ApiServer::setPodIps(
    std::function<std::string(const std::string& ns, const std::string& pod)> ips) {
  impl_->state.deployments.setPodIps(std::move(ips));
}

void ApiServer::setPodsRunByKubelet() { impl_->state.deployments.setPodsRunByKubelet(); }

bool ApiServer::updatePodStatus(const nlohmann::json& pod) {
  std::optional<KindInfo> kind = impl_->state.registry.byKind("v1", "Pod");
  const nlohmann::json& metadata = pod.at("metadata");
  const std::string ns = metadata.value("namespace", "");
  const std::string name = metadata.value("name", "");
  WriteOptions options;
  options.field_manager = "kubelet";
  if (!impl_->state.service.update(*kind, ns, name, "status", pod, options).ok()) return false;
  impl_->state.deployments.podStatusChanged(pod);
  return true;
}

std::string ApiServer::serviceAccountToken(const std::string& ns, const std::string& name) {
  const nlohmann::json request = {{"apiVersion", "authentication.k8s.io/v1"},
                                  {"kind", "TokenRequest"},
                                  {"spec", {{"expirationSeconds", 86400}}}};
  ApiResult result =
      impl_->state.service_account_tokens.createToken(ns, name, "application/json", request.dump());
  if (!result.ok()) return "";
  return result.body.at("status").value("token", "");
}

void ApiServer::setDeploymentStatus(const std::string& ns, const std::string& name,
                                    int64_t replicas, int64_t updated, int64_t ready) {
  impl_->state.deployments.setStatus(ns, name, replicas, updated, ready);
}

uint64_t ApiServer::resourceVersion() const { return impl_->state.store.resourceVersion(); }

}  // namespace tandem::testing
