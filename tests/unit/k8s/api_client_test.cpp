// ApiClient against the in-process test API server (CRUD, list paging, patch,
// apply, watch, TLS, tokens, timeouts), and against a scripted HTTP server for
// what the API server does not do on request (error bodies that are not JSON,
// 5xx and 429 answers, chunk boundaries inside a watch event).
#include "operator/k8s/api_client.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/apiserver/api_server.h"
#include "tests/support/test_files.h"
#include "tests/unit/k8s/scripted_http_server.h"

namespace tandem::k8s {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace fs = std::filesystem;
using asio::ip::tcp;
using nlohmann::json;
using scripted::answer;
using scripted::chunk;
using scripted::kChunkedHeader;
using scripted::ScriptedReply;
using scripted::ScriptedServer;
using ::tandem::testing::writeFile;
using testing::ApiServer;
using testing::ApiServerOptions;

const ResourceType kConfigMaps{"", "v1", "configmaps", "ConfigMap"};

// Fast retries, so that tests of retried failures finish quickly.
RetryPolicy quickRetries(int attempts = 3) {
  return RetryPolicy{attempts, std::chrono::milliseconds(5), std::chrono::milliseconds(20)};
}

ClusterConfig configFor(const ApiServer& server, const std::string& token = "test-token") {
  ClusterConfig config;
  config.server = server.url();
  config.token = token;
  if (server.url().rfind("https://", 0) == 0) {
    config.certificate_authority_pem = server.pki().ca_certificate;
  }
  config.source = "test";
  config.connect_timeout_s = 5;
  config.request_timeout_s = 10;
  return config;
}

json configMap(const std::string& name, const json& data, const json& labels = json::object()) {
  return json{{"apiVersion", "v1"},
              {"kind", "ConfigMap"},
              {"metadata", {{"name", name}, {"namespace", "default"}, {"labels", labels}}},
              {"data", data}};
}

size_t countMatching(const std::vector<std::string>& log, const std::string& prefix,
                     const std::string& part = "") {
  size_t count = 0;
  for (const auto& line : log) {
    if (line.rfind(prefix, 0) == 0 && line.find(part) != std::string::npos) ++count;
  }
  return count;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The next event of a watch that is not a BOOKMARK.
Result<std::optional<WatchEvent>> nextChange(WatchStream& watch) {
  while (true) {
    auto event = watch.next();
    if (!event.isOk() || !event.value() || event.value()->type != "BOOKMARK") return event;
  }
}

// Polls `condition` until it holds or a generous deadline passes (the server
// may count a write just after it has answered it).
bool eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::path(::testing::TempDir()) / "api-client-XXXXXX").string();
    EXPECT_NE(mkdtemp(pattern.data()), nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---------------------------------------------------------------------------
// Against the test API server.

class ApiClientTest : public ::testing::Test {
 protected:
  ApiServer server_;
  ApiClient client_{configFor(server_), quickRetries()};
};

TEST_F(ApiClientTest, CreateGetUpdateAndStaleUpdateConflicts) {
  auto created = client_.create(kConfigMaps, "default", configMap("settings", {{"a", "1"}}));
  ASSERT_TRUE(created.isOk()) << created.error().toString();
  const std::string first_version = created->at("metadata").at("resourceVersion");

  auto read = client_.get(kConfigMaps, "default", "settings");
  ASSERT_TRUE(read.isOk()) << read.error().toString();
  EXPECT_EQ(read->at("data"), (json{{"a", "1"}}));

  json changed = read.value();
  changed["data"]["a"] = "2";
  auto updated = client_.update(kConfigMaps, "default", changed);
  ASSERT_TRUE(updated.isOk()) << updated.error().toString();
  EXPECT_NE(updated->at("metadata").at("resourceVersion"), first_version);
  EXPECT_EQ(server_.get("v1", "ConfigMap", "default", "settings")->at("data").at("a"), "2");

  // `changed` still carries the first resourceVersion.
  changed["data"]["a"] = "3";
  auto stale = client_.update(kConfigMaps, "default", changed);
  ASSERT_FALSE(stale.isOk());
  EXPECT_EQ(stale.error().code, 409);
  EXPECT_EQ(stale.error().reason, "Conflict");
  EXPECT_TRUE(stale.error().isConflict());
  EXPECT_FALSE(stale.error().message.empty());
  EXPECT_EQ(server_.get("v1", "ConfigMap", "default", "settings")->at("data").at("a"), "2");
}

TEST_F(ApiClientTest, CreateOfAnExistingObjectIsAlreadyExists) {
  ASSERT_TRUE(client_.create(kConfigMaps, "default", configMap("twice", {})).isOk());
  auto again = client_.create(kConfigMaps, "default", configMap("twice", {}));
  ASSERT_FALSE(again.isOk());
  EXPECT_EQ(again.error().code, 409);
  EXPECT_TRUE(again.error().isAlreadyExists()) << again.error().toString();
  EXPECT_FALSE(again.error().isConflict());
}

TEST_F(ApiClientTest, GetOfAMissingObjectIsNotFoundAndNotRetried) {
  const uint64_t before = client_.requestCount();
  auto missing = client_.get(kConfigMaps, "default", "nothing-here");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.error().code, 404);
  EXPECT_EQ(missing.error().reason, "NotFound");
  EXPECT_TRUE(missing.error().isNotFound());
  EXPECT_TRUE(contains(missing.error().message, "nothing-here")) << missing.error().message;
  EXPECT_EQ(client_.requestCount() - before, 1u);
}

TEST_F(ApiClientTest, ReadModifyWriteRetriesConflicts) {
  server_.put(configMap("counter", {{"n", "0"}}));
  server_.injectConflicts(2, "ConfigMap");
  int calls = 0;
  auto written = client_.readModifyWrite(kConfigMaps, "default", "counter", [&](json& object) {
    ++calls;
    object["data"]["n"] = "1";
    return true;
  });
  ASSERT_TRUE(written.isOk()) << written.error().toString();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(written->at("data").at("n"), "1");
  EXPECT_EQ(server_.get("v1", "ConfigMap", "default", "counter")->at("data").at("n"), "1");
  EXPECT_EQ(
      countMatching(server_.requestLog(), "PUT /api/v1/namespaces/default/configmaps/counter"), 3u);
}

TEST_F(ApiClientTest, ReadModifyWriteGivesUpAfterTheConfiguredAttempts) {
  server_.put(configMap("contended", {{"n", "0"}}));
  server_.injectConflicts(10, "ConfigMap");
  auto written = client_.readModifyWrite(kConfigMaps, "default", "contended", [](json& object) {
    object["data"]["n"] = "1";
    return true;
  });
  ASSERT_FALSE(written.isOk());
  EXPECT_TRUE(written.error().isConflict()) << written.error().toString();
  EXPECT_EQ(countMatching(server_.requestLog(), "PUT /api/v1/namespaces/default/configmaps/"), 3u);
}

TEST_F(ApiClientTest, ReadModifyWriteWithNothingToChangeWritesNothing) {
  server_.put(configMap("steady", {{"n", "5"}}));
  auto result =
      client_.readModifyWrite(kConfigMaps, "default", "steady", [](json&) { return false; });
  ASSERT_TRUE(result.isOk()) << result.error().toString();
  EXPECT_EQ(result->at("data").at("n"), "5");
  EXPECT_EQ(countMatching(server_.requestLog(), "PUT "), 0u);
}

TEST_F(ApiClientTest, ListFollowsContinueAcrossPages) {
  for (int i = 0; i < 5; ++i) {
    server_.put(configMap("item-" + std::to_string(i), {{"i", std::to_string(i)}},
                          {{"app", "tandem"}, {"tier", i % 2 == 0 ? "even" : "odd"}}));
  }
  server_.put(configMap("other", {}, {{"app", "unrelated"}}));
  ListOptions options;
  options.limit = 2;
  options.label_selector = "app=tandem";
  auto listed = client_.list(kConfigMaps, "default", options);
  ASSERT_TRUE(listed.isOk()) << listed.error().toString();
  std::vector<std::string> names;
  for (const auto& item : listed->at("items")) names.push_back(item["metadata"]["name"]);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"item-0", "item-1", "item-2", "item-3", "item-4"}));
  EXPECT_FALSE(listed->at("metadata").at("resourceVersion").get<std::string>().empty());
  EXPECT_FALSE(listed->at("metadata").contains("continue"));
  // Three pages, each with the selector URL-encoded and the page size.
  EXPECT_EQ(countMatching(server_.requestLog(), "GET /api/v1/namespaces/default/configmaps?",
                          "labelSelector=app%3Dtandem"),
            3u);

  options.label_selector = "app=tandem,tier=odd";
  auto odd = client_.list(kConfigMaps, "default", options);
  ASSERT_TRUE(odd.isOk()) << odd.error().toString();
  EXPECT_EQ(odd->at("items").size(), 2u);
}

