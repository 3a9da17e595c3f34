// The options of `tandem-agent serve`: flags and YAML keys go through one
// table and one check, so a value is refused the same way from both, naming
// the flag or the file and key with the accepted range; unknown and
// duplicated YAML keys, and YAML values of the wrong shape, are refused;
// kv_transfer_config may be a YAML mapping whose scalars keep their types.
#include "agent/agent_config.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/serve_command.h"
#include "common/closest_match.h"
#include "common/status.h"

namespace tandem::agent {
namespace {

using nlohmann::json;

// Parses `args` after `serve` and applies them over `yaml` (empty: no file);
// returns the error message, "" when the options were accepted.
std::string apply(std::vector<std::string> args, const std::string& yaml,
                  ServeOptions* out = nullptr) {
  CLI::App app;
  app.fallthrough();
  int threads = 0;
  app.add_option("--threads", threads);
  ServeOptions options;
  CLI::App* serve = addServeCommand(app, options);
  args.insert(args.begin(), "serve");
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
  try {
    applyServeOptions(*serve, yaml.empty() ? YAML::Node() : YAML::Load(yaml), "agent.yaml",
                      options);
  } catch (const Error& error) {
    return error.what();
  }
  if (out != nullptr) *out = options;
  return "";
}

TEST(ServeOptions, FlagsAndYamlRefuseTheSameValuesWithTheSameMessage) {
  struct Case {
    std::string key;
    std::string value;
    std::string message;  // after the name of the flag or key
  };
  for (const Case& c : std::vector<Case>{
           {"block_size", "0", "must be an integer between 1 and 1024, got 0"},
           {"block_size", "2000", "must be an integer between 1 and 1024, got 2000"},
           {"max_num_seqs", "0", "must be an integer between 1 and 4096, got 0"},
           {"num_blocks", "-5", "must be an integer between 0 and 2147483647, got -5"},
           {"max_num_batched_tokens", "0", "must be an integer between 1 and 1048576, got 0"},
           {"max_model_len", "1000000000000000",
            "must be an integer between 0 and 16777216, got 1000000000000000"},
           {"max_waiting_requests", "0", "must be an integer between 1 and 1000000, got 0"},
           {"threads", "100000", "must be an integer between 0 and 1024, got 100000"},
           {"port", "70000", "must be an integer between 0 and 65535, got 70000"},
           {"port", "80.5", "must be an integer between 0 and 65535, got \"80.5\""},
           {"shutdown_timeout", "1e308",
            "must be a number of seconds between 0 and 86400, got 1e308"},
           {"shutdown_timeout", "-1", "must be a number of seconds between 0 and 86400, got -1"},
           // Decimal only: strtod reads hex.
           {"shutdown_timeout", "0x10",
            "must be a number of seconds between 0 and 86400, got 0x10"},
           {"kv_dtype", "f16", "must be one of bf16, f32, fp8, got \"f16\""},
           {"compute_dtype", "f16", "must be one of auto, f32, bf16, got \"f16\""},
           {"fuse_projections", "yes", "must be one of auto, true, false, got \"yes\""},
           {"scheduling_policy", "lifo", "must be one of fcfs, priority, got \"lifo\""},
           {"cuda_kernels", "turbo", "must be one of auto, reference, fast, flash, got \"turbo\""},
           {"role", "reader", "must be one of prefill, decode, both, got \"reader\""},
           {"prefix_caching_hash", "md5", "must be one of xxhash, sha256, got \"md5\""},
           {"kv_cache_memory", "0",
            "must be a size between 1 byte and 1PiB such as 2GiB, 512MiB or 1073741824, got \"0\""},
           {"kv_cache_memory", "1e300",
            "must be a size between 1 byte and 1PiB such as 2GiB, 512MiB or 1073741824, got "
            "\"1e300\""},
           // Not decimal sizes: std::stod read them, and cut "1.5" bytes to 1.
           {"kv_cache_memory", "1.5",
            "must be a size between 1 byte and 1PiB such as 2GiB, 512MiB or 1073741824, got "
            "\"1.5\""},
           {"kv_cache_memory", "0x4000000",
            "must be a size between 1 byte and 1PiB such as 2GiB, 512MiB or 1073741824, got "
            "\"0x4000000\""},
           {"kv_cache_memory", "inf",
            "must be a size between 1 byte and 1PiB such as 2GiB, 512MiB or 1073741824, got "
            "\"inf\""},
           {"kv_cache_memory", "1.1PiB",
            "must be a size between 1 byte and 1PiB such as 2GiB, 512MiB or 1073741824, got "
            "\"1.1PiB\""},
       }) {
    std::string flag = "--" + c.key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    EXPECT_EQ(apply({flag, c.value}, ""), flag + " " + c.message);
    EXPECT_EQ(apply({}, c.key + ": " + c.value), "agent.yaml: " + c.key + " " + c.message);
  }
}

TEST(ServeOptions, AcceptedValuesReachTheOptionsAndFlagsWinOverTheFile) {
  ServeOptions options;
  ASSERT_EQ(apply({"--max-num-seqs", "8"},
                  "model: /models/m\nblock-size: 32\nmax_num_seqs: 128\nshutdown_timeout: 2.5\n"
                  "kv_cache_memory: 512MiB\ninsecure_kv: true\nthreads: 3\nport: 0\n"
                  "scheduling_policy: priority\nfuse_projections: True\n",
                  &options),
            "");
  EXPECT_EQ(options.scheduling_policy, "priority");
  // A YAML boolean is a boolean choice's value, however it is spelled.
  EXPECT_EQ(options.fuse_projections, "true");
  ServeOptions unfused, defaults;
  ASSERT_EQ(apply({"--fuse-projections", "false"}, "", &unfused), "");
  EXPECT_EQ(unfused.fuse_projections, "false");
  ASSERT_EQ(apply({}, "", &defaults), "");
  EXPECT_EQ(defaults.fuse_projections, "auto");
  EXPECT_EQ(defaults.compute_dtype, "auto");
  EXPECT_EQ(options.model, "/models/m");
  EXPECT_EQ(options.block_size, 32);
  EXPECT_EQ(options.max_num_seqs, 8);
  EXPECT_EQ(options.shutdown_timeout_s, 2.5);
  EXPECT_EQ(options.kv_cache_memory, "512MiB");
  EXPECT_TRUE(options.insecure_kv);
  EXPECT_EQ(options.threads, 3);
  EXPECT_EQ(options.port, 0);
  // --threads before the subcommand counts as given.
  CLI::App app;
  app.fallthrough();
  int threads = 0;
  app.add_option("--threads", threads);
  ServeOptions outer;
  CLI::App* serve = addServeCommand(app, outer);
  app.parse(std::vector<std::string>{"serve", "7", "--threads"});
  applyServeOptions(*serve, YAML::Load("threads: 3"), "agent.yaml", outer);
  EXPECT_EQ(outer.threads, 7);
}

// Sizes up to the documented 1 PiB, in every unit the table names; a
// larger unit's fraction rounds down to a whole byte.
TEST(ServeOptions, SizesReadEveryDocumentedUnit) {
  EXPECT_EQ(parseByteSize("1PiB", "s"), int64_t{1} << 50);
  EXPECT_EQ(parseByteSize("2TiB", "s"), int64_t{2} << 40);
  EXPECT_EQ(parseByteSize("1.5GiB", "s"), int64_t{3} << 29);
  EXPECT_EQ(parseByteSize("2e9", "s"), int64_t{2000000000});
  EXPECT_EQ(parseByteSize("0.1KB", "s"), 100);
  EXPECT_EQ(parseByteSize("1073741824", "s"), int64_t{1} << 30);
  EXPECT_EQ(parseByteSize("4TB", "s"), int64_t{4000000000000});
  for (const char* bad : {"", " 64MiB", "64 MiB", "-1", "+5", "1e", ".", "1.5", "5XB", "1e400"}) {
    EXPECT_THROW(parseByteSize(bad, "s"), Error) << bad;
  }
  ServeOptions options;
  EXPECT_EQ(apply({"--kv-cache-memory", "1PiB"}, "", &options), "");
}

TEST(ServeOptions, UnknownYamlKeysAreRefusedWithTheAcceptedOnes) {
  const std::string typo = apply({}, "model: m\nmax_num_seq: 5\n");
  EXPECT_TRUE(
      typo.starts_with("agent.yaml: unknown key \"max_num_seq\" (did you mean "
                       "max_num_seqs?); accepted keys: model, host, port,"))
      << typo;
  EXPECT_NE(typo.find("kv_transfer_config"), std::string::npos) << typo;
  const std::string unrelated = apply({}, "colour: blue\n");
  EXPECT_TRUE(unrelated.starts_with("agent.yaml: unknown key \"colour\"; accepted keys: model"))
      << unrelated;
  EXPECT_EQ(apply({}, "block_size: 16\nblock-size: 32\n"),
            "agent.yaml: block_size is given twice (as block_size and block-size)");
  EXPECT_NE(apply({}, "config: other.yaml\n").find("unknown key \"config\""), std::string::npos);
}

TEST(ServeOptions, YamlValuesOfTheWrongShapeNameTheKey) {
  EXPECT_EQ(apply({}, "block_size: [1, 2]\n"),
            "agent.yaml: block_size must be an integer between 1 and 1024, got a list");
  EXPECT_EQ(apply({}, "model: {path: /m}\n"),
            "agent.yaml: model must be a non-empty string, got a mapping");
  EXPECT_EQ(apply({}, "max_num_seqs:\n"),
            "agent.yaml: max_num_seqs must be an integer between 1 and 4096, got nothing (null)");
  EXPECT_EQ(apply({}, "insecure_kv: yes\n"),
            "agent.yaml: insecure_kv must be true or false, got \"yes\"");
  EXPECT_EQ(apply({}, "kv_transfer_config: [1]\n"),
            "agent.yaml: kv_transfer_config must be a JSON object, or in YAML a mapping, got a "
            "list");
}

// An on/off flag given a value takes that value: --insecure-kv=false is
// off (it used to turn the flag on, whatever the value: a pod's extraArgs
// saying --insecure-kv=false lifted the non-loopback guard), and a value
// other than true or false is refused as the file refuses it.
TEST(ServeOptions, AnOnOffFlagGivenAValueTakesIt) {
  for (const char* flag :
       {"insecure-kv", "enable-fault-injection", "return-tokens-as-token-ids", "enforce-eager"}) {
    SCOPED_TRACE(flag);
    const std::string bare = std::string("--") + flag;
    ServeOptions on, off, explicitly_on, last;
    EXPECT_EQ(apply({bare}, "", &on), "");
    EXPECT_EQ(apply({bare + "=false"}, "", &off), "");
    EXPECT_EQ(apply({bare + "=true"}, "", &explicitly_on), "");
    EXPECT_EQ(apply({bare, bare + "=false"}, "", &last), "");
    EXPECT_EQ(apply({bare + "=no"}, ""), bare + " must be true or false, got \"no\"");
    EXPECT_EQ(apply({bare + "=0"}, ""), bare + " must be true or false, got \"0\"");
    if (std::string(flag) == "insecure-kv") {
      EXPECT_TRUE(on.insecure_kv);
      EXPECT_FALSE(off.insecure_kv);
      EXPECT_TRUE(explicitly_on.insecure_kv);
      EXPECT_FALSE(last.insecure_kv) << "the last one given wins";
    } else if (std::string(flag) == "enforce-eager") {
      EXPECT_TRUE(on.enforce_eager);
      EXPECT_FALSE(off.enforce_eager);
    }
  }
}

// A JSON option nesting past the bound is refused from a file as from the
// flag, whether written as JSON text or as a YAML mapping: a file can carry
// a value far deeper than a command line can (100,000 levels overflowed
// the stack when it was written out again).
TEST(ServeOptions, DeeplyNestedJsonOptionsAreRefusedFromAFile) {
  const int depth = 100000;
  const std::string deep_json =
      "{\"kv_connector\": \"offload\", \"x\": " + std::string(depth, '[') +
      std::string(depth, ']') + "}";
  const std::string from_text = apply({}, "kv_transfer_config: '" + deep_json + "'\n");
  EXPECT_TRUE(from_text.starts_with("agent.yaml: kv_transfer_config")) << from_text.substr(0, 300);
  EXPECT_NE(from_text.find("nesting deeper than 128 levels"), std::string::npos)
      << from_text.substr(0, 300);
  std::string deep_yaml = "hf_overrides: ";
  for (int i = 0; i < 200; ++i) deep_yaml += "{a: ";
  deep_yaml += "1" + std::string(200, '}') + "\n";
  EXPECT_EQ(apply({}, deep_yaml),
            "agent.yaml: hf_overrides: a YAML value nests deeper than 128 levels (line 1)");
}

// A key given twice inside a JSON option is refused from a YAML mapping as
// from the flag's JSON (the last one was kept).
TEST(ServeOptions, AKeyGivenTwiceInAJsonOptionIsRefused) {
  EXPECT_EQ(apply({},
                  "kv_transfer_config:\n  kv_connector: ucx\n  kv_connector_extra_config:\n"
                  "    secret: first-secret\n    secret: second-secret\n"),
            "agent.yaml: kv_transfer_config: key secret is given twice (line 5)");
  EXPECT_EQ(
      apply({"--kv-transfer-config", R"({"kv_connector": "offload", "kv_connector_extra_config": )"
                                     R"({"capacity_blocks": 8, "capacity_blocks": 9}})"},
            ""),
      "--kv-transfer-config: kv_connector_extra_config.capacity_blocks is given twice");
}

TEST(ServeOptions, KvTransferConfigMayBeAYamlMappingInBlockOrInlineStyle) {
  const json expected = {{"kv_connector", "offload"},
                         {"kv_role", "kv_both"},
                         {"kv_connector_extra_config", {{"capacity_blocks", 8}}}};
  for (const std::string yaml : {
           "kv_transfer_config:\n  kv_connector: offload\n  kv_role: kv_both\n"
           "  kv_connector_extra_config:\n    capacity_blocks: 8\n",
           "kv_transfer_config: {kv_connector: offload, kv_role: kv_both, "
           "kv_connector_extra_config: {capacity_blocks: 8}}\n",
           "kv_transfer_config: '{\"kv_connector\": \"offload\", \"kv_role\": \"kv_both\", "
           "\"kv_connector_extra_config\": {\"capacity_blocks\": 8}}'\n",
       }) {
    ServeOptions options;
    ASSERT_EQ(apply({}, yaml, &options), "") << yaml;
    EXPECT_EQ(json::parse(options.kv_transfer_config), expected) << yaml;
  }
  // The connector's own checks name the key as written.
  EXPECT_EQ(apply({}, "kv_transfer_config: {kv_connector: nixl}\n"),
            "agent.yaml: kv_transfer_config: kv_connector \"nixl\" is not supported (accepted: "
            "storage, ucx, offload, multi)");
  EXPECT_EQ(apply({},
                  "kv_transfer_config: {kv_connector: ucx, kv_connector_extra_config: "
                  "{abort_timeout_s: 1e308}}\n"),
            "agent.yaml: kv_transfer_config: kv_connector_extra_config.abort_timeout_s must be a "
            "number of seconds above 0 and at most 86400, got 1e+308");
}

TEST(ServeOptions, InvalidJsonInTheFlagIsReportedWithItsPosition) {
  const std::string message =
      apply({"--kv-transfer-config", R"({"kv_connector": "offload",, "kv_role": "kv_both"})"}, "");
  EXPECT_TRUE(
      message.starts_with("--kv-transfer-config is not valid JSON (byte 28): parse error "
                          "at line 1, column 28: syntax error"))
      << message;
  EXPECT_EQ(apply({"--kv-transfer-config", "[1, 2]"}, ""),
            "--kv-transfer-config must be a JSON object, got array");
}

// --speculative-config is checked at start by its own parser, from the flag
// or from a YAML mapping, naming where the value came from.
TEST(ServeOptions, SpeculativeConfigIsCheckedFromTheFlagOrAYamlMapping) {
  ServeOptions options;
  ASSERT_EQ(apply({},
                  "speculative_config:\n  method: ngram\n  num_speculative_tokens: 4\n"
                  "  prompt_lookup_max: 3\n",
                  &options),
            "");
  EXPECT_EQ(json::parse(options.speculative_config),
            (json{{"method", "ngram"}, {"num_speculative_tokens", 4}, {"prompt_lookup_max", 3}}));
  EXPECT_EQ(apply({}, "speculative_config: {method: eagle, num_speculative_tokens: 4}\n"),
            "agent.yaml: speculative_config: method \"eagle\" is not supported; accepted: ngram "
            "(prompt lookup, no draft model)");
  EXPECT_EQ(apply({"--speculative-config", R"({"method": "ngram"})"}, ""),
            "--speculative-config needs num_speculative_tokens, the drafts per step (1 to 64)");
  EXPECT_EQ(apply({"--speculative-config", "[1]"}, ""),
            "--speculative-config must be a JSON object, got array");
  EXPECT_TRUE(apply({"--speculative-config", R"({"method": "ngram",})"}, "")
                  .starts_with("--speculative-config is not valid JSON (byte 20)"));
}

// --hf-overrides: a JSON object (in YAML a mapping) whose fields the model
// reads in place of its config.json's (ModelConfig checks them at load).
TEST(ServeOptions, HfOverridesAreAJsonObjectFromTheFlagOrAYamlMapping) {
  ServeOptions options;
  ASSERT_EQ(apply({},
                  "hf_overrides:\n  rope_scaling:\n    rope_type: yarn\n    factor: 4.0\n"
                  "    original_max_position_embeddings: 32768\n",
                  &options),
            "");
  EXPECT_EQ(json::parse(options.hf_overrides),
            (json{{"rope_scaling",
                   {{"rope_type", "yarn"},
                    {"factor", 4.0},
                    {"original_max_position_embeddings", 32768}}}}));
  ASSERT_EQ(apply({"--hf-overrides", R"({"max_position_embeddings": 8192})"}, "", &options), "");
  EXPECT_EQ(json::parse(options.hf_overrides), (json{{"max_position_embeddings", 8192}}));
  EXPECT_EQ(apply({"--hf-overrides", "[1]"}, ""),
            "--hf-overrides must be a JSON object, got array");
  EXPECT_TRUE(apply({"--hf-overrides", R"({"rope_scaling": })"}, "")
                  .starts_with("--hf-overrides is not valid JSON (byte 18)"));
}

TEST(ServeOptions, OptionsAddedOutsideTheTableTakeTheirYamlValueThroughCli11) {
  for (const auto& [yaml, expected] : std::vector<std::pair<std::string, std::string>>{
           {"connection_limit: 5", ""},
           {"connection-limit: 50",
            "agent.yaml: connection-limit: --connection-limit: Value 50 "
            "not in range 1 to 10"},
           {"connection_limit: [5]",
            "agent.yaml: connection_limit must be a single value, got a "
            "list"}}) {
    CLI::App app;
    ServeOptions options;
    CLI::App* serve = addServeCommand(app, options);
    int limit = 0;
    serve->add_option("--connection-limit", limit)->check(CLI::Range(1, 10));
    app.parse(std::vector<std::string>{"serve"});
    std::string message;
    try {
      applyServeOptions(*serve, YAML::Load(yaml), "agent.yaml", options);
    } catch (const Error& error) {
      message = error.what();
    }
    EXPECT_EQ(message, expected) << yaml;
    if (expected.empty()) {
      EXPECT_EQ(limit, 5);
    }
  }
}

TEST(YamlToJson, PlainScalarsKeepTheirTypesAndQuotedOnesStayStrings) {
  const json converted = yamlToJson(YAML::Load(
      "{int: 8, negative: -7, hex: 0x10, float: 1.5, exp: 1e3, yes: true, no: False, none: ~, "
      "empty: , quoted: \"8\", single: '1.5', word: offload, version: 1.2.3, "
      "list: [1, two, {three: 3}]}"));
  EXPECT_EQ(converted, json::parse(R"({"int": 8, "negative": -7, "hex": 16, "float": 1.5,
      "exp": 1000.0, "yes": true, "no": false, "none": null, "empty": null, "quoted": "8",
      "single": "1.5", "word": "offload", "version": "1.2.3",
      "list": [1, "two", {"three": 3}]})"));
  EXPECT_TRUE(converted["int"].is_number_integer());
  EXPECT_TRUE(converted["exp"].is_number_float());
}

TEST(ClosestMatch, SuggestsOnlyNearWords) {
  const std::vector<std::string> keys = {"max_num_seqs", "max_model_len", "block_size", "port"};
  EXPECT_EQ(closestMatch("max_num_seq", keys), "max_num_seqs");
  EXPECT_EQ(closestMatch("blocksize", keys), "block_size");
  EXPECT_EQ(closestMatch("colour", keys), "");
  EXPECT_EQ(closestMatch("pt", keys), "");
}

}  // namespace
}  // namespace tandem::agent
