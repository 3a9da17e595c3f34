// --kv-transfer-config parsing for the offload and multi connectors: members
// are parsed and validated with the top-level config, errors name the field
// (down to kv_connector_extra_config.connectors[i].<field>), the multi's
// policy and hold timeout reach its members, and a ucx member asks for a UCX
// slab.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "agent/kv/connector.h"
#include "agent/kv/connector_registry.h"
#include "agent/kv/multi/multi_connector.h"
#include "tests/unit/kv/kv_test_support.h"

namespace tandem::kv {
namespace {

using nlohmann::json;

json multiOf(const std::vector<json>& members, json extra = json::object()) {
  extra["connectors"] = members;
  return {{"kv_connector", "multi"}, {"kv_connector_extra_config", extra}};
}

std::string parseError(const json& config) {
  StatusOr<KvTransferConfig> parsed = KvTransferConfig::parse(config.dump());
  return parsed.isOk() ? "" : parsed.status().message();
}

TEST(KvTransferConfigParse, OffloadAndMultiAreAccepted) {
  StatusOr<KvTransferConfig> offload = KvTransferConfig::parse(
      R"({"kv_connector": "offload", "kv_connector_extra_config": {"capacity_blocks": 8}})");
  ASSERT_TRUE(offload.isOk()) << offload.status().message();
  EXPECT_EQ(offload->connector, "offload");
  EXPECT_TRUE(offload->members.empty());

  StatusOr<KvTransferConfig> multi = KvTransferConfig::parse(
      multiOf({{{"kv_connector", "offload"},
                {"kv_role", "kv_consumer"},
                {"kv_connector_extra_config", {{"capacity_blocks", 8}}}},
               {{"kv_connector", "storage"},
                {"kv_connector_extra_config", {{"shared_storage_path", "/tmp/kv"}}}}},
              {{"kv_load_failure_policy", "fail"}, {"abort_timeout_s", 5}})
          .dump());
  ASSERT_TRUE(multi.isOk()) << multi.status().message();
  ASSERT_EQ(multi->members.size(), 2u);
  EXPECT_EQ(multi->members[0].connector, "offload");
  EXPECT_EQ(multi->members[0].role, KvRole::kConsumer);
  EXPECT_EQ(multi->members[1].connector, "storage");
  EXPECT_EQ(multi->members[1].role, KvRole::kBoth);
  for (const KvTransferConfig& member : multi->members) {
    EXPECT_EQ(member.load_failure_policy, LoadFailurePolicy::kFail);
    EXPECT_EQ(member.abort_timeout_s, 5);
  }
  EXPECT_FALSE(needsUcxSlab(*multi));
}

TEST(KvTransferConfigParse, AUcxMemberNeedsTheUcxSlab) {
  StatusOr<KvTransferConfig> multi =
      KvTransferConfig::parse(multiOf({{{"kv_connector", "offload"},
                                        {"kv_connector_extra_config", {{"capacity_blocks", 8}}}},
                                       {{"kv_connector", "ucx"}}})
                                  .dump());
  ASSERT_TRUE(multi.isOk()) << multi.status().message();
  EXPECT_TRUE(needsUcxSlab(*multi));
}

// A multi connector has one KV secret: given at its top level or in one
// member, every member and the multi itself carry it (before, a secret at
// the top level left a ucx member unauthenticated while the agent's control
// routes asked for signatures). Two different ones, or one that is not a
// non-empty string, are refused without showing the value.
TEST(KvTransferConfigParse, AMultiConnectorsSecretReachesEveryMember) {
  const json ucx = {{"kv_connector", "ucx"}};
  const json offload = {{"kv_connector", "offload"},
                        {"kv_connector_extra_config", {{"capacity_blocks", 8}}}};
  for (const json& config :
       {multiOf({offload, ucx}, {{"secret", "s3cret-value"}}),
        multiOf({offload,
                 {{"kv_connector", "ucx"},
                  {"kv_connector_extra_config", {{"secret", "s3cret-value"}}}}})}) {
    StatusOr<KvTransferConfig> multi = KvTransferConfig::parse(config.dump());
    ASSERT_TRUE(multi.isOk()) << multi.status().message();
    EXPECT_EQ(kvSecret(*multi), "s3cret-value") << config.dump();
    for (const KvTransferConfig& member : multi->members) {
      EXPECT_EQ(kvSecret(member), "s3cret-value") << member.connector << " in " << config.dump();
    }
  }
  const std::string differing = parseError(multiOf(
      {offload,
       {{"kv_connector", "ucx"}, {"kv_connector_extra_config", {{"secret", "other-value"}}}}},
      {{"secret", "s3cret-value"}}));
  EXPECT_EQ(differing,
            "kv-transfer-config: kv_connector_extra_config.connectors[1].kv_connector_extra_config."
            "secret differs from kv_connector_extra_config.secret: a multi connector has one KV "
            "secret (set it once, in the multi connector's kv_connector_extra_config)");
  // A NUL would end the secret in an agent's environment, where it travels
  // too: "\0s3cret" was no secret at all there.
  for (const json& secret :
       {json(8675309867530986), json(""), json(true), json(std::string("\0s3cret", 7))}) {
    const std::string message = parseError(multiOf({ucx}, {{"secret", secret}}));
    EXPECT_EQ(message,
              "kv-transfer-config: kv_connector_extra_config.secret must be a non-empty "
              "string without NUL characters");
  }
  EXPECT_EQ(parseError(multiOf(
                {{{"kv_connector", "ucx"}, {"kv_connector_extra_config", {{"secret", 12}}}}})),
            "kv-transfer-config: kv_connector_extra_config.connectors[0].kv_connector_extra_config."
            "secret must be a non-empty string without NUL characters");
}

TEST(KvTransferConfigParse, ErrorsNameTheFieldAndWhatIsAccepted) {
  struct Case {
    json config;
    std::string message;
  };
  const json offload = {{"kv_connector", "offload"},
                        {"kv_connector_extra_config", {{"capacity_blocks", 8}}}};
  for (const Case& c : std::vector<Case>{
           {{{"kv_connector", "nixl"}},
            "kv_connector \"nixl\" is not supported (accepted: storage, ucx, offload, multi)"},
           {{{"kv_connector", "multi"}},
            "kv_connector_extra_config.connectors must be a non-empty array"},
           {multiOf({}), "kv_connector_extra_config.connectors must be a non-empty array"},
           {multiOf({offload, 3}),
            "kv_connector_extra_config.connectors[1] must be a "
            "kv-transfer-config object, got 3"},
           {multiOf({offload, {{"kv_connector", "nixl"}}}),
            "kv_connector_extra_config.connectors[1].kv_connector \"nixl\" is not supported "
            "(accepted: storage, ucx, offload, multi)"},
           {multiOf({offload, {{"kv_role", "kv_both"}}}),
            "kv_connector_extra_config.connectors[1].kv_connector must be a string"},
           {multiOf({{{"kv_connector", "offload"}, {"kv_role", "reader"}}}),
            "kv_connector_extra_config.connectors[0].kv_role must be kv_producer, kv_consumer "
            "or kv_both, got reader"},
           {multiOf({multiOf({offload})}),
            "kv_connector_extra_config.connectors[0].kv_connector \"multi\" cannot be a member "
            "of a multi connector (accepted: storage, ucx, offload)"},
           {multiOf({{{"kv_connector", "offload"},
                      {"kv_connector_extra_config",
                       {{"capacity_blocks", 8}, {"kv_load_failure_policy", "fail"}}}}}),
            "kv_connector_extra_config.connectors[0].kv_connector_extra_config."
            "kv_load_failure_policy is not accepted for a member"},
       }) {
    EXPECT_NE(parseError(c.config).find(c.message), std::string::npos)
        << c.config.dump() << " → " << parseError(c.config);
  }
}

TEST(KvTransferConfigParse, NumberBeyondADoubleIsInvalidJsonNotAnException) {
  StatusOr<KvTransferConfig> parsed =
      KvTransferConfig::parse(R"({"kv_connector": "offload", "x": 1e400})");
  ASSERT_FALSE(parsed.isOk());
  EXPECT_EQ(parsed.status().message(),
            "kv-transfer-config is not valid JSON: a number is out of range");
}

// A key given twice, at any depth, is refused (nlohmann kept the last one
// silently: two secrets, two capacities), and so is a field no
// kv-transfer-config has (a misspelt kv_connector_extra_config was
// ignored, and its secret with it); vLLM's other fields are taken.
TEST(KvTransferConfigParse, RepeatedKeysAndUnknownFieldsAreRefused) {
  for (
      const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
          {R"({"kv_connector": "ucx", "kv_connector_extra_config": {"secret": "a", "secret": "b"}})",
           "kv-transfer-config: kv_connector_extra_config.secret is given twice"},
          {R"({"kv_connector": "offload", "kv_connector": "offload"})",
           "kv-transfer-config: kv_connector is given twice"},
          {R"({"kv_connector": "multi", "kv_connector_extra_config": {"connectors": [)"
           R"({"kv_connector": "offload"}, {"kv_connector": "ucx", "kv_role": "kv_both",)"
           R"( "kv_role": "kv_both"}]}})",
           "kv-transfer-config: kv_connector_extra_config.connectors[1].kv_role is given twice"},
          {R"({"kv_connector": "offload", "kv_connectr_extra_config": {},)"
           R"( "kv_connector_extra_config": {"capacity_blocks": 8}})",
           "kv-transfer-config: kv_connectr_extra_config is not a field of a kv-transfer-config "
           "object (accepted: kv_connector, kv_role, kv_connector_extra_config; vLLM's other "
           "fields are taken and ignored)"},
          {R"({"kv_connector": "offload", "kv_load_failure_policy": "fail"})",
           "kv-transfer-config: kv_load_failure_policy is read from kv_connector_extra_config "
           "(put it there)"},
      }) {
    StatusOr<KvTransferConfig> parsed = KvTransferConfig::parse(text);
    ASSERT_FALSE(parsed.isOk()) << text;
    EXPECT_EQ(parsed.status().message(), message) << text;
  }
  // The same key in two objects is no repetition; vLLM's fields are taken.
  EXPECT_TRUE(KvTransferConfig::parse(
                  R"({"kv_connector": "multi", "kv_role": "kv_both", "engine_id": "e",)"
                  R"( "kv_buffer_device": "cpu", "kv_connector_extra_config": {"connectors": [)"
                  R"({"kv_connector": "offload", "kv_role": "kv_both"}, {"kv_connector": "ucx",)"
                  R"( "kv_role": "kv_both"}]}})")
                  .isOk());
}

// Each connector takes the kv_connector_extra_config keys it reads: a
// misspelt secret left a connector without one, a member's fault_injection
// was never applied, a storage connector's read_timeout_s bounded nothing.
TEST(KvTransferConfigParse, ExtraConfigKeysAreTheConnectorsOwn) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"kv_connector": "ucx", "kv_connector_extra_config": {"secrett": "s3cret"}})",
            "kv-transfer-config: kv_connector_extra_config.secrett is not read by the ucx "
            "connector (did you mean secret?); accepted keys: secret, kv_load_failure_policy, "
            "abort_timeout_s, fault_injection, read_timeout_s, peer_idle_timeout_s, "
            "advertise_host, remote_pull_threshold, kv_buffer, staging_blocks, hold_slots"},
           {R"({"kv_connector": "storage", "kv_connector_extra_config":)"
            R"( {"shared_storage_path": "/kv", "read_timeout_s": 5}})",
            "kv-transfer-config: kv_connector_extra_config.read_timeout_s is not read by the "
            "storage connector; accepted keys: secret, kv_load_failure_policy, abort_timeout_s, "
            "fault_injection, shared_storage_path, capacity_blocks, capacity_bytes"},
           {R"({"kv_connector": "offload", "kv_connector_extra_config": {"capacity_block": 8}})",
            "kv-transfer-config: kv_connector_extra_config.capacity_block is not read by the "
            "offload connector (did you mean capacity_blocks?); accepted keys: secret, "
            "kv_load_failure_policy, abort_timeout_s, fault_injection, capacity_blocks, "
            "capacity_bytes"},
           {R"({"kv_connector": "multi", "kv_connector_extra_config": {"connectors": [)"
            R"({"kv_connector": "offload", "kv_connector_extra_config": {"capacity_blocks": 8}}],)"
            R"( "hold_slots": 4}})",
            "kv-transfer-config: kv_connector_extra_config.hold_slots is not read by the multi "
            "connector; accepted keys: secret, kv_load_failure_policy, abort_timeout_s, "
            "fault_injection, connectors"},
           {R"({"kv_connector": "multi", "kv_connector_extra_config": {"connectors": [)"
            R"({"kv_connector": "ucx", "kv_connector_extra_config": {"hold_slot": 4}}]}})",
            "kv-transfer-config: kv_connector_extra_config.connectors[0].kv_connector_extra_config."
            "hold_slot is not read by the ucx connector (did you mean hold_slots?); accepted keys: "
            "secret, read_timeout_s, peer_idle_timeout_s, advertise_host, remote_pull_threshold, "
            "kv_buffer, staging_blocks, hold_slots"},
           {R"({"kv_connector": "multi", "kv_connector_extra_config": {"connectors": [)"
            R"({"kv_connector": "ucx", "kv_connector_extra_config":)"
            R"( {"fault_injection": {"drop_blocks": "all"}}}]}})",
            "kv-transfer-config: kv_connector_extra_config.connectors[0].kv_connector_extra_config."
            "fault_injection is not accepted for a member; set it in the multi connector's "
            "kv_connector_extra_config"},
       }) {
    StatusOr<KvTransferConfig> parsed = KvTransferConfig::parse(text);
    ASSERT_FALSE(parsed.isOk()) << text;
    EXPECT_EQ(parsed.status().message(), message) << text;
  }
  // Every key each connector reads is taken.
  for (const char* text : {
           R"({"kv_connector": "ucx", "kv_connector_extra_config": {"secret": "s",)"
           R"( "kv_load_failure_policy": "fail", "abort_timeout_s": 60, "read_timeout_s": 5,)"
           R"( "peer_idle_timeout_s": 30, "advertise_host": "10.0.0.1",)"
           R"( "remote_pull_threshold": 2, "kv_buffer": "staging", "staging_blocks": 16,)"
           R"( "hold_slots": 8, "fault_injection": {}}})",
           R"({"kv_connector": "storage", "kv_connector_extra_config":)"
           R"( {"shared_storage_path": "/kv", "capacity_bytes": 4096}})",
           R"({"kv_connector": "multi", "kv_connector_extra_config": {"secret": "s",)"
           R"( "connectors": [{"kv_connector": "offload", "kv_connector_extra_config":)"
           R"( {"capacity_blocks": 8, "secret": "s"}}]}})",
       }) {
    StatusOr<KvTransferConfig> parsed = KvTransferConfig::parse(text);
    EXPECT_TRUE(parsed.isOk()) << text << ": " << parsed.status().message();
  }
}