TEST_F(ApiClientTest, ListPageReturnsOnePageAndItsContinueToken) {
  for (int i = 0; i < 3; ++i) server_.put(configMap("page-" + std::to_string(i), {}));
  ListOptions options;
  options.limit = 2;
  auto first = client_.listPage(kConfigMaps, "default", options, "");
  ASSERT_TRUE(first.isOk()) << first.error().toString();
  EXPECT_EQ(first->at("items").size(), 2u);
  const std::string token = first->at("metadata").value("continue", "");
  ASSERT_FALSE(token.empty());
  auto second = client_.listPage(kConfigMaps, "default", options, token);
  ASSERT_TRUE(second.isOk()) << second.error().toString();
  EXPECT_EQ(second->at("items").size(), 1u);
}

TEST_F(ApiClientTest, MergePatchChangesOnlyThePatchedFields) {
  server_.put(configMap("patched", {{"keep", "yes"}, {"change", "old"}}));
  auto patched = client_.mergePatch(kConfigMaps, "default", "patched",
                                    {{"data", {{"change", "new"}, {"added", "1"}}}});
  ASSERT_TRUE(patched.isOk()) << patched.error().toString();
  EXPECT_EQ(server_.get("v1", "ConfigMap", "default", "patched")->at("data"),
            (json{{"keep", "yes"}, {"change", "new"}, {"added", "1"}}));
}

