#include "tools/bench/transfer_bench.h"

#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/engine/kv_cache.h"
#include "agent/engine/model_config.h"
#include "common/dtype.h"
#include "common/loopback_socket.h"
#include "common/prometheus_text.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "tools/model/test_model.h"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using std::chrono::seconds;

constexpr char kServedModelName[] = "bench";
constexpr double kGB = 1e9;
// ucx_perftest prints bandwidth in MB/s of 2^20 bytes.
constexpr double kPerftestMegabyte = 1024.0 * 1024.0;
// Bytes ucx_perftest moves per measurement (iterations = this / message size).
constexpr double kPerftestBytes = 1024.0 * 1024.0 * 1024.0;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2.0;
}

std::string mibText(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", bytes / (1024.0 * 1024.0));
  return text;
}

// A fresh directory under the system temp dir, removed with what it holds.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem-bench-transfer-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error("cannot create a directory under " + fs::temp_directory_path().string() + ": " +
                  std::strerror(errno));
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string lastLines(const std::string& text, size_t lines) {
  size_t start = text.size();
  for (size_t seen = 0; start > 0 && seen <= lines; --start) {
    if (text[start - 1] == '\n') ++seen;
  }
  return text.substr(start == 0 ? 0 : start + 1);
}

// What the decode agent's metrics say about its ucx loads so far.
struct LoadTotals {
  double bytes = 0.0;
  double seconds = 0.0;
  double blocks = 0.0;
  double loads = 0.0;

  LoadTotals operator-(const LoadTotals& before) const {
    return {bytes - before.bytes, seconds - before.seconds, blocks - before.blocks,
            loads - before.loads};
  }
};

// One `tandem-agent serve` process on 127.0.0.1 and a port of its choosing.
class AgentProcess {
 public:
  AgentProcess(const std::string& name, std::vector<std::string> argv, const fs::path& log_dir,
               const std::string& ucx_tls)
      : name_(name),
        process_(std::make_unique<Subprocess>(
            argv, log_dir / (name + ".stderr"),
            std::vector<std::pair<std::string, std::string>>{{"UCX_TLS", ucx_tls}})) {}

  // Waits for "listening on HOST:PORT"; throws with the agent's last stderr lines.
  void waitUntilListening() {
    const std::string line = process_->waitForLine("listening on ", seconds(300));
    if (line.empty()) {
      throw Error("the " + name_ +
                  " agent did not start: " + lastLines(process_->stderrText(), 10));
    }
    port_ = std::stoi(line.substr(line.rfind(':') + 1));
  }

  // SIGTERM, then SIGKILL (by the destructor) if it has not exited in 10 s.
  void stop() {
    process_->signal(SIGTERM);
    process_->wait(seconds(10));
    process_.reset();
  }

  // POSTs a completion request; the response body and the seconds until it
  // was complete (with max_tokens 1, the time to first token).
  std::pair<json, double> complete(const json& body) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(600, 0);
    client.set_connection_timeout(30, 0);
    const auto start = Clock::now();
    auto result = client.Post("/v1/completions", body.dump(), "application/json");
    const double seconds = secondsSince(start);
    if (!result) {
      throw Error("no response from the " + name_ +
                  " agent: " + httplib::to_string(result.error()) +
                  "; its stderr ends with: " + lastLines(process_->stderrText(), 10));
    }
    if (result->status != 200) {
      throw Error("the " + name_ + " agent answered HTTP " + std::to_string(result->status) + ": " +
                  result->body.substr(0, 300));
    }
    json response = json::parse(result->body, nullptr, false);
    if (!response.is_object()) {
      throw Error("the " + name_ +
                  " agent answered malformed JSON: " + result->body.substr(0, 300));
    }
    return {std::move(response), seconds};
  }

  LoadTotals loadTotals() const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(60, 0);
    auto result = client.Get("/metrics");
    if (!result || result->status != 200) {
      throw Error("cannot read /metrics of the " + name_ + " agent");
    }
    const std::string_view ucx = "source=\"ucx\"";
    auto sample = [&](std::string_view metric) {
      return prometheusSample(result->body, metric, ucx).value_or(0.0);
    };
    return {sample("tandem_kv_transfer_bytes_total"),
            sample("tandem_kv_transfer_duration_seconds_sum"),
            sample("tandem_kv_blocks_loaded_total"),
            sample("tandem_kv_transfer_duration_seconds_count")};
  }

 private:
  std::string name_;
  std::unique_ptr<Subprocess> process_;
  int port_ = 0;
};

