// Watches of the test API server: replay from a version, order, selectors,
// bookmarks, timeouts, compaction (410) and closing.
#include <gtest/gtest.h>

#include "tests/support/apiserver/api_server.h"
#include "tests/unit/apiserver/api_test_client.h"

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

constexpr char kConfigMaps[] = "/api/v1/namespaces/default/configmaps";

std::vector<std::string> summary(const std::vector<Json>& events) {
  std::vector<std::string> out;
  for (const Json& event : events) {
    out.push_back(event["type"].get<std::string>() + " " +
                  event["object"]["metadata"].value("name", ""));
  }
  return out;
}

TEST(ApiWatchTest, WatchFromAVersionSeesLaterChangesInOrder) {
  ApiServer server;
  ApiTestClient client(server);
  JsonAnswer first = client.post(kConfigMaps, configMap("first"));
  std::string from = first.body["metadata"]["resourceVersion"];
  JsonAnswer second = client.post(kConfigMaps, configMap("second"));
  Json changed = second.body;
  changed["data"]["key"] = "changed";
  ASSERT_EQ(client.put(std::string(kConfigMaps) + "/second", changed).status, 200);
  ASSERT_EQ(client.del(std::string(kConfigMaps) + "/first").status, 200);

  // Replayed from history, then live.
  WatchReader watch(server, std::string(kConfigMaps) + "?watch=1&resourceVersion=" + from);
  std::vector<Json> events = watch.waitForEvents(3);
  EXPECT_EQ(summary(events),
            (std::vector<std::string>{"ADDED second", "MODIFIED second", "DELETED first"}));
  ASSERT_EQ(client.post(kConfigMaps, configMap("third")).status, 201);
  events = watch.waitForEvents(4);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(summary(events)[3], "ADDED third");
  // Versions only grow along the stream.
  uint64_t last = 0;
  for (const Json& event : events) {
    uint64_t version =
        std::stoull(event["object"]["metadata"]["resourceVersion"].get<std::string>());
    EXPECT_GT(version, last);
    last = version;
  }
  EXPECT_EQ(last, server.resourceVersion());
}

TEST(ApiWatchTest, WatchWithoutVersionStartsWithEveryObject) {
  ApiServer server;
  ApiTestClient client(server);
  client.post(kConfigMaps, configMap("a"));
  client.post(kConfigMaps, configMap("b"));
  WatchReader watch(server, std::string(kConfigMaps) + "?watch=1");
  EXPECT_EQ(summary(watch.waitForEvents(2)), (std::vector<std::string>{"ADDED a", "ADDED b"}));
}

TEST(ApiWatchTest, SelectorsFilterAndObjectsLeavingThemAreDeleted) {
  ApiServer server;
  ApiTestClient client(server);
  WatchReader watch(server, std::string(kConfigMaps) +
                                "?watch=1&labelSelector=role%3Dweb&resourceVersion=" +
                                std::to_string(server.resourceVersion()));
  client.post(kConfigMaps, configMap("other", {{"role", "db"}}));
  JsonAnswer web = client.post(kConfigMaps, configMap("web", {{"role", "web"}}));
  ASSERT_EQ(client
                .patch(std::string(kConfigMaps) + "/web",
                       R"({"metadata":{"labels":{"role":"db"}}})", "application/merge-patch+json")
                .status,
            200);
  ASSERT_EQ(client
                .patch(std::string(kConfigMaps) + "/other",
                       R"({"metadata":{"labels":{"role":"web"}}})", "application/merge-patch+json")
                .status,
            200);
  EXPECT_EQ(summary(watch.waitForEvents(3)),
            (std::vector<std::string>{"ADDED web", "DELETED web", "ADDED other"}));
}

TEST(ApiWatchTest, CompactionEndsWatchesWith410AndRefusesOldVersions) {
  ApiServer server;
  ApiTestClient client(server);
  JsonAnswer first = client.post(kConfigMaps, configMap("a"));
  std::string old_version = first.body["metadata"]["resourceVersion"];
  client.post(kConfigMaps, configMap("b"));
  WatchReader open(server, std::string(kConfigMaps) + "?watch=1&resourceVersion=" +
                               std::to_string(server.resourceVersion()));
  client.post(kConfigMaps, configMap("c"));
  ASSERT_EQ(open.waitForEvents(1).size(), 1u);

  server.compactHistory();
  std::vector<Json> events = open.waitForEvents(2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["type"], "ERROR");
  EXPECT_EQ(events[1]["object"]["kind"], "Status");
  EXPECT_EQ(events[1]["object"]["code"], 410);
  EXPECT_EQ(events[1]["object"]["reason"], "Expired");
  EXPECT_TRUE(open.waitForEnd());

  ApiTestClient late(server);
  JsonAnswer gone = late.get(std::string(kConfigMaps) + "?watch=1&resourceVersion=" + old_version);
  EXPECT_EQ(gone.status, 410);
  EXPECT_EQ(gone.body["reason"], "Expired");
  EXPECT_EQ(gone.body["code"], 410);

  // From the current version on, watching works again.
  WatchReader fresh(server, std::string(kConfigMaps) + "?watch=1&resourceVersion=" +
                                std::to_string(server.resourceVersion()));
  client.post(kConfigMaps, configMap("d"));
  EXPECT_EQ(summary(fresh.waitForEvents(1)), (std::vector<std::string>{"ADDED d"}));
}

TEST(ApiWatchTest, BookmarksCarryTheCurrentVersion) {
  ApiServerOptions options;
  options.bookmark_interval_ms = 20;
  ApiServer server(options);
  ApiTestClient client(server);
  client.post(kConfigMaps, configMap("a"));
  WatchReader watch(server, std::string(kConfigMaps) +
                                "?watch=1&allowWatchBookmarks=true&resourceVersion=" +
                                std::to_string(server.resourceVersion()));
  std::vector<Json> events = watch.waitForEvents(1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "BOOKMARK");
  EXPECT_EQ(events[0]["object"]["kind"], "ConfigMap");
  EXPECT_EQ(events[0]["object"]["apiVersion"], "v1");
  EXPECT_EQ(events[0]["object"]["metadata"]["resourceVersion"],
            std::to_string(server.resourceVersion()));
}

TEST(ApiWatchTest, TimeoutSecondsAndCloseWatchesEndStreamsCleanly) {
  ApiServer server;
  WatchReader timed(server, std::string(kConfigMaps) + "?watch=1&timeoutSeconds=1");
  EXPECT_TRUE(timed.waitForEnd(std::chrono::seconds(10)));
  EXPECT_EQ(timed.status(), 200);

  WatchReader open(server, std::string(kConfigMaps) + "?watch=1");
  ApiTestClient client(server);
  client.post(kConfigMaps, configMap("a"));
  ASSERT_EQ(open.waitForEvents(1).size(), 1u);
  server.closeWatches();
  EXPECT_TRUE(open.waitForEnd());
  EXPECT_EQ(open.waitForEvents(1).size(), 1u) << "no ERROR event on a plain close";
}

}  // namespace
}  // namespace tandem::testing
