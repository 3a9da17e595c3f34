// Informer against the in-process API server: paged initial list, watch
// events, watch restarts from the last resourceVersion, and relist with a
// diff after the server forgets its history (410 Gone).
#include "operator/k8s/informer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/apiserver/api_server.h"

namespace tandem::k8s {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const ResourceType kConfigMaps{"", "v1", "configmaps", "ConfigMap"};
constexpr char kNamespace[] = "informer-test";

bool waitUntil(const std::function<bool()>& condition, seconds timeout = seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

nlohmann::json configMap(const std::string& name, const std::string& value,
                         const std::string& ns = kNamespace) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"data", {{"value", value}}}};
}

std::string versionOf(const nlohmann::json& object) {
  return object["metadata"].value("resourceVersion", "");
}

struct Seen {
  EventType type;
  std::string key;
  std::string resource_version;
  std::string value;
};

// Records the handler's calls.
class Recorder {
 public:
  Informer::Handler handler() {
    return [this](EventType type, const nlohmann::json& object) {
      std::lock_guard<std::mutex> lock(mutex_);
      std::string value;
      if (object.contains("data")) value = object["data"].value("value", "");
      events_.push_back({type, objectKey(object), versionOf(object), value});
    };
  }
  std::vector<Seen> events() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_.size();
  }
  bool sawEvent(EventType type, const std::string& key, const std::string& value = "") const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& event : events_) {
      if (event.type == type && event.key == key && (value.empty() || event.value == value)) {
        return true;
      }
    }
    return false;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Seen> events_;
};

class InformerTest : public ::testing::Test {
 protected:
  InformerTest() : server_(serverOptions()), client_(clusterConfig(server_)) {
    server_.put(
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNamespace}}}});
    server_.put(
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "elsewhere"}}}});
  }

  static testing::ApiServerOptions serverOptions() {
    testing::ApiServerOptions options;
    options.bookmark_interval_ms = 100;
    return options;
  }
  static ClusterConfig clusterConfig(const testing::ApiServer& server) {
    ClusterConfig config;
    config.server = server.url();
    config.source = "informer test";
    return config;
  }
  static InformerOptions informerOptions() {
    InformerOptions options;
    options.ns = kNamespace;
    options.list_page_size = 2;
    options.watch_timeout_seconds = 60;
    return options;
  }

  // name -> resourceVersion, of the server's objects and of the informer's cache.
  std::map<std::string, std::string> serverVersions() const {
    std::map<std::string, std::string> versions;
    for (const auto& object : server_.list("v1", "ConfigMap", kNamespace)) {
      versions[objectKey(object)] = versionOf(object);
    }
    return versions;
  }
  static std::map<std::string, std::string> cacheVersions(const Informer& informer) {
    std::map<std::string, std::string> versions;
    for (const auto& object : informer.list()) versions[objectKey(object)] = versionOf(object);
    return versions;
  }

  // The server's request log, for failure messages.
  std::string requestLogText() const {
    std::string text;
    for (const auto& line : server_.requestLog()) text += line + "\n";
    return text;
  }

  // A request log line or target of a watch of the ConfigMaps.
  static bool isConfigMapWatch(const std::string& text) {
    return text.find("/configmaps?") != std::string::npos &&
           text.find("watch=") != std::string::npos;
  }
  // Watches whose stream started (the server answered 200).
  size_t openedWatches() const {
    size_t count = 0;
    for (const auto& record : server_.answeredRequests()) {
      count += isConfigMapWatch(record.target) && record.status == 200;
    }
    return count;
  }
  size_t watchRequests() const {
    size_t count = 0;
    for (const auto& line : server_.requestLog()) count += isConfigMapWatch(line);
    return count;
  }
  size_t listRequests() const {
    size_t count = 0;
    for (const auto& line : server_.requestLog()) {
      if (line.rfind("GET ", 0) == 0 && line.find("/configmaps") != std::string::npos &&
          line.find("watch=") == std::string::npos) {
        count++;
      }
    }
    return count;
  }

  testing::ApiServer server_;
  ApiClient client_;
  Recorder recorder_;
};

TEST(ObjectKeyTest, NamespacedAndClusterScoped) {
  EXPECT_EQ(objectKey({{"metadata", {{"namespace", "ns"}, {"name", "a"}}}}), "ns/a");
  EXPECT_EQ(objectKey({{"metadata", {{"name", "node-1"}}}}), "node-1");
  EXPECT_EQ(objectKey(nlohmann::json::object()), "");
}

