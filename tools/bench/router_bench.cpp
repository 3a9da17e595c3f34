#include "tools/bench/router_bench.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/prometheus_text.h"
#include "common/status.h"
#include "operator/router/router.h"
#include "tools/bench/latency_stats.h"
#include "tools/bench/openai_client.h"

namespace tandem::bench {
namespace {

using nlohmann::json;

// Seconds for one non-streamed completion; throws on failure.
double timedCompletion(httplib::Client& client, const std::string& body, const char* where) {
  const auto start = Clock::now();
  auto result = client.Post("/v1/completions", body, "application/json");
  const double seconds = secondsBetween(start, Clock::now());
  if (!result || result->status != 200) {
    throw Error(std::string("a request ") + where + " failed: " +
                (result
                     ? "HTTP " + std::to_string(result->status) + " " + result->body.substr(0, 200)
                     : httplib::to_string(result.error())));
  }
  return seconds;
}

}  // namespace

int runRouterBench(const RouterBenchOptions& options) {
  if (options.scale.agents > 0) {
    RouterScaleOptions scale = options.scale;
    scale.requests = options.requests;
    scale.prompt_tokens = options.prompt_tokens;
    scale.max_tokens = options.max_tokens;
    scale.json_path = options.json_path;
    return runRouterScaleBench(scale);
  }
  const std::string base = checkedBaseUrl(options.agent_url, "--agent-url");
  const auto models = listModels(base, 30);
  if (models.empty()) throw Error(base + " lists no model");
  const size_t colon = base.rfind(':');
  const std::string host = base.substr(base.find("://") + 3, colon - base.find("://") - 3);
  const int agent_port = std::stoi(base.substr(colon + 1));

  router::RouterConfig config;
  config.port = 0;
  config.decode.push_back({"agent", host, agent_port});
  config.poll_interval_s = 0.2;
  router::Router router(config);
  router.start();
  httplib::Client routed("127.0.0.1", router.port());
  httplib::Client direct(host, agent_port);
  for (auto* client : {&routed, &direct}) {
    client->set_read_timeout(600, 0);
    client->set_keep_alive(false);  // a new connection per request, both ways
  }
  const auto ready_by = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    auto health = routed.Get("/health");
    if (health && health->status == 200) break;
    if (Clock::now() > ready_by) throw Error("the router did not become ready in 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  std::mt19937 random(7);
  std::vector<int> prompt;
  for (int i = 0; i < options.prompt_tokens; ++i) {
    prompt.push_back(std::uniform_int_distribution<int>(3, 400)(random));
  }
  const std::string body = json{
      {"model", models[0].id},
      {"prompt", prompt},
      {"max_tokens", options.max_tokens},
      {"temperature", 0},
      {"ignore_eos", true}}.dump();
  // Warm up: the prompt's blocks are cached from here on, so both paths ask
  // the agent for the same work.
  timedCompletion(direct, body, "to the agent");
  timedCompletion(routed, body, "through the router");

  std::vector<double> direct_s, routed_s, added_s;
  for (int i = 0; i < options.requests; ++i) {
    // Alternate which goes first so drift on a shared machine cancels out.
    double d = 0, r = 0;
    if (i % 2 == 0) {
      d = timedCompletion(direct, body, "to the agent");
      r = timedCompletion(routed, body, "through the router");
    } else {
      r = timedCompletion(routed, body, "through the router");
      d = timedCompletion(direct, body, "to the agent");
    }
    direct_s.push_back(d);
    routed_s.push_back(r);
    added_s.push_back(r - d);
  }
  const std::string metrics = routed.Get("/metrics")->body;
  const double decisions =
      prometheusSample(metrics, "tandem_router_decision_seconds_count").value_or(0);
  const double decision_seconds =
      prometheusSample(metrics, "tandem_router_decision_seconds_sum").value_or(0);
  router.stop(5);

  const Distribution direct_d = distributionOf(direct_s);
  const Distribution routed_d = distributionOf(routed_s);
  const Distribution added_d = distributionOf(added_s);
  const double decision_mean = decisions > 0 ? decision_seconds / decisions : 0;
  std::printf("router cost: %d request pairs, %d-token prompt (cached), max_tokens %d\n",
              options.requests, options.prompt_tokens, options.max_tokens);
  std::printf("%-12s %10s %10s %10s %10s\n", "(ms)", "mean", "median", "p90", "p99");
  printDistribution("direct", direct_d);
  printDistribution("routed", routed_d);
  printDistribution("added", added_d);
  std::printf("decision (tokenize, hash, choose): mean %.1f us = %.0f decisions/s per thread\n",
              decision_mean * 1e6, decision_mean > 0 ? 1 / decision_mean : 0.0);
  std::printf("routed / direct median: %.2f\n",
              direct_d.median > 0 ? routed_d.median / direct_d.median : 0.0);
  if (!options.json_path.empty()) {
    json out = {{"requests", options.requests},
                {"prompt_tokens", options.prompt_tokens},
                {"direct_ms", distributionMsJson(direct_d)},
                {"routed_ms", distributionMsJson(routed_d)},
                {"added_ms", distributionMsJson(added_d)},
                {"decision_mean_us", decision_mean * 1e6},
                {"decisions_per_second_per_thread", decision_mean > 0 ? 1 / decision_mean : 0.0},
                {"decisions", decisions}};
    std::ofstream(options.json_path) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace tandem::bench
