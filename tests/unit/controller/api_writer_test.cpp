// ApiWriter's fence against the test API server: a closed writer refuses
// every write before it reaches the server, and close() returns only once
// each write begun before it has been answered, so a replica that says it
// stopped leading has no write left to land.
#include "operator/controller/api_writer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>

#include "tests/support/apiserver/api_server.h"
#include "tests/unit/controller/controller_test_support.h"

namespace tandem::controller {
namespace {

using nlohmann::json;

constexpr char kNamespace[] = "serving";
const k8s::ResourceType kConfigMaps{"", "v1", "configmaps", "ConfigMap"};

json configMap(const std::string& name) {
  return json{{"apiVersion", "v1"},
              {"kind", "ConfigMap"},
              {"metadata", {{"name", name}, {"namespace", kNamespace}}},
              {"data", {{"a", "1"}}}};
}

size_t postsSeen(const testing::ApiServer& server) {
  size_t posts = 0;
  for (const std::string& line : server.requestLog()) {
    if (line.rfind("POST /api/v1/namespaces/serving/configmaps", 0) == 0) ++posts;
  }
  return posts;
}

size_t postsAnswered(const testing::ApiServer& server) {
  size_t posts = 0;
  for (const testing::RequestRecord& record : server.answeredRequests()) {
    if (record.method == "POST" && record.target.find("/configmaps") != std::string::npos) ++posts;
  }
  return posts;
}

// The server reads each request, then holds its answer, while one lives.
// Declared after the futures of a test, it lets the held requests go
// before they are waited for, however the test ends.
class HeldAnswers {
 public:
  explicit HeldAnswers(testing::ApiServer& server) : server_(server) { server_.setStalled(true); }
  ~HeldAnswers() { server_.setStalled(false); }
  HeldAnswers(const HeldAnswers&) = delete;
  HeldAnswers& operator=(const HeldAnswers&) = delete;

 private:
  testing::ApiServer& server_;
};

TEST(ApiWriterTest, AClosedWriterRefusesWritesBeforeTheyReachTheServer) {
  testing::ApiServer server;
  k8s::ApiClient client(testClusterConfig(server, kNamespace));
  int counted = 0;
  ApiWriter writer(client, /*open=*/false, [&] { ++counted; });
  EXPECT_FALSE(writer.mayWrite());

  auto refused = writer.create(kConfigMaps, kNamespace, configMap("a"));
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().reason, "NotLeader");
  auto changed = writer.readModifyWrite(kConfigMaps, kNamespace, "a", [](json&) { return true; });
  ASSERT_FALSE(changed.isOk());
  EXPECT_EQ(changed.error().reason, "NotLeader");
  EXPECT_EQ(postsSeen(server), 0u);
  EXPECT_EQ(server.requestLog().size(), 0u) << "not even the read of a read-modify-write";

  writer.open();
  ASSERT_TRUE(writer.create(kConfigMaps, kNamespace, configMap("a")).isOk());
  EXPECT_EQ(counted, 1);
  writer.close();
  EXPECT_FALSE(writer.create(kConfigMaps, kNamespace, configMap("b")).isOk());
  EXPECT_EQ(counted, 1);
  EXPECT_EQ(writer.writesInFlight(), 0);
}

TEST(ApiWriterTest, CloseReturnsOnlyOnceTheWriteInFlightIsAnswered) {
  testing::ApiServer server;
  k8s::ApiClient client(testClusterConfig(server, kNamespace));
  ApiWriter writer(client, /*open=*/true, [] {});

  // Written by the futures' threads: declared before them, so that it
  // outlives the threads however the test ends.
  size_t answered_when_closed = 0;
  std::future<k8s::Result<json>> write;
  std::future<void> closing;
  const HeldAnswers held(server);
  write = std::async(std::launch::async,
                     [&] { return writer.create(kConfigMaps, kNamespace, configMap("late")); });
  ASSERT_TRUE(waitUntil([&] { return postsSeen(server) == 1; }));
  EXPECT_EQ(writer.writesInFlight(), 1);

  closing = std::async(std::launch::async, [&] {
    writer.close();
    answered_when_closed = postsAnswered(server);
  });
  // New writes are refused at once, while the old one is still held.
  ASSERT_TRUE(waitUntil([&] { return !writer.mayWrite(); }));
  auto refused = writer.create(kConfigMaps, kNamespace, configMap("refused"));
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.error().reason, "NotLeader");
  // close() cannot have returned: the write it waits for is unanswered.
  EXPECT_EQ(closing.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  EXPECT_EQ(postsAnswered(server), 0u);

  server.setStalled(false);
  closing.get();
  EXPECT_EQ(answered_when_closed, 1u) << "the write landed before close() returned";
  auto written = write.get();
  ASSERT_TRUE(written.isOk()) << written.error().toString();
  EXPECT_TRUE(server.get("v1", "ConfigMap", kNamespace, "late").has_value());
  EXPECT_FALSE(server.get("v1", "ConfigMap", kNamespace, "refused").has_value());
  EXPECT_EQ(postsSeen(server), 1u);
}

// A read-modify-write is in flight from its read: close() waits for the
// read held by the server, and the write it would have made is not made.
TEST(ApiWriterTest, AReadModifyWriteClosedDuringItsReadWritesNothing) {
  testing::ApiServer server;
  k8s::ApiClient client(testClusterConfig(server, kNamespace));
  ApiWriter writer(client, /*open=*/true, [] {});
  ASSERT_TRUE(writer.create(kConfigMaps, kNamespace, configMap("settings")).isOk());
  auto readsSeen = [&] {
    size_t reads = 0;
    for (const std::string& line : server.requestLog()) {
      if (line.rfind("GET /api/v1/namespaces/serving/configmaps/settings", 0) == 0) ++reads;
    }
    return reads;
  };
  auto putsSeen = [&] {
    size_t puts = 0;
    for (const std::string& line : server.requestLog()) {
      if (line.rfind("PUT ", 0) == 0) ++puts;
    }
    return puts;
  };

  bool mutated = false;  // before the futures, as above
  std::future<k8s::Result<json>> changed;
  std::future<void> closing;
  const HeldAnswers held(server);
  changed = std::async(std::launch::async, [&] {
    return writer.readModifyWrite(kConfigMaps, kNamespace, "settings", [&](json& object) {
      mutated = true;
      object["data"]["a"] = "2";
      return true;
    });
  });
  ASSERT_TRUE(waitUntil([&] { return readsSeen() == 1; }));
  EXPECT_EQ(writer.writesInFlight(), 1);
  closing = std::async(std::launch::async, [&] { writer.close(); });
  ASSERT_TRUE(waitUntil([&] { return !writer.mayWrite(); }));
  EXPECT_EQ(closing.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "close() returned while the read-modify-write's read was held";

  server.setStalled(false);
  closing.get();
  auto result = changed.get();
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.error().reason, "NotLeader");
  EXPECT_FALSE(mutated);
  EXPECT_EQ(putsSeen(), 0u);
  EXPECT_EQ(server.get("v1", "ConfigMap", kNamespace, "settings")->at("data")["a"], "1");
}

}  // namespace
}  // namespace tandem::controller
