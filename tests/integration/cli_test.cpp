// The command-line tools as a user runs them: exit codes, stdout, stderr;
// `tandem-agent serve` refuses bad options from its flags and its YAML file
// alike, and takes kv_transfer_config as a YAML mapping.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/support/agent_server.h"
#include "tests/support/test_files.h"

namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

using ::tandem::testing::readFile;

class CliTest : public ::testing::Test {
 protected:
  // Runs a shell command line with stdin from `input`; captures both streams.
  CommandResult run(const std::string& command, const std::string& input = "") {
    fs::path in = dir_ / "stdin", out = dir_ / "stdout", err = dir_ / "stderr";
    std::ofstream(in, std::ios::binary) << input;
    std::string line =
        command + " < '" + in.string() + "' > '" + out.string() + "' 2> '" + err.string() + "'";
    int status = std::system(line.c_str());
    CommandResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = readFile(out);
    result.err = readFile(err);
    return result;
  }

  std::string bin(const std::string& name) { return std::string(TANDEM_BIN_DIR) + "/" + name; }

  // `tandem-agent tokenize` over the first 20 texts of a tokenizer case in
  // `data` and one bad line: the reference's ids, then the error.
  void checkTokenizeCommand(const std::string& data);

  fs::path makeTinyModel(const std::string& name, int seed) {
    fs::path model = dir_ / name;
    CommandResult r = run(bin("tandem-model") + " --preset tiny --seed " + std::to_string(seed) +
                          " --out '" + model.string() + "'");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return model;
  }

  ::tandem::testing::TempDir temp_{"tandem-cli-test"};
  fs::path dir_ = temp_.path();
};

TEST_F(CliTest, TandemModelIsByteDeterministic) {
  fs::path a = makeTinyModel("a", 5);
  fs::path b = makeTinyModel("b", 5);
  fs::path c = makeTinyModel("c", 6);
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(a)) files.push_back(entry.path().filename());
  ASSERT_GE(files.size(), 4u);
  for (const char* file :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(a / file)) << file;
  }
  for (const std::string& file : files) {
    EXPECT_EQ(readFile(a / file), readFile(b / file)) << file << " differs for the same seed";
  }
  EXPECT_NE(readFile(a / "model.safetensors"), readFile(c / "model.safetensors"))
      << "a different seed gave the same weights";
}

// --layers keeps the preset's shapes and writes that many decoder layers:
// config.json says so and the safetensors header names layers 0..N-1 only.
TEST_F(CliTest, TandemModelLayersSetsTheDecoderLayers) {
  const fs::path model = dir_ / "three";
  CommandResult r =
      run(bin("tandem-model") + " --preset tiny --layers 3 --out '" + model.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json config = nlohmann::json::parse(readFile(model / "config.json"));
  EXPECT_EQ(config["num_hidden_layers"], 3);
  const nlohmann::json tiny =
      nlohmann::json::parse(readFile(makeTinyModel("tiny", 0) / "config.json"));
  EXPECT_EQ(config["hidden_size"], tiny["hidden_size"]);
  EXPECT_EQ(config["intermediate_size"], tiny["intermediate_size"]);
  const std::string weights = readFile(model / "model.safetensors");
  ASSERT_GE(weights.size(), 8u);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | static_cast<uint8_t>(weights[i]);
  const nlohmann::json header = nlohmann::json::parse(weights.substr(8, header_bytes));
  EXPECT_TRUE(header.contains("model.layers.2.self_attn.q_proj.weight"));
  EXPECT_FALSE(header.contains("model.layers.3.self_attn.q_proj.weight"));

  r = run(bin("tandem-model") + " --preset tiny --layers 0 --out '" + (dir_ / "none").string() +
          "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--layers"), std::string::npos) << r.err;
}

TEST_F(CliTest, TokenizeMatchesReferenceIdsAndReportsBadLines) {
  for (const char* name : {"llama3", "mistral", "gemma3"}) {
    SCOPED_TRACE(name);
    checkTokenizeCommand(std::string(TANDEM_TEST_DATA_DIR) + "/tokenizers/" + name);
  }
}

void CliTest::checkTokenizeCommand(const std::string& data) {
  std::ifstream expected_file(data + "/expected.jsonl");
  std::string input, line;
  std::vector<nlohmann::json> expected;
  while (expected.size() < 20 && std::getline(expected_file, line)) {
    auto record = nlohmann::json::parse(line);
    expected.push_back(record["ids"]);
    input += nlohmann::json{{"text", record["text"]}}.dump() + "\n";
  }
  input += "{\"txt\": 1}\n";
  CommandResult r = run(bin("tandem-agent") + " tokenize --tokenizer " + data, input);
  EXPECT_EQ(r.exit_code, 1) << "a bad line must make the exit code non-zero";
  std::istringstream out(r.out);
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(std::getline(out, line)) << "missing output line " << i;
    EXPECT_EQ(nlohmann::json::parse(line)["ids"], expected[i]) << "line " << i;
  }
  ASSERT_TRUE(std::getline(out, line));
  EXPECT_EQ(nlohmann::json::parse(line)["error"], "line 21: field \"text\" must be a string");
}

