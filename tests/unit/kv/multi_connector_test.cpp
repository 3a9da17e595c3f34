// The multi connector over real members (an offload tier and a storage
// directory on one KV cache) and small fakes: the longest prefix wins (ties:
// the earlier member), loads name the member that served them, saves reach
// every member, pending answers wait only when they could offer more, and
// finish decisions, polls and failure counts combine the members'.
#include "agent/kv/multi/multi_connector.h"

#include <gtest/gtest.h>

#include "agent/kv/connector_registry.h"
#include "agent/kv/offload/offload_connector.h"
#include "agent/kv/storage/storage_connector.h"
#include "tests/support/test_files.h"
#include "tests/unit/kv/kv_test_support.h"

namespace tandem::kv {
namespace {

using namespace ::tandem::kv::testing;  // NOLINT: the test vocabulary
using ::tandem::testing::TempDir;

// A member whose answers the test sets, recording what reaches it.
class FakeMember : public KvConnector, KvConnectorScheduler, KvConnectorWorker {
 public:
  explicit FakeMember(std::string name) { config_.connector = std::move(name); }
  KvConnectorScheduler& scheduler() override { return *this; }
  KvConnectorWorker& worker() override { return *this; }
  const KvTransferConfig& config() const override { return config_; }

  LookupResult lookup(const ConnectorRequest&, int64_t) override { return answer; }
  FinishDecision requestFinished(const ConnectorRequest&, std::span<const BlockId>,
                                 int64_t) override {
    ++finished;
    return decision;
  }
  void requestAbandoned(std::string_view id) override { abandoned.emplace_back(id); }
  void lookupNotTaken(std::string_view id) override { not_taken.emplace_back(id); }
  void holdEnded(std::string_view id) override { ended.emplace_back(id); }
  bool verifiesRequests() const override { return verifies; }
  LoadResult load(const ConnectorRequest&, int64_t, std::span<const BlockId> ids) override {
    loaded += static_cast<int64_t>(ids.size());
    failures_.add("fake", 1);
    return {};
  }
  void save(const ConnectorRequest&, int64_t, std::span<const BlockId> ids) override {
    saved += static_cast<int64_t>(ids.size());
  }
  std::vector<FinishedLoad> poll() override { return std::exchange(finished_loads, {}); }
  std::vector<std::string> pollReleased() override { return std::exchange(released, {}); }

  LookupResult answer;
  bool verifies = false;
  FinishDecision decision;
  std::vector<FinishedLoad> finished_loads;
  std::vector<std::string> released;
  int64_t loaded = 0;
  int64_t saved = 0;
  int finished = 0;
  std::vector<std::string> abandoned;
  std::vector<std::string> not_taken;
  std::vector<std::string> ended;

 private:
  KvTransferConfig config_;
};

LookupResult available(int64_t tokens) { return {LookupResult::State::kAvailable, tokens}; }
LookupResult pending() { return {LookupResult::State::kPending, 0}; }

class MultiOverRealMembers : public ::testing::Test {
 protected:
  std::unique_ptr<engine::KvCache> cache_ = makeCache();
  TempDir store_{"tandem-kv-multi"};