TEST_F(InformerTest, InitialPagedListFillsTheCacheAndSyncs) {
  for (int i = 0; i < 5; ++i) server_.put(configMap("cm-" + std::to_string(i), "v"));
  server_.put(configMap("not-mine", "v", "elsewhere"));

  Informer informer(client_, kConfigMaps, informerOptions(), recorder_.handler());
  EXPECT_FALSE(informer.hasSynced());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(milliseconds(20000)));

  EXPECT_EQ(informer.list().size(), 5u);
  EXPECT_EQ(cacheVersions(informer), serverVersions());
  auto cached = informer.get(std::string(kNamespace) + "/cm-3");
  ASSERT_TRUE(cached.has_value());
  EXPECT_EQ((*cached)["data"]["value"], "v");
  EXPECT_EQ((*cached)["kind"], "ConfigMap");
  EXPECT_EQ((*cached)["apiVersion"], "v1");
  EXPECT_FALSE(informer.get("elsewhere/not-mine").has_value());

  // The handler saw each object added once, before hasSynced().
  auto events = recorder_.events();
  ASSERT_EQ(events.size(), 5u);
  for (const auto& event : events) EXPECT_EQ(event.type, EventType::kAdded) << event.key;

  // Five objects in pages of two: three list requests, the later ones with a continue token.
  size_t pages = 0;
  size_t continued = 0;
  for (const auto& line : server_.requestLog()) {
    if (line.find("/configmaps?") == std::string::npos ||
        line.find("watch=") != std::string::npos) {
      continue;
    }
    if (line.find("limit=2") != std::string::npos) pages++;
    if (line.find("continue=") != std::string::npos) continued++;
  }
  EXPECT_EQ(pages, 3u) << requestLogText();
  EXPECT_EQ(continued, 2u) << requestLogText();
  informer.stop();
}

TEST_F(InformerTest, WatchEventsReachTheHandlerAndTheCache) {
  server_.put(configMap("existing", "1"));
  Informer informer(client_, kConfigMaps, informerOptions(), recorder_.handler());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(milliseconds(20000)));
  const std::string key = std::string(kNamespace) + "/";

  server_.put(configMap("fresh", "1"));
  ASSERT_TRUE(waitUntil([&] { return recorder_.sawEvent(EventType::kAdded, key + "fresh"); }));
  ASSERT_TRUE(informer.get(key + "fresh").has_value());

  server_.put(configMap("existing", "2"));
  ASSERT_TRUE(
      waitUntil([&] { return recorder_.sawEvent(EventType::kModified, key + "existing", "2"); }));
  EXPECT_EQ((*informer.get(key + "existing"))["data"]["value"], "2");

  server_.remove("v1", "ConfigMap", kNamespace, "fresh");
  ASSERT_TRUE(waitUntil([&] { return recorder_.sawEvent(EventType::kDeleted, key + "fresh"); }));
  EXPECT_FALSE(informer.get(key + "fresh").has_value());
  EXPECT_EQ(cacheVersions(informer), serverVersions());

  auto events = recorder_.events();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].type, EventType::kAdded);  // the initial list
  EXPECT_EQ(events[1].type, EventType::kAdded);
  EXPECT_EQ(events[2].type, EventType::kModified);
  EXPECT_EQ(events[3].type, EventType::kDeleted);
  EXPECT_EQ(informer.relists(), 0u);
}

TEST_F(InformerTest, ClosedWatchIsResumedFromTheLastVersion) {
  server_.put(configMap("a", "1"));
  Informer informer(client_, kConfigMaps, informerOptions(), recorder_.handler());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(milliseconds(20000)));
  // Open, not just sent: a watch read but not yet handled when the server
  // stalls below would be held, not closed, and the informer would wait
  // for its answer until its own timeout.
  ASSERT_TRUE(waitUntil([&] { return openedWatches() >= 1; })) << requestLogText();
  const size_t lists_before = listRequests();

  // Hold new requests so that the change below is made while no watch is open.
  server_.setStalled(true);
  ASSERT_TRUE(waitUntil([&] {
    server_.closeWatches();
    return informer.watchRestarts() >= 1;
  }));
  server_.put(configMap("a", "2"));
  server_.put(configMap("b", "1"));
  server_.setStalled(false);

  const std::string key = std::string(kNamespace) + "/";
  ASSERT_TRUE(waitUntil([&] { return recorder_.sawEvent(EventType::kModified, key + "a", "2"); }));
  ASSERT_TRUE(waitUntil([&] { return recorder_.sawEvent(EventType::kAdded, key + "b"); }));
  EXPECT_EQ(cacheVersions(informer), serverVersions());
  EXPECT_GE(informer.watchRestarts(), 1u);
  EXPECT_GE(watchRequests(), 2u);
  // Resumed by watching from the last version, not by listing again.
  EXPECT_EQ(informer.relists(), 0u);
  EXPECT_EQ(listRequests(), lists_before);
}