TEST_F(ApiClientTest, ApplyCreatesThenUpdatesWithTheFieldManager) {
  auto created = client_.apply(kConfigMaps, "default", configMap("applied", {{"v", "1"}}));
  ASSERT_TRUE(created.isOk()) << created.error().toString();
  auto updated = client_.apply(kConfigMaps, "default", configMap("applied", {{"v", "2"}}));
  ASSERT_TRUE(updated.isOk()) << updated.error().toString();
  EXPECT_EQ(server_.get("v1", "ConfigMap", "default", "applied")->at("data").at("v"), "2");
  EXPECT_EQ(
      countMatching(server_.requestLog(), "PATCH /api/v1/namespaces/default/configmaps/applied",
                    "fieldManager=tandem-operator&force=true"),
      2u);
}

TEST_F(ApiClientTest, RemoveDeletesAndNotFoundCountsAsDone) {
  server_.put(configMap("doomed", {}));
  ASSERT_TRUE(client_.remove(kConfigMaps, "default", "doomed").isOk());
  EXPECT_FALSE(server_.get("v1", "ConfigMap", "default", "doomed").has_value());
  auto again = client_.remove(kConfigMaps, "default", "doomed");
  EXPECT_TRUE(again.isOk()) << again.error().toString();
  EXPECT_EQ(
      countMatching(server_.requestLog(), "DELETE /api/v1/namespaces/default/configmaps/doomed"),
      2u);
}

TEST_F(ApiClientTest, GetPathReadsDiscovery) {
  auto version = client_.getPath("/version");
  ASSERT_TRUE(version.isOk()) << version.error().toString();
  EXPECT_TRUE(version->contains("gitVersion")) << version->dump();
}

TEST_F(ApiClientTest, WatchSeesAddedModifiedDeletedInOrder) {
  auto listed = client_.list(kConfigMaps, "default");
  ASSERT_TRUE(listed.isOk()) << listed.error().toString();
  WatchOptions options;
  options.resource_version = listed->at("metadata").at("resourceVersion");
  auto watch = client_.watch(kConfigMaps, "default", options);
  ASSERT_TRUE(watch.isOk()) << watch.error().toString();

  auto created = client_.create(kConfigMaps, "default", configMap("watched", {{"v", "1"}}));
  ASSERT_TRUE(created.isOk()) << created.error().toString();
  ASSERT_TRUE(
      client_.mergePatch(kConfigMaps, "default", "watched", {{"data", {{"v", "2"}}}}).isOk());
  ASSERT_TRUE(client_.remove(kConfigMaps, "default", "watched").isOk());

  std::vector<std::pair<std::string, std::string>> seen;
  for (int i = 0; i < 3; ++i) {
    auto event = nextChange(*watch.value());
    ASSERT_TRUE(event.isOk()) << event.error().toString();
    ASSERT_TRUE(event.value().has_value());
    seen.emplace_back(event.value()->type, event.value()->object["metadata"]["name"]);
    if (event.value()->type == "MODIFIED") {
      EXPECT_EQ(event.value()->object["data"]["v"], "2");
    }
  }
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, std::string>>{
                      {"ADDED", "watched"}, {"MODIFIED", "watched"}, {"DELETED", "watched"}}));
  EXPECT_EQ(countMatching(server_.requestLog(), "GET /api/v1/namespaces/default/configmaps?watch=1",
                          "allowWatchBookmarks=true&timeoutSeconds=300"),
            1u);
}

TEST_F(ApiClientTest, CompactedHistoryEndsTheWatchWithGone) {
  WatchOptions options;
  options.resource_version = std::to_string(server_.resourceVersion());
  auto watch = client_.watch(kConfigMaps, "default", options);
  ASSERT_TRUE(watch.isOk()) << watch.error().toString();
  server_.compactHistory();
  auto event = nextChange(*watch.value());
  ASSERT_FALSE(event.isOk());
  EXPECT_TRUE(event.error().isGone()) << event.error().toString();
  EXPECT_EQ(event.error().code, 410);
}

