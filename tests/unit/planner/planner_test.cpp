// PoolPlanner decisions with synthetic histograms and an injected clock: the
// time of every observation is passed in, so no test waits.
#include "operator/planner/planner.h"

#include <gtest/gtest.h>

#include <limits>

namespace tandem::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

AutoscalingSpec prefillSpec() {
  AutoscalingSpec spec;
  spec.min_replicas = 1;
  spec.max_replicas = 10;
  spec.target_ttft_seconds = 1.0;
  spec.pending_timeout_seconds = 120;
  return spec;
}

AutoscalingSpec decodeSpec() {
  AutoscalingSpec spec;
  spec.min_replicas = 1;
  spec.max_replicas = 10;
  spec.target_itl_seconds = 0.05;
  return spec;
}

// Windowed values of `pods` pods whose latency quantile is `seconds` over
// `count` observations (count 0: no requests in the window).
WindowedValues latency(double seconds, double count = 100, int pods = 2) {
  WindowedValues values;
  values.pods = pods;
  values.latency_count = count;
  values.latency_measured = true;
  if (count > 0) values.latency_quantile = seconds;
  return values;
}

PoolObservation pool(double now, int replicas) {
  PoolObservation observation;
  observation.now_seconds = now;
  observation.spec_replicas = replicas;
  observation.ready_replicas = replicas;
  return observation;
}

// A TTFT histogram scrape with buckets 0.5, 1, 2, 4, +Inf.
std::string ttftScrape(double le_05, double le_1, double le_2, double le_4, double le_inf) {
  std::string text = "# TYPE tandem_time_to_first_token_seconds histogram\n";
  const std::pair<const char*, double> buckets[] = {
      {"0.5", le_05}, {"1", le_1}, {"2", le_2}, {"4", le_4}, {"+Inf", le_inf}};
  for (const auto& [le, count] : buckets) {
    text += "tandem_time_to_first_token_seconds_bucket{model=\"m\",role=\"prefill\",le=\"" +
            std::string(le) + "\"} " + std::to_string(count) + "\n";
  }
  return text;
}

TEST(PoolPlannerTest, TtftMissScalesPrefillUpAndGoodItlLeavesDecodeAlone) {
  MetricWindow window(agentMetricNames(PoolKind::kPrefill), 60);
  ASSERT_TRUE(window.addScrape("prefill-0", 0, ttftScrape(0, 0, 0, 0, 0)).isOk());
  ASSERT_TRUE(window.addScrape("prefill-1", 0, ttftScrape(0, 0, 0, 0, 0)).isOk());
  ASSERT_TRUE(window.addScrape("prefill-0", 30, ttftScrape(0, 5, 50, 50, 50)).isOk());
  ASSERT_TRUE(window.addScrape("prefill-1", 30, ttftScrape(0, 5, 50, 50, 50)).isOk());
  // Summed: 0, 10, 100, 100, 100; p90 = rank 90 in (1, 2] holding 10..100.
  const WindowedValues prefill_metrics = window.values(30, 0.9);
  const double p90 = 1 + 80.0 / 90.0;
  ASSERT_DOUBLE_EQ(*prefill_metrics.latency_quantile, p90);

  PoolPlanner prefill("p", PoolKind::kPrefill, prefillSpec());
  const Decision up = prefill.decide(pool(30, 2), prefill_metrics);
  // ceil(2 * 1.89 / 1.0) = 4
  EXPECT_EQ(up.desired_replicas, 4);
  EXPECT_EQ(up.recommended_replicas, 4);
  EXPECT_TRUE(up.write);
  EXPECT_EQ(up.reason, "ScaledUp");
  ASSERT_TRUE(up.event.has_value());
  EXPECT_EQ(up.event->type, "Normal");
  EXPECT_EQ(up.event->reason, "ScaledUp");
  EXPECT_EQ(up.event->message,
            "prefill pool p: TTFT p90 1.89 s against target 1 s over 60 s (100 observations); "
            "recommends 4; replicas 2 -> 4");
  EXPECT_EQ(up.metrics.desired_replicas, 4);
  EXPECT_DOUBLE_EQ(*up.metrics.observed_seconds, p90);
  EXPECT_DOUBLE_EQ(up.metrics.target_seconds, 1.0);
  EXPECT_DOUBLE_EQ(up.metrics.quantile, 0.9);
  EXPECT_FALSE(up.scaling_conflict.status);
  EXPECT_FALSE(up.scaling_limited.status);

  PoolPlanner decode("d", PoolKind::kDecode, decodeSpec());
  const Decision stay = decode.decide(pool(30, 3), latency(0.048));
  EXPECT_EQ(stay.desired_replicas, 3);
  EXPECT_FALSE(stay.write);
  EXPECT_EQ(stay.reason, "Steady");
  EXPECT_FALSE(stay.event.has_value());
}