// The flag carries the KV secret: a syntax error gives its position, never
// the text around it (nlohmann's message ends with the token it last read,
// here the secret's unterminated string).
TEST(KvTransferConfigParse, BrokenJsonDoesNotShowTheSecret) {
  for (const char* text :
       {R"({"kv_connector": "ucx", "kv_connector_extra_config": {"secret": "s3cret-value)",
        R"({"kv_connector": "ucx", "kv_connector_extra_config": {"secret": "s3cret-value" x)",
        R"({"kv_connector": "ucx", "kv_connector_extra_config": {"secret": 1s3cret})",
        R"(["s3cret-value"])"}) {
    StatusOr<KvTransferConfig> parsed = KvTransferConfig::parse(text);
    ASSERT_FALSE(parsed.isOk()) << text;
    const std::string& message = parsed.status().message();
    EXPECT_TRUE(message.starts_with("kv-transfer-config ")) << message;
    EXPECT_EQ(message.find("s3cret"), std::string::npos) << message;
  }
}

TEST(KvTransferConfigParse, InvalidJsonIsReportedWithItsPosition) {
  StatusOr<KvTransferConfig> parsed =
      KvTransferConfig::parse(R"({"kv_connector": "offload",, "kv_role": "kv_both"})");
  ASSERT_FALSE(parsed.isOk());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = parsed.status().message();
  EXPECT_TRUE(
      message.starts_with("kv-transfer-config is not valid JSON (byte 28): parse error at "
                          "line 1, column 28: syntax error"))
      << message;
  EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
  // Valid JSON of the wrong kind keeps its own message.
  EXPECT_EQ(parseError(json::array({1, 2})), "kv-transfer-config must be a JSON object, got array");
}