// Both agents of one transport.
struct AgentPair {
  std::unique_ptr<AgentProcess> prefill;
  std::unique_ptr<AgentProcess> decode;
};

// Prompt token ids, fresh for every request so that no prefix cache hits.
class PromptSource {
 public:
  explicit PromptSource(int64_t vocab_size)
      : low_(static_cast<int32_t>(std::min<int64_t>(100, vocab_size / 4))),
        high_(static_cast<int32_t>(std::min<int64_t>(5000, vocab_size) - 1)) {}
  std::vector<int32_t> next(int64_t tokens) {
    std::uniform_int_distribution<int32_t> dist(low_, high_);
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    for (int32_t& id : ids) id = dist(rng_);
    return ids;
  }

 private:
  int32_t low_, high_;
  std::mt19937_64 rng_{20240611};
};

// One prefill → decode hand-off as timed by the client.
struct HandOff {
  double prefill_seconds = 0.0;  // the prefill request (max_tokens 1): its TTFT
  double decode_seconds = 0.0;   // the decode request (max_tokens 1): its TTFT, read included
  int64_t remote_blocks = 0;     // blocks the prefill agent offered
  int64_t remote_runs = 0;       // runs of consecutive ids among them, in any order
};

HandOff handOff(const AgentPair& agents, const std::vector<int32_t>& prompt) {
  json body = {{"model", kServedModelName},
               {"prompt", prompt},
               {"max_tokens", 1},
               {"temperature", 0},
               {"ignore_eos", true}};
  HandOff result;
  body["kv_transfer_params"] = {{"do_remote_decode", true}};
  auto [prefilled, prefill_seconds] = agents.prefill->complete(body);
  result.prefill_seconds = prefill_seconds;
  json params = prefilled.value("kv_transfer_params", json());
  if (!params.is_object() || !params.contains("remote_block_ids") ||
      !params["remote_block_ids"].is_array()) {
    throw Error("the prefill agent's response has no kv_transfer_params with remote_block_ids: " +
                prefilled.dump().substr(0, 300));
  }
  const json& ids = params["remote_block_ids"];
  result.remote_blocks = static_cast<int64_t>(ids.size());
  // The transport reads pairs in remote id order, one read per run.
  std::vector<int64_t> sorted = ids.get<std::vector<int64_t>>();
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i == 0 || sorted[i] != sorted[i - 1] + 1) ++result.remote_runs;
  }
  params["do_remote_prefill"] = true;
  body["kv_transfer_params"] = params;
  result.decode_seconds = agents.decode->complete(body).second;
  return result;
}

// One measurement of moving N blocks: its hand-offs back to back.
struct TransferRun {
  double bytes = 0.0;
  double seconds = 0.0;  // of the decode agent's reads, from its metrics
  double blocks_loaded = 0.0;
  int64_t remote_runs = 0;
  double gbps() const { return seconds > 0.0 ? bytes / seconds / kGB : 0.0; }
};

struct TransferResult {
  std::string transport;
  int64_t blocks = 0;
  int64_t handoffs = 0;
  int64_t message_bytes = 0;  // the largest hand-off's bytes: one read when its ids are consecutive
  std::vector<TransferRun> runs;
  std::optional<double> perftest_gbps;
  std::string perftest_error;
  double memcpy_gbps = 0.0;
};

struct TtftResult {
  std::string transport;
  int64_t requested_prompt_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t blocks_read = 0;
  double prefill_ttft_s = 0.0;  // medians over the repeats
  double decode_ttft_s = 0.0;
  double read_s = 0.0;
  double read_share = 0.0;  // median of read / (prefill TTFT + decode TTFT) per repeat
};