TEST(PoolPlannerTest, ItlMissScalesDecodeUp) {
  PoolPlanner decode("d", PoolKind::kDecode, decodeSpec());
  const Decision decision = decode.decide(pool(0, 3), latency(0.1));
  EXPECT_EQ(decision.desired_replicas, 6);
  EXPECT_TRUE(decision.write);
  EXPECT_EQ(decision.reason, "ScaledUp");
  EXPECT_DOUBLE_EQ(decision.metrics.target_seconds, 0.05);
  EXPECT_NE(decision.message.find("ITL p90 0.1 s against target 0.05 s"), std::string::npos)
      << decision.message;
}

TEST(PoolPlannerTest, WithinTheToleranceNothingMoves) {
  PoolPlanner decode("d", PoolKind::kDecode, decodeSpec());
  // 0.054 / 0.05 = 1.08: within 10%.
  EXPECT_EQ(decode.decide(pool(0, 5), latency(0.054)).desired_replicas, 5);
  // 0.056 / 0.05 = 1.12: ceil(5 * 1.12) = 6.
  EXPECT_EQ(decode.decide(pool(1, 5), latency(0.056)).desired_replicas, 6);
}

TEST(PoolPlannerTest, MaxStepLimitsEachDecisionAndBoundsClamp) {
  AutoscalingSpec spec = prefillSpec();
  spec.max_step = 3;
  PoolPlanner prefill("p", PoolKind::kPrefill, spec);
  // TTFT 10x the target: ceil(2 * 10) = 20, clamped to maxReplicas 10.
  Decision first = prefill.decide(pool(0, 2), latency(10));
  EXPECT_EQ(first.recommended_replicas, 10);
  EXPECT_EQ(first.desired_replicas, 5);
  EXPECT_NE(first.message.find("replicas 2 -> 5 (maxStep 3)"), std::string::npos) << first.message;
  Decision second = prefill.decide(pool(15, 5), latency(10));
  EXPECT_EQ(second.desired_replicas, 8);
  Decision third = prefill.decide(pool(30, 8), latency(10));
  EXPECT_EQ(third.desired_replicas, 10);
  Decision fourth = prefill.decide(pool(45, 10), latency(10));
  EXPECT_EQ(fourth.desired_replicas, 10);
  EXPECT_FALSE(fourth.write);

  // Replicas outside the bounds are brought inside at once.
  PoolPlanner low("low", PoolKind::kPrefill, spec);
  AutoscalingSpec raised = spec;
  raised.min_replicas = 2;
  low.setSpec(raised);
  EXPECT_EQ(low.decide(pool(0, 0), latency(1.0)).desired_replicas, 2);
  PoolPlanner high("high", PoolKind::kPrefill, spec);
  const Decision over = high.decide(pool(0, 30), latency(1.0));
  EXPECT_EQ(over.desired_replicas, 10);
  EXPECT_TRUE(over.write);
}