TEST_F(ApiClientTest, WatchFromACompactedVersionIsGone) {
  const std::string old_version = std::to_string(server_.resourceVersion());
  server_.put(configMap("after", {}));
  server_.compactHistory();
  WatchOptions options;
  options.resource_version = old_version;
  auto watch = client_.watch(kConfigMaps, "default", options);
  if (watch.isOk()) {
    // Some servers answer 200 and then send the 410 as an ERROR event.
    auto event = nextChange(*watch.value());
    ASSERT_FALSE(event.isOk());
    EXPECT_TRUE(event.error().isGone()) << event.error().toString();
  } else {
    EXPECT_TRUE(watch.error().isGone()) << watch.error().toString();
  }
}

TEST_F(ApiClientTest, ClosedWatchEndsWithoutError) {
  WatchOptions options;
  options.resource_version = std::to_string(server_.resourceVersion());
  auto watch = client_.watch(kConfigMaps, "default", options);
  ASSERT_TRUE(watch.isOk()) << watch.error().toString();
  server_.closeWatches();
  auto event = nextChange(*watch.value());
  ASSERT_TRUE(event.isOk()) << event.error().toString();
  EXPECT_FALSE(event.value().has_value());
}

TEST_F(ApiClientTest, CancelUnblocksAWaitingWatch) {
  WatchOptions options;
  options.resource_version = std::to_string(server_.resourceVersion());
  options.allow_bookmarks = false;
  auto watch = client_.watch(kConfigMaps, "default", options);
  ASSERT_TRUE(watch.isOk()) << watch.error().toString();
  WatchStream& stream = *watch.value();
  auto waiting = std::async(std::launch::async, [&] { return stream.next(); });
  stream.cancel();
  // A hang here is the failure; the bound only keeps the suite from hanging.
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  auto result = waiting.get();
  ASSERT_TRUE(result.isOk()) << result.error().toString();
  EXPECT_FALSE(result.value().has_value());
}

TEST_F(ApiClientTest, StalledServerTimesOutNamingTheUrl) {
  ClusterConfig config = configFor(server_);
  config.request_timeout_s = 0.3;
  ApiClient client(config, quickRetries(1));
  server_.setStalled(true);
  auto result = client.get(kConfigMaps, "default", "anything");
  server_.setStalled(false);
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().code, 0);
  EXPECT_EQ(result.error().reason, "Timeout");
  EXPECT_TRUE(contains(result.error().message,
                       "GET " + server_.url() + "/api/v1/namespaces/default/configmaps/anything"))
      << result.error().message;
  EXPECT_TRUE(contains(result.error().message, "no answer within 0.3 s")) << result.error().message;
}

// ---------------------------------------------------------------------------
// Authentication.

TEST(ApiClientAuthTest, WrongTokenIsUnauthorizedWithTheServersMessage) {
  ApiServerOptions options;
  options.tokens = {"right"};
  ApiServer server(options);
  ApiClient client(configFor(server, "wrong"), quickRetries());
  auto result = client.get(kConfigMaps, "default", "x");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().code, 401);
  EXPECT_EQ(result.error().reason, "Unauthorized");
  EXPECT_FALSE(result.error().message.empty());
  EXPECT_EQ(client.requestCount(), 1u);  // a 401 without a token file is not retried
}

TEST(ApiClientAuthTest, RotatedTokenFileIsReadAgainWithoutRestart) {
  TempDir dir;
  const fs::path token_file = dir.path() / "token";
  writeFile(token_file, "token-a\n");
  ApiServerOptions options;
  options.tokens = {"token-b-rotated"};
  ApiServer server(options);
  ClusterConfig config = configFor(server, "");
  config.token_file = token_file;
  ApiClient client(config, quickRetries());

  // The file's token is refused: the client reads the file again once, then reports the 401.
  auto refused = client.get(kConfigMaps, "default", "x");
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().code, 401);
  EXPECT_EQ(client.requestCount(), 2u);

  writeFile(token_file, "token-b-rotated\n");
  auto missing = client.get(kConfigMaps, "default", "x");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.error().code, 404) << missing.error().toString();
  EXPECT_EQ(server.writesBy("token-b-rotated"), 0u);
  ASSERT_TRUE(client.create(kConfigMaps, "default", configMap("by-b", {})).isOk());
  EXPECT_TRUE(eventually([&] { return server.writesBy("token-b-rotated") == 1u; }));
}

TEST(ApiClientAuthTest, UnreadableTokenFileIsAConfigError) {
  ApiServer server;
  ClusterConfig config = configFor(server, "");
  config.token_file = "/nonexistent/dir/token";
  ApiClient client(config, quickRetries());
  auto result = client.get(kConfigMaps, "default", "x");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().reason, "ConfigError");
  EXPECT_TRUE(contains(result.error().message, "/nonexistent/dir/token")) << result.error().message;
  EXPECT_EQ(client.requestCount(), 0u);
}

// ---------------------------------------------------------------------------
// TLS.

