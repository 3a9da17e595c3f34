#include "tools/bench/large_body_bench.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/status.h"
#include "tools/bench/openai_client.h"

namespace tandem::bench {
namespace {

using nlohmann::json;

// VmRSS of `pid` in bytes; 0 when it cannot be read.
int64_t residentBytes(int pid) {
  std::ifstream status(std::filesystem::path("/proc") / std::to_string(pid) / "status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("VmRSS:")) {
      std::istringstream fields(line.substr(6));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

std::string bodyFor(const std::string& endpoint, const std::string& text) {
  if (endpoint == "/v1/chat/completions") {
    return json{{"model", nullptr},
                {"max_tokens", 1},
                {"messages", json::array({{{"role", "user"}, {"content", text}}})}}
        .dump();
  }
  if (endpoint == "/tokenize") return json{{"prompt", text}}.dump();
  return json{{"model", nullptr}, {"max_tokens", 1}, {"prompt", text}}.dump();
}

struct Answer {
  int status = 0;
  double seconds = 0.0;
};

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int runLargeBodyBench(const LargeBodyBenchOptions& options) {
  const std::string base = checkedBaseUrl(options.url, "--url");
  if (options.pid <= 0 || residentBytes(options.pid) == 0) {
    throw Error("--pid must name a running process whose /proc/PID/status is readable, got " +
                std::to_string(options.pid));
  }
  // The served model's name: the body must name it or the agent answers 404
  // before reading the prompt.
  std::string model;
  if (auto models = listModels(base, 30.0); !models.empty()) model = models.front().id;
  std::string text;
  text.reserve(static_cast<size_t>(options.mb) * 1000000);
  while (text.size() + 6 <= static_cast<size_t>(options.mb) * 1000000) text += "hello ";
  json body = json::parse(bodyFor(options.endpoint, text));
  if (body.contains("model")) body["model"] = model;
  if (options.truncate != 0) {
    if (options.endpoint == "/tokenize")
      throw Error("--truncate is for completions, not /tokenize");
    body["truncate_prompt_tokens"] = options.truncate;
  }
  const std::string payload = body.dump();
  text.clear();
  text.shrink_to_fit();

  std::printf("large bodies: %s%s, pid %d, %d MB prompts (%.1f MiB bodies)%s\n", base.c_str(),
              options.endpoint.c_str(), options.pid, options.mb,
              mib(static_cast<int64_t>(payload.size())),
              options.truncate != 0
                  ? (", truncate_prompt_tokens " + std::to_string(options.truncate)).c_str()
                  : "");
  std::printf("%11s %12s %12s %12s %12s  %s\n", "concurrency", "before MiB", "peak MiB",
              "after MiB", "slowest s", "statuses");
  json levels = json::array();
  for (int concurrency : options.concurrency) {
    const int64_t before = residentBytes(options.pid);
    std::atomic<int64_t> peak{before};
    std::atomic<bool> done{false};
    std::thread sampler([&] {
      while (!done.load()) {
        const int64_t now = residentBytes(options.pid);
        int64_t seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    std::vector<Answer> answers(static_cast<size_t>(concurrency));
    std::vector<std::thread> clients;
    for (int i = 0; i < concurrency; ++i) {
      clients.emplace_back([&, i] {
        httplib::Client client(base);
        client.set_read_timeout(std::chrono::seconds(600));
        client.set_write_timeout(std::chrono::seconds(600));
        client.set_connection_timeout(std::chrono::seconds(30));
        const auto start = Clock::now();
        auto result = client.Post(options.endpoint, payload, "application/json");
        answers[static_cast<size_t>(i)] = {result ? result->status : 0,
                                           secondsBetween(start, Clock::now())};
      });
    }
    for (std::thread& client : clients) client.join();
    std::this_thread::sleep_for(std::chrono::duration<double>(options.settle_s));
    done = true;
    sampler.join();
    const int64_t after = residentBytes(options.pid);
    double slowest = 0.0;
    std::string statuses;
    json level_statuses = json::array();
    for (const Answer& answer : answers) {
      slowest = std::max(slowest, answer.seconds);
      if (!statuses.empty()) statuses.push_back(',');
      statuses.append(std::to_string(answer.status));
      level_statuses.push_back(answer.status);
    }
    std::printf("%11d %12.1f %12.1f %12.1f %12.2f  %s\n", concurrency, mib(before),
                mib(peak.load()), mib(after), slowest, statuses.c_str());
    levels.push_back({{"concurrency", concurrency},
                      {"rss_before_bytes", before},
                      {"rss_peak_bytes", peak.load()},
                      {"rss_after_bytes", after},
                      {"slowest_answer_s", slowest},
                      {"statuses", level_statuses}});
  }
  if (!options.json_path.empty()) {
    std::ofstream(options.json_path) << json{{"url", base},
                                             {"endpoint", options.endpoint},
                                             {"prompt_mb", options.mb},
                                             {"truncate_prompt_tokens", options.truncate},
                                             {"body_bytes", payload.size()},
                                             {"levels", levels}}
                                            .dump(2)
                                     << "\n";
  }
  return 0;
}

}  // namespace tandem::bench