TEST(PoolPlannerTest, ScaleDownOnlyAfterTheStabilisationWindow) {
  PoolPlanner prefill("p", PoolKind::kPrefill, prefillSpec());
  // Load at the target until t=100 (recommendation 4).
  for (double t = 0; t <= 100; t += 20) {
    EXPECT_EQ(prefill.decide(pool(t, 4), latency(1.0)).desired_replicas, 4) << t;
  }
  // Then the load is gone: no requests in the window.
  Decision waiting = prefill.decide(pool(120, 4), latency(0, 0));
  EXPECT_EQ(waiting.recommended_replicas, 1);
  EXPECT_EQ(waiting.desired_replicas, 4);
  EXPECT_EQ(waiting.reason, "Stabilizing");
  EXPECT_FALSE(waiting.write);
  EXPECT_FALSE(waiting.metrics.observed_seconds.has_value());
  for (double t = 140; t <= 399; t += 20) {
    EXPECT_EQ(prefill.decide(pool(t, 4), latency(0, 0)).desired_replicas, 4) << t;
  }
  EXPECT_EQ(prefill.decide(pool(399.5, 4), latency(0, 0)).desired_replicas, 4);
  // 300 s after the last recommendation of 4 (t=100).
  Decision down = prefill.decide(pool(401, 4), latency(0, 0));
  EXPECT_EQ(down.desired_replicas, 1);
  EXPECT_TRUE(down.write);
  EXPECT_EQ(down.reason, "ScaledDown");
  ASSERT_TRUE(down.event.has_value());
  EXPECT_EQ(down.event->message,
            "prefill pool p: no requests in the last 60 s; recommends 1; replicas 4 -> 1");
}

TEST(PoolPlannerTest, EachScaleDownWaitsForAWindowObservedAtTheNewSize) {
  AutoscalingSpec spec = prefillSpec();
  spec.max_step = 2;
  spec.window_seconds = 10;
  spec.scale_down_stabilization_seconds = 20;
  PoolPlanner prefill("p", PoolKind::kPrefill, spec);
  // Grown to 6 by a TTFT miss.
  ASSERT_EQ(prefill.decide(pool(0, 4), latency(2.0)).desired_replicas, 6);
  // Far under the target at 6: the proportional rule asks for 1.
  double t = 1;
  Decision decision;
  for (; t <= 40; t += 1) {
    decision = prefill.decide(pool(t, 6), latency(0.05));
    if (decision.write) break;
  }
  ASSERT_TRUE(decision.write);
  EXPECT_EQ(decision.recommended_replicas, 1);
  EXPECT_EQ(decision.desired_replicas, 4) << "maxStep";
  const double first_down = t;
  // At 4 replicas the recommendation is still 1, but the window still holds
  // what was seen at 6: no further step until a whole window at 4.
  Decision held = prefill.decide(pool(first_down + 1, 4), latency(0.05));
  EXPECT_EQ(held.desired_replicas, 4);
  EXPECT_EQ(held.reason, "Stabilizing");
  EXPECT_NE(held.message.find("waits for a full 10 s window observed at 4 replicas"),
            std::string::npos)
      << held.message;
  EXPECT_EQ(prefill.decide(pool(first_down + 10.5, 4), latency(0.05)).desired_replicas, 4);
  EXPECT_EQ(prefill.decide(pool(first_down + 11.5, 4), latency(0.05)).desired_replicas, 2);
  // Scaling up never waits.
  const Decision up = prefill.decide(pool(first_down + 12.5, 2), latency(3.0));
  EXPECT_EQ(up.desired_replicas, 4);
  EXPECT_EQ(up.reason, "ScaledUp");
}