TEST_F(CliTest, GenerateStreamsACompletion) {
  fs::path model = makeTinyModel("m", 1);
  CommandResult r = run(bin("tandem-agent") + " generate --model '" + model.string() +
                        "' --prompt 'Once upon a time' --max-tokens 12 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("Once upon a time\n").size()) << "nothing was generated";
  EXPECT_NE(r.err.find("generated: 12 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;

  // Greedy decoding is deterministic run to run.
  CommandResult again = run(bin("tandem-agent") + " generate --model '" + model.string() +
                            "' --prompt 'Once upon a time' --max-tokens 12 --ignore-eos");
  EXPECT_EQ(again.out, r.out);
}

TEST_F(CliTest, BadModelDirectoriesExitNonZeroNamingTheProblem) {
  CommandResult missing =
      run(bin("tandem-agent") + " generate --model '" + (dir_ / "nope").string() + "' --prompt hi");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("nope"), std::string::npos) << missing.err;

  fs::path model = makeTinyModel("broken", 2);
  // Truncate the weights: the loader must name the file and refuse.
  fs::resize_file(model / "model.safetensors", fs::file_size(model / "model.safetensors") / 2);
  CommandResult truncated =
      run(bin("tandem-agent") + " generate --model '" + model.string() + "' --prompt hi");
  EXPECT_NE(truncated.exit_code, 0);
  EXPECT_NE(truncated.err.find("model.safetensors"), std::string::npos) << truncated.err;

  CommandResult too_long =
      run(bin("tandem-agent") + " generate --model '" + makeTinyModel("ok", 2).string() +
          "' --prompt hi --max-tokens 100000");
  EXPECT_NE(too_long.exit_code, 0);
  EXPECT_NE(too_long.err.find("--max-tokens must be between 1 and"), std::string::npos)
      << too_long.err;
  // A prompt past the context is the prompt's fault, not --max-tokens'.
  const fs::path short_context = makeTinyModel("short-context", 2);
  nlohmann::json config = nlohmann::json::parse(readFile(short_context / "config.json"));
  config["max_position_embeddings"] = 4;
  std::ofstream(short_context / "config.json") << config.dump();
  CommandResult long_prompt =
      run(bin("tandem-agent") + " generate --model '" + short_context.string() +
          "' --prompt 'Hello world, again and again'");
  EXPECT_EQ(long_prompt.exit_code, 1) << long_prompt.err;
  EXPECT_NE(long_prompt.err.find("but the context is 4"), std::string::npos) << long_prompt.err;
  EXPECT_EQ(long_prompt.err.find("--max-tokens"), std::string::npos) << long_prompt.err;

  // A complete model that a fetch is updating (or left half done): its
  // .tandem-fetch/ has no complete.json, and serve refuses it.
  fs::path fetching = makeTinyModel("fetching", 2);
  fs::create_directories(fetching / ".tandem-fetch");
  CommandResult incomplete = run("timeout 60 " + bin("tandem-agent") + " serve --model '" +
                                 fetching.string() + "' --port 0");
  EXPECT_EQ(incomplete.exit_code, 1) << incomplete.err;
  EXPECT_NE(incomplete.err.find("holds an incomplete download"), std::string::npos)
      << incomplete.err;
}

// A tokenizer with an added token past the model's vocab_size (a fine-tune
// that never resized the embedding): a prompt encoding to it is refused
// naming the id, where it failed a check and aborted.
TEST_F(CliTest, GenerateRefusesAPromptOutsideTheModelsVocabulary) {
  const fs::path model = makeTinyModel("oov", 2);
  const auto vocab_size =
      nlohmann::json::parse(readFile(model / "config.json"))["vocab_size"].get<int64_t>();
  nlohmann::json tokenizer = nlohmann::json::parse(readFile(model / "tokenizer.json"));
  tokenizer["added_tokens"].push_back({{"id", vocab_size},
                                       {"content", "<tool>"},
                                       {"single_word", false},
                                       {"lstrip", false},
                                       {"rstrip", false},
                                       {"normalized", false},
                                       {"special", true}});
  std::ofstream(model / "tokenizer.json") << tokenizer.dump();
  CommandResult r = run("timeout 60 " + bin("tandem-agent") + " generate --model '" +
                        model.string() + "' --prompt 'Hello <tool> world' --max-tokens 2");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--prompt encodes to token id " + std::to_string(vocab_size) +
                       ", outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")"),
            std::string::npos)
      << r.err;
}

