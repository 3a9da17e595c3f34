// The chart's monitoring objects against a real Prometheus: the rendered
// PrometheusRule passes `promtool check rules`; a local cluster (a prefill
// and a decode pool behind the router) and the controller (against the API
// stand-in, with pools of the same names) are scraped with the labels the
// PodMonitor's relabelling gives; every panel query of the rendered Grafana
// dashboard returns data, every alert rule evaluates with health "ok", and
// TandemTTFTHigh fires for the prefill pool with a tiny target while the
// default target keeps it quiet.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_socket.h"
#include "common/subprocess.h"
#include "tests/support/agent_server.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/apiserver/yaml_json.h"
#include "tests/support/helm.h"
#include "tests/support/test_files.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::eventually;

const fs::path kSourceDir = TANDEM_SOURCE_DIR;
const fs::path kChartDir = kSourceDir / "charts/tandem";
const fs::path kOperator = fs::path(TANDEM_BIN_DIR) / "tandem-operator";
constexpr char kNamespace[] = "llm";
// What the dashboard's $__rate_interval stands for here (scrapes every 1 s).
constexpr char kRateInterval[] = "30s";

using tandem::freeLoopbackPort;

// An executable in /usr/bin or /usr/local/bin, or "" when there is none.
void replaceAll(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

// A cluster file of the tiny test model: one prefill and one decode agent,
// prompts of 16 tokens and more disaggregated.
std::string clusterYaml() {
  auto pool = [](const std::string& kind, const std::string& name) {
    return "apiVersion: tandem.dev/v1alpha1\nkind: " + kind + "\nmetadata:\n  name: " + name +
           "\nspec:\n  replicas: 1\n  model:\n    path: " + testing::tinyModelDir().string() +
           "\n    name: tiny\n  engine:\n    numBlocks: 128\n    threads: 1\n"
           "    shutdownTimeoutSeconds: 5\n";
  };
  return pool("PrefillPool", "prefill") + "---\n" + pool("DecodePool", "decode") +
         "---\napiVersion: tandem.dev/v1alpha1\nkind: Router\nspec:\n"
         "  disaggThresholdTokens: 16\n";
}

json poolObject(const std::string& kind, const std::string& name) {
  return {{"apiVersion", "tandem.dev/v1alpha1"},
          {"kind", kind},
          {"metadata", {{"name", name}, {"namespace", kNamespace}}},
          {"spec",
           {{"replicas", 1},
            {"model", {{"path", "/models/tiny"}}},
            {"kvTransfer", {{"secretRef", {{"name", "kv"}, {"key", "secret"}}}}}}}};
}

class MonitoringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prometheus_ = tandem::testing::findSystemTool("prometheus");
    promtool_ = tandem::testing::findSystemTool("promtool");
    if (prometheus_.empty() || promtool_.empty()) {
      GTEST_SKIP() << "prometheus and promtool are not installed";
    }
  }

  // `helm template` of the chart with monitoring on and `extra` arguments.
  std::vector<json> render(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {
        testing::helmPath(), "template", "tandem",         kChartDir.string(),
        "--namespace",       kNamespace, "--api-versions", "monitoring.coreos.com/v1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const std::string home = dir_.path().string();
    Subprocess helm(argv, dir_.path() / "helm.err",
                    {{"HOME", home},
                     {"HELM_CACHE_HOME", home + "/cache"},
                     {"HELM_CONFIG_HOME", home + "/config"},
                     {"HELM_DATA_HOME", home + "/data"}});
    const std::string out = helm.readStdout(seconds(60));
    EXPECT_EQ(helm.wait(seconds(5)), 0) << helm.stderrText();
    return testing::yamlDocumentsToJson(out);
  }

  static json only(const std::vector<json>& objects, const std::string& kind) {
    for (const json& object : objects) {
      if (object.value("kind", "") == kind) return object;
    }
    ADD_FAILURE() << "no " << kind << " rendered";
    return json::object();
  }

  // The PrometheusRule's spec of a rendering, as a rule file checked by promtool.
  fs::path rulesFile(const std::string& name, const std::vector<std::string>& extra) {
    const json rule = only(render(extra), "PrometheusRule");
    const fs::path path = dir_.path() / name;
    std::ofstream(path) << rule.value("spec", json::object()).dump(2);
    Subprocess check({promtool_, "check", "rules", path.string()}, dir_.path() / "promtool.err");
    const std::string out = check.readStdout(seconds(30));
    EXPECT_EQ(check.wait(seconds(5)), 0) << out << check.stderrText();
    EXPECT_NE(out.find("SUCCESS: 6 rules found"), std::string::npos) << out;
    return path;
  }

  json prometheusGet(const std::string& path, const httplib::Params& params = {}) {
    httplib::Client client("127.0.0.1", prometheus_port_);
    client.set_read_timeout(10, 0);
    auto response = client.Get(path, params, httplib::Headers{});
    if (!response || response->status != 200) return json::object();
    return json::parse(response->body, nullptr, false);
  }

  testing::TempDir dir_{"tandem-monitoring-test"};
  std::string prometheus_;
  std::string promtool_;
  int prometheus_port_ = 0;
};