class ApiClientTlsTest : public ::testing::Test {
 protected:
  static ApiServerOptions tlsOptions() {
    ApiServerOptions options;
    options.tls = true;
    options.tokens = {"tls-token"};
    return options;
  }
  ApiServer server_{tlsOptions()};
};

TEST_F(ApiClientTlsTest, TestCaFromAKubeconfigWorks) {
  TempDir dir;
  const fs::path kubeconfig = server_.writeKubeconfig(dir.path() / "config", "tls-token", "tls-ns");
  const ClusterConfig config = loadKubeconfig(kubeconfig);
  EXPECT_EQ(config.default_namespace, "tls-ns");
  ApiClient client(config, quickRetries());
  auto created = client.create(kConfigMaps, "default", configMap("over-tls", {{"a", "b"}}));
  ASSERT_TRUE(created.isOk()) << created.error().toString();
  EXPECT_TRUE(eventually([&] { return server_.writesBy("tls-token") == 1u; }));
}

TEST_F(ApiClientTlsTest, WrongCaIsATlsErrorNamingTheServer) {
  ApiServerOptions other_options;
  other_options.tls = true;
  ApiServer other(other_options);  // a second, unrelated test CA
  ClusterConfig config = configFor(server_, "tls-token");
  config.certificate_authority_pem = other.pki().ca_certificate;
  ApiClient client(config, quickRetries(1));
  auto result = client.get(kConfigMaps, "default", "x");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().code, 0);
  EXPECT_EQ(result.error().reason, "TLSError");
  EXPECT_TRUE(contains(result.error().message, server_.url())) << result.error().message;
  EXPECT_TRUE(contains(result.error().message, "certificate")) << result.error().message;
}

TEST_F(ApiClientTlsTest, ServerNameNotInTheCertificateIsATlsError) {
  ClusterConfig config = configFor(server_, "tls-token");
  config.tls_server_name = "not-this-server.example";
  ApiClient client(config, quickRetries(1));
  auto result = client.get(kConfigMaps, "default", "x");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().reason, "TLSError");
  EXPECT_TRUE(contains(result.error().message, "not-this-server.example"))
      << result.error().message;
}

TEST_F(ApiClientTlsTest, InsecureSkipTlsVerifyWorksWithoutTheCa) {
  ClusterConfig config = configFor(server_, "tls-token");
  config.certificate_authority_pem.clear();
  config.insecure_skip_tls_verify = true;
  ApiClient client(config, quickRetries(1));
  auto missing = client.get(kConfigMaps, "default", "x");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.error().code, 404) << missing.error().toString();
}

TEST_F(ApiClientTlsTest, ClientCertificateAuthenticates) {
  ClusterConfig config = configFor(server_, "");
  config.client_certificate_pem = server_.pki().client_certificate;
  config.client_key_pem = server_.pki().client_key;
  ApiClient client(config, quickRetries());
  ASSERT_TRUE(client.create(kConfigMaps, "default", configMap("by-cert", {})).isOk());
  EXPECT_TRUE(eventually([&] { return server_.writesBy("test-client") == 1u; }));
}

TEST_F(ApiClientTlsTest, HttpsWatchStreamsEvents) {
  ApiClient client(configFor(server_, "tls-token"), quickRetries());
  WatchOptions options;
  options.resource_version = std::to_string(server_.resourceVersion());
  auto watch = client.watch(kConfigMaps, "default", options);
  ASSERT_TRUE(watch.isOk()) << watch.error().toString();
  server_.put(configMap("tls-watched", {}));
  auto event = nextChange(*watch.value());
  ASSERT_TRUE(event.isOk()) << event.error().toString();
  ASSERT_TRUE(event.value().has_value());
  EXPECT_EQ(event.value()->type, "ADDED");
  EXPECT_EQ(event.value()->object["metadata"]["name"], "tls-watched");
}

TEST(ApiClientConfigTest, BadCaPemIsAConfigError) {
  ClusterConfig config;
  config.server = "https://127.0.0.1:1";
  config.certificate_authority_pem = "not a certificate";
  config.source = "kubeconfig /x (context c)";
  ApiClient client(config, quickRetries());
  auto result = client.getPath("/version");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().reason, "ConfigError");
  EXPECT_TRUE(contains(result.error().message, "kubeconfig /x")) << result.error().message;
  EXPECT_EQ(client.requestCount(), 0u);
}

TEST(ApiClientConfigTest, BadServerUrlIsAConfigError) {
  ClusterConfig config;
  config.server = "ftp://somewhere";
  config.source = "test";
  ApiClient client(config, quickRetries());
  auto result = client.getPath("/version");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().reason, "ConfigError");
  EXPECT_TRUE(contains(result.error().message, "ftp://somewhere")) << result.error().message;
}