// A bad value refused at start: exit code 1 (not a signal, not serving), and
// one line on stderr naming the key or flag and what is accepted. A value that
// slipped through would serve until `timeout` ends it (exit code 124).
TEST_F(CliTest, ServeRefusesBadOptionsFromTheFileAndTheFlagsAlike) {
  const fs::path model = makeTinyModel("m", 3);
  const std::string serve =
      "timeout 60 " + bin("tandem-agent") + " serve --model '" + model.string() + "' --port 0 ";
  struct Case {
    std::string key;
    std::string value;    // YAML, and the flag's value unless `flag_value` is set
    std::string message;  // after the key or flag
    std::string flag_value;
  };
  const std::string offload_1e308 =
      "{kv_connector: offload, kv_connector_extra_config: {capacity_blocks: 8, "
      "abort_timeout_s: 1e308}}";
  for (const Case& c : std::vector<Case>{
           {"block_size", "0", "must be an integer between 1 and 1024, got 0", ""},
           {"max_num_seqs", "0", "must be an integer between 1 and 4096, got 0", ""},
           {"num_blocks", "-5", "must be an integer between 0 and 2147483647, got -5", ""},
           {"threads", "100000", "must be an integer between 0 and 1024, got 100000", ""},
           {"shutdown_timeout", "1e308",
            "must be a number of seconds between 0 and 86400, got 1e308", ""},
           {"kv_transfer_config", offload_1e308,
            ": kv_connector_extra_config.abort_timeout_s must be a number of seconds above 0 and "
            "at most 86400, got 1e+308",
            R"({"kv_connector": "offload", "kv_connector_extra_config": )"
            R"({"capacity_blocks": 8, "abort_timeout_s": 1e308}})"},
       }) {
    const fs::path file = dir_ / (c.key + ".yaml");
    std::ofstream(file) << c.key << ": " << c.value << "\n";
    CommandResult from_file = run(serve + "--config '" + file.string() + "'");
    EXPECT_EQ(from_file.exit_code, 1) << c.key << ": " << from_file.err;
    EXPECT_EQ(from_file.err, "tandem-agent: " + file.string() + ": " + c.key +
                                 (c.message.starts_with(":") ? "" : " ") + c.message + "\n");

    std::string flag = "--" + c.key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const std::string value = c.flag_value.empty() ? c.value : c.flag_value;
    CommandResult from_flag = run(serve + flag + " '" + value + "'");
    EXPECT_EQ(from_flag.exit_code, 1) << flag << ": " << from_flag.err;
    EXPECT_EQ(from_flag.err,
              "tandem-agent: " + flag + (c.message.starts_with(":") ? "" : " ") + c.message + "\n");
  }

  // A bad value in the file is refused though a flag replaces it (the file
  // is refused whatever command line it is given with).
  {
    const fs::path file = dir_ / "block_size.yaml";
    CommandResult covered = run(serve + "--config '" + file.string() + "' --block-size 16");
    EXPECT_EQ(covered.exit_code, 1) << covered.err;
    EXPECT_EQ(covered.err, "tandem-agent: " + file.string() +
                               ": block_size must be an integer between 1 and 1024, got 0\n");
  }

  // --threads also goes before the subcommand, for every subcommand: the
  // same check and message there.
  for (const std::string& command :
       {bin("tandem-agent") + " --threads abc serve --model '" + model.string() + "' --port 0",
        bin("tandem-agent") + " --threads 2000 generate --model '" + model.string() +
            "' --prompt hi --max-tokens 1"}) {
    CommandResult refused = run("timeout 60 " + command);
    EXPECT_EQ(refused.exit_code, 1) << command << ": " << refused.err;
    EXPECT_TRUE(refused.err.starts_with(
        "tandem-agent: --threads must be an integer between 0 and 1024, got "))
        << refused.err;
  }
  EXPECT_EQ(run("timeout 60 " + bin("tandem-agent") + " --threads 1 generate --model '" +
                model.string() + "' --prompt hi --max-tokens 1")
                .exit_code,
            0);

  const fs::path typo = dir_ / "typo.yaml";
  std::ofstream(typo) << "max_num_seq: 8\n";
  CommandResult unknown = run(serve + "--config '" + typo.string() + "'");
  EXPECT_EQ(unknown.exit_code, 1) << unknown.err;
  EXPECT_TRUE(unknown.err.starts_with("tandem-agent: " + typo.string() +
                                      ": unknown key \"max_num_seq\" (did you mean "
                                      "max_num_seqs?); accepted keys: model, host, port,"))
      << unknown.err;
  EXPECT_EQ(std::count(unknown.err.begin(), unknown.err.end(), '\n'), 1) << unknown.err;

  const fs::path list = dir_ / "list.yaml";
  std::ofstream(list) << "max_num_seqs: [8, 16]\n";
  CommandResult wrong_type = run(serve + "--config '" + list.string() + "'");
  EXPECT_EQ(wrong_type.exit_code, 1) << wrong_type.err;
  EXPECT_EQ(wrong_type.err, "tandem-agent: " + list.string() +
                                ": max_num_seqs must be an integer between 1 and 4096, got a "
                                "list\n");

  // A second YAML document would be ignored, its options with it; a
  // directory in the file's place is named as such.
  const fs::path two = dir_ / "two.yaml";
  std::ofstream(two) << "port: 8001\n---\nmax_num_seqs: 4\n";
  CommandResult documents = run(serve + "--config '" + two.string() + "'");
  EXPECT_EQ(documents.exit_code, 1) << documents.err;
  EXPECT_EQ(documents.err, "tandem-agent: " + two.string() +
                               ": holds 2 YAML documents, the second at line 3 (accepted: one "
                               "mapping of option names to values)\n");
  CommandResult directory = run(serve + "--config '" + dir_.string() + "'");
  EXPECT_EQ(directory.exit_code, 1) << directory.err;
  EXPECT_EQ(directory.err, "tandem-agent: " + dir_.string() +
                               ": not a regular file (accepted: a file, or a link to one)\n");
}