TEST_F(InformerTest, RelistAfterGoneReportsExactlyWhatChanged) {
  server_.put(configMap("keep", "1"));
  server_.put(configMap("change", "1"));
  server_.put(configMap("drop", "1"));
  Informer informer(client_, kConfigMaps, informerOptions(), recorder_.handler());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(milliseconds(20000)));
  const std::string key = std::string(kNamespace) + "/";
  const std::string dropped_version = versionOf(*informer.get(key + "drop"));
  // A change seen through the watch shows that the watch is open.
  server_.put(configMap("keep", "2"));
  ASSERT_TRUE(waitUntil([&] { return recorder_.sawEvent(EventType::kModified, key + "keep"); }));
  ASSERT_EQ(recorder_.size(), 4u);

  // The changes are made while the informer's next request is held, after
  // the server has forgotten the history its watch would resume from.
  server_.setStalled(true);
  server_.compactHistory();
  server_.put(configMap("added", "1"));
  server_.put(configMap("change", "2"));
  server_.remove("v1", "ConfigMap", kNamespace, "drop");
  server_.setStalled(false);

  ASSERT_TRUE(waitUntil([&] { return informer.relists() >= 1; }));
  ASSERT_TRUE(waitUntil([&] { return cacheVersions(informer) == serverVersions(); }));
  // A later change flushes out any extra event the relist may have produced.
  server_.put(configMap("sentinel", "1"));
  ASSERT_TRUE(waitUntil([&] { return recorder_.sawEvent(EventType::kAdded, key + "sentinel"); }));

  auto events = recorder_.events();
  ASSERT_EQ(events.size(), 8u);
  std::map<std::string, Seen> changes;
  for (size_t i = 4; i < 7; ++i) changes[events[i].key] = events[i];
  ASSERT_EQ(changes.size(), 3u);
  ASSERT_TRUE(changes.count(key + "added"));
  ASSERT_TRUE(changes.count(key + "change"));
  ASSERT_TRUE(changes.count(key + "drop"));
  EXPECT_EQ(changes[key + "added"].type, EventType::kAdded);
  EXPECT_EQ(changes[key + "change"].type, EventType::kModified);
  EXPECT_EQ(changes[key + "change"].value, "2");
  EXPECT_EQ(changes[key + "drop"].type, EventType::kDeleted);
  // The deleted object is passed as last known.
  EXPECT_EQ(changes[key + "drop"].resource_version, dropped_version);
  EXPECT_EQ(events[7].key, key + "sentinel");
  EXPECT_EQ(cacheVersions(informer), serverVersions());
}

// A server restarted on a fresh store has not reached the informer's last
// version: it answers the watch "Too large resource version" (504), and the
// informer lists again from its newest state, as client-go's reflector does;
// retrying the watch from that version would keep a stale cache for good.
TEST_F(InformerTest, AServerRestartedWithAFreshHistoryIsListedAgain) {
  for (const char* name : {"a", "b", "c", "d"}) server_.put(configMap(name, "1"));
  Informer informer(client_, kConfigMaps, informerOptions(), recorder_.handler());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(milliseconds(20000)));
  const std::string key = std::string(kNamespace) + "/";

  server_.restartEmpty();
  server_.put({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kNamespace}}}});
  server_.put(configMap("fresh", "1"));
  ASSERT_TRUE(waitUntil([&] { return cacheVersions(informer) == serverVersions(); }))
      << requestLogText();
  EXPECT_GE(informer.relists(), 1u);
  for (const char* name : {"a", "b", "c", "d"}) {
    EXPECT_TRUE(recorder_.sawEvent(EventType::kDeleted, key + name)) << name;
  }
  EXPECT_TRUE(recorder_.sawEvent(EventType::kAdded, key + "fresh"));
}

// A server that answers every watch with a 410 (200 and an ERROR event, as
// a real one does) is listed again at once the first time (a compacted
// history is routine), then after back-offs that double: four 410s in a row
// take at least 250 + 500 + 1000 ms of waiting (the lower ends of the
// jittered delays), which a slow machine can only lengthen.
TEST_F(InformerTest, WatchesAnsweredGoneAgainAndAgainBackOffBeforeListingAgain) {
  server_.put(configMap("a", "1"));
  Informer informer(client_, kConfigMaps, informerOptions(), recorder_.handler());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(milliseconds(20000)));
  ASSERT_TRUE(waitUntil([&] { return openedWatches() == 1; }));
  const size_t lists_before = listRequests();
  server_.injectWatchesGone(4);
  const auto start = std::chrono::steady_clock::now();
  server_.closeWatches();
  // The fourth list follows the third back-off.
  ASSERT_TRUE(waitUntil([&] { return listRequests() >= lists_before + 4; })) << requestLogText();
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(1750));
  // Events flow again, with no list more.
  server_.put(configMap("a", "2"));
  ASSERT_TRUE(waitUntil([&] {
    return recorder_.sawEvent(EventType::kModified, std::string(kNamespace) + "/a", "2");
  }));
  EXPECT_EQ(informer.relists(), 4u);
  EXPECT_EQ(listRequests(), lists_before + 4) << requestLogText();
}

}  // namespace
}  // namespace tandem::k8s