TEST(ApiClientConfigTest, BackoffDelayIsJitteredAndCapped) {
  using std::chrono::milliseconds;
  for (int i = 0; i < 50; ++i) {
    const auto first = backoffDelay(0, milliseconds(100), milliseconds(1000));
    EXPECT_GE(first.count(), 50);
    EXPECT_LE(first.count(), 100);
    const auto third = backoffDelay(2, milliseconds(100), milliseconds(1000));
    EXPECT_GE(third.count(), 200);
    EXPECT_LE(third.count(), 400);
    const auto late = backoffDelay(30, milliseconds(100), milliseconds(1000));
    EXPECT_GE(late.count(), 500);
    EXPECT_LE(late.count(), 1000);
  }
}

// ---------------------------------------------------------------------------
// Against a scripted HTTP server: answers chosen per request.

ClusterConfig plainConfig(const std::string& url) {
  ClusterConfig config;
  config.server = url;
  config.token = "scripted-token";
  config.source = "test";
  config.connect_timeout_s = 5;
  config.request_timeout_s = 10;
  return config;
}

TEST(ApiClientScriptedTest, RequestsCarryTheHeadersAndEncodedQuery) {
  ScriptedServer server([](const auto&) {
    return ScriptedReply{answer(200, "OK", R"({"kind":"ConfigMapList","items":[]})")};
  });
  ApiClient client(plainConfig(server.url()), quickRetries());
  ListOptions options;
  options.label_selector = "app in (a,b),tier!=x";
  ASSERT_TRUE(client.listPage(kConfigMaps, "ns1", options, "").isOk());
  ASSERT_TRUE(client.apply(kConfigMaps, "ns1", configMap("applied", {})).isOk());
  ASSERT_TRUE(client.remove(kConfigMaps, "ns1", "gone").isOk());
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 3u);

  EXPECT_EQ(requests[0].method_string(), "GET");
  EXPECT_EQ(requests[0].target(),
            "/api/v1/namespaces/ns1/configmaps?labelSelector=app%20in%20%28a%2Cb%29%2Ctier%21%3Dx");
  EXPECT_EQ(requests[0][http::field::authorization], "Bearer scripted-token");
  EXPECT_EQ(requests[0][http::field::accept], "application/json");
  EXPECT_EQ(requests[0][http::field::user_agent], "tandem-operator");

  EXPECT_EQ(requests[1].method_string(), "PATCH");
  EXPECT_EQ(requests[1].target(),
            "/api/v1/namespaces/ns1/configmaps/applied?fieldManager=tandem-operator&force=true");
  EXPECT_EQ(requests[1][http::field::content_type], "application/apply-patch+yaml");
  EXPECT_EQ(json::parse(requests[1].body()), configMap("applied", {}));

  EXPECT_EQ(requests[2].method_string(), "DELETE");
  EXPECT_EQ(requests[2].target(), "/api/v1/namespaces/ns1/configmaps/gone");
  EXPECT_EQ(
      json::parse(requests[2].body()),
      (json{{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"propagationPolicy", "Background"}}));
}

TEST(ApiClientScriptedTest, ListRestartsOnceWhenTheContinueTokenExpired) {
  std::atomic<int> expired_answers{0};
  ScriptedServer server([&](const http::request<http::string_body>& request) {
    const std::string target(request.target());
    if (target.find("continue=token-1") == std::string::npos) {
      return ScriptedReply{answer(200, "OK",
                                  R"({"kind":"ConfigMapList","metadata":)"
                                  R"({"resourceVersion":"10","continue":"token-1"},)"
                                  R"("items":[{"metadata":{"name":"a"}}]})")};
    }
    if (expired_answers++ == 0) {
      return ScriptedReply{answer(410, "Gone",
                                  R"({"kind":"Status","code":410,"reason":"Expired",)"
                                  R"("message":"continue token expired"})")};
    }
    return ScriptedReply{answer(200, "OK",
                                R"({"kind":"ConfigMapList","metadata":)"
                                R"({"resourceVersion":"11"},)"
                                R"("items":[{"metadata":{"name":"b"}}]})")};
  });
  ApiClient client(plainConfig(server.url()), quickRetries());
  ListOptions options;
  options.limit = 1;
  auto listed = client.list(kConfigMaps, "default", options);
  ASSERT_TRUE(listed.isOk()) << listed.error().toString();
  EXPECT_EQ(listed->at("items"),
            json::parse(R"([{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}])"));
  EXPECT_EQ(listed->at("metadata"), (json{{"resourceVersion", "10"}}));
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(requests[1].target(), "/api/v1/namespaces/default/configmaps?limit=1&continue=token-1");
}