// Hand-off sizes, as even as possible, for moving `blocks` at most `cap` at a time.
std::vector<int64_t> splitBlocks(int64_t blocks, int64_t cap) {
  const int64_t count = (blocks + cap - 1) / cap;
  std::vector<int64_t> sizes(static_cast<size_t>(count), blocks / count);
  for (int64_t i = 0; i < blocks % count; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

// Best single-thread memcpy rate for `bytes`; each timing repeats the copy
// until at least 64 MiB moved so that small sizes are not timer noise.
double memcpyGBps(int64_t bytes) {
  const size_t size = static_cast<size_t>(bytes);
  std::vector<char> source(size, 1), destination(size, 0);
  const int64_t inner = std::max<int64_t>(1, (int64_t{64} << 20) / bytes);
  std::memcpy(destination.data(), source.data(), size);  // fault the pages in
  double best = 1e30;
  for (int repeat = 0; repeat < 7; ++repeat) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < inner; ++i) std::memcpy(destination.data(), source.data(), size);
    best = std::min(best, secondsSince(start));
  }
  // Keep the copies observable.
  if (std::memcmp(destination.data(), source.data(), size) != 0) {
    std::fprintf(stderr, "memcpy check failed\n");
  }
  return static_cast<double>(bytes) * static_cast<double>(inner) / best / kGB;
}

std::optional<fs::path> findExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return fs::path(name);
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const fs::path candidate = fs::path(dirs.substr(start, end - start)) / name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