// --lora-modules refused at start, each with one line naming the problem:
// not NAME=PATH, the served model's own name, an adapter the engine cannot
// apply (naming the file and field), a name given twice.
TEST_F(CliTest, ServeRefusesLoraAdaptersItCannotServe) {
  const fs::path model = makeTinyModel("base", 3);
  const fs::path adapter = dir_ / "adapter";
  tandem::tools::writeTestLoraAdapter(
      {}, tandem::engine::ModelConfig::fromFile(model / "config.json"), adapter);
  const fs::path dora = dir_ / "dora";
  tandem::tools::writeTestLoraAdapter(
      {}, tandem::engine::ModelConfig::fromFile(model / "config.json"), dora);
  nlohmann::json config = nlohmann::json::parse(readFile(dora / "adapter_config.json"));
  config["use_dora"] = true;
  std::ofstream(dora / "adapter_config.json") << config.dump();
  const std::string serve =
      "timeout 60 " + bin("tandem-agent") + " serve --model '" + model.string() + "' --port 0 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sql", "tandem-agent: --lora-modules: \"sql\" is not NAME=PATH"},
      {"sql=" + adapter.string() + ", chat=" + adapter.string(),
       "tandem-agent: --lora-modules: \" chat=" + adapter.string() + "\" is not NAME=PATH"},
      {"base=" + adapter.string(),
       "tandem-agent: --lora-modules names base, the served model's own name"},
      {"sql=" + adapter.string() + ",sql=" + adapter.string(),
       "tandem-agent: --lora-modules names sql twice"},
      {"sql=" + dora.string(), "tandem-agent: " + (dora / "adapter_config.json").string() +
                                   ": field \"use_dora\" is set (true)"},
  };
  for (const auto& [value, message] : cases) {
    SCOPED_TRACE(value);
    CommandResult refused = run(serve + "--lora-modules '" + value + "'");
    EXPECT_EQ(refused.exit_code, 1) << refused.err;
    // The last line (an adapter's refusal follows the model's loading log).
    const size_t last = refused.err.rfind('\n', refused.err.size() - 2);
    const std::string line = refused.err.substr(last == std::string::npos ? 0 : last + 1);
    EXPECT_TRUE(line.starts_with(message)) << refused.err;
    EXPECT_EQ(line.back(), '\n');
  }
}

// The router's HTTP limits accept what the agent's flags of the same names
// accept (one table, common/http/http_limits.h): a router with a 1-byte
// header limit answered its own probes 431.
TEST_F(CliTest, TheRoutersHttpLimitsHaveTheAgentsBounds) {
  const fs::path model = makeTinyModel("m", 4);
  const std::string router =
      "timeout 30 " + bin("tandem-operator") + " router --decode 127.0.0.1:2 --port 0 ";
  const std::string agent =
      "timeout 30 " + bin("tandem-agent") + " serve --model '" + model.string() + "' --port 0 ";
  for (const auto& [flag, value, range] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--max-header-bytes", "1", "1024 and 1048576"},
           {"--max-body-bytes", "0", "1024 and 4294967296"},
           {"--request-timeout", "7200", "1 and 3600"},
           {"--max-large-requests", "2000", "1 and 1024"},
           {"--max-connections", "-1", "0 and 1048576"},
           // Decimal only, as the agent's (CLI11's conversion read hex).
           {"--request-timeout", "0x10", "1 and 3600"},
           {"--max-large-requests", "5x", "1 and 1024"}}) {
    const bool integer = value.find_first_not_of("-0123456789") == std::string::npos;
    const std::string words =
        "must be an integer between " + range + ", got " + (integer ? value : "\"" + value + "\"");
    CommandResult refused = run(router + flag + " " + value);
    EXPECT_NE(refused.exit_code, 0) << flag;
    EXPECT_NE(refused.err.find(flag + ": " + words), std::string::npos) << refused.err;
    CommandResult agent_refused = run(agent + flag + " " + value);
    EXPECT_EQ(agent_refused.exit_code, 1) << flag;
    EXPECT_NE(agent_refused.err.find(flag + " " + words), std::string::npos) << agent_refused.err;
  }
}

