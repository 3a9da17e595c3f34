// Structured outputs against an independent validator: every schema of the
// conformance corpus (tests/data/structured/schemas.jsonl: JSON-Schema-Test-
// Suite cases and real tool definitions, see its README) is sent as
// `guided_json` to tandem-agent serve on the tiny generated model, greedy and
// seeded, and every output that finished with "stop" must validate against
// its schema under Ajv (draft 2020-12, with ajv-formats) run by node
// (tests/support/validate_json_schema.cjs). `make deps` installs node and the
// pinned packages (scripts/fetch-node-packages.sh).
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/agent_server.h"
#include "tests/support/node_script.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary

constexpr int kMaxTokens = 256;
constexpr int kClientThreads = 16;
// Each schema is sent once greedy and this many times seeded.
constexpr int kSeededSamples = 3;
constexpr size_t kSamplesPerSchema = 1 + kSeededSamples;  // greedy first
// The corpus must keep at least this many schemas the compiler accepts.
constexpr size_t kMinAccepted = 200;
// Of all outputs, at least this fraction must finish with "stop" (the rest
// reach max_tokens mid-structure and are not checked): 0.73 on the tiny
// model (0.75 over 100 seeds a schema), so a drop means outputs no longer
// finish where they could.
constexpr double kMinStopFraction = 0.6;

struct CorpusEntry {
  std::string source;
  std::string name;
  ordered_json schema;
};

fs::path corpusPath() {
  return fs::path(TANDEM_SOURCE_DIR) / "tests" / "data" / "structured" / "schemas.jsonl";
}

std::vector<CorpusEntry> loadCorpus() {
  std::ifstream in(corpusPath());
  std::vector<CorpusEntry> corpus;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    ordered_json entry = ordered_json::parse(line);
    corpus.push_back({entry.at("source"), entry.at("name"), entry.at("schema")});
  }
  return corpus;
}

// One completion request of the run: a schema, greedy or seeded.
struct Sample {
  size_t index = 0;  // into the corpus
  std::optional<uint64_t> seed;
};

struct Output {
  int status = 0;  // 0: no response
  std::string text;
  std::string finish_reason;
  std::string error;  // the response body when not 200
};

// The request body keeps the schema's key order (properties come out in it).
std::string requestBody(const CorpusEntry& entry, const Sample& sample) {
  ordered_json body = {{"model", "tiny"},
                       {"prompt", randomPrompt(6 + sample.index % 5, 7919 * sample.index + 1)},
                       {"max_tokens", kMaxTokens},
                       {"temperature", sample.seed ? 1.0 : 0.0},
                       {"return_token_ids", false},
                       {"guided_json", entry.schema}};
  if (sample.seed) body["seed"] = *sample.seed;
  return body.dump();
}

// Sends every sample, kClientThreads at a time.
std::vector<Output> complete(const Agent& agent, const std::vector<CorpusEntry>& corpus,
                             const std::vector<Sample>& samples) {
  std::vector<Output> outputs(samples.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < kClientThreads; ++t) {
    clients.emplace_back([&] {
      httplib::Client client("127.0.0.1", agent.port());
      client.set_read_timeout(300, 0);
      for (size_t i = next++; i < samples.size(); i = next++) {
        const Sample& sample = samples[i];
        auto res = client.Post("/v1/completions", requestBody(corpus[sample.index], sample),
                               "application/json");
        Output& output = outputs[i];
        if (!res) continue;
        output.status = res->status;
        if (res->status != 200) {
          output.error = res->body;
          continue;
        }
        const json choice = json::parse(res->body).at("choices").at(0);
        output.text = choice.at("text");
        output.finish_reason = choice.at("finish_reason");
      }
    });
  }
  for (auto& client : clients) client.join();
  return outputs;
}

