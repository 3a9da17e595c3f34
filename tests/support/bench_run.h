// Runs `tandem-bench` as a user would, from the integration tests: one
// subcommand with its arguments, stdout, stderr and the --json report kept
// in a directory of the test, and all three handed back with the exit code;
// and the fixture of suites that run it on a tiny model of their own.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace tandem::testing {

struct BenchRun {
  int exit_code = -1;
  std::string out;
  std::string err;
  nlohmann::json report;  // null when the run wrote none
};

// `tandem-bench <subcommand> --json DIR/bench.json <args>` with `env`
// (assignments, e.g. "TANDEM_KERNEL_ISA=avx2") before it; args are shell
// words, quoted by the caller where needed.
inline BenchRun runBench(const std::filesystem::path& dir, const std::string& subcommand,
                         const std::string& args, const std::string& env = "") {
  namespace fs = std::filesystem;
  const fs::path out = dir / "bench.stdout", err = dir / "bench.stderr",
                 report = dir / "bench.json";
  fs::remove(report);
  const std::string command = env + " " + std::string(TANDEM_BIN_DIR) + "/tandem-bench " +
                              subcommand + " --json '" + report.string() + "' " + args + " > '" +
                              out.string() + "' 2> '" + err.string() + "'";
  const int status = std::system(command.c_str());
  BenchRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = readFile(out);
  run.err = readFile(err);
  if (fs::exists(report)) run.report = nlohmann::json::parse(readFile(report));
  return run;
}

// A test suite running `tandem-bench Suite::kSubcommand --model <tiny>` on
// a tiny model written once per suite with seed Suite::kSeed into a
// directory of its own, removed after the suite.
template <typename Suite>
class TinyModelBenchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    temp_ = new TempDir(std::string("tandem-bench-") + Suite::kSubcommand + "-test");
    tools::TestModelOptions options;
    options.seed = Suite::kSeed;
    tools::writeTestModel(options, modelDir());
  }
  static void TearDownTestSuite() {
    delete temp_;
    temp_ = nullptr;
  }

  static const std::filesystem::path& dir() { return temp_->path(); }
  static std::filesystem::path modelDir() { return temp_->path() / "tiny"; }
  static BenchRun bench(const std::string& args) {
    return runBench(dir(), Suite::kSubcommand, "--model '" + modelDir().string() + "' " + args);
  }

 private:
  inline static TempDir* temp_ = nullptr;
};

}  // namespace tandem::testing
