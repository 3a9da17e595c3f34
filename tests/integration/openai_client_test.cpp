// The official OpenAI Node client (npm `openai` 4.x, with zod) against the
// router in front of one prefill and one decode agent, then against one
// colocated agent: `beta.chat.completions.parse` with `zodResponseFormat`
// gives parsed objects zod accepts, `tool_choice: "required"` (with JSON
// Schema tools through `create`, with `zodFunction` tools through `parse`)
// gives calls of the offered functions whose arguments satisfy their
// schemas, and the router's answers equal the colocated agent's byte for
// byte. tests/support/openai_client_check.cjs makes the requests; `make
// deps` installs node and the packages (scripts/fetch-node-packages.sh).
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/support/node_script.h"
#include "tests/support/router_cluster.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary
using tandem::prometheusSample;

// As many as openai_client_check.cjs makes.
constexpr size_t kParseCases = 4;
constexpr size_t kToolCases = 3;

const std::set<std::string> kOfferedFunctions = {"get_weather", "set_timer"};

class OpenAiClientTest : public RouterCluster {
 protected:
  // The check script's stdout against the server at `port`.
  std::string runClient(const NodeScripts& node, int port, const std::string& label) {
    const CommandResult run =
        node.run("openai_client_check.cjs", {"http://127.0.0.1:" + std::to_string(port)},
                 work_.path() / (label + ".stderr"), std::chrono::seconds(300));
    EXPECT_EQ(run.exit_status, 0) << label << ": " << run.err;
    return run.out;
  }

  TempDir work_{"tandem-openai-client"};
};

// Every parse call gave an object zod accepts, finished with "stop".
void expectParsedObjects(const json& records, const std::string& label) {
  ASSERT_TRUE(records.is_array()) << label;
  ASSERT_EQ(records.size(), kParseCases) << label;
  for (const json& record : records) {
    SCOPED_TRACE(label + " parse: " + record.dump());
    EXPECT_TRUE(record.at("error").is_null());
    EXPECT_EQ(record.at("finish_reason"), "stop");
    EXPECT_TRUE(record.at("refusal").is_null());
    EXPECT_TRUE(record.at("parsed").is_object());
    EXPECT_EQ(record.at("valid"), true);
    // What the client parsed is the content, nothing else.
    EXPECT_TRUE(record.at("content").is_string());
    if (record.at("content").is_string()) {
      EXPECT_EQ(json::parse(record.at("content").get<std::string>(), nullptr, false),
                record.at("parsed"));
    }
  }
}

// Every forced tool call request gave at least one call of an offered
// function, its arguments a JSON object zod accepts.
void expectToolCalls(const json& records, const std::string& label, bool parsed_arguments) {
  ASSERT_TRUE(records.is_array()) << label;
  ASSERT_EQ(records.size(), kToolCases) << label;
  for (const json& record : records) {
    SCOPED_TRACE(label + " tools: " + record.dump());
    EXPECT_TRUE(record.at("error").is_null());
    EXPECT_EQ(record.at("finish_reason"), "tool_calls");
    const json& calls = record.at("tool_calls");
    // parallel_tool_calls: false
    EXPECT_EQ(calls.size(), 1u);
    for (const json& call : calls) {
      EXPECT_TRUE(kOfferedFunctions.contains(call.at("name").get<std::string>()));
      const json arguments = json::parse(call.at("arguments").get<std::string>(), nullptr, false);
      EXPECT_TRUE(arguments.is_object());
      EXPECT_EQ(call.at("valid"), true);
      if (parsed_arguments) {
        EXPECT_EQ(call.at("parsed_arguments"), arguments);
      }
    }
  }
}

// A batch of 3 prompts with n = 2 read by the real client: 6 choices
// indexed 0 to 5 in order, the streamed texts the whole answer's.
void expectBatch(const json& record, const std::string& label) {
  SCOPED_TRACE(label + " batch: " + record.dump());
  EXPECT_TRUE(record.at("error").is_null());
  const json& whole = record.at("whole");
  ASSERT_TRUE(whole.is_array());
  ASSERT_EQ(whole.size(), 6u);
  const json& streamed = record.at("streamed");
  ASSERT_TRUE(streamed.is_array());
  ASSERT_EQ(streamed.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(whole[i].at("index"), i);
    EXPECT_TRUE(whole[i].at("finish_reason") == "length" || whole[i].at("finish_reason") == "stop");
    EXPECT_EQ(streamed[i].at("index"), i);
    EXPECT_EQ(streamed[i].at("text"), whole[i].at("text"));
  }
}

void expectValidAnswers(const std::string& out, const std::string& label) {
  const json result = json::parse(out, nullptr, false);
  ASSERT_TRUE(result.is_object()) << label << ": the client check printed no JSON: " << out;
  expectBatch(result.at("batch"), label);
  expectParsedObjects(result.at("parse"), label);
  expectToolCalls(result.at("tools"), label + " create", false);
  expectToolCalls(result.at("parse_tools"), label + " zodFunction", true);
}

TEST_F(OpenAiClientTest, ParseAndForcedToolCallsThroughTheRouterEqualColocated) {
  const NodeScripts node(TANDEM_NODE_MODULES, {"openai", "zod"});
  ASSERT_EQ(node.missing(), "");
  RouterClusterOptions options;
  options.prefills = 1;
  options.decodes = 1;
  options.agent_args = [](bool, int) {
    return std::vector<std::string>{"--tool-call-parser", "hermes"};
  };
  startCluster(options);

  const std::string routed = runClient(node, router_->port(), "router");
  expectValidAnswers(routed, "router");
  // The prompts are past the disaggregation threshold: prefilled on
  // prefill-0, decoded on decode-0.
  EXPECT_TRUE(eventually([&] {
    return prometheusSample(routerMetrics(), "tandem_router_requests_total",
                            "decision=\"disaggregated\"")
               .value_or(0) > 0;
  })) << routerMetrics();

  Agent colocated({"--tool-call-parser", "hermes"});
  const std::string alone = runClient(node, colocated.port(), "colocated");
  expectValidAnswers(alone, "colocated");
  // Section by section first, for a readable difference; then the whole
  // output, which holds no ids or timestamps: the same bytes.
  const json routed_result = json::parse(routed, nullptr, false);
  const json alone_result = json::parse(alone, nullptr, false);
  for (const char* section : {"parse", "tools", "parse_tools", "batch"}) {
    if (!routed_result.is_object() || !alone_result.is_object()) break;
    EXPECT_EQ(routed_result.value(section, json()).dump(2),
              alone_result.value(section, json()).dump(2))
        << section << ": the router's answers differ from the colocated agent's";
  }
  EXPECT_EQ(routed, alone);
}

}  // namespace