TEST(ApiClientScriptedTest, ErrorBodyThatIsNotJsonKeepsTheStatusLine) {
  ScriptedServer server([](const auto&) {
    return ScriptedReply{answer(403, "Forbidden", "proxy says no\n", "", "text/plain")};
  });
  ApiClient client(plainConfig(server.url()), quickRetries());
  auto result = client.getPath("/version");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().code, 403);
  EXPECT_EQ(result.error().reason, "Forbidden");
  EXPECT_EQ(result.error().message, "proxy says no");
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST(ApiClientScriptedTest, ServerErrorsAreRetriedThenSucceed) {
  std::atomic<int> calls{0};
  ScriptedServer server([&](const auto&) {
    if (calls++ < 2) {
      return ScriptedReply{answer(
          503, "Service Unavailable",
          R"({"kind":"Status","code":503,"reason":"ServiceUnavailable","message":"etcd busy"})")};
    }
    return ScriptedReply{answer(200, "OK", R"({"gitVersion":"v1.32.0"})")};
  });
  ApiClient client(plainConfig(server.url()), quickRetries(3));
  auto result = client.getPath("/version");
  ASSERT_TRUE(result.isOk()) << result.error().toString();
  EXPECT_EQ(result->at("gitVersion"), "v1.32.0");
  EXPECT_EQ(server.requests().size(), 3u);
  EXPECT_EQ(client.requestCount(), 3u);
}

TEST(ApiClientScriptedTest, ServerErrorsGiveUpAfterTheAttemptsWithTheLastStatus) {
  ScriptedServer server([](const auto&) {
    return ScriptedReply{
        answer(500, "Internal Server Error",
               R"({"kind":"Status","code":500,"reason":"InternalError","message":"boom"})")};
  });
  ApiClient client(plainConfig(server.url()), quickRetries(2));
  auto result = client.getPath("/version");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().toString(), "500 InternalError: boom");
  EXPECT_EQ(server.requests().size(), 2u);
}

// A RetryGate that closes stops the retries of its thread's calls: the
// controller's write fence sends no new try once a replica lost its Lease.
TEST(ApiClientScriptedTest, AClosedRetryGateStopsTheRetries) {
  std::atomic<int> calls{0};
  ScriptedServer server([&](const auto&) {
    ++calls;
    return ScriptedReply{answer(
        503, "Service Unavailable",
        R"({"kind":"Status","code":503,"reason":"ServiceUnavailable","message":"etcd busy"})")};
  });
  ApiClient client(plainConfig(server.url()), quickRetries(4));
  {
    // Open for the first try's retry only.
    RetryGate gate([&] { return calls.load() < 2; });
    auto result = client.getPath("/version");
    ASSERT_FALSE(result.isOk());
    EXPECT_EQ(result.error().code, 503);
    EXPECT_EQ(server.requests().size(), 2u);
  }
  // Without a gate (the thread's gate gone with its scope): every attempt.
  ASSERT_FALSE(client.getPath("/version").isOk());
  EXPECT_EQ(server.requests().size(), 6u);
}

TEST(ApiClientScriptedTest, TooManyRequestsHonoursRetryAfter) {
  std::atomic<int> calls{0};
  ScriptedServer server([&](const auto&) {
    if (calls++ == 0) {
      return ScriptedReply{
          answer(429, "Too Many Requests",
                 R"({"kind":"Status","code":429,"reason":"TooManyRequests","message":"slow down"})",
                 "Retry-After: 1\r\n")};
    }
    return ScriptedReply{answer(200, "OK", "{}")};
  });
  ApiClient client(plainConfig(server.url()), quickRetries(3));
  auto result = client.getPath("/version");
  ASSERT_TRUE(result.isOk()) << result.error().toString();
  EXPECT_EQ(server.requests().size(), 2u);
}

TEST(ApiClientScriptedTest, TokenFileChangeIsPickedUpBeforeTheCall) {
  TempDir dir;
  const fs::path token_file = dir.path() / "token";
  writeFile(token_file, "first");
  std::mutex mutex;
  std::string accepted = "first";
  ScriptedServer server([&](const http::request<http::string_body>& request) {
    std::lock_guard lock(mutex);
    if (request[http::field::authorization] != "Bearer " + accepted) {
      return ScriptedReply{answer(401, "Unauthorized",
                                  R"({"kind":"Status","code":401,"reason":"Unauthorized",)"
                                  R"("message":"Unauthorized"})")};
    }
    return ScriptedReply{answer(200, "OK", "{}")};
  });
  ClusterConfig config = plainConfig(server.url());
  config.token.clear();
  config.token_file = token_file;
  ApiClient client(config, quickRetries());
  ASSERT_TRUE(client.getPath("/version").isOk());
  {
    std::lock_guard lock(mutex);
    accepted = "second-and-longer";
  }
  writeFile(token_file, "second-and-longer\n");
  ASSERT_TRUE(client.getPath("/version").isOk());
  // The size changed, so the new token went out at once: no 401 in between.
  EXPECT_EQ(server.requests().size(), 2u);
}

