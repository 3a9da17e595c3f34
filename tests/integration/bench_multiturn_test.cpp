// `tandem-bench multiturn` against a real `tandem-agent serve` on the tiny
// model: every turn of every conversation accounted for, each turn's prompt
// is exactly the previous prompt + its answer + the new user tokens, later
// turns hit the prefix cache, and the JSON report's shape. Then, with
// --cluster-file, both routing policies in one run against fresh local-mode
// clusters of simulated agents: goodput under an SLO, and the prompt tokens
// the agents computed against the plan's minimum; with prefix groups and two
// rounds, every round's reports, the summary over rounds, how evenly agents
// finished requests and the host's CPU use. The open loop against the agent.
// Nothing here depends on speed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "tests/support/agent_server.h"
#include "tests/support/bench_run.h"
#include "tests/support/test_files.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::tandem::testing::Agent;
using ::tandem::testing::BenchRun;
using ::tandem::testing::readFile;
using ::tandem::testing::TempDir;

class BenchMultiTurnTest : public ::testing::Test {
 protected:
  // Runs tandem-bench multiturn with `args`, by default against the agent and
  // with token ids from the tiny model's text vocabulary; reads its JSON report.
  BenchRun bench(const std::string& args, const std::string& env = "") {
    std::string defaults;
    if (args.find("--base-url") == std::string::npos) {
      defaults += " --base-url http://127.0.0.1:" + std::to_string(agent_.port());
    }
    if (args.find("--vocab-range") == std::string::npos) defaults += " --vocab-range 3:480";
    return ::tandem::testing::runBench(dir_, "multiturn", defaults + " " + args, env);
  }

  TempDir temp_{"tandem-bench-multiturn-test"};
  fs::path dir_ = temp_.path();
  Agent agent_;
};

constexpr int kConversations = 3;
constexpr int kTurns = 3;
constexpr int kPrefix = 40;
constexpr int kOutput = 8;