// One scrape job of static targets, each with its labels.
struct Job {
  std::string name;
  bool honor_labels = false;
  std::vector<std::pair<std::string, std::map<std::string, std::string>>> targets;
};

std::string prometheusConfig(const std::vector<Job>& jobs, const std::vector<fs::path>& rules) {
  json config = {{"global", {{"scrape_interval", "1s"}, {"evaluation_interval", "1s"}}},
                 {"rule_files", json::array()},
                 {"scrape_configs", json::array()}};
  for (const fs::path& file : rules) config["rule_files"].push_back(file.string());
  for (const Job& job : jobs) {
    json scrape = {{"job_name", job.name},
                   {"honor_labels", job.honor_labels},
                   {"static_configs", json::array()}};
    for (const auto& [target, labels] : job.targets) {
      scrape["static_configs"].push_back({{"targets", {target}}, {"labels", labels}});
    }
    config["scrape_configs"].push_back(scrape);
  }
  return config.dump(2);
}

TEST_F(MonitoringTest, DashboardPanelsHaveDataAndAlertsEvaluate) {
  // The rules: the chart's defaults (latency alerts at once, so "not firing"
  // means the condition does not hold), and a tiny TTFT target for the
  // prefill pool.
  const fs::path default_rules = rulesFile(
      "default-rules.yaml", {"--set", "monitoring.prometheusRule.alerts.ttftHigh.for=0s", "--set",
                             "monitoring.prometheusRule.ruleLabels.rendering=default"});
  const fs::path tiny_values = dir_.write("tiny.yaml", R"(monitoring:
  prometheusRule:
    ruleLabels: {rendering: tiny}
    poolTargets:
      - {pool: prefill, ttftP95Seconds: 0.000001}
    alerts:
      ttftHigh: {for: 0s, severity: page}
)");
  const fs::path tiny_rules = rulesFile("tiny-rules.yaml", {"-f", tiny_values.string()});
  const json dashboard_map = only(render({}), "ConfigMap");
  const json dashboard = json::parse(dashboard_map["data"].value("tandem.json", "{}"));
  ASSERT_FALSE(dashboard.value("panels", json::array()).empty());

  // The local cluster; agents' ports from their "listening on" lines.
  const fs::path cluster = dir_.write("cluster.yaml", clusterYaml());
  Subprocess local({kOperator.string(), "local", "-f", cluster.string(), "--port", "0"},
                   dir_.path() / "local.err");
  std::map<std::string, int> agent_ports;
  int router_port = 0;
  while (router_port == 0) {
    const std::string line = local.waitForLine("", seconds(120));
    ASSERT_FALSE(line.empty()) << local.stderrText();
    const size_t listening = line.find("listening on 127.0.0.1:");
    if (listening == std::string::npos) continue;
    const int port = std::stoi(line.substr(line.rfind(':') + 1));
    if (line.starts_with("router ")) {
      router_port = port;
    } else if (line.starts_with("[")) {
      agent_ports[line.substr(1, line.find(']') - 1)] = port;
    }
  }
  ASSERT_EQ(agent_ports.size(), 2u) << "agents seen: " << agent_ports.size();
  ASSERT_TRUE(agent_ports.count("prefill-0") && agent_ports.count("decode-0"));

  // The controller, leader-elected, with pools of the same names.
  testing::ApiServer server;
  server.registerCrds(kSourceDir / "crds");
  server.setDeploymentControllerAuto(true);
  server.put(poolObject("PrefillPool", "prefill"));
  server.put(poolObject("DecodePool", "decode"));
  const int controller_port = freeLoopbackPort();
  const fs::path kubeconfig =
      server.writeKubeconfig(dir_.path() / "controller.kubeconfig", "controller", kNamespace);
  Subprocess controller(
      {kOperator.string(), "controller", "--kubeconfig", kubeconfig.string(), "--namespace",
       kNamespace, "--leader-elect", "--default-agent-image", "agent:test", "--metrics-host",
       "127.0.0.1", "--metrics-port", std::to_string(controller_port)},
      dir_.path() / "controller.err");
  ASSERT_FALSE(controller.waitForLine("controller started", seconds(60)).empty())
      << controller.stderrText();

  // Prometheus, the targets labelled as the PodMonitor's relabelling would.
  auto agent = [&](const std::string& name, const std::string& pool) {
    return std::make_pair(
        "127.0.0.1:" + std::to_string(agent_ports[name]),
        std::map<std::string, std::string>{
            {"pool", pool}, {"component", pool}, {"namespace", kNamespace}, {"pod", name}});
  };
  const std::vector<Job> jobs = {
      {"tandem-agents", false, {agent("prefill-0", "prefill"), agent("decode-0", "decode")}},
      {"tandem-routers",
       false,
       {{"127.0.0.1:" + std::to_string(router_port),
         {{"component", "router"}, {"namespace", kNamespace}, {"pod", "router-0"}}}}},
      // As the ServiceMonitor: the controller's own labels win.
      {"tandem-operator",
       true,
       {{"127.0.0.1:" + std::to_string(controller_port),
         {{"component", "operator"}, {"namespace", kNamespace}, {"pod", "operator-0"}}}}}};
  const fs::path config =
      dir_.write("prometheus.yml", prometheusConfig(jobs, {default_rules, tiny_rules}));
  prometheus_port_ = freeLoopbackPort();
  Subprocess prometheus({prometheus_, "--config.file=" + config.string(),
                         "--storage.tsdb.path=" + (dir_.path() / "tsdb").string(),
                         "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port_)},
                        dir_.path() / "prometheus.err");

  // Every target up, scraped at least a few times.
  ASSERT_TRUE(eventually(
      [&] {
        const json targets = prometheusGet("/api/v1/targets");
        if (!targets.contains("data")) return false;
        const json& active = targets["data"]["activeTargets"];
        if (active.size() != 4) return false;
        for (const json& target : active) {
          if (target.value("health", "") != "up") return false;
        }
        const json scrapes =
            prometheusGet("/api/v1/query", {{"query", "min(count_over_time(up[1m]))"}});
        return scrapes.value("status", "") == "success" && !scrapes["data"]["result"].empty() &&
               std::stod(scrapes["data"]["result"][0]["value"][1].get<std::string>()) >= 4;
      },
      seconds(60), milliseconds(200)))
      << prometheusGet("/api/v1/targets").dump() << "\n"
      << prometheus.stderrText();

  // Load through the router once Prometheus watches: streamed and not,
  // prompts repeated so that they hit the prefix cache; long enough to be
  // disaggregated.
  httplib::Client client("127.0.0.1", router_port);
  client.set_read_timeout(60, 0);
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<int> prompt = testing::randomPrompt(70, seed);
    for (bool stream : {false, true, false}) {
      json body = testing::greedy(prompt, 8);
      body["stream"] = stream;
      auto response = client.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(response) << local.stderrText();
      ASSERT_EQ(response->status, 200) << response->body;
    }
  }

  // Prometheus has scraped the agents a few times since the load, and the
  // controller reports both pools ready (the stand-in plays the Deployment
  // controller).
  auto value = [&](const std::string& query) {
    const json answer = prometheusGet("/api/v1/query", {{"query", query}});
    if (answer.value("status", "") != "success" || answer["data"]["result"].empty()) return -1.0;
    return std::stod(answer["data"]["result"][0]["value"][1].get<std::string>());
  };
  ASSERT_TRUE(eventually(
      [&] {
        return value("min_over_time(sum(tandem_requests_total{component=\"decode\"})[5s:1s])") >=
                   9 &&
               value("count(tandem_operator_pool_replicas{state=\"ready\"} == 1)") == 2;
      },
      seconds(30), milliseconds(200)))
      << prometheusGet("/api/v1/query",
                       {{"query", "tandem_operator_pool_replicas or sum(tandem_requests_total)"}})
             .dump()
      << controller.stderrText();

  // Every panel target returns data.
  int queries = 0;
  for (const json& panel : dashboard["panels"]) {
    for (const json& target : panel.value("targets", json::array())) {
      std::string expr = target.value("expr", "");
      replaceAll(expr, "$__rate_interval", kRateInterval);
      replaceAll(expr, "$namespace", kNamespace);
      replaceAll(expr, "$pool", "prefill|decode");
      replaceAll(expr, "${datasource}", "prometheus");
      ASSERT_EQ(expr.find('$'), std::string::npos) << expr;
      const json answer = prometheusGet("/api/v1/query", {{"query", expr}});
      EXPECT_EQ(answer.value("status", ""), "success")
          << panel["title"] << ": " << expr << " -> " << answer.dump();
      EXPECT_FALSE(answer.value("data", json::object()).value("result", json::array()).empty())
          << "panel \"" << panel["title"].get<std::string>() << "\" has no data: " << expr;
      ++queries;
    }
  }
  EXPECT_GE(queries, 20);

  // Every rule of both files evaluates; TandemTTFTHigh fires for the prefill
  // pool under the tiny target only.
  const std::set<std::string> alert_names = {
      "TandemTTFTHigh",           "TandemITLHigh",          "TandemKVTransferFailures",
      "TandemConnectionsRefused", "TandemPoolNoReadyAgent", "TandemOperatorNotLeading"};
  std::map<std::string, std::map<std::string, json>> rules_by_file;
  ASSERT_TRUE(eventually(
      [&] {
        rules_by_file.clear();
        const json rules = prometheusGet("/api/v1/rules");
        if (!rules.contains("data")) return false;
        for (const json& group : rules["data"]["groups"]) {
          const std::string file = fs::path(group.value("file", "")).filename().string();
          for (const json& rule : group["rules"]) rules_by_file[file][rule["name"]] = rule;
        }
        if (rules_by_file.size() != 2) return false;
        for (const auto& [file, rules_of_file] : rules_by_file) {
          for (const std::string& name : alert_names) {
            if (!rules_of_file.count(name)) return false;
            if (rules_of_file.at(name).value("lastEvaluation", "").starts_with("0001"))
              return false;
          }
        }
        return rules_by_file["tiny-rules.yaml"]["TandemTTFTHigh"].value("state", "") == "firing";
      },
      seconds(30), milliseconds(200)))
      << prometheusGet("/api/v1/rules").dump(2);
  for (const auto& [file, rules_of_file] : rules_by_file) {
    EXPECT_EQ(rules_of_file.size(), alert_names.size()) << file;
    for (const auto& [name, rule] : rules_of_file) {
      EXPECT_EQ(rule.value("health", ""), "ok") << file << " " << name << ": " << rule.dump();
    }
  }
  const json& defaults = rules_by_file["default-rules.yaml"];
  for (const std::string& name : alert_names) {
    EXPECT_EQ(defaults.at(name).value("state", ""), "inactive")
        << name << ": " << defaults.at(name).dump();
  }
  EXPECT_EQ(rules_by_file["tiny-rules.yaml"]["TandemITLHigh"].value("state", ""), "inactive");

  const json alerts = prometheusGet("/api/v1/alerts");
  std::vector<std::string> firing;
  for (const json& alert : alerts["data"]["alerts"]) {
    const json& labels = alert["labels"];
    if (alert.value("state", "") != "firing") continue;
    firing.push_back(labels.value("alertname", "") + "/" + labels.value("rendering", "") + "/" +
                     labels.value("pool", "") + "/" + labels.value("severity", ""));
  }
  EXPECT_EQ(firing, std::vector<std::string>{"TandemTTFTHigh/tiny/prefill/page"}) << alerts.dump(2);

  prometheus.signal(SIGTERM);
  EXPECT_EQ(prometheus.wait(seconds(30)), 0) << prometheus.stderrText();
  controller.signal(SIGTERM);
  EXPECT_EQ(controller.wait(seconds(30)), 0) << controller.stderrText();
  local.readStdout(milliseconds(10));
  local.signal(SIGTERM);
  EXPECT_EQ(local.wait(seconds(60)), 0) << local.stderrText();
}

}  // namespace
}  // namespace tandem
