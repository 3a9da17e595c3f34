// A real `tandem-agent serve` process for integration tests, with helpers to
// talk to it: JSON posts, metric samples, greedy request bodies, polling
// with a deadline.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/prometheus_text.h"
#include "tests/support/agent_process.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"
#include "tools/model/test_model.h"

namespace tandem::testing {

namespace fs = std::filesystem;
using nlohmann::json;

inline const fs::path& tinyModelDir() {
  static TempDir dir("tandem-server-test-model");
  static bool written = [] {
    tandem::tools::TestModelOptions options;
    options.seed = 21;
    tandem::tools::writeTestModel(options, dir.path() / "tiny");
    return true;
  }();
  (void)written;
  static fs::path path = dir.path() / "tiny";
  return path;
}

// The `small` preset: slow enough per token that a client can leave
// mid-generation.
inline const fs::path& smallModelDir() {
  static TempDir dir("tandem-server-test-small");
  static fs::path path = [] {
    tandem::tools::TestModelOptions options;
    options.preset = "small";
    tandem::tools::writeTestModel(options, dir.path() / "small");
    return dir.path() / "small";
  }();
  return path;
}

// A tiny-model test agent's KV cache, unless its flags (`extra`) size it:
// 64 MiB (16,384 blocks) in place of the default 1 GiB, which UCX allocates
// as a shared-memory slab committed at start (about half a second per GiB
// on the test machines, several seconds where it is zeroed with writes:
// docs/testing.md); no test needs that many blocks. A
// simulated agent (--simulate) keeps the default: its blocks are the
// profile's (2 MiB in the tests' profiles), and its slab is never UCX
// memory (serve_command.cpp resolveKvBuffers).
inline void sizeTinyAgentKv(std::vector<std::string>& argv, const std::vector<std::string>& extra,
                            const fs::path& model) {
  const bool sized = std::any_of(extra.begin(), extra.end(), [](const std::string& arg) {
    return arg == "--kv-cache-memory" || arg == "--num-blocks" || arg == "--config" ||
           arg == "--simulate";
  });
  if (model != tinyModelDir() || sized) return;
  argv.push_back("--kv-cache-memory");
  argv.push_back("64MiB");
}

// A running `tandem-agent serve` on a free port; `env` is set in its
// environment only (e.g. its TZ); `global` options go before `serve` (as
// the operator writes `--threads`).
class Agent {
 public:
  using Environment = std::vector<std::pair<std::string, std::string>>;
  explicit Agent(std::vector<std::string> extra = {}, const fs::path& model = tinyModelDir(),
                 const Environment& env = {}, const std::vector<std::string>& global = {}) {
    std::vector<std::string> argv = {std::string(TANDEM_BIN_DIR) + "/tandem-agent"};
    argv.insert(argv.end(), global.begin(), global.end());
    for (const std::string& arg :
         {std::string("serve"), std::string("--model"), model.string(), std::string("--port"),
          std::string("0"), std::string("--served-model-name"), std::string("tiny")}) {
      argv.push_back(arg);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    sizeTinyAgentKv(argv, extra, model);
    process_ = std::make_unique<ChildProcess>(argv, logs_.path() / "stderr", env);
    std::string line = process_->waitForLine("listening on ", std::chrono::seconds(60));
    if (line.empty()) throw std::runtime_error("agent did not start: " + process_->stderrText());
    port_ = std::stoi(line.substr(line.rfind(':') + 1));
  }
  // Every scenario must leave no KV block referenced once its requests are
  // done (unless the test stopped the server itself).
  ~Agent() {
    if (stopped_) return;
    EXPECT_TRUE(eventually([&] {
      return metric("tandem_num_requests_running") == 0 &&
             metric("tandem_num_requests_waiting") == 0 &&
             metric("tandem_kv_cache_usage_ratio") == 0;
    })) << "blocks still referenced after the test: "
        << metricsText();
  }
  int port() const { return port_; }
  // What the agent has written to stderr (its log) so far.
  std::string stderrText() const { return process_->stderrText(); }
  // The process id, for reading /proc (the process is left alone).
  int pid() const { return process_->pid(); }
  ChildProcess& process() {
    stopped_ = true;  // the caller may signal it
    return *process_;
  }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(60, 0);
    return c;
  }
  json post(const std::string& path, const json& body, int* status = nullptr) const {
    auto res = client()->Post(path.c_str(), body.dump(), "application/json");
    if (!res) throw std::runtime_error("no response from " + path);
    if (status != nullptr) *status = res->status;
    return json::parse(res->body);
  }
  std::string metricsText() const {
    auto res = client()->Get("/metrics");
    return res ? res->body : "";
  }
  // Value of a sample line "name{labels} value" (first match), 0 when absent.
  double metric(const std::string& name, const std::string& label_filter = "") const {
    return prometheusSample(metricsText(), name, label_filter).value_or(0.0);
  }

 private:
  TempDir logs_{"tandem-server-test-logs"};
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
  bool stopped_ = false;
};

// Prompt token ids within the tiny model's text vocabulary.
inline std::vector<int> randomPrompt(size_t n, uint32_t seed) {
  return randomTokenIds(n, seed, 3, 480);
}

inline json greedy(const std::vector<int>& prompt, int max_tokens) {
  return {{"model", "tiny"},  {"prompt", prompt},   {"max_tokens", max_tokens},
          {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
}

inline std::vector<int> tokenIds(const json& response) {
  return response.at("choices").at(0).at("token_ids").get<std::vector<int>>();
}

// Sends every body at once, one client thread each; the generated token ids.
inline std::vector<std::vector<int>> postConcurrently(const Agent& agent,
                                                      const std::vector<json>& bodies) {
  std::vector<std::vector<int>> ids(bodies.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); ++i) {
    threads.emplace_back([&, i] { ids[i] = tokenIds(agent.post("/v1/completions", bodies[i])); });
  }
  for (auto& t : threads) t.join();
  return ids;
}

// The token ids and the text of a streamed completion, its [DONE]s and
// error events.
struct StreamedCompletion {
  std::vector<int> ids;
  std::string text;
  int done = 0;
  std::string errors;
};

inline StreamedCompletion parseStream(const std::string& body) {
  StreamedCompletion stream;
  std::istringstream events(body);
  for (std::string line; std::getline(events, line);) {
    if (line == "data: [DONE]") ++stream.done;
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6));
    if (chunk.contains("error")) stream.errors += line + "\n";
    if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    for (int id : choice.value("token_ids", std::vector<int>{})) stream.ids.push_back(id);
    stream.text += choice.value("text", "");
  }
  return stream;
}

// Streams every completion body at once to 127.0.0.1:`port`, one client
// thread each, into `streams`; the threads are the caller's to join.
inline std::vector<std::thread> streamConcurrently(int port, const std::vector<json>& bodies,
                                                   std::vector<StreamedCompletion>& streams) {
  streams.assign(bodies.size(), {});
  std::vector<std::thread> clients;
  for (size_t i = 0; i < bodies.size(); ++i) {
    clients.emplace_back([&bodies, &streams, port, i] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(120, 0);
      auto res = client.Post("/v1/completions", bodies[i].dump(), "application/json");
      if (res) streams[i] = parseStream(res->body);
    });
  }
  return clients;
}

}  // namespace tandem::testing