TEST_F(BenchMultiTurnTest, ConversationsGrowTurnByTurnAndReuseTheirPrefix) {
  const BenchRun run = bench(
      "--num-clients 2 --num-conversations 3 --turns 3 "
      "--shared-prefix-tokens 40 --input-tokens uniform:10,30 "
      "--output-tokens constant:8 --seed 5");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_EQ(run.err, "") << "no progress bar when stderr is not a terminal";
  const json& r = run.report;
  EXPECT_EQ(r["model"], "tiny") << "the model comes from /v1/models";
  EXPECT_EQ(r["num_requests"], kConversations * kTurns);
  EXPECT_EQ(r["completed"], kConversations * kTurns);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["skipped"], 0);
  EXPECT_EQ(r["length_mismatches"], 0);
  EXPECT_EQ(r["total_output_tokens"], kConversations * kTurns * kOutput);
  EXPECT_EQ(r["errors"], json::array());
  EXPECT_TRUE(r["request_rate"].is_null()) << "null stands for no pacing";
  for (const char* key : {"duration_s", "request_throughput", "output_throughput"}) {
    EXPECT_GT(r[key].get<double>(), 0.0) << key;
  }

  // Every latency figure, overall and per turn, is there and positive.
  auto expectLatencies = [](const json& figures, int count, const std::string& where) {
    for (const char* key : {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"}) {
      ASSERT_TRUE(figures[key].is_object()) << where << " " << key;
      for (const char* stat : {"mean", "median", "p90", "p99"}) {
        EXPECT_GT(figures[key][stat].get<double>(), 0.0) << where << " " << key << "." << stat;
      }
    }
    EXPECT_EQ(figures["ttft_ms"]["count"], count) << where;
    EXPECT_EQ(figures["e2el_ms"]["count"], count) << where;
  };
  expectLatencies(r, kConversations * kTurns, "overall");

  ASSERT_EQ(r["per_turn"].size(), static_cast<size_t>(kTurns));
  for (int t = 0; t < kTurns; ++t) {
    const json& turn = r["per_turn"][t];
    const std::string where = "turn " + std::to_string(t + 1);
    EXPECT_EQ(turn["turn"], t + 1);
    EXPECT_EQ(turn["completed"], kConversations) << where;
    EXPECT_EQ(turn["failed"], 0) << where;
    expectLatencies(turn, kConversations, where);
    ASSERT_TRUE(turn["cache_hit_rate"].is_number()) << where;
    if (t >= 1) {
      // Turn k's prompt starts with turn k-1's prompt and answer, whose KV
      // blocks the agent computed moments ago.
      EXPECT_GT(turn["cache_hit_rate"].get<double>(), 0.0) << where;
    }
    EXPECT_NE(run.out.find(where + ":"), std::string::npos) << run.out;
  }

  // The server's counters moved over the run, and agree that prompts were reused.
  const json& server = r["prefix_cache"]["server"];
  ASSERT_TRUE(server.is_object()) << r["prefix_cache"];
  EXPECT_GT(server["queries"].get<double>(), 0.0);
  EXPECT_GT(server["hit_rate"].get<double>(), 0.0);
  const json& usage = r["prefix_cache"]["usage"];
  ASSERT_TRUE(usage.is_object()) << r["prefix_cache"];
  EXPECT_GT(usage["hit_rate"].get<double>(), 0.0);
  EXPECT_EQ(usage["prompt_tokens"], r["total_input_tokens"]);

  // Each conversation: turn 1 is the prefix and new tokens; turn k adds the
  // previous answer and its own new tokens, all exact.
  ASSERT_EQ(r["requests"].size(), static_cast<size_t>(kConversations * kTurns));
  std::map<std::pair<int, int>, json> by_turn;
  for (const json& request : r["requests"]) {
    ASSERT_TRUE(request["success"].get<bool>()) << request.dump();
    by_turn[{request["conversation"].get<int>(), request["turn"].get<int>()}] = request;
    const int64_t input_len = request["input_len"];
    EXPECT_GE(input_len, 10);
    EXPECT_LE(input_len, 30);
    EXPECT_EQ(request["completion_tokens"], kOutput);
    EXPECT_EQ(request["prompt_tokens"], request["prompt_len"]);
    EXPECT_LE(request["cached_tokens"].get<int64_t>(), request["prompt_tokens"].get<int64_t>());
    EXPECT_GE(request["itl_ms"].size(), 1u);
    EXPECT_LE(request["itl_ms"].size(), static_cast<size_t>(kOutput - 1));
    EXPECT_LE(request["ttft_ms"].get<double>(), request["e2el_ms"].get<double>());
  }
  for (int c = 0; c < kConversations; ++c) {
    const json& first = by_turn[{c, 1}];
    EXPECT_EQ(first["prompt_tokens"].get<int64_t>(), kPrefix + first["input_len"].get<int64_t>());
    for (int t = 2; t <= kTurns; ++t) {
      const json& previous = by_turn[{c, t - 1}];
      const json& current = by_turn[{c, t}];
      EXPECT_EQ(current["prompt_tokens"].get<int64_t>(),
                previous["prompt_tokens"].get<int64_t>() +
                    previous["completion_tokens"].get<int64_t>() +
                    current["input_len"].get<int64_t>())
          << "conversation " << c << " turn " << t;
      EXPECT_GT(current["cached_tokens"].get<int64_t>(), 0)
          << "conversation " << c << " turn " << t;
    }
  }
}