TEST(PoolPlannerTest, ScaleDownKeepsTheReplicasAQueueingEstimateNeeds) {
  // 6 replicas, TTFT p90 0.06 s against 0.5 s: proportionally 1 replica.
  // But the window's p10 (the service time, no queueing) is 0.0425 s, so
  // the replicas run at utilisation 1 - 0.0425 / 0.06 = 0.29: one replica
  // would get 1.75 replicas' load and never keep up; two run at 0.875 and
  // queue to 0.0425 / 0.125 = 0.34 s, within the target.
  WindowedValues queued = latency(0.06);
  queued.latency_buckets = {{0.04, 0}, {0.045, 20}, {0.1, 100}, {kInf, 100}};
  PoolPlanner prefill("p", PoolKind::kPrefill, prefillSpec());
  const Decision decision = prefill.decide(pool(0, 6), queued);
  EXPECT_EQ(decision.recommended_replicas, 2);
  EXPECT_NE(decision.message.find("at utilisation 0.29 fewer than 2 replicas would queue"),
            std::string::npos)
      << decision.message;
  // No queueing seen (the quantile at the service time): the proportional
  // count stands.
  WindowedValues idle = latency(0.041);
  idle.latency_buckets = queued.latency_buckets;
  PoolPlanner other("q", PoolKind::kPrefill, prefillSpec());
  EXPECT_EQ(other.decide(pool(0, 6), idle).recommended_replicas, 1);
  // p10 and p90 both in the first bucket, from 0: their spread is
  // interpolation, not queueing.
  WindowedValues one_bucket = latency(0.054);
  one_bucket.latency_buckets = {{0.06, 100}, {kInf, 100}};
  PoolPlanner third("r", PoolKind::kPrefill, prefillSpec());
  EXPECT_EQ(third.decide(pool(0, 6), one_bucket).recommended_replicas, 1);
}

TEST(PoolPlannerTest, NoScaleDownInTheFirstWindowAfterStart) {
  PoolPlanner decode("d", PoolKind::kDecode, decodeSpec());
  EXPECT_EQ(decode.decide(pool(0, 6), latency(0.01)).desired_replicas, 6);
  EXPECT_EQ(decode.decide(pool(299, 6), latency(0.01)).desired_replicas, 6);
  // ceil(6 * 0.2) = 2 once the start has left the window.
  EXPECT_EQ(decode.decide(pool(301, 6), latency(0.01)).desired_replicas, 2);
}

TEST(PoolPlannerTest, ScaleUpStabilisationUsesTheLowestRecommendation) {
  AutoscalingSpec spec = prefillSpec();
  spec.scale_up_stabilization_seconds = 30;
  PoolPlanner prefill("p", PoolKind::kPrefill, spec);
  EXPECT_EQ(prefill.decide(pool(0, 2), latency(1.0)).desired_replicas, 2);
  // A spike: 3x the target, but the recommendation of 2 at t=0 is in the window.
  EXPECT_EQ(prefill.decide(pool(10, 2), latency(3.0)).desired_replicas, 2);
  EXPECT_EQ(prefill.decide(pool(25, 2), latency(3.0)).desired_replicas, 2);
  // It lasted 30 s: scale up.
  EXPECT_EQ(prefill.decide(pool(31, 2), latency(3.0)).desired_replicas, 6);
}

TEST(PoolPlannerTest, LoadSignalsPerReplica) {
  AutoscalingSpec prefill_spec = prefillSpec();
  prefill_spec.target_queued_prefill_tokens_per_replica = 8192;
  prefill_spec.max_step = 10;
  PoolPlanner prefill("p", PoolKind::kPrefill, prefill_spec);
  WindowedValues queued = latency(1.0);
  queued.queued_prefill_tokens = 50000;  // ceil(50000 / 8192) = 7
  const Decision by_queue = prefill.decide(pool(0, 2), queued);
  EXPECT_EQ(by_queue.desired_replicas, 7);
  EXPECT_NE(by_queue.message.find("queued prefill tokens 50000 against target 8192 per replica"),
            std::string::npos)
      << by_queue.message;

  AutoscalingSpec decode_spec = decodeSpec();
  decode_spec.target_running_sequences_per_replica = 64;
  decode_spec.target_kv_cache_usage = 0.6;
  PoolPlanner decode("d", PoolKind::kDecode, decode_spec);
  WindowedValues busy = latency(0.05);
  busy.running_sequences = 300;  // ceil(300 / 64) = 5
  busy.kv_cache_usage = 0.9;     // ceil(2 * 0.9 / 0.6) = 3
  EXPECT_EQ(decode.decide(pool(0, 2), busy).desired_replicas, 5);
  busy.running_sequences = 10;
  EXPECT_EQ(decode.decide(pool(1, 5), busy).recommended_replicas, 8);  // ceil(5 * 1.5)
}

