// The command-line tools as a user runs them: exit codes, stdout, stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

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

TEST_F(CliTest, TokenizeMatchesReferenceIdsAndReportsBadLines) {
  const std::string data = std::string(TANDEM_TEST_DATA_DIR) + "/tokenizers/llama3";
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
}

}  // namespace