  std::unique_ptr<KvConnector> makeMulti(int offload_capacity_blocks) {
    nlohmann::json config = {
        {"kv_connector", "multi"},
        {"kv_connector_extra_config",
         {{"connectors",
           {{{"kv_connector", "offload"},
             {"kv_connector_extra_config", {{"capacity_blocks", offload_capacity_blocks}}}},
            {{"kv_connector", "storage"},
             {"kv_connector_extra_config", {{"shared_storage_path", store_.path().string()}}}}}}}}};
    return makeConnector(parseConfig(config), *cache_, "test-model");
  }
  static OffloadConnector& offload(KvConnector& multi) {
    return dynamic_cast<OffloadConnector&>(*dynamic_cast<MultiConnector&>(multi).members()[0]);
  }
  static StorageConnector& storage(KvConnector& multi) {
    return dynamic_cast<StorageConnector&>(*dynamic_cast<MultiConnector&>(multi).members()[1]);
  }
};

TEST_F(MultiOverRealMembers, SavesReachEveryMember) {
  auto multi = makeMulti(8);
  TestRequest request("r", 9, 10);
  const BlockId blocks[] = {1, 2};
  multi->worker().save(request.view(), 0, blocks);
  for (const BlockHash& hash : request.hashes) {
    EXPECT_TRUE(offload(*multi).contains(hash));
    EXPECT_TRUE(std::filesystem::exists(storage(*multi).blockPath(hash)));
  }
}

TEST_F(MultiOverRealMembers, LongestPrefixWinsAndTheLoadNamesItsSource) {
  auto multi = makeMulti(2);
  TestRequest request("r", 17, 10);  // 4 loadable blocks
  for (BlockId block : {1, 2, 3, 4}) fillBlock(*cache_, block, 70 + block);
  const BlockId blocks[] = {1, 2, 3, 4};
  multi->worker().save(request.view(), 0, blocks);
  // The 2-block tier kept blocks 2 and 3 only: nothing from the start.
  EXPECT_EQ(offload(*multi).lookup(request.view(), 0).state, LookupResult::State::kNone);

  LookupResult lookup = multi->scheduler().lookup(request.view(), 0);
  EXPECT_EQ(lookup.num_tokens, 16);
  const BlockId targets[] = {9, 10, 11, 12};
  LoadResult load = multi->worker().load(request.view(), 0, targets);
  EXPECT_EQ(load.source, "storage");
  EXPECT_TRUE(load.failed_block_indices.empty());
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(blockBytes(*cache_, targets[i]), blockBytes(*cache_, i + 1));

  // After the 2 blocks in this agent's cache, the tier offers blocks 2-3 as
  // storage does: a tie, and the earlier member (the tier) wins.
  EXPECT_EQ(multi->scheduler().lookup(request.view(), 8).num_tokens, 8);
  load = multi->worker().load(request.view(), 2, std::span<const BlockId>(targets).subspan(2));
  EXPECT_EQ(load.source, "offload");
  EXPECT_TRUE(load.failed_block_indices.empty());

  // Storage short of a block: the tier's longer run wins.
  TestRequest shorter("s", 9, 1000);
  multi->worker().save(shorter.view(), 0, std::span<const BlockId>(blocks, 2));
  std::filesystem::remove(storage(*multi).blockPath(shorter.hashes[1]));
  EXPECT_EQ(multi->scheduler().lookup(shorter.view(), 0).num_tokens, 8);
  EXPECT_EQ(multi->worker().load(shorter.view(), 0, std::span<const BlockId>(targets, 2)).source,
            "offload");
}

TEST_F(MultiOverRealMembers, FailuresOfTheWinningMemberAreCounted) {
  auto multi = makeMulti(2);
  TestRequest request("r", 9, 10);
  const BlockId blocks[] = {1, 2};
  multi->worker().save(request.view(), 0, blocks);
  ASSERT_EQ(multi->scheduler().lookup(request.view(), 0).num_tokens, 8);
  // The tier won the tie; evict its block 0 before the load.
  TestRequest other("o", 5, 500);
  multi->worker().save(other.view(), 0, std::span<const BlockId>(blocks, 1));
  const BlockId targets[] = {9, 10};
  LoadResult load = multi->worker().load(request.view(), 0, targets);
  EXPECT_EQ(load.source, "offload");
  EXPECT_EQ(load.failed_block_indices, std::vector<int64_t>{0});
  EXPECT_EQ(multi->failureCounts(), (std::map<std::string, int64_t>{{"evicted", 1}}));
}

class MultiOverFakes : public ::testing::Test {
 protected:
  MultiOverFakes() {
    auto first = std::make_unique<FakeMember>("first");
    auto second = std::make_unique<FakeMember>("second");
    first_ = first.get();
    second_ = second.get();
    std::vector<std::unique_ptr<KvConnector>> members;
    members.push_back(std::move(first));
    members.push_back(std::move(second));
    config_.connector = "multi";
    multi_ = std::make_unique<MultiConnector>(config_, kBlockSize, std::move(members));
  }
  KvTransferConfig config_;
  FakeMember* first_;
  FakeMember* second_;
  std::unique_ptr<MultiConnector> multi_;
  TestRequest request_{"r", 17, 10};  // at most 16 tokens loadable
};

TEST_F(MultiOverFakes, PendingWaitsOnlyWhenItCouldOfferMore) {
  first_->answer = pending();
  second_->answer = {};
  EXPECT_EQ(multi_->lookup(request_.view(), 0).state, LookupResult::State::kPending);
  second_->answer = available(8);
  EXPECT_EQ(multi_->lookup(request_.view(), 0).state, LookupResult::State::kPending);
  second_->answer = available(16);  // every loadable block: nothing longer can come
  LookupResult lookup = multi_->lookup(request_.view(), 0);
  EXPECT_EQ(lookup.state, LookupResult::State::kAvailable);
  EXPECT_EQ(lookup.num_tokens, 16);
  second_->answer = available(8);
  EXPECT_EQ(multi_->lookup(request_.view(), 4).state, LookupResult::State::kPending);
  second_->answer = available(12);  // blocks 1-3 after the local one: all there is
  EXPECT_EQ(multi_->lookup(request_.view(), 4).num_tokens, 12);
  const BlockId ids[] = {1, 2, 3};
  EXPECT_EQ(multi_->load(request_.view(), 1, ids).source, "second");
  EXPECT_EQ(second_->loaded, 3);
  EXPECT_EQ(first_->loaded, 0);
}

TEST_F(MultiOverFakes, RolesOfTheMultiConnectorApplyToAllMembers) {
  const BlockId ids[] = {1, 2};
  config_.role = KvRole::kProducer;
  std::vector<std::unique_ptr<KvConnector>> members;
  members.push_back(std::make_unique<FakeMember>("a"));
  auto* member = static_cast<FakeMember*>(members.back().get());
  member->answer = available(8);
  MultiConnector producer(config_, kBlockSize, std::move(members));
  EXPECT_EQ(producer.lookup(request_.view(), 0).state, LookupResult::State::kNone);
  producer.save(request_.view(), 0, ids);
  EXPECT_EQ(member->saved, 2);

  config_.role = KvRole::kConsumer;
  members.clear();
  members.push_back(std::make_unique<FakeMember>("b"));
  member = static_cast<FakeMember*>(members.back().get());
  MultiConnector consumer(config_, kBlockSize, std::move(members));
  consumer.save(request_.view(), 0, ids);
  EXPECT_EQ(member->saved, 0);
}

TEST_F(MultiOverFakes, FirstMemberThatHoldsOrAnswersDecidesTheFinish) {
  const BlockId blocks[] = {1, 2};
  EXPECT_FALSE(multi_->requestFinished(request_.view(), blocks, 8).hold);
  EXPECT_EQ(first_->finished, 1);
  EXPECT_EQ(second_->finished, 1);

  second_->decision.hold = true;
  second_->decision.kv_transfer_params = {{"from", "second"}};
  FinishDecision decision = multi_->requestFinished(request_.view(), blocks, 8);
  EXPECT_TRUE(decision.hold);
  EXPECT_EQ(decision.kv_transfer_params["from"], "second");

  first_->decision.kv_transfer_params = {{"from", "first"}};
  decision = multi_->requestFinished(request_.view(), blocks, 8);
  EXPECT_FALSE(decision.hold);
  EXPECT_EQ(decision.kv_transfer_params["from"], "first");
  EXPECT_EQ(second_->finished, 2) << "members after the deciding one are not asked";
}

TEST_F(MultiOverFakes, PollsAndFailureCountsCombineTheMembers) {
  first_->finished_loads.emplace_back().request_id = "a";
  second_->finished_loads.emplace_back().request_id = "b";
  second_->finished_loads.back().failed_block_indices = {3};
  first_->released = {"x"};
  second_->released = {"y", "z"};
  auto loads = multi_->poll();
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].request_id, "a");
  EXPECT_EQ(loads[0].source, "first") << "an asynchronous load names its member";
  EXPECT_EQ(loads[1].failed_block_indices, std::vector<int64_t>{3});
  EXPECT_EQ(loads[1].source, "second");
  EXPECT_EQ(multi_->pollReleased(), (std::vector<std::string>{"x", "y", "z"}));