TEST(PoolPlannerTest, SignalsFarPastAnIntsRangeAskForMaxReplicas) {
  // ceil(2 * 9e299 / 1) and 8e9 running sequences at 1 per replica
  // overflowed an int to a negative count, which lost to every other
  // signal: the pool stayed or even shrank.
  AutoscalingSpec prefill_spec = prefillSpec();
  prefill_spec.max_step = 100;
  PoolPlanner prefill("p", PoolKind::kPrefill, prefill_spec);
  const Decision far = prefill.decide(pool(0, 2), latency(9e299));
  EXPECT_EQ(far.recommended_replicas, 10);
  EXPECT_EQ(far.desired_replicas, 10);

  AutoscalingSpec decode_spec = decodeSpec();
  decode_spec.target_running_sequences_per_replica = 1e-9;
  decode_spec.target_kv_cache_usage = 0.6;
  PoolPlanner decode("d", PoolKind::kDecode, decode_spec);
  WindowedValues busy = latency(0.05);
  busy.running_sequences = 8;  // 8e9 replicas' worth
  busy.kv_cache_usage = 0.3;   // would halve the pool
  EXPECT_EQ(decode.decide(pool(0, 4), busy).recommended_replicas, 10);
}

TEST(PoolPlannerTest, BelowMinReplicasWithoutMetricsIsRaisedToTheMinimum) {
  // Replicas 0 (or under the floor) have no pods and so no metrics: held
  // as MetricsUnavailable, the pool stayed below minReplicas for ever.
  AutoscalingSpec spec = prefillSpec();
  spec.min_replicas = 2;
  spec.max_step = 1;
  PoolPlanner prefill("p", PoolKind::kPrefill, spec);
  Decision decision = prefill.decide(pool(0, 0), WindowedValues{});
  EXPECT_EQ(decision.reason, "ScaledUp");
  EXPECT_EQ(decision.desired_replicas, 1);  // maxStep 1
  EXPECT_TRUE(decision.write);
  EXPECT_EQ(decision.message,
            "prefill pool p: replicas 0 are below minReplicas 2; recommends 2; replicas 0 -> 1 "
            "(maxStep 1)");
  decision = prefill.decide(pool(1, 1), WindowedValues{});
  EXPECT_EQ(decision.desired_replicas, 2);
  // At the minimum, no metrics hold the replicas as before.
  EXPECT_EQ(prefill.decide(pool(2, 2), WindowedValues{}).reason, "MetricsUnavailable");
  // A manual scale below the minimum is respected for the window, then
  // overwritten.
  PoolPlanner manual("p", PoolKind::kPrefill, spec);
  manual.decide(pool(0, 2), latency(1.0));
  EXPECT_EQ(manual.decide(pool(10, 0), WindowedValues{}).reason, "ManualScaleRespected");
  const Decision later = manual.decide(pool(100000, 0), {});  // past any window
  EXPECT_EQ(later.reason, "ManualScaleOverwritten");
  EXPECT_EQ(later.desired_replicas, 1);
}

