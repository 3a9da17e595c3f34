// spec.autoscaling: defaults, and every wrong field named with what is accepted.
#include "operator/planner/autoscaling_spec.h"

#include <gtest/gtest.h>

namespace tandem::planner {
namespace {

std::string errorOf(std::string_view text, PoolKind kind) {
  StatusOr<AutoscalingSpec> spec = parseAutoscalingSpecText(text, kind);
  EXPECT_FALSE(spec.isOk()) << text;
  if (spec.isOk()) return "";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  return spec.status().message();
}

TEST(AutoscalingSpecTest, DefaultsFollowTheHpa) {
  StatusOr<AutoscalingSpec> spec = parseAutoscalingSpecText(
      R"({"maxReplicas": 8, "targetTTFTSeconds": 0.5})", PoolKind::kPrefill);
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  EXPECT_EQ(spec->min_replicas, 1);
  EXPECT_EQ(spec->max_replicas, 8);
  EXPECT_DOUBLE_EQ(*spec->target_ttft_seconds, 0.5);
  EXPECT_FALSE(spec->target_itl_seconds.has_value());
  EXPECT_DOUBLE_EQ(spec->quantile, 0.9);
  EXPECT_DOUBLE_EQ(spec->window_seconds, 60);
  EXPECT_DOUBLE_EQ(spec->scale_up_stabilization_seconds, 0);
  EXPECT_DOUBLE_EQ(spec->scale_down_stabilization_seconds, 300);
  EXPECT_EQ(spec->max_step, 4);
  EXPECT_DOUBLE_EQ(spec->pending_timeout_seconds, 300);
  EXPECT_DOUBLE_EQ(spec->targetSeconds(PoolKind::kPrefill), 0.5);
}

TEST(AutoscalingSpecTest, ReadsEveryDecodeField) {
  StatusOr<AutoscalingSpec> spec = parseAutoscalingSpecText(
      R"({"minReplicas": 2, "maxReplicas": 16, "targetITLSeconds": 0.05, "quantile": 0.99,
          "windowSeconds": 30, "scaleUpStabilizationSeconds": 15,
          "scaleDownStabilizationSeconds": 120, "maxStep": 2, "pendingTimeoutSeconds": 90,
          "targetRunningSequencesPerReplica": 64, "targetKVCacheUsage": 0.8})",
      PoolKind::kDecode);
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  EXPECT_EQ(spec->min_replicas, 2);
  EXPECT_EQ(spec->max_replicas, 16);
  EXPECT_DOUBLE_EQ(*spec->target_itl_seconds, 0.05);
  EXPECT_DOUBLE_EQ(spec->quantile, 0.99);
  EXPECT_DOUBLE_EQ(spec->window_seconds, 30);
  EXPECT_DOUBLE_EQ(spec->scale_up_stabilization_seconds, 15);
  EXPECT_DOUBLE_EQ(spec->scale_down_stabilization_seconds, 120);
  EXPECT_EQ(spec->max_step, 2);
  EXPECT_DOUBLE_EQ(spec->pending_timeout_seconds, 90);
  EXPECT_DOUBLE_EQ(*spec->target_running_sequences_per_replica, 64);
  EXPECT_DOUBLE_EQ(*spec->target_kv_cache_usage, 0.8);
}

TEST(AutoscalingSpecTest, PrefillQueueTarget) {
  StatusOr<AutoscalingSpec> spec = parseAutoscalingSpecText(
      R"({"maxReplicas": 4, "targetTTFTSeconds": 1, "targetQueuedPrefillTokensPerReplica": 8192})",
      PoolKind::kPrefill);
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  EXPECT_DOUBLE_EQ(*spec->target_queued_prefill_tokens_per_replica, 8192);
}