TEST_F(BenchMultiTurnTest, PoissonArrivalsLognormalLengthsAndAPlotOrItsNotice) {
  const fs::path png = dir_ / "ttft.png";
  const BenchRun run = bench(
      "--num-clients 2 --num-conversations 2 --turns 2 --input-tokens lognormal:12,0.5 "
      "--output-tokens uniform:2,6 --request-rate 40 --seed 7 --plot '" +
      png.string() + "'");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const json& r = run.report;
  EXPECT_EQ(r["completed"], 4);
  EXPECT_EQ(r["request_rate"], 40.0);
  EXPECT_EQ(r["input_tokens"], "lognormal:12,0.5");
  EXPECT_EQ(r["output_tokens"], "uniform:2,6");
  for (const json& request : r["requests"]) {
    EXPECT_GE(request["input_len"].get<int>(), 1);
    EXPECT_GE(request["output_len"].get<int>(), 2);
    EXPECT_LE(request["output_len"].get<int>(), 6);
    EXPECT_EQ(request["completion_tokens"], request["output_len"]);
    EXPECT_TRUE(request["arrival_s"].is_number());
    EXPECT_GE(request["send_s"].get<double>() + 1e-3, request["arrival_s"].get<double>())
        << "no request goes before its arrival time";
  }
  // gnuplot is optional: with it the PNG is drawn, without it a notice says so.
  if (run.out.find("gnuplot is not on PATH") == std::string::npos) {
    ASSERT_TRUE(fs::exists(png)) << run.out << run.err;
    EXPECT_EQ(readFile(png).substr(1, 3), "PNG");
  } else {
    EXPECT_FALSE(fs::exists(png));
  }
  const BenchRun without = bench(
      "--num-conversations 1 --turns 1 --input-tokens constant:4 "
      "--output-tokens constant:2 --plot '" +
          (dir_ / "none.png").string() + "'",
      "PATH=/nonexistent");
  EXPECT_EQ(without.exit_code, 0) << without.out << without.err;
  EXPECT_NE(without.out.find("--plot skipped: gnuplot is not on PATH"), std::string::npos)
      << without.out;
}

TEST_F(BenchMultiTurnTest, AFailedTurnEndsItsConversationAndIsCounted) {
  // Token ids past the tiny vocabulary (512) are refused by the agent.
  const BenchRun run = bench(
      "--num-clients 1 --num-conversations 2 --turns 3 "
      "--input-tokens constant:4 --output-tokens constant:2 "
      "--vocab-range 600:700");
  EXPECT_EQ(run.exit_code, 1) << "failed requests make the exit code non-zero";
  const json& r = run.report;
  EXPECT_EQ(r["completed"], 0);
  EXPECT_EQ(r["failed"], 2) << "the first turn of each conversation";
  EXPECT_EQ(r["skipped"], 4) << "the turns after a failure are not sent";
  ASSERT_EQ(r["errors"].size(), 2u);
  EXPECT_NE(r["errors"][0].get<std::string>().find("HTTP 400"), std::string::npos) << r["errors"];
  EXPECT_TRUE(r["ttft_ms"].is_null()) << "nothing was measured";
  EXPECT_NE(run.out.find("error: conversation 0 turn 1: HTTP 400"), std::string::npos) << run.out;
}

TEST_F(BenchMultiTurnTest, BadOptionsAreRefusedNamingWhatIsAccepted) {
  const BenchRun bad_spec = bench("--input-tokens normal:5,1");
  EXPECT_EQ(bad_spec.exit_code, 1);
  EXPECT_NE(
      bad_spec.err.find("--input-tokens takes constant:N, uniform:A,B or lognormal:MEAN,SIGMA"),
      std::string::npos)
      << bad_spec.err;

  const BenchRun too_long = bench(
      "--turns 4 --shared-prefix-tokens 460 --input-tokens constant:10 "
      "--output-tokens constant:10");
  EXPECT_EQ(too_long.exit_code, 1);
  EXPECT_NE(too_long.err.find("max_model_len 512"), std::string::npos) << too_long.err;

  const BenchRun bad_url = bench("--no-progress --base-url http://127.0.0.1:1/v1");
  EXPECT_EQ(bad_url.exit_code, 1);
  EXPECT_NE(bad_url.err.find("--base-url must be scheme://host[:port]"), std::string::npos)
      << bad_url.err;

  const BenchRun bad_arrival = bench("--arrival poisson:0");
  EXPECT_EQ(bad_arrival.exit_code, 1);
  EXPECT_NE(bad_arrival.err.find("--arrival takes closed or poisson:RATE"), std::string::npos)
      << bad_arrival.err;
  const BenchRun both_rates = bench("--arrival poisson:5 --request-rate 5");
  EXPECT_EQ(both_rates.exit_code, 1);
  EXPECT_NE(both_rates.err.find("--request-rate paces the closed loop"), std::string::npos)
      << both_rates.err;
  const BenchRun rounds_alone = bench("--rounds 2");
  EXPECT_EQ(rounds_alone.exit_code, 1);
  EXPECT_NE(rounds_alone.err.find("--rounds 2 needs --cluster-file"), std::string::npos)
      << rounds_alone.err;
  const BenchRun groups_without_prefix = bench("--prefix-groups 4");
  EXPECT_EQ(groups_without_prefix.exit_code, 1);
  EXPECT_NE(groups_without_prefix.err.find("--prefix-groups 4 needs --shared-prefix-tokens"),
            std::string::npos)
      << groups_without_prefix.err;
  const BenchRun bad_zipf = bench("--shared-prefix-tokens 8 --prefix-groups 2 --prefix-zipf -1");
  EXPECT_EQ(bad_zipf.exit_code, 1);
  EXPECT_NE(bad_zipf.err.find("--prefix-zipf must be a finite number >= 0"), std::string::npos)
      << bad_zipf.err;
}