  const BlockId ids[] = {1};
  first_->answer = available(4);
  multi_->lookup(request_.view(), 0);
  multi_->load(request_.view(), 0, ids);
  second_->answer = available(8);
  multi_->lookup(request_.view(), 0);
  multi_->load(request_.view(), 0, ids);
  EXPECT_EQ(multi_->failureCounts(), (std::map<std::string, int64_t>{{"fake", 2}}));
}

// Only the winner loads; the members that lost hear so at the load (a ucx
// member lets the prefill agent's hold go then, not when the request ends).
TEST_F(MultiOverFakes, SavesReachEveryMemberAndLoadsOnlyTheWinner) {
  const BlockId ids[] = {1, 2, 3};
  multi_->save(request_.view(), 0, ids);
  EXPECT_EQ(first_->saved, 3);
  EXPECT_EQ(second_->saved, 3);
  first_->answer = available(8);
  second_->answer = available(8);
  EXPECT_EQ(multi_->lookup(request_.view(), 0).num_tokens, 8);
  EXPECT_TRUE(second_->not_taken.empty()) << "a lookup decides nothing until the load";
  EXPECT_EQ(multi_->load(request_.view(), 0, std::span<const BlockId>(ids, 2)).source, "first");
  EXPECT_EQ(first_->loaded, 2);
  EXPECT_EQ(second_->loaded, 0);
  EXPECT_EQ(second_->not_taken, std::vector<std::string>{"r"});
  EXPECT_TRUE(first_->not_taken.empty());
}