TEST(StructuredConformance, EveryFinishedOutputValidatesWithAjv) {
  const NodeScripts node(TANDEM_NODE_MODULES, {"ajv", "ajv-formats"});
  ASSERT_EQ(node.missing(), "");

  TempDir work("tandem-structured-conformance");
  const auto validate = [&](const fs::path& corpus_path, const fs::path& outputs_path) {
    const CommandResult run =
        node.run("validate_json_schema.cjs", {corpus_path.string(), outputs_path.string()},
                 work.path() / "node.stderr", std::chrono::seconds(120));
    EXPECT_EQ(run.exit_status, 0) << run.err;
    return json::parse(run.out, nullptr, false);
  };
  // The validator itself: it finds a wrong output, and skips one cut short.
  const json control = validate(
      work.write("control.jsonl", R"({"source":"","name":"n","schema":{"type":"integer"}})"
                                  "\n"),
      work.write("control-outputs.jsonl", R"({"index":0,"text":"\"a\"","finish_reason":"stop"})"
                                          "\n"
                                          R"({"index":0,"text":"7","finish_reason":"stop"})"
                                          "\n"
                                          R"({"index":0,"text":"[","finish_reason":"length"})"
                                          "\n"));
  ASSERT_TRUE(control.is_object()) << "the validator printed no JSON";
  ASSERT_EQ(control.value("checked", 0), 2) << control.dump();
  ASSERT_EQ(control.at("invalid").size(), 1u) << control.dump();

  const std::vector<CorpusEntry> corpus = loadCorpus();
  ASSERT_GE(corpus.size(), kMinAccepted) << corpusPath();

  std::vector<Sample> samples;
  for (size_t i = 0; i < corpus.size(); ++i) {
    samples.push_back({i, std::nullopt});
    for (int k = 0; k < kSeededSamples; ++k) samples.push_back({i, 1000 + 100 * i + k});
  }
  Agent agent;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Output> outputs = complete(agent, corpus, samples);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::ostringstream lines;
  std::map<std::string, size_t> finish_reasons;
  std::vector<size_t> refused;
  size_t greedy_stopped = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Output& output = outputs[i];
    const CorpusEntry& entry = corpus[samples[i].index];
    if (output.status == 400) {
      if (!samples[i].seed) refused.push_back(samples[i].index);
      continue;
    }
    ASSERT_EQ(output.status, 200) << entry.name << ": " << output.error;
    EXPECT_TRUE(output.finish_reason == "stop" || output.finish_reason == "length")
        << entry.name << ": " << output.finish_reason;
    ++finish_reasons[output.finish_reason];
    if (!samples[i].seed && output.finish_reason == "stop") ++greedy_stopped;
    lines << json{{"index", samples[i].index},
                  {"text", output.text},
                  {"finish_reason", output.finish_reason}}
                 .dump()
          << "\n";
  }
  for (size_t index : refused) {
    ADD_FAILURE() << "refused: " << corpus[index].name << " (" << corpus[index].source
                  << "): " << outputs[kSamplesPerSchema * index].error;
  }
  EXPECT_GE(corpus.size() - refused.size(), kMinAccepted);

  const fs::path outputs_path = work.write("outputs.jsonl", lines.str());
  const json result = validate(corpusPath(), outputs_path);
  ASSERT_TRUE(result.is_object()) << "the validator printed no JSON";
  for (const json& invalid : result.at("invalid")) {
    const size_t index = invalid.at("index");
    ADD_FAILURE() << "Ajv rejects the output of " << invalid.at("name").get<std::string>() << " ("
                  << corpus[index].source << ")\n  schema: " << corpus[index].schema.dump()
                  << "\n  output: " << invalid.at("text").get<std::string>()
                  << "\n  errors: " << invalid.at("errors").dump();
  }
  for (const json& unparsable : result.at("unparsable")) {
    ADD_FAILURE() << "not JSON: the output of " << unparsable.at("name").get<std::string>() << ": "
                  << unparsable.at("text").get<std::string>() << " ("
                  << unparsable.at("error").get<std::string>() << ")";
  }

  const size_t answered = samples.size() - kSamplesPerSchema * refused.size();
  const size_t stopped = finish_reasons["stop"];
  // The validator saw every finished output.
  EXPECT_EQ(result.at("checked").get<size_t>() + result.at("unparsable").size(), stopped);
  const double stop_fraction = answered == 0 ? 0.0 : static_cast<double>(stopped) / answered;
  EXPECT_GE(stop_fraction, kMinStopFraction);
  std::printf(
      "%zu schemas, %zu requests in %.1f s; %zu finished with stop (%.2f; greedy %zu of %zu), "
      "%zu length\n",
      corpus.size(), samples.size(), seconds, stopped, stop_fraction, greedy_stopped,
      corpus.size() - refused.size(), finish_reasons["length"]);

  // Outputs repeat, greedy and seeded: a few schemas spread over the corpus
  // (both sources) again, all at once.
  std::vector<size_t> picked;
  std::vector<Sample> again;
  for (size_t i = 0; i < corpus.size(); i += corpus.size() / 12) {
    for (size_t k : {size_t{0}, size_t{1}}) {
      picked.push_back(kSamplesPerSchema * i + k);
      again.push_back(samples[picked.back()]);
    }
  }
  const std::vector<Output> repeated = complete(agent, corpus, again);
  for (size_t i = 0; i < again.size(); ++i) {
    const Output& first = outputs[picked[i]];
    const std::string what =
        corpus[again[i].index].name + (again[i].seed ? " (seeded)" : " (greedy)");
    EXPECT_EQ(repeated[i].status, first.status) << what;
    EXPECT_EQ(repeated[i].text, first.text) << what;
    EXPECT_EQ(repeated[i].finish_reason, first.finish_reason) << what;
  }
}

}  // namespace