TEST_F(BenchMultiTurnTest, OpenLoopConversationsArriveOnTheirOwnAndKeepTheirTurnsInOrder) {
  const BenchRun run = bench(
      "--arrival poisson:40 --num-conversations 3 --turns 2 --shared-prefix-tokens 16 "
      "--input-tokens constant:6 --output-tokens constant:3 --seed 9");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const json& r = run.report;
  EXPECT_EQ(r["arrival"], "poisson:40");
  EXPECT_EQ(r["offered_rate"], 40.0);
  EXPECT_EQ(r["completed"], 6);
  EXPECT_NE(run.out.find("request rate offered / achieved (req/s)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("(40 req/s offered)"), std::string::npos) << run.out;
  std::map<std::pair<int, int>, json> by_turn;
  for (const json& request : r["requests"]) {
    by_turn[{request["conversation"].get<int>(), request["turn"].get<int>()}] = request;
  }
  double last_start = -1.0;
  for (int c = 0; c < 3; ++c) {
    const json& first = by_turn[{c, 1}];
    const json& second = by_turn[{c, 2}];
    ASSERT_TRUE(first["arrival_s"].is_number()) << first;
    EXPECT_GE(first["arrival_s"].get<double>(), last_start) << "conversations arrive in order";
    last_start = first["arrival_s"].get<double>();
    EXPECT_GE(first["send_s"].get<double>() + 1e-3, first["arrival_s"].get<double>());
    EXPECT_EQ(first["client"], c) << "each conversation is its own client";
    EXPECT_TRUE(second["arrival_s"].is_null()) << "later turns follow their previous one";
    EXPECT_GE(second["send_s"].get<double>(), first["end_s"].get<double>())
        << "conversation " << c << ": turn 2 waits for turn 1's answer";
  }
  EXPECT_EQ((by_turn[{0, 1}]["arrival_s"]), 0.0) << "the first conversation arrives at once";
  EXPECT_TRUE(r["host_cpu"]["busy_fraction"].is_number()) << r["host_cpu"];
}

// A local-mode cluster of one simulated prefill and one simulated decode
// agent on the tiny model, with the H100 profile.
std::string simulatedClusterYaml() {
  std::string yaml;
  for (const char* kind : {"PrefillPool", "DecodePool"}) {
    const std::string name = std::string(kind) == "PrefillPool" ? "prefill" : "decode";
    yaml += std::string("apiVersion: tandem.dev/v1alpha1\nkind: ") + kind +
            "\nmetadata:\n  name: " + name + "\nspec:\n  replicas: 1\n  model:\n    path: " +
            ::tandem::testing::tinyModelDir().string() +
            "\n    name: tiny\n  engine:\n    simulate: " + TANDEM_SOURCE_DIR +
            "/profiles/llama3.1-8b-h100.yaml\n    numBlocks: 128\n"
            "  kvTransfer:\n    connector: ucx\n    role: kv_both\n---\n";
  }
  return yaml;
}

TEST_F(BenchMultiTurnTest, BothPoliciesInOneRunCountComputedPromptTokensAndGoodput) {
  const fs::path cluster = dir_ / "sim-1p1d.yaml";
  { std::ofstream(cluster) << simulatedClusterYaml(); }
  // Turn 1 (prefix + up to 30 new tokens) is long enough to be disaggregated;
  // turn 2's uncached part is short, so the kv policy prefills it on the
  // decode agent: both agents compute prompt tokens.
  const std::string workload =
      " --cluster-file '" + cluster.string() + "' --work-dir '" + (dir_ / "clusters").string() +
      "' --policies kv,round_robin --num-clients 2 --num-conversations 3 --turns 2"
      " --shared-prefix-tokens 270 --input-tokens uniform:10,30 --output-tokens constant:6"
      " --seed 3";
  const BenchRun run = bench(workload + " --slo-ttft-ms 1e9 --slo-itl-ms 1e9");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const json& r = run.report;
  ASSERT_EQ(r["num_rounds"], 1) << r.dump(1).substr(0, 2000);
  ASSERT_EQ(r["rounds"].size(), 1u) << r.dump(1).substr(0, 2000);
  const json& policies = r["rounds"][0]["policies"];
  ASSERT_EQ(policies.size(), 2u) << r.dump(1).substr(0, 2000);
  EXPECT_EQ(policies[0]["policy"], "kv");
  EXPECT_EQ(policies[1]["policy"], "round_robin");
  EXPECT_EQ(r["ratios"]["numerator"], "kv");
  EXPECT_EQ(r["ratios"]["denominator"], "round_robin");
  EXPECT_TRUE(r["ratios"]["figures"]["ttft_ms.mean"].is_number()) << r["ratios"];
  for (const json& p : policies) {
    const std::string where = p["policy"];
    EXPECT_EQ(p["completed"], 6) << where;
    EXPECT_EQ(p["failed"], 0) << where;
    EXPECT_EQ(p["skipped"], 0) << where;

    // Every request met an SLO of 1e9 ms: goodput is the throughput.
    ASSERT_TRUE(p["goodput"].is_object()) << where;
    EXPECT_EQ(p["goodput"]["good"], 6) << where;
    EXPECT_EQ(p["goodput"]["share"], 1.0) << where;
    EXPECT_DOUBLE_EQ(p["goodput"]["goodput"].get<double>(), p["request_throughput"].get<double>())
        << where;

    // Prompt tokens computed: every agent read, the sum at least the
    // minimum, and equal to what the agents' counters moved by.
    const json& c = p["prompt_tokens_computed"];
    ASSERT_TRUE(c.is_object()) << where;
    ASSERT_EQ(c["agents"].size(), 2u) << c;
    ASSERT_TRUE(c["computed"].is_number()) << c;
    const double computed = c["computed"];
    EXPECT_GE(computed, c["minimum"].get<double>()) << c;
    EXPECT_LE(c["minimum"].get<double>(), c["distinct"].get<double>()) << c;
    EXPECT_DOUBLE_EQ(c["ratio"].get<double>(), computed / c["minimum"].get<double>());
    double moved_computed = 0, moved_by_counters = 0;
    for (const json& agent : c["agents"]) {
      const json &before = agent["before"], &after = agent["after"];
      const double d_computed =
          after["computed_tokens"].get<double>() - before["computed_tokens"].get<double>();
      const double d_generated =
          after["generation_tokens"].get<double>() - before["generation_tokens"].get<double>();
      const double d_finished =
          after["finished_requests"].get<double>() - before["finished_requests"].get<double>();
      EXPECT_GT(d_computed, 0.0) << where << ": every agent computed something " << agent;
      moved_computed += d_computed;
      moved_by_counters += d_computed - (d_generated - d_finished);
    }
    EXPECT_DOUBLE_EQ(computed, moved_by_counters) << c;
    // Independently of the agents' generation counters: all they computed
    // is the prompt tokens plus one decode step per answer token but the first.
    int64_t decode_steps = 0;
    for (const json& request : p["requests"]) {
      decode_steps += request["completion_tokens"].get<int64_t>() - 1;
    }
    EXPECT_DOUBLE_EQ(moved_computed, computed + static_cast<double>(decode_steps)) << c;
  }
  EXPECT_NE(run.out.find("kv/round_robin"), std::string::npos) << run.out;

  // An SLO of 0 ms: no request is good.
  const BenchRun strict = bench(workload + " --slo-ttft-ms 0 --slo-itl-ms 0");
  ASSERT_EQ(strict.exit_code, 0) << strict.out << strict.err;
  ASSERT_EQ(strict.report["rounds"][0]["policies"].size(), 2u);
  for (const json& p : strict.report["rounds"][0]["policies"]) {
    EXPECT_EQ(p["goodput"]["good"], 0) << p["policy"];
    EXPECT_EQ(p["goodput"]["goodput"], 0.0) << p["policy"];
    EXPECT_EQ(p["goodput"]["share"], 0.0) << p["policy"];
    EXPECT_GT(p["request_throughput"].get<double>(), 0.0) << p["policy"];
  }

  std::string bad_workload = workload;
  bad_workload.replace(bad_workload.find("kv,round_robin"), 14, "kv,fastest");
  const BenchRun bad = bench(bad_workload);
  EXPECT_EQ(bad.exit_code, 1);
  // The router's own list of policies, every one named.
  EXPECT_NE(bad.err.find("--policies"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("got \"fastest\""), std::string::npos) << bad.err;
  for (const char* policy : {"kv", "round_robin", "random", "dynamo", "llm_d", "sglang"}) {
    EXPECT_NE(bad.err.find(policy), std::string::npos) << policy << ": " << bad.err;
  }
  EXPECT_EQ(bad.err.find("kv, round_robin or random"), std::string::npos)
      << "the old list of three: " << bad.err;
}

TEST_F(BenchMultiTurnTest, RoundsOfPoliciesWithPrefixGroupsSummariseBalanceAndHostCpu) {
  const fs::path cluster = dir_ / "sim-1p1d.yaml";
  { std::ofstream(cluster) << simulatedClusterYaml(); }
  constexpr int kPrefixTokens = 270, kGroupConversations = 4;
  const BenchRun run =
      bench(" --cluster-file '" + cluster.string() + "' --work-dir '" + (dir_ / "rounds").string() +
            "' --policies kv,round_robin --rounds 2 --prefix-groups 2 --prefix-zipf 0"
            " --num-clients 2 --num-conversations 4 --turns 2 --shared-prefix-tokens 270"
            " --input-tokens uniform:10,30 --output-tokens constant:6 --seed 4"
            " --slo-ttft-ms 1e9 --slo-itl-ms 1e9");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const json& r = run.report;
  ASSERT_EQ(r["num_rounds"], 2) << r.dump(1).substr(0, 2000);
  ASSERT_EQ(r["rounds"].size(), 2u);
  EXPECT_EQ(r["policy_names"], json({"kv", "round_robin"}));
  EXPECT_EQ(r["rounds"][0]["order"], json({"kv", "round_robin"}));
  EXPECT_EQ(r["rounds"][1]["order"], json({"round_robin", "kv"})) << "the order rotates";
  EXPECT_TRUE(fs::exists(dir_ / "rounds" / "round-2" / "kv")) << "a fresh cluster per run";

  // The same plan in every run: groups, lengths and prompts.
  const json& reference_requests = r["rounds"][0]["policies"][0]["requests"];
  std::set<int> groups_used;
  for (const json& request : reference_requests) {
    groups_used.insert(request["prefix_group"].get<int>());
  }
  for (size_t round = 0; round < 2; ++round) {
    const json& policies = r["rounds"][round]["policies"];
    ASSERT_EQ(policies.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const json& p = policies[i];
      const std::string where = p["policy"].get<std::string>() + " round " + std::to_string(round);
      EXPECT_EQ(p["policy"], i == 0 ? "kv" : "round_robin") << "reports in --policies order";
      EXPECT_EQ(p["round"], round + 1);
      EXPECT_EQ(p["position"], round == 0 ? i + 1 : 2 - i) << where;
      EXPECT_EQ(p["prefix_groups"], 2) << where;
      EXPECT_EQ(p["completed"], 2 * kGroupConversations) << where;
      ASSERT_EQ(p["requests"].size(), reference_requests.size()) << where;
      for (size_t k = 0; k < reference_requests.size(); ++k) {
        for (const char* key : {"prefix_group", "input_len", "prompt_len"}) {
          EXPECT_EQ(p["requests"][k][key], reference_requests[k][key]) << where << " " << key;
        }
      }

      // The minimum counts each group's prefix once, then per conversation
      // its last prompt less its prefix less the first answer's tokens but
      // one (their KV came from decode steps).
      int64_t minimum = 0, distinct = 0;
      std::set<int> groups;
      for (const json& request : p["requests"]) {
        if (request["turn"] != 2) continue;
        groups.insert(request["prefix_group"].get<int>());
        distinct += request["prompt_len"].get<int64_t>() - kPrefixTokens;
        minimum += request["prompt_len"].get<int64_t>() - kPrefixTokens - (6 - 1);
      }
      minimum += kPrefixTokens * static_cast<int64_t>(groups.size());
      distinct += kPrefixTokens * static_cast<int64_t>(groups.size());
      EXPECT_EQ(p["prompt_tokens_computed"]["minimum"], minimum) << where;
      EXPECT_EQ(p["prompt_tokens_computed"]["distinct"], distinct) << where;

      // Balance: every request finishes on the one decode agent.
      const json& balance = p["balance"];
      ASSERT_TRUE(balance.is_object()) << where << " " << p["prompt_tokens_computed"];
      EXPECT_EQ(balance["decode"]["agents"], 1) << balance;
      EXPECT_EQ(balance["prefill"]["agents"], 1) << balance;
      EXPECT_EQ(balance["decode"]["finished_requests"], json({2.0 * kGroupConversations}))
          << balance;
      EXPECT_EQ(balance["decode"]["max_over_mean"], 1.0) << balance;

      // Host CPU over the run.
      const json& cpu = p["host_cpu"];
      ASSERT_TRUE(cpu["busy_fraction"].is_number()) << cpu;
      EXPECT_GE(cpu["busy_fraction"].get<double>(), 0.0);
      EXPECT_LE(cpu["busy_fraction"].get<double>(), 1.0);
      EXPECT_GE(cpu["load_average_1m"].get<double>(), 0.0) << cpu;
      EXPECT_GE(cpu["cores"].get<int>(), 1) << cpu;
      EXPECT_EQ(cpu["overloaded"].get<bool>(), cpu["busy_fraction"].get<double>() > 0.9) << cpu;
      if (cpu["overloaded"].get<bool>()) {
        EXPECT_NE(run.out.find("host overloaded: figures measure the host, not the routing"),
                  std::string::npos);
      }
    }
  }
  EXPECT_EQ(groups_used.size(), 2u) << "4 conversations drawn uniformly over 2 groups (seed 4)";

  // The summary: each figure's median and range over the two rounds.
  const json& ttft = r["summary"]["figures"]["ttft_ms.mean"];
  for (const char* policy : {"kv", "round_robin"}) {
    const json& f = ttft[policy];
    ASSERT_EQ(f["values"].size(), 2u) << f;
    const double a = f["values"][0], b = f["values"][1];
    EXPECT_DOUBLE_EQ(f["median"].get<double>(), (a + b) / 2) << f;
    EXPECT_DOUBLE_EQ(f["min"].get<double>(), std::min(a, b)) << f;
    EXPECT_DOUBLE_EQ(f["max"].get<double>(), std::max(a, b)) << f;
  }
  EXPECT_TRUE(r["summary"]["figures"].contains("balance.decode.max_over_mean"));
  EXPECT_TRUE(r["summary"]["figures"].contains("host_cpu.busy_fraction"));
  const json& versus = r["summary"]["kv_vs_best_other"];
  for (const char* key : {"ttft_ms.mean", "ttft_ms.p90", "goodput.goodput"}) {
    ASSERT_TRUE(versus[key].is_object()) << versus;
    EXPECT_EQ(versus[key]["best_other"], "round_robin") << key;
    EXPECT_DOUBLE_EQ(versus[key]["ratio"].get<double>(),
                     r["summary"]["figures"][key]["kv"]["median"].get<double>() /
                         r["summary"]["figures"][key]["round_robin"]["median"].get<double>())
        << key;
    EXPECT_EQ(versus[key]["per_round"].size(), 2u) << key;
  }
  EXPECT_NE(run.out.find("kv / best other policy"), std::string::npos) << run.out;
}

}  // namespace