TEST(PoolPlannerTest, HpaPresentIsAConflictAndNothingIsWritten) {
  PoolPlanner prefill("p", PoolKind::kPrefill, prefillSpec());
  PoolObservation observed = pool(0, 2);
  observed.hpa_present = true;
  const Decision conflict = prefill.decide(observed, latency(5.0));
  EXPECT_EQ(conflict.desired_replicas, 2);
  EXPECT_FALSE(conflict.write);
  EXPECT_EQ(conflict.reason, "ScalingConflict");
  EXPECT_EQ(conflict.scaling_conflict.type, "ScalingConflict");
  EXPECT_TRUE(conflict.scaling_conflict.status);
  EXPECT_EQ(conflict.scaling_conflict.reason, "HorizontalPodAutoscalerPresent");
  ASSERT_TRUE(conflict.event.has_value());
  EXPECT_EQ(conflict.event->type, "Warning");
  EXPECT_EQ(conflict.event->message,
            "a HorizontalPodAutoscaler targets prefill pool p; the planner does not change its "
            "replicas while it does");
  // The HPA changes the replicas: still no write, no new Event, no manual change.
  observed.now_seconds = 10;
  observed.spec_replicas = 7;
  const Decision again = prefill.decide(observed, latency(5.0));
  EXPECT_FALSE(again.write);
  EXPECT_EQ(again.desired_replicas, 7);
  EXPECT_TRUE(again.scaling_conflict.status);
  EXPECT_FALSE(again.event.has_value());
  // The HPA is gone: the planner decides again (up at once, down only after
  // a window).
  const Decision resumed = prefill.decide(pool(20, 7), latency(2.0));
  EXPECT_FALSE(resumed.scaling_conflict.status);
  EXPECT_EQ(resumed.reason, "ScaledUp");
  EXPECT_EQ(resumed.desired_replicas, 10);
}

TEST(PoolPlannerTest, PendingPastTheTimeoutIsGivenBackAndLimitsScaling) {
  PoolPlanner prefill("p", PoolKind::kPrefill, prefillSpec());
  PoolObservation observed = pool(0, 6);
  observed.ready_replicas = 4;
  observed.pending_seconds = {60, 60};
  // Pending, but not for long yet: nothing given back.
  Decision early = prefill.decide(observed, latency(3.0));
  EXPECT_FALSE(early.scaling_limited.status);
  EXPECT_EQ(early.desired_replicas, 10);

  observed.now_seconds = 70;
  observed.pending_seconds = {130, 125};
  const Decision limited = prefill.decide(observed, latency(3.0));
  EXPECT_EQ(limited.desired_replicas, 4);
  EXPECT_TRUE(limited.write);
  EXPECT_EQ(limited.reason, "ScalingLimited");
  EXPECT_TRUE(limited.scaling_limited.status);
  EXPECT_EQ(limited.scaling_limited.reason, "Unschedulable");
  ASSERT_TRUE(limited.event.has_value());
  EXPECT_EQ(limited.event->type, "Warning");
  EXPECT_EQ(limited.event->message,
            "2 replica(s) of prefill pool p stayed Pending (unschedulable) past 120 s; given "
            "back: replicas 6 -> 4; the planner asks for no more than 4 for the next 120 s");

  // Still missing the target, but no more is asked until the limit expires.
  const Decision held = prefill.decide(pool(100, 4), latency(3.0));
  EXPECT_EQ(held.desired_replicas, 4);
  EXPECT_FALSE(held.write);
  EXPECT_TRUE(held.scaling_limited.status);
  EXPECT_EQ(held.recommended_replicas, 10);
  EXPECT_EQ(held.reason, "Stabilizing");
  // After it, one more try.
  const Decision retry = prefill.decide(pool(191, 4), latency(3.0));
  EXPECT_FALSE(retry.scaling_limited.status);
  EXPECT_EQ(retry.desired_replicas, 8);

  // The retry's replicas stay Pending too: the next limit holds twice as long.
  PoolObservation again = pool(320, 8);
  again.ready_replicas = 4;
  again.pending_seconds = {129, 129, 129, 129};
  const Decision second = prefill.decide(again, latency(3.0));
  EXPECT_EQ(second.desired_replicas, 4);
  EXPECT_NE(second.scaling_limited.message.find("for the next 240 s"), std::string::npos)
      << second.scaling_limited.message;
}

TEST(PoolPlannerTest, PendingPodsStillListedAfterTheGiveBackTakeNothingMore) {
  PoolPlanner prefill("p", PoolKind::kPrefill, prefillSpec());
  PoolObservation observed = pool(0, 6);
  observed.ready_replicas = 4;
  observed.pending_seconds = {130, 130};
  ASSERT_EQ(prefill.decide(observed, latency(1.0)).desired_replicas, 4);
  // The deleted Pending pods are still in the cache.
  observed.now_seconds = 5;
  observed.spec_replicas = 4;
  observed.pending_seconds = {135, 135};
  const Decision decision = prefill.decide(observed, latency(1.0));
  EXPECT_EQ(decision.desired_replicas, 4);
  EXPECT_FALSE(decision.write);
  EXPECT_FALSE(decision.event.has_value());
  EXPECT_TRUE(decision.scaling_limited.status);
}