// "/" among the API key's exempt paths is a prefix of every path: the key
// would guard nothing, and the agent or router would say nothing of it.
// Refused at start, in one line, by both.
TEST_F(CliTest, AnApiKeyExemptPathOfEveryPathIsRefused) {
  const fs::path model = makeTinyModel("m", 4);
  const std::string words =
      "--api-key-exempt-paths: \"/\" is a prefix of every path: the API key would guard "
      "nothing; give the paths to serve without it (default /health,/metrics,/v1/kv_transfer/), "
      "or no --api-key\n";
  CommandResult router = run("timeout 30 " + bin("tandem-operator") +
                             " router --decode 127.0.0.1:2 --port 0 --api-key k "
                             "--api-key-exempt-paths /health,/");
  EXPECT_EQ(router.exit_code, 1);
  EXPECT_EQ(router.err, "tandem-operator: " + words);
  CommandResult agent = run("timeout 60 " + bin("tandem-agent") + " serve --model '" +
                            model.string() + "' --port 0 --api-key k --api-key-exempt-paths /");
  EXPECT_EQ(agent.exit_code, 1);
  EXPECT_EQ(agent.err, "tandem-agent: " + words);
}

// An explicit --max-connections above half the descriptors the process may
// open (here 256, soft and hard) is refused at start, before the model's
// load: past the descriptors, clients (probes among them) would wait in the
// listen backlog, never closed for by the bound's idle-closing.
TEST_F(CliTest, AConnectionBoundAboveTheDescriptorLimitIsRefused) {
  const fs::path model = makeTinyModel("m", 4);
  const std::string words =
      "--max-connections 200 is more than half the descriptors this process may open (256, "
      "RLIMIT_NOFILE: the other half is kept for its own connections, files and KV transfers); "
      "give at most 128, or raise the limit (ulimit -n, a container's nofile)\n";
  auto limited = [](const std::string& command) {
    return "bash -c 'ulimit -n 256 && exec " + command + "'";
  };
  CommandResult router =
      run(limited("timeout 30 " + bin("tandem-operator") +
                  " router --decode 127.0.0.1:2 --port 0 --max-connections 200"));
  EXPECT_EQ(router.exit_code, 1);
  EXPECT_EQ(router.err, "tandem-operator: " + words);
  CommandResult agent = run(limited("timeout 60 " + bin("tandem-agent") + " serve --model " +
                                    model.string() + " --port 0 --max-connections 200"));
  EXPECT_EQ(agent.exit_code, 1);
  EXPECT_EQ(agent.err, "tandem-agent: " + words);
}