// The overall bandwidth (GB/s) from ucx_perftest's CSV output (-v -f):
// a header line "iterations,...,overall_bw,..." and a line of values.
std::optional<double> parsePerftestBandwidth(const std::string& output) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = output.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(output.substr(start, end - start));
  }
  lines.push_back(output.substr(start));
  auto split = [](const std::string& line) {
    std::vector<std::string> fields;
    size_t from = 0;
    for (size_t comma; (comma = line.find(',', from)) != std::string::npos; from = comma + 1) {
      fields.push_back(line.substr(from, comma - from));
    }
    fields.push_back(line.substr(from));
    for (std::string& field : fields) {
      field.erase(0, field.find_first_not_of(' '));
    }
    return fields;
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!lines[i].starts_with("iterations,")) continue;
    const std::vector<std::string> header = split(lines[i]);
    const auto column = std::find(header.begin(), header.end(), "overall_bw");
    if (column == header.end()) return std::nullopt;
    for (size_t j = i + 1; j < lines.size(); ++j) {
      const std::vector<std::string> values = split(lines[j]);
      const size_t index = static_cast<size_t>(column - header.begin());
      if (values.size() != header.size()) continue;
      try {
        return std::stod(values[index]) * kPerftestMegabyte / kGB;
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

// ucx_perftest -t ucp_get of `bytes` between a server and a client process
// over UCX_TLS=transport; the bandwidth, or the reason there is none.
std::pair<std::optional<double>, std::string> runPerftest(const std::string& perftest,
                                                          const std::string& transport,
                                                          int64_t bytes, const fs::path& log_dir) {
  const auto binary = findExecutable(perftest);
  if (!binary) {
    return {std::nullopt,
            perftest + " not found (Debian package ucx-utils; or pass --ucx-perftest)"};
  }
  const int64_t iterations = std::clamp<int64_t>(
      static_cast<int64_t>(kPerftestBytes / static_cast<double>(bytes)), 10, 1000);
  const std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", transport}};
  const std::string port = std::to_string(freeLoopbackPort());
  Subprocess server({binary->string(), "-p", port}, log_dir / "ucx_perftest-server.stderr", env);
  // The server's "Waiting for connection" sits in its stdout buffer, so the
  // client retries until the server listens.
  const auto deadline = Clock::now() + seconds(20);
  for (;;) {
    Subprocess client({binary->string(), "127.0.0.1", "-p", port, "-t", "ucp_get", "-s",
                       std::to_string(bytes), "-n", std::to_string(iterations), "-w",
                       std::to_string(std::max<int64_t>(2, iterations / 10)), "-f", "-v"},
                      log_dir / "ucx_perftest-client.stderr", env);
    const std::string output = client.readStdout(seconds(300));
    const int status = client.wait(seconds(10));
    const std::string errors = client.stderrText();
    if (status == 0) {
      server.wait(seconds(10));
      const std::string server_output = server.readStdout(seconds(1));
      auto bandwidth = parsePerftestBandwidth(output);
      if (!bandwidth) bandwidth = parsePerftestBandwidth(server_output);
      if (bandwidth && *bandwidth > 0.0) return {bandwidth, ""};
      return {std::nullopt, "no bandwidth in ucx_perftest's output: " + lastLines(output, 3)};
    }
    const bool refused = errors.find("Connection refused") != std::string::npos ||
                         output.find("Connection refused") != std::string::npos;
    if (!refused || Clock::now() >= deadline || server.wait(seconds(0)) >= 0) {
      std::string reason = lastLines(errors.empty() ? output : errors, 2);
      while (!reason.empty() && reason.back() == '\n') reason.pop_back();
      return {std::nullopt, "ucx_perftest failed (exit " + std::to_string(status) +
                                "): " + (reason.empty() ? std::string("no output") : reason)};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<int64_t> uniqueSorted(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

void validate(const TransferBenchOptions& options) {
  if (options.blocks.empty()) throw Error("--blocks needs at least one block count");
  for (int64_t blocks : options.blocks) {
    if (blocks < 1 || blocks > (int64_t{1} << 20)) {
      throw Error("--blocks takes block counts between 1 and 1048576, got " +
                  std::to_string(blocks));
    }
  }
  if (options.transports.empty()) throw Error("--transports needs at least one UCX_TLS value");
  for (const std::string& transport : options.transports) {
    if (transport.empty() || transport.find_first_of(" \t\n;") != std::string::npos) {
      throw Error("--transports takes UCX_TLS values such as sm and tcp, got \"" + transport +
                  "\"");
    }
  }
  for (int64_t tokens : options.ttft_prompts) {
    if (tokens < 2) {
      throw Error("--ttft-prompts takes prompt lengths of at least 2 tokens, got " +
                  std::to_string(tokens));
    }
  }
  if (options.repeats < 1 || options.repeats > 100) {
    throw Error("--repeats must be between 1 and 100, got " + std::to_string(options.repeats));
  }
  engine::kvDtypeFromName(options.kv_dtype);  // throws naming the accepted values
}

std::string ratioText(double numerator, double denominator) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f%%", numerator / denominator * 100.0);
  return text;
}

}  // namespace

int runTransferBench(const TransferBenchOptions& options) {
  validate(options);
  ScratchDir scratch;
  fs::path model_dir = options.model_dir;
  if (model_dir.empty()) {
    tools::TestModelOptions model_options;
    model_options.preset = "small";
    model_dir = scratch.path() / "small";
    std::printf("writing the small test model to %s\n", model_dir.c_str());
    std::fflush(stdout);
    tools::writeTestModel(model_options, model_dir);
  }
  const fs::path agent_bin = options.agent_bin.empty()
                                 ? fs::read_symlink("/proc/self/exe").parent_path() / "tandem-agent"
                                 : fs::path(options.agent_bin);
  if (::access(agent_bin.c_str(), X_OK) != 0) {
    throw Error(agent_bin.string() + " is not an executable tandem-agent; pass --agent-bin");
  }

  // The KV layout the agents will have, to know what N blocks weigh.
  const engine::ModelConfig config = engine::ModelConfig::fromFile(model_dir / "config.json");
  const int64_t block_bytes =
      engine::KvCacheConfig::forModel(config, engine::kvDtypeFromName(options.kv_dtype),
                                      options.block_size)
          .blockBytes();
  const int64_t max_model_len = config.max_position_embeddings;
  // A prompt of k·block_size + 1 tokens plus the one generated token must fit.
  const int64_t max_blocks_per_handoff = (max_model_len - 2) / options.block_size;
  if (max_blocks_per_handoff < 1) {
    throw Error("the model's context of " + std::to_string(max_model_len) +
                " tokens holds no hand-off of one " + std::to_string(options.block_size) +
                "-token block");
  }
  std::vector<std::pair<int64_t, int64_t>> ttft_prompts;  // requested, used
  for (int64_t tokens : options.ttft_prompts) {
    ttft_prompts.emplace_back(tokens, std::min(tokens, max_model_len - 1));
  }
  const int64_t max_blocks = *std::max_element(options.blocks.begin(), options.blocks.end());
  int64_t longest_prompt = 0;
  for (const auto& [requested, used] : ttft_prompts)
    longest_prompt = std::max(longest_prompt, used);
  const int64_t blocks_per_sequence = (max_model_len + options.block_size - 1) / options.block_size;
  // Room for the N blocks or a longest prompt, and one sequence besides.
  const int64_t agent_blocks =
      std::max(max_blocks, longest_prompt / options.block_size + 1) + blocks_per_sequence + 8;

  std::printf("tandem-bench transfer: model %s, block %d tokens = %lld bytes (%s, %lld layers)\n",
              model_dir.c_str(), options.block_size, static_cast<long long>(block_bytes),
              options.kv_dtype.c_str(), static_cast<long long>(config.num_hidden_layers));
  std::printf(
      "context %lld tokens: at most %lld blocks per hand-off; %lld blocks per agent; "
      "median of %d\n",
      static_cast<long long>(max_model_len), static_cast<long long>(max_blocks_per_handoff),
      static_cast<long long>(agent_blocks), options.repeats);
  for (const auto& [requested, used] : ttft_prompts) {
    if (used != requested) {
      std::printf("note: a %lld-token prompt does not fit the context of %lld; using %lld\n",
                  static_cast<long long>(requested), static_cast<long long>(max_model_len),
                  static_cast<long long>(used));
    }
  }
  std::fflush(stdout);

  PromptSource prompts(config.vocab_size);
  std::vector<TransferResult> transfers;
  std::vector<TtftResult> ttfts;
  std::vector<std::string> problems;

  for (const std::string& transport : options.transports) {
    const fs::path log_dir = scratch.path() / ("logs-" + transport);
    fs::create_directories(log_dir);
    auto agentArgv = [&](const std::string& role, const std::string& kv_role) {
      return std::vector<std::string>{agent_bin.string(),
                                      "serve",
                                      "--model",
                                      model_dir.string(),
                                      "--host",
                                      "127.0.0.1",
                                      "--port",
                                      "0",
                                      "--served-model-name",
                                      kServedModelName,
                                      "--role",
                                      role,
                                      "--block-size",
                                      std::to_string(options.block_size),
                                      "--kv-dtype",
                                      options.kv_dtype,
                                      "--num-blocks",
                                      std::to_string(agent_blocks),
                                      "--kv-transfer-config",
                                      json{{"kv_connector", "ucx"}, {"kv_role", kv_role}}.dump()};
    };
    std::printf("[%s] starting the prefill and decode agents (UCX_TLS=%s)\n", transport.c_str(),
                transport.c_str());
    std::fflush(stdout);
    AgentPair agents;
    agents.prefill = std::make_unique<AgentProcess>("prefill", agentArgv("prefill", "kv_producer"),
                                                    log_dir, transport);
    agents.decode = std::make_unique<AgentProcess>("decode", agentArgv("decode", "kv_consumer"),
                                                   log_dir, transport);
    agents.prefill->waitUntilListening();
    agents.decode->waitUntilListening();

    // Unmeasured hand-offs first: they connect the agents' UCX endpoints,
    // page the weights in, and write every block of both KV pools once, so
    // that no measurement pays for first-touch page faults of the slabs. The
    // pools are then in their steady state: blocks come back from the
    // evictable list, not in id order.
    std::printf("[%s] warming up: hand-offs through all %lld blocks of both agents\n",
                transport.c_str(), static_cast<long long>(agent_blocks));
    std::fflush(stdout);
    for (int64_t touched = 0; touched < agent_blocks;) {
      const int64_t size = std::min(max_blocks_per_handoff, agent_blocks - touched);
      handOff(agents, prompts.next(size * options.block_size + 1));
      touched += size + 1;  // the loaded blocks and the one holding the last token
    }

    for (int64_t blocks : uniqueSorted(options.blocks)) {
      TransferResult result;
      result.transport = transport;
      result.blocks = blocks;
      const std::vector<int64_t> sizes = splitBlocks(blocks, max_blocks_per_handoff);
      result.handoffs = static_cast<int64_t>(sizes.size());
      result.message_bytes = blocks * block_bytes;
      for (int repeat = 0; repeat < options.repeats; ++repeat) {
        const LoadTotals before = agents.decode->loadTotals();
        TransferRun run;
        for (int64_t size : sizes) {
          const HandOff done = handOff(agents, prompts.next(size * options.block_size + 1));
          run.remote_runs += done.remote_runs;
          if (done.remote_blocks != size) {
            problems.push_back(
                transport + ", " + std::to_string(blocks) + " blocks: the prefill agent offered " +
                std::to_string(done.remote_blocks) + " blocks instead of " + std::to_string(size));
          }
        }
        const LoadTotals moved = agents.decode->loadTotals() - before;
        run.bytes = moved.bytes;
        run.seconds = moved.seconds;
        run.blocks_loaded = moved.blocks;
        if (moved.bytes != static_cast<double>(blocks * block_bytes)) {
          problems.push_back(transport + ", " + std::to_string(blocks) + " blocks: read " +
                             std::to_string(static_cast<int64_t>(moved.bytes)) + " bytes, not " +
                             std::to_string(blocks * block_bytes));
        }
        result.runs.push_back(run);
      }
      std::vector<double> rates;
      for (const TransferRun& run : result.runs) rates.push_back(run.gbps());
      std::printf("[%s] %lld blocks in %lld hand-offs: %.2f GB/s\n", transport.c_str(),
                  static_cast<long long>(blocks), static_cast<long long>(result.handoffs),
                  median(rates));
      std::fflush(stdout);
      transfers.push_back(std::move(result));
    }

    for (const auto& [requested, used] : ttft_prompts) {
      TtftResult result;
      result.transport = transport;
      result.requested_prompt_tokens = requested;
      result.prompt_tokens = used;
      std::vector<double> prefill, decode, read, share;
      for (int repeat = 0; repeat < options.repeats; ++repeat) {
        const LoadTotals before = agents.decode->loadTotals();
        const HandOff done = handOff(agents, prompts.next(used));
        const LoadTotals moved = agents.decode->loadTotals() - before;
        result.blocks_read = static_cast<int64_t>(moved.blocks);
        prefill.push_back(done.prefill_seconds);
        decode.push_back(done.decode_seconds);
        read.push_back(moved.seconds);
        share.push_back(moved.seconds / (done.prefill_seconds + done.decode_seconds));
      }
      result.prefill_ttft_s = median(prefill);
      result.decode_ttft_s = median(decode);
      result.read_s = median(read);
      result.read_share = median(share);
      ttfts.push_back(result);
    }
    agents.prefill->stop();
    agents.decode->stop();

    // The references run with the agents gone, so that nothing else competes.
    std::map<int64_t, std::pair<std::optional<double>, std::string>> perftest;
    for (TransferResult& result : transfers) {
      if (result.transport != transport) continue;
      if (!perftest.contains(result.message_bytes)) {
        perftest[result.message_bytes] =
            runPerftest(options.ucx_perftest, transport, result.message_bytes, log_dir);
      }
      std::tie(result.perftest_gbps, result.perftest_error) = perftest[result.message_bytes];
    }
  }
  std::map<int64_t, double> memcpy_rates;
  for (TransferResult& result : transfers) {
    if (!memcpy_rates.contains(result.message_bytes)) {
      memcpy_rates[result.message_bytes] = memcpyGBps(result.message_bytes);
    }
    result.memcpy_gbps = memcpy_rates[result.message_bytes];
  }

  std::printf("\n%-10s %8s %9s %6s %10s %11s %18s %12s %13s\n", "transport", "blocks", "hand-offs",
              "runs", "MiB", "agent GB/s", "ucx_perftest GB/s", "memcpy GB/s", "agent/memcpy");
  for (const TransferResult& result : transfers) {
    std::vector<double> rates;
    for (const TransferRun& run : result.runs) rates.push_back(run.gbps());
    const double agent = median(rates);
    char perftest_text[32] = "n/a";
    if (result.perftest_gbps)
      std::snprintf(perftest_text, sizeof(perftest_text), "%.2f", *result.perftest_gbps);
    int64_t runs = 0;
    for (const TransferRun& run : result.runs) runs = std::max(runs, run.remote_runs);
    std::printf("%-10s %8lld %9lld %6lld %10s %11.2f %18s %12.2f %13s\n", result.transport.c_str(),
                static_cast<long long>(result.blocks), static_cast<long long>(result.handoffs),
                static_cast<long long>(runs),
                mibText(static_cast<double>(result.blocks * block_bytes)).c_str(), agent,
                perftest_text, result.memcpy_gbps, ratioText(agent, result.memcpy_gbps).c_str());
  }
  for (const TransferResult& result : transfers) {
    if (!result.perftest_gbps) {
      std::printf("ucx_perftest n/a (%s, %s MiB): %s\n", result.transport.c_str(),
                  mibText(static_cast<double>(result.message_bytes)).c_str(),
                  result.perftest_error.c_str());
    }
  }
  std::printf(
      "runs: runs of consecutive block ids among those offered (reads needed at least); "
      "ucx_perftest: ucp_get of the same MiB in one message; memcpy: the same MiB, one thread\n");

  if (!ttfts.empty()) {
    std::printf("\n%-10s %8s %12s %17s %16s %9s %11s\n", "transport", "prompt", "blocks read",
                "prefill TTFT ms", "decode TTFT ms", "read ms", "read share");
    for (const TtftResult& result : ttfts) {
      std::printf("%-10s %8lld %12lld %17.2f %16.2f %9.2f %10.2f%%\n", result.transport.c_str(),
                  static_cast<long long>(result.prompt_tokens),
                  static_cast<long long>(result.blocks_read), result.prefill_ttft_s * 1e3,
                  result.decode_ttft_s * 1e3, result.read_s * 1e3, result.read_share * 100.0);
    }
  }
  for (const std::string& problem : problems) std::printf("problem: %s\n", problem.c_str());
  std::fflush(stdout);

  if (!options.json_path.empty()) {
    json transfer_entries = json::array();
    for (const TransferResult& result : transfers) {
      json runs = json::array();
      std::vector<double> rates, read_seconds;
      double bytes = static_cast<double>(result.blocks * block_bytes);
      int64_t remote_runs = 0;
      for (const TransferRun& run : result.runs) {
        runs.push_back({{"bytes", static_cast<int64_t>(run.bytes)},
                        {"seconds", run.seconds},
                        {"gbps", run.gbps()},
                        {"blocks_loaded", static_cast<int64_t>(run.blocks_loaded)},
                        {"remote_runs", run.remote_runs}});
        rates.push_back(run.gbps());
        read_seconds.push_back(run.seconds);
        bytes = std::min(bytes, run.bytes);
        remote_runs = std::max(remote_runs, run.remote_runs);
      }
      const double agent = median(rates);
      transfer_entries.push_back({
          {"transport", result.transport},
          {"blocks", result.blocks},
          {"handoffs", result.handoffs},
          {"message_bytes", result.message_bytes},
          {"bytes", static_cast<int64_t>(bytes)},
          {"read_seconds", median(read_seconds)},
          {"remote_runs", remote_runs},
          {"agent_gbps", agent},
          {"ucx_perftest_gbps", result.perftest_gbps ? json(*result.perftest_gbps) : json(nullptr)},
          {"ucx_perftest_error",
           result.perftest_gbps ? json(nullptr) : json(result.perftest_error)},
          {"memcpy_gbps", result.memcpy_gbps},
          {"agent_over_memcpy", agent / result.memcpy_gbps},
          {"agent_over_ucx_perftest",
           result.perftest_gbps ? json(agent / *result.perftest_gbps) : json(nullptr)},
          {"runs", std::move(runs)},
      });
    }
    json ttft_entries = json::array();
    for (const TtftResult& result : ttfts) {
      ttft_entries.push_back({{"transport", result.transport},
                              {"requested_prompt_tokens", result.requested_prompt_tokens},
                              {"prompt_tokens", result.prompt_tokens},
                              {"blocks_read", result.blocks_read},
                              {"prefill_ttft_ms", result.prefill_ttft_s * 1e3},
                              {"decode_ttft_ms", result.decode_ttft_s * 1e3},
                              {"read_ms", result.read_s * 1e3},
                              {"read_share", result.read_share}});
    }
    json out = {
        {"model", options.model_dir.empty() ? "small preset (generated)" : model_dir.string()},
        {"block_size", options.block_size},
        {"kv_dtype", options.kv_dtype},
        {"block_bytes", block_bytes},
        {"max_model_len", max_model_len},
        {"max_blocks_per_handoff", max_blocks_per_handoff},
        {"agent_num_blocks", agent_blocks},
        {"repeats", options.repeats},
        {"transfers", std::move(transfer_entries)},
        {"ttft", std::move(ttft_entries)},
        {"problems", problems}};
    std::ofstream file(options.json_path);
    if (!file) throw Error("cannot write --json file " + options.json_path);
    file << out.dump(2) << '\n';
  }
  return problems.empty() ? 0 : 1;
}

}  // namespace tandem::bench