TEST(PoolPlannerTest, AboveMaxReplicasWithoutMetricsIsBroughtToTheMaximum) {
  // Scaled past maxReplicas by hand (or maxReplicas lowered) with no
  // metrics to decide by: held as MetricsUnavailable, the pool stayed above
  // its cost cap for ever.
  AutoscalingSpec spec = prefillSpec();
  spec.max_replicas = 4;
  spec.max_step = 2;
  PoolPlanner prefill("p", PoolKind::kPrefill, spec);
  Decision decision = prefill.decide(pool(0, 8), WindowedValues{});
  EXPECT_EQ(decision.reason, "ScaledDown");
  EXPECT_EQ(decision.desired_replicas, 6);  // maxStep 2
  EXPECT_TRUE(decision.write);
  EXPECT_EQ(decision.message,
            "prefill pool p: replicas 8 are above maxReplicas 4; recommends 4; replicas 8 -> 6 "
            "(maxStep 2)");
  EXPECT_EQ(prefill.decide(pool(1, 6), WindowedValues{}).desired_replicas, 4);
  // At the maximum, no metrics hold the replicas as before.
  EXPECT_EQ(prefill.decide(pool(2, 4), WindowedValues{}).reason, "MetricsUnavailable");
  // A manual scale above it is respected for the window, then overwritten.
  PoolPlanner manual("p", PoolKind::kPrefill, spec);
  manual.decide(pool(0, 2), latency(1.0));
  EXPECT_EQ(manual.decide(pool(10, 50), WindowedValues{}).reason, "ManualScaleRespected");
  const Decision later = manual.decide(pool(100000, 50), {});  // past any window
  EXPECT_EQ(later.reason, "ManualScaleOverwritten");
  EXPECT_EQ(later.desired_replicas, 48);
}

TEST(PoolPlannerTest, GivingBackNeverGoesBelowMinReplicas) {
  AutoscalingSpec spec = prefillSpec();
  spec.min_replicas = 3;
  PoolPlanner prefill("p", PoolKind::kPrefill, spec);
  PoolObservation observed = pool(0, 4);
  observed.ready_replicas = 1;
  observed.pending_seconds = {200, 200, 200};
  EXPECT_EQ(prefill.decide(observed, latency(1.0)).desired_replicas, 3);
}

TEST(PoolPlannerTest, ManualScaleIsRespectedThenOverwrittenAfterTheWindow) {
  AutoscalingSpec spec = prefillSpec();
  spec.min_replicas = 2;
  PoolPlanner prefill("p", PoolKind::kPrefill, spec);
  // TTFT at half the target: the recommendation is half the replicas.
  EXPECT_EQ(prefill.decide(pool(0, 2), latency(0.5)).desired_replicas, 2);
  // Someone scales to 8 (noticed without the caller saying so).
  const Decision seen = prefill.decide(pool(10, 8), latency(0.5));
  EXPECT_EQ(seen.desired_replicas, 8);
  EXPECT_FALSE(seen.write);
  EXPECT_EQ(seen.reason, "ManualScaleRespected");
  ASSERT_TRUE(seen.event.has_value());
  EXPECT_EQ(seen.event->message,
            "replicas of prefill pool p set to 8 outside the planner; respected until the 300 s "
            "stabilisation window has passed");
  // Inside the window: held, without a new Event, even though the metrics
  // ask for 4.
  const Decision held = prefill.decide(pool(309, 8), latency(0.5));
  EXPECT_EQ(held.desired_replicas, 8);
  EXPECT_EQ(held.recommended_replicas, 4);
  EXPECT_FALSE(held.write);
  EXPECT_FALSE(held.event.has_value());
  // After it: overwritten, with an Event saying so.
  const Decision overwritten = prefill.decide(pool(311, 8), latency(0.5));
  EXPECT_EQ(overwritten.desired_replicas, 4);
  EXPECT_TRUE(overwritten.write);
  EXPECT_EQ(overwritten.reason, "ManualScaleOverwritten");
  ASSERT_TRUE(overwritten.event.has_value());
  EXPECT_EQ(overwritten.event->reason, "ManualScaleOverwritten");
  EXPECT_EQ(overwritten.event->message,
            "prefill pool p: TTFT p90 0.5 s against target 1 s over 60 s (100 observations); "
            "recommends 4; replicas 8 -> 4; the manual change to 8 was respected for the 300 s "
            "stabilisation window and is now overwritten");
  // The planner's own write read back is not a manual change.
  const Decision after = prefill.decide(pool(320, 4), latency(1.0));
  EXPECT_EQ(after.reason, "Steady");
}