// An abandoned request (aborted after its lookup, before its load) is
// forgotten by the multi connector and every member: nothing kept for it
// outlives it, and a load under its id finds no winner.
TEST_F(MultiOverFakes, AnAbandonedRequestIsForgottenByEveryMember) {
  first_->answer = available(8);
  ASSERT_EQ(multi_->lookup(request_.view(), 0).num_tokens, 8);
  multi_->requestAbandoned("r");
  EXPECT_EQ(first_->abandoned, std::vector<std::string>{"r"});
  EXPECT_EQ(second_->abandoned, std::vector<std::string>{"r"});
  const BlockId ids[] = {1, 2};
  LoadResult result = multi_->load(request_.view(), 0, ids);
  EXPECT_EQ(result.failed_block_indices, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(first_->loaded, 0);
}

// The end of a hold reaches every member: the one that lent the blocks
// ends its hold ticket before the engine frees them.
TEST_F(MultiOverFakes, TheEndOfAHoldReachesEveryMember) {
  multi_->holdEnded("r");
  EXPECT_EQ(first_->ended, std::vector<std::string>{"r"});
  EXPECT_EQ(second_->ended, std::vector<std::string>{"r"});
}

// The engine leaves control requests to the connector when it checks
// signatures: a multi connector does when any member does.
TEST_F(MultiOverFakes, VerifiesRequestsWhenAnyMemberDoes) {
  EXPECT_FALSE(multi_->verifiesRequests());
  second_->verifies = true;
  EXPECT_TRUE(multi_->verifiesRequests());
}

}  // namespace
}  // namespace tandem::kv