// The router's other number flags are checked as its file's fields are:
// ranges enforced (a seed of -1 or a queue bound past int64 started), NaN
// refused (a planner interval of nan spun the planner), decimal only.
// Each agent given by address has its own name (it labels the agent's
// metrics and logs, and keys the router's table of agents: a second of one
// name replaced the first), and each address comes once per role.
// A command line refused reads the same in every program: its name, what
// is wrong (an option misspelt names the closest one), where the options
// are listed; exit status 2. Before, each printed CLI11's bare message
// ("The following arguments were not expected: 3 --max-num-seq") and
// exited 104-114, one status per kind of error.
TEST_F(CliTest, EveryProgramRefusesACommandLineInItsOwnWords) {
  const std::vector<std::tuple<std::string, std::string>> cases = {
      {"tandem-agent serve --max-num-seq 3",
       "tandem-agent: --max-num-seq is not an option of tandem-agent serve (did you mean "
       "--max-num-seqs?)\nRun 'tandem-agent serve --help' for the options.\n"},
      {"tandem-agent serve --bogus=1 extra",
       "tandem-agent: --bogus is not an option of tandem-agent serve; \"extra\" is not an "
       "argument tandem-agent serve takes (it takes options only)\nRun 'tandem-agent serve "
       "--help' for the options.\n"},
      {"tandem-agent",
       "tandem-agent: a command is needed: tokenize, generate, serve, render-chat\nRun "
       "'tandem-agent --help' for the options.\n"},
      {"tandem-agent generate --model m",
       "tandem-agent: --prompt is required\nRun 'tandem-agent generate --help' for the "
       "options.\n"},
      {"tandem-operator router --prefil x",
       "tandem-operator: --prefil is not an option of tandem-operator router (did you mean "
       "--prefill?)\nRun 'tandem-operator router --help' for the options.\n"},
      {"tandem-model --layer 3",
       "tandem-model: --layer is not an option of tandem-model (did you mean --layers?)\nRun "
       "'tandem-model --help' for the options.\n"},
      {"tandem-bench engine --model m --bogus",
       "tandem-bench: --bogus is not an option of tandem-bench engine\nRun 'tandem-bench "
       "engine --help' for the options.\n"},
      // A misspelt option is named though a required one is missing (it
      // is, misspelt).
      {"tandem-agent generate --model m --promt hi",
       "tandem-agent: --promt is not an option of tandem-agent generate (did you mean "
       "--prompt?)\nRun 'tandem-agent generate --help' for the options.\n"},
      // An option of the command, given before it.
      {"tandem-agent --port 1 serve --model m",
       "tandem-agent: --port is an option of tandem-agent serve: give it after serve\nRun "
       "'tandem-agent serve --help' for the options.\n"},
      // A command misspelt, or none.
      {"tandem-operator route",
       "tandem-operator: \"route\" is not a command of tandem-operator (did you mean "
       "router?)\nRun 'tandem-operator --help' for the options.\n"},
      {"tandem-model lor",
       "tandem-model: \"lor\" is not a command of tandem-model (did you mean lora?)\nRun "
       "'tandem-model --help' for the options.\n"},
      {"tandem-agent --bogus",
       "tandem-agent: --bogus is not an option of tandem-agent; a command is needed: tokenize, "
       "generate, serve, render-chat\nRun 'tandem-agent --help' for the options.\n"},
  };
  for (const auto& [command, err] : cases) {
    SCOPED_TRACE(command);
    const CommandResult refused = run(bin(command));
    EXPECT_EQ(refused.exit_code, 2);
    EXPECT_EQ(refused.err, err);
    EXPECT_EQ(refused.out, "");
  }
  // Help is no error: the help of the command given, status 0.
  const CommandResult help = run(bin("tandem-agent serve --help"));
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("Usage: tandem-agent serve [OPTIONS]"), std::string::npos) << help.out;
}

TEST_F(CliTest, TheRoutersAgentsHaveDistinctNamesAndAddresses) {
  const std::string router = "timeout 10 " + bin("tandem-operator") + " router --port 0 ";
  CommandResult names = run(router + "--prefill a=127.0.0.1:1 --decode a=127.0.0.1:2");
  EXPECT_EQ(names.exit_code, 1) << names.err;
  EXPECT_EQ(names.err,
            "tandem-operator: agent name a is given twice (prefill and decode agents): each agent "
            "needs its own name, which labels its metrics and logs\n");
  CommandResult addresses = run(router + "--decode 127.0.0.1:2 --decode 127.0.0.1:2");
  EXPECT_EQ(addresses.exit_code, 1) << addresses.err;
  EXPECT_EQ(addresses.err,
            "tandem-operator: the decode agent 127.0.0.1:2 is given twice (as decode-0 and "
            "decode-1)\n");
}

TEST_F(CliTest, TheRoutersNumberFlagsAreCheckedAsItsFilesFields) {
  const std::string router =
      "timeout 10 " + bin("tandem-operator") + " router --decode 127.0.0.1:2 --port 0 ";
  for (const auto& [flag, value, words] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--seed", "-1", "must be a non-negative integer"},
           {"--max-inflight-requests", "18446744073709551616", "must be a positive integer"},
           {"--max-queued-requests", "", "must be a non-negative integer"},
           {"--disagg-threshold-tokens", "1.5", "must be a non-negative integer"},
           {"--port", "0x10", "must be an integer between 0 and 65535"},
           {"--port", "++5", "must be an integer between 0 and 65535"},
           {"--drain-delay", "nan", "must be a number of at least 0 and at most 600"},
           {"--upstream-timeout", "1e400", "must be a number greater than 0 and at most 86400"},
           {"--upstream-timeout", "0x10", "must be a number greater than 0 and at most 86400"}}) {
    SCOPED_TRACE(flag + " " + value);
    CommandResult refused = run(router + flag + " '" + value + "'");
    EXPECT_NE(refused.exit_code, 0);
    // Integers that are no integers are quoted, as the agent quotes them.
    const bool quoted =
        words.find("integer") != std::string::npos &&
        (value.empty() || value.find_first_not_of("-0123456789") != std::string::npos);
    EXPECT_NE(
        refused.err.find(flag + ": " + words + ", got " + (quoted ? "\"" + value + "\"" : value)),
        std::string::npos)
        << refused.err;
  }
  // An empty key is refused, as the agent refuses it; taken as none, it left
  // the router open.
  for (const std::string flag : {"--api-key", "--agent-api-key"}) {
    CommandResult refused = run(router + flag + " ''");
    EXPECT_EQ(refused.exit_code, 1) << refused.err;
    EXPECT_NE(refused.err.find(flag + " must be a non-empty string, got an empty string"),
              std::string::npos)
        << refused.err;
  }
  CommandResult local = run("timeout 10 " + bin("tandem-operator") +
                            " local -f /nonexistent.yaml --planner-interval nan");
  EXPECT_NE(local.exit_code, 0);
  EXPECT_NE(local.err.find("--planner-interval: must be a number of at least 0.05 and at most "
                           "3600, got nan"),
            std::string::npos)
      << local.err;
}