TEST(KvTransferConfigParse, TimeoutsMustBeAtMostADay) {
  for (const char* key : {"abort_timeout_s", "read_timeout_s"}) {
    for (const json& bad : {json(1e308), json(86400.5), json(0), json(-1), json("5")}) {
      const json config = {{"kv_connector", "ucx"}, {"kv_connector_extra_config", {{key, bad}}}};
      EXPECT_EQ(parseError(config), std::string("kv-transfer-config: kv_connector_extra_config.") +
                                        key +
                                        " must be a number of seconds above 0 and at most 86400, "
                                        "got " +
                                        bad.dump());
    }
    const json longest = {{"kv_connector", "ucx"}, {"kv_connector_extra_config", {{key, 86400}}}};
    EXPECT_EQ(parseError(longest), "") << key;
  }
  // A multi member's read timeout is checked with its name.
  EXPECT_NE(parseError(multiOf({{{"kv_connector", "ucx"},
                                 {"kv_connector_extra_config", {{"read_timeout_s", 1e308}}}}}))
                .find("connectors[0].kv_connector_extra_config.read_timeout_s must be a number of "
                      "seconds above 0 and at most 86400"),
            std::string::npos);
}

TEST(KvTransferConfigParse, MemberConstructionErrorsNameTheMember) {
  auto cache = testing::makeCache();
  const KvTransferConfig config = testing::parseConfig(multiOf(
      {{{"kv_connector", "offload"}, {"kv_connector_extra_config", {{"capacity_blocks", 8}}}},
       {{"kv_connector", "offload"}}}));
  try {
    makeConnector(config, *cache, "test-model");
    ADD_FAILURE() << "a member without a capacity was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("kv_connector_extra_config.connectors[1]: offload "
                        "connector: kv_connector_extra_config needs exactly "
                        "one of capacity_blocks"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace tandem::kv
