// The KV buffer decision (agent/kv/ucx/kv_buffer.h): which path a slab and a
// UCX's memory types allow, and the errors for settings that cannot work.
#include "agent/kv/ucx/kv_buffer.h"

#include <gtest/gtest.h>

namespace tandem::kv {
namespace {

using nlohmann::json;

KvBufferOptions requested(const std::string& buffer) {
  auto options = parseKvBufferOptions(json{{"kv_buffer", buffer}});
  EXPECT_TRUE(options.isOk()) << options.status().message();
  return *options;
}

TEST(KvBuffer, DefaultsAreAutoAnd256Slots) {
  auto options = parseKvBufferOptions(json::object());
  ASSERT_TRUE(options.isOk());
  EXPECT_EQ(options->requested, "auto");
  EXPECT_EQ(options->staging_blocks, 256);
  options = parseKvBufferOptions(json{{"staging_blocks", 7}});
  ASSERT_TRUE(options.isOk());
  EXPECT_EQ(options->staging_blocks, 7);
}

TEST(KvBuffer, AutoUsesTheSlabWhenUcxCanMoveItAndStagingOtherwise) {
  const KvBufferOptions autoselect = requested("auto");
  EXPECT_EQ(*chooseKvBuffer(autoselect, /*slab_host_accessible=*/true, false), KvBufferPath::kSlab);
  EXPECT_EQ(*chooseKvBuffer(autoselect, false, /*ucx_supports_cuda=*/true), KvBufferPath::kSlab);
  EXPECT_EQ(*chooseKvBuffer(autoselect, false, false), KvBufferPath::kStaging)
      << "a device slab over a UCX without CUDA goes through host staging";
}

TEST(KvBuffer, StagingIsAlwaysPossible) {
  const KvBufferOptions staging = requested("staging");
  EXPECT_EQ(*chooseKvBuffer(staging, true, false), KvBufferPath::kStaging);
  EXPECT_EQ(*chooseKvBuffer(staging, false, true), KvBufferPath::kStaging);
  EXPECT_EQ(*chooseKvBuffer(staging, false, false), KvBufferPath::kStaging);
}

TEST(KvBuffer, SlabOnADeviceSlabWithoutCudaUcxIsRefusedSayingWhy) {
  const KvBufferOptions slab = requested("slab");
  EXPECT_EQ(*chooseKvBuffer(slab, true, false), KvBufferPath::kSlab);
  EXPECT_EQ(*chooseKvBuffer(slab, false, true), KvBufferPath::kSlab);
  auto refused = chooseKvBuffer(slab, /*slab_host_accessible=*/false, /*ucx_supports_cuda=*/false);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "kv_connector_extra_config.kv_buffer \"slab\" cannot work here: the KV slab is in "
            "device memory and this UCX does not support CUDA memory (its memory types lack "
            "\"cuda\"); use \"staging\" or \"auto\", or a UCX built with CUDA");
}

TEST(KvBuffer, BadValuesNameTheFieldAndWhatIsAccepted) {
  struct Case {
    json extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"kv_buffer", "gpu"}},
       "kv_connector_extra_config.kv_buffer must be \"auto\", \"slab\" or \"staging\", got "
       "\"gpu\""},
      {{{"kv_buffer", 1}}, "kv_connector_extra_config.kv_buffer must be"},
      {{{"staging_blocks", 0}},
       "kv_connector_extra_config.staging_blocks must be an integer number of block slots "
       "between 1 and 1048576, got 0"},
      {{{"staging_blocks", -3}}, "kv_connector_extra_config.staging_blocks must be"},
      {{{"staging_blocks", 2.5}}, "kv_connector_extra_config.staging_blocks must be"},
      {{{"staging_blocks", "256"}}, "kv_connector_extra_config.staging_blocks must be"},
      {{{"staging_blocks", int64_t{1} << 21}}, "got 2097152"},
  };
  for (const Case& c : cases) {
    auto options = parseKvBufferOptions(c.extra);
    ASSERT_FALSE(options.isOk()) << c.extra.dump();
    EXPECT_EQ(options.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(options.status().message().find(c.message), std::string::npos)
        << options.status().message();
  }
}

}  // namespace
}  // namespace tandem::kv