TEST(AutoscalingSpecTest, ErrorsNameTheFieldAndTheRange) {
  const PoolKind prefill = PoolKind::kPrefill;
  EXPECT_EQ(errorOf(R"({"maxReplicas": 0, "targetTTFTSeconds": 1})", prefill),
            "spec.autoscaling.maxReplicas must be an integer between 1 and 1000, got 0");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 2.5, "targetTTFTSeconds": 1})", prefill),
            "spec.autoscaling.maxReplicas must be an integer between 1 and 1000, got 2.5");
  EXPECT_EQ(errorOf(R"({"minReplicas": "2", "maxReplicas": 4, "targetTTFTSeconds": 1})", prefill),
            "spec.autoscaling.minReplicas must be an integer between 1 and 1000, got \"2\"");
  EXPECT_EQ(errorOf(R"({"minReplicas": 5, "maxReplicas": 4, "targetTTFTSeconds": 1})", prefill),
            "spec.autoscaling.maxReplicas must be at least minReplicas (5), got 4");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 4, "targetTTFTSeconds": 0})", prefill),
            "spec.autoscaling.targetTTFTSeconds must be a number above 0 and up to 3600, got 0");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 4, "targetTTFTSeconds": 1, "quantile": 1})", prefill),
            "spec.autoscaling.quantile must be a number above 0 and below 1, got 1");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 4, "targetTTFTSeconds": 1, "quantile": -0.5})", prefill),
            "spec.autoscaling.quantile must be a number above 0 and below 1, got -0.5");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 4, "targetTTFTSeconds": 1, "windowSeconds": 0.5})", prefill),
            "spec.autoscaling.windowSeconds must be a number from 1 to 3600, got 0.5");
  EXPECT_EQ(
      errorOf(
          R"({"maxReplicas": 4, "targetTTFTSeconds": 1, "scaleDownStabilizationSeconds": 4000})",
          prefill),
      "spec.autoscaling.scaleDownStabilizationSeconds must be a number from 0 to 3600, got 4000");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 4, "targetTTFTSeconds": 1, "maxStep": 0})", prefill),
            "spec.autoscaling.maxStep must be an integer between 1 and 1000, got 0");
  EXPECT_EQ(
      errorOf(R"({"maxReplicas": 4, "targetTTFTSeconds": 1, "pendingTimeoutSeconds": 0})", prefill),
      "spec.autoscaling.pendingTimeoutSeconds must be a number from 1 to 86400, got 0");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 4, "targetITLSeconds": 0.1, "targetKVCacheUsage": 1.5})",
                    PoolKind::kDecode),
            "spec.autoscaling.targetKVCacheUsage must be a number above 0 and up to 1, got 1.5");
}

TEST(AutoscalingSpecTest, RequiredFields) {
  EXPECT_EQ(errorOf(R"({"targetTTFTSeconds": 1})", PoolKind::kPrefill),
            "spec.autoscaling.maxReplicas is required (an integer between minReplicas and 1000)");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 3})", PoolKind::kPrefill),
            "spec.autoscaling.targetTTFTSeconds is required on a PrefillPool (a number of seconds "
            "above 0 and up to 3600)");
  EXPECT_EQ(errorOf(R"({"maxReplicas": 3})", PoolKind::kDecode),
            "spec.autoscaling.targetITLSeconds is required on a DecodePool (a number of seconds "
            "above 0 and up to 3600)");
}

TEST(AutoscalingSpecTest, FieldsOfTheOtherKindAndUnknownFields) {
  EXPECT_EQ(errorOf(R"({"maxReplicas": 3, "targetTTFTSeconds": 1, "targetITLSeconds": 0.1})",
                    PoolKind::kPrefill),
            "spec.autoscaling.targetITLSeconds applies to DecodePools only; a prefill pool "
            "accepts: minReplicas, maxReplicas, targetTTFTSeconds, "
            "targetQueuedPrefillTokensPerReplica, quantile, windowSeconds, "
            "scaleUpStabilizationSeconds, scaleDownStabilizationSeconds, maxStep, "
            "pendingTimeoutSeconds");
  const std::string unknown =
      errorOf(R"({"maxReplicas": 3, "targetITLSeconds": 0.1, "maxReplica": 4})", PoolKind::kDecode);
  EXPECT_EQ(unknown.rfind("spec.autoscaling.maxReplica is not a field of spec.autoscaling; "
                          "accepted: minReplicas, maxReplicas, targetITLSeconds, ",
                          0),
            0u)
      << unknown;
  EXPECT_NE(unknown.find("targetKVCacheUsage"), std::string::npos) << unknown;
}

TEST(AutoscalingSpecTest, NotAnObjectOrNotJson) {
  EXPECT_EQ(errorOf("[1]", PoolKind::kDecode).rfind("spec.autoscaling must be an object", 0), 0u);
  EXPECT_EQ(errorOf("{", PoolKind::kDecode).rfind("spec.autoscaling is not valid JSON: ", 0), 0u);
}

}  // namespace
}  // namespace tandem::planner