TEST(PoolPlannerTest, CallerFlagMarksAManualChange) {
  PoolPlanner decode("d", PoolKind::kDecode, decodeSpec());
  EXPECT_EQ(decode.decide(pool(0, 3), latency(0.05)).reason, "Steady");
  PoolObservation observed = pool(10, 3);
  observed.replicas_changed_externally = true;
  const Decision decision = decode.decide(observed, latency(0.2));
  EXPECT_EQ(decision.reason, "ManualScaleRespected");
  EXPECT_FALSE(decision.write);
}

TEST(PoolPlannerTest, AStaleReadAfterAWriteIsNotAManualChange) {
  PoolPlanner decode("d", PoolKind::kDecode, decodeSpec());
  ASSERT_EQ(decode.decide(pool(0, 2), latency(0.1)).desired_replicas, 4);
  // The cache still shows 2 (the same decision again), then the written 4.
  const Decision stale = decode.decide(pool(1, 2), latency(0.1));
  EXPECT_EQ(stale.reason, "ScaledUp");
  EXPECT_EQ(stale.desired_replicas, 4);
  const Decision read_back = decode.decide(pool(2, 4), latency(0.05));
  EXPECT_EQ(read_back.reason, "Steady");
  EXPECT_FALSE(read_back.event.has_value());
}

// Pods were scraped, but none twice in the window (a window no longer than
// the planner's interval): no latency was measured, which is not "no
// requests": the replicas are held, never dropped to minReplicas.
TEST(PoolPlannerTest, AWindowWithoutTwoScrapesOfAPodHoldsTheReplicas) {
  PoolPlanner prefill("p", PoolKind::kPrefill, prefillSpec());
  WindowedValues unmeasured;
  unmeasured.pods = 3;
  const Decision decision = prefill.decide(pool(1000, 3), unmeasured);
  EXPECT_EQ(decision.reason, "MetricsUnavailable");
  EXPECT_EQ(decision.desired_replicas, 3);
  EXPECT_FALSE(decision.write);
  EXPECT_NE(decision.message.find("two scrapes"), std::string::npos) << decision.message;
  // The window says which it is.
  MetricWindow window(agentMetricNames(PoolKind::kPrefill), 1);
  ASSERT_TRUE(
      window.addScrape("a", 10, "tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} 5\n")
          .isOk());
  EXPECT_FALSE(window.values(10, 0.9).latency_measured);
  ASSERT_TRUE(
      window.addScrape("a", 10.5, "tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} 5\n")
          .isOk());
  EXPECT_TRUE(window.values(10.5, 0.9).latency_measured) << "two scrapes: an increase of 0";
}

TEST(PoolPlannerTest, NoMetricsAtAllHoldsTheReplicas) {
  PoolPlanner decode("d", PoolKind::kDecode, decodeSpec());
  const Decision decision = decode.decide(pool(1000, 5), WindowedValues{});
  EXPECT_EQ(decision.reason, "MetricsUnavailable");
  EXPECT_EQ(decision.desired_replicas, 5);
  EXPECT_FALSE(decision.write);
}

}  // namespace
}  // namespace tandem::planner