TEST(ApiClientScriptedTest, UnansweredConnectionTimesOut) {
  ScriptedServer server([](const auto&) { return ScriptedReply{"", true}; });
  ClusterConfig config = plainConfig(server.url());
  config.request_timeout_s = 0.2;
  ApiClient client(config, quickRetries(2));
  auto result = client.get(kConfigMaps, "default", "slow");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().reason, "Timeout");
  EXPECT_EQ(result.error().message, "GET " + server.url() +
                                        "/api/v1/namespaces/default/configmaps/slow: no answer "
                                        "within 0.2 s");
  EXPECT_EQ(server.requests().size(), 2u);  // a timeout is transient: retried
}

TEST(ApiClientScriptedTest, RefusedConnectionIsConnectionFailed) {
  unsigned short port = 0;
  {
    asio::io_context ioc;
    tcp::acceptor probe(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = probe.local_endpoint().port();
  }
  ApiClient client(plainConfig("http://127.0.0.1:" + std::to_string(port)), quickRetries(1));
  auto result = client.getPath("/version");
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().code, 0);
  EXPECT_EQ(result.error().reason, "ConnectionFailed");
  EXPECT_TRUE(contains(result.error().message, "127.0.0.1:" + std::to_string(port)))
      << result.error().message;
}

TEST(ApiClientScriptedTest, WatchEventsSplitAcrossChunksAreReassembled) {
  const std::string added = R"({"type":"ADDED","object":{"metadata":{"name":"a"}}})";
  const std::string modified = R"({"type":"MODIFIED","object":{"metadata":{"name":"a"}}})";
  const std::string error =
      R"({"type":"ERROR","object":{"kind":"Status","code":500,"message":"internal"}})";
  ScriptedServer server([&](const auto&) {
    std::string body = kChunkedHeader + chunk(added.substr(0, 10)) +
                       chunk(added.substr(10) + "\n" + modified.substr(0, 5)) +
                       chunk(modified.substr(5) + "\n") + chunk(error + "\n") + "0\r\n\r\n";
    return ScriptedReply{body};
  });
  ApiClient client(plainConfig(server.url()), quickRetries());
  auto watch = client.watch(kConfigMaps, "default", WatchOptions{});
  ASSERT_TRUE(watch.isOk()) << watch.error().toString();
  std::vector<std::string> types;
  while (true) {
    auto event = watch.value()->next();
    ASSERT_TRUE(event.isOk()) << event.error().toString();
    if (!event.value()) break;
    types.push_back(event.value()->type);
  }
  // An ERROR event other than 410 is an event like the others.
  EXPECT_EQ(types, (std::vector<std::string>{"ADDED", "MODIFIED", "ERROR"}));
}

TEST(ApiClientScriptedTest, WatchErrorEventWith410IsGone) {
  ScriptedServer server([](const auto&) {
    return ScriptedReply{
        kChunkedHeader +
        chunk(R"({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired",)"
              R"json("message":"too old resource version: 5 (20)"}})json"
              "\n") +
        "0\r\n\r\n"};
  });
  ApiClient client(plainConfig(server.url()), quickRetries());
  auto watch = client.watch(kConfigMaps, "default", WatchOptions{});
  ASSERT_TRUE(watch.isOk()) << watch.error().toString();
  auto event = watch.value()->next();
  ASSERT_FALSE(event.isOk());
  EXPECT_EQ(event.error().toString(), "410 Expired: too old resource version: 5 (20)");
}

TEST(ApiClientScriptedTest, WatchRefusedIsAnApiError) {
  ScriptedServer server([](const auto&) {
    return ScriptedReply{answer(
        403, "Forbidden",
        R"({"kind":"Status","code":403,"reason":"Forbidden","message":"cannot watch configmaps"})")};
  });
  ApiClient client(plainConfig(server.url()), quickRetries());
  auto watch = client.watch(kConfigMaps, "default", WatchOptions{});
  ASSERT_FALSE(watch.isOk());
  EXPECT_EQ(watch.error().toString(), "403 Forbidden: cannot watch configmaps");
}

TEST(ApiClientScriptedTest, CancelUnblocksAWatchWithNoEvents) {
  ScriptedServer server([](const auto&) {
    return ScriptedReply{kChunkedHeader + chunk(R"({"type":"BOOKMARK","object":{}})"
                                                "\n"),
                         true};
  });
  ApiClient client(plainConfig(server.url()), quickRetries());
  auto watch = client.watch(kConfigMaps, "default", WatchOptions{});
  ASSERT_TRUE(watch.isOk()) << watch.error().toString();
  WatchStream& stream = *watch.value();
  auto first = stream.next();
  ASSERT_TRUE(first.isOk()) << first.error().toString();
  ASSERT_TRUE(first.value().has_value());
  EXPECT_EQ(first.value()->type, "BOOKMARK");
  auto waiting = std::async(std::launch::async, [&] { return stream.next(); });
  stream.cancel();
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  auto result = waiting.get();
  ASSERT_TRUE(result.isOk()) << result.error().toString();
  EXPECT_FALSE(result.value().has_value());
}

}  // namespace
}  // namespace tandem::k8s