// The router's --chat-template is read and parsed at start, as an agent's:
// it is used only once an agent names the model, and a missing or broken
// file left the router up, answering every request "no agent is ready yet".
TEST_F(CliTest, ARoutersChatTemplateIsCheckedAtStart) {
  const std::string router =
      "timeout 10 " + bin("tandem-operator") + " router --decode 127.0.0.1:2 --port 0 ";
  CommandResult missing = run(router + "--chat-template /nonexistent/template.jinja");
  EXPECT_EQ(missing.exit_code, 1) << missing.err;
  EXPECT_TRUE(missing.err.starts_with("tandem-operator: --chat-template: ")) << missing.err;
  EXPECT_NE(missing.err.find("/nonexistent/template.jinja"), std::string::npos) << missing.err;
  const fs::path broken = dir_ / "broken.jinja";
  std::ofstream(broken) << "{% for m in messages %}\n{{ m.content }\n";
  CommandResult unparsed = run(router + "--chat-template '" + broken.string() + "'");
  EXPECT_EQ(unparsed.exit_code, 1) << unparsed.err;
  EXPECT_NE(unparsed.err.find("--chat-template: " + broken.string() +
                              ": chat template does not parse: line 2"),
            std::string::npos)
      << unparsed.err;
}

// A router flag given twice takes its last value, as the agent's: a Router's
// spec.extraArgs come after the flags the controller writes.
TEST_F(CliTest, ARouterFlagGivenTwiceTakesItsLastValue) {
  const std::string router =
      "timeout 3 " + bin("tandem-operator") + " router --decode 127.0.0.1:2 --port 0 ";
  CommandResult last_good = run(router + "--host 999.1.1.1 --host 127.0.0.1");
  EXPECT_EQ(last_good.exit_code, 124) << last_good.err;  // it ran until stopped
  EXPECT_NE(last_good.out.find("router listening on 127.0.0.1:"), std::string::npos)
      << last_good.out << last_good.err;
  CommandResult last_bad = run(router + "--host 127.0.0.1 --host 999.1.1.1");
  EXPECT_EQ(last_bad.exit_code, 1) << last_bad.err;
  EXPECT_NE(last_bad.err.find("cannot listen on 999.1.1.1:0"), std::string::npos) << last_bad.err;
}

// --host takes a host name the machine resolves ("localhost", as vLLM's
// server does), and one it cannot is refused before the model loads (it
// was refused after: "Invalid argument", a minute into an 8B model's load).
TEST_F(CliTest, AHostNameIsResolvedAndOneThatIsNoneIsRefusedAtOnce) {
  const std::string router =
      "timeout 3 " + bin("tandem-operator") + " router --decode 127.0.0.1:2 --port 0 ";
  CommandResult named = run(router + "--host localhost");
  EXPECT_EQ(named.exit_code, 124) << named.err;  // it ran until stopped
  EXPECT_NE(named.out.find("router listening on localhost:"), std::string::npos) << named.out;
  const fs::path model = makeTinyModel("h", 4);
  CommandResult refused = run("timeout 60 " + bin("tandem-agent") + " serve --model '" +
                              model.string() + "' --port 0 --host no-such-host.invalid");
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_NE(refused.err.find("tandem-agent: cannot listen on no-such-host.invalid:0: not an IP "
                             "address, nor a host name this machine resolves"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.err.find("weights digest"), std::string::npos) << refused.err;
}

// --device takes cpu, cuda or auto; cuda needs a CUDA build and a visible GPU,
// and says which is missing.
TEST_F(CliTest, DeviceFlagNamesWhatIsAcceptedAndWhyCudaIsUnavailable) {
  const fs::path model = makeTinyModel("m", 4);
  const std::string serve =
      "timeout 60 " + bin("tandem-agent") + " serve --model '" + model.string() + "' --port 0 ";
  CommandResult from_flag = run(serve + "--device gpu");
  EXPECT_EQ(from_flag.exit_code, 1) << from_flag.err;
  EXPECT_EQ(from_flag.err, "tandem-agent: --device must be one of cpu, cuda, auto, got \"gpu\"\n");
  const fs::path file = dir_ / "device.yaml";
  std::ofstream(file) << "device: gpu\n";
  CommandResult from_file = run(serve + "--config '" + file.string() + "'");
  EXPECT_EQ(from_file.exit_code, 1) << from_file.err;
  EXPECT_EQ(from_file.err, "tandem-agent: " + file.string() +
                               ": device must be one of cpu, cuda, auto, got \"gpu\"\n");

  const std::string generate = bin("tandem-agent") + " generate --model '" + model.string() +
                               "' --prompt 'Once upon a time' --max-tokens 4 --ignore-eos ";
  CommandResult on_cpu = run(generate + "--device cpu");
  ASSERT_EQ(on_cpu.exit_code, 0) << on_cpu.err;
  // The same tokens as the default device when that is the CPU.
  CommandResult by_default = run(generate);
  ASSERT_EQ(by_default.exit_code, 0) << by_default.err;
  CommandResult on_cuda = run(generate + "--device cuda");
  if (on_cuda.exit_code != 0) {
    EXPECT_TRUE(on_cuda.err ==
                    "tandem-agent: --device cuda: this build has no CUDA backend (configure "
                    "with -DTANDEM_CUDA=ON)\n" ||
                on_cuda.err == "tandem-agent: --device cuda: no CUDA device is visible\n")
        << on_cuda.err;
    EXPECT_EQ(by_default.out, on_cpu.out);
  }
}

TEST_F(CliTest, ServeReportsInvalidKvTransferConfigJsonWithItsPosition) {
  const fs::path model = makeTinyModel("m", 3);
  CommandResult r =
      run("timeout 60 " + bin("tandem-agent") + " serve --model '" + model.string() +
          "' --port 0 --kv-transfer-config '{\"kv_connector\": \"offload\",, \"kv_role\": 1}'");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(
      r.err.starts_with("tandem-agent: --kv-transfer-config is not valid JSON (byte 28): "
                        "parse error at line 1, column 28: syntax error"))
      << r.err;
}

// docs/configuration.md: in YAML, kv_transfer_config may be a mapping, in
// block or inline style; its numbers stay numbers.
TEST_F(CliTest, ServeTakesKvTransferConfigAsAYamlMapping) {
  for (const std::string mapping :
       {"kv_transfer_config:\n  kv_connector: offload\n  kv_role: kv_both\n"
        "  kv_connector_extra_config:\n    capacity_blocks: 8\n",
        "kv_transfer_config: {kv_connector: offload, kv_connector_extra_config: "
        "{capacity_blocks: 8}}\n"}) {
    const fs::path file = dir_ / "agent.yaml";
    std::ofstream(file) << "num_blocks: 64\n" << mapping;
    ::tandem::testing::Agent agent({"--config", file.string()});
    int status = 0;
    const nlohmann::json response =
        agent.post("/v1/completions", ::tandem::testing::greedy({5, 6, 7, 8, 9}, 4), &status);
    EXPECT_EQ(status, 200) << response.dump();
    EXPECT_EQ(::tandem::testing::tokenIds(response).size(), 4u) << response.dump();
    // The offload connector's series exist from the start.
    EXPECT_TRUE(::tandem::prometheusSample(agent.metricsText(), "tandem_kv_blocks_loaded_total",
                                           "source=\"offload\"")
                    .has_value())
        << agent.metricsText();
    EXPECT_EQ(agent.metric("tandem_kv_cache_free_blocks"), 64);
  }
}

// An error from the KV connector's checks names the field in the body's
// param, not only in the message.
TEST_F(CliTest, KvTransferParamsErrorsNameTheFieldInParam) {
  ::tandem::testing::Agent agent(
      {"--kv-transfer-config", R"({"kv_connector": "ucx", "kv_role": "kv_consumer"})"});
  nlohmann::json body = ::tandem::testing::greedy({5, 6, 7, 8, 9}, 2);
  body["kv_transfer_params"] = {{"do_remote_prefill", "yes"}};
  int status = 0;
  const nlohmann::json response = agent.post("/v1/completions", body, &status);
  EXPECT_EQ(status, 400) << response.dump();
  EXPECT_EQ(response["error"]["message"],
            "kv_transfer_params.do_remote_prefill must be true or false");
  EXPECT_EQ(response["error"]["param"], "kv_transfer_params.do_remote_prefill") << response.dump();
}

}  // namespace
