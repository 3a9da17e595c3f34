// Structured outputs through tandem-agent serve: every finished output is in
// the constraint's language (choices compared, regexes matched by PCRE2,
// JSON parsed and checked field by field), greedy and seeded; constrained
// requests batched with others, streamed or resumed elsewhere give the same
// tokens; max_tokens mid-structure ends with "length"; what cannot run is a
// 400 naming the field.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <gtest/gtest.h>
#include <httplib.h>
#include <pcre2.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/agent_server.h"
#include "tests/support/command.h"
#include "tests/support/node_script.h"

namespace {

using nlohmann::json;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary

// Whether PCRE2 matches all of `text` (anchored at both ends).
bool fullMatch(const std::string& pattern, const std::string& text) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                    PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &error, &offset, nullptr);
  if (code == nullptr) {
    ADD_FAILURE() << "PCRE2 refused " << pattern;
    return false;
  }
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.c_str()), text.size(), 0, 0,
                             data, nullptr);
  pcre2_match_data_free(data);
  pcre2_code_free(code);
  return rc >= 0;
}

json constrained(const std::vector<int>& prompt, int max_tokens, const json& fields,
                 std::optional<uint64_t> seed = std::nullopt) {
  json body = {{"model", "tiny"},
               {"prompt", prompt},
               {"max_tokens", max_tokens},
               {"temperature", seed ? 1.0 : 0.0},
               {"return_token_ids", true}};
  if (seed) body["seed"] = *seed;
  body.update(fields);
  return body;
}

std::string text(const json& response) { return response["choices"][0]["text"]; }
std::string finish(const json& response) { return response["choices"][0]["finish_reason"]; }

TEST(StructuredOutput, ChoicesAndRegexesUnderGreedyAndSeededSampling) {
  Agent agent;
  const std::vector<std::string> choices = {"red", "green", "blue", "ultraviolet"};
  const std::string pattern = "[a-c]{2,5}-[0-9]{3}(x|yz)?";
  std::set<std::string> chosen;
  for (uint32_t i = 0; i < 12; ++i) {
    std::optional<uint64_t> seed;
    if (i % 2 == 1) seed = 1000 + i;
    const json choice =
        agent.post("/v1/completions",
                   constrained(randomPrompt(6 + i, i), 16, {{"guided_choice", choices}}, seed));
    EXPECT_EQ(finish(choice), "stop");
    EXPECT_NE(std::find(choices.begin(), choices.end(), text(choice)), choices.end())
        << text(choice);
    chosen.insert(text(choice));
    const json regex = agent.post(
        "/v1/completions", constrained(randomPrompt(6 + i, 50 + i), 32,
                                       {{"structured_outputs", {{"regex", pattern}}}}, seed));
    EXPECT_TRUE(fullMatch(pattern, text(regex))) << text(regex);
    // The pattern can end after the digits or go on to x / yz: the
    // output ends by an end-of-sequence token or because nothing can follow.
    EXPECT_EQ(finish(regex), "stop") << text(regex);
  }
  // Seeded sampling is not stuck on one choice.
  EXPECT_GT(chosen.size(), 1u);
}

// A bounded schema (every value finite), as tool definitions are; its
// properties are not in alphabetical order, and the output keeps its order.
const nlohmann::ordered_json kPersonSchema = nlohmann::ordered_json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "member": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c\"d"]}, "maxItems": 3},
    "unit": {"enum": ["celsius", "fahrenheit", null]}
  },
  "required": ["name", "age", "member"]
})");

void expectPerson(const std::string& output) {
  SCOPED_TRACE(output);
  const json person = json::parse(output, nullptr, false);
  ASSERT_TRUE(person.is_object());
  ASSERT_TRUE(person.contains("name") && person["name"].is_string());
  const std::string name = person["name"];
  EXPECT_GE(name.size(), 1u);
  ASSERT_TRUE(person["age"].is_number_integer());
  EXPECT_GE(person["age"].get<int>(), 0);
  EXPECT_LE(person["age"].get<int>(), 120);
  EXPECT_TRUE(person["member"].is_boolean());
  for (const auto& [key, value] : person.items()) {
    EXPECT_TRUE(key == "name" || key == "age" || key == "member" || key == "tags" || key == "unit")
        << key;
  }
  if (person.contains("tags")) {
    ASSERT_TRUE(person["tags"].is_array());
    EXPECT_LE(person["tags"].size(), 3u);
  }
  // In the schema's property order.
  EXPECT_LT(output.find("\"name\""), output.find("\"age\""));
}

// POSTs a body whose key order matters (nlohmann::json sorts keys).
json postOrdered(const Agent& agent, const json& body, const nlohmann::ordered_json& extra) {
  nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body.dump());
  for (const auto& [key, value] : extra.items()) ordered[key] = value;
  auto res = agent.client()->Post("/v1/completions", ordered.dump(), "application/json");
  if (!res) throw std::runtime_error("no response");
  return json::parse(res->body);
}

TEST(StructuredOutput, JsonSchemaOutputsAreValidAndExactHoweverTheyRan) {
  Agent agent;
  const nlohmann::ordered_json format = {
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema", {{"name", "person"}, {"schema", kPersonSchema}}}}}};
  std::vector<json> bodies;
  for (uint32_t i = 0; i < 6; ++i) {
    bodies.push_back(constrained(randomPrompt(8 + 3 * i, 200 + i), 120, json::object(),
                                 i % 2 == 0 ? std::nullopt : std::optional<uint64_t>(77 + i)));
  }
  std::vector<json> solo;
  for (const json& body : bodies) {
    solo.push_back(postOrdered(agent, body, format));
    EXPECT_EQ(finish(solo.back()), "stop") << text(solo.back());
    expectPerson(text(solo.back()));
  }
  // Batched together and with unconstrained requests: the same tokens.
  std::vector<std::vector<int>> together(bodies.size() + 4);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < together.size(); ++i) {
    clients.emplace_back([&, i] {
      together[i] =
          i < bodies.size()
              ? tokenIds(postOrdered(agent, bodies[i], format))
              : tokenIds(agent.post("/v1/completions", greedy(randomPrompt(10, 300 + i), 40)));
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(together[i], tokenIds(solo[i])) << "request " << i << " changed when batched";
  }
  // Streamed: the same tokens and text (the schema's own order of keys is
  // not needed to compare with itself: json_schema given as sorted here).
  json sorted_body = bodies[1];
  sorted_body["response_format"] = json::parse(format["response_format"].dump());
  const json sorted_solo = agent.post("/v1/completions", sorted_body);
  std::vector<json> streamed_bodies = {sorted_body};
  streamed_bodies[0]["stream"] = true;
  std::vector<StreamedCompletion> streams;
  for (auto& t : streamConcurrently(agent.port(), streamed_bodies, streams)) t.join();
  EXPECT_EQ(streams[0].ids, tokenIds(sorted_solo));
  EXPECT_EQ(streams[0].text, text(sorted_solo));
  // Resumed after its first tokens (as a migrated stream is): the rest equal.
  const std::vector<int> all = tokenIds(sorted_solo);
  ASSERT_GT(all.size(), 4u);
  std::vector<json> resumed = streamed_bodies;
  resumed[0]["resume_token_ids"] = std::vector<int>(all.begin(), all.begin() + 4);
  for (auto& t : streamConcurrently(agent.port(), resumed, streams)) t.join();
  EXPECT_EQ(streams[0].ids, std::vector<int>(all.begin() + 4, all.end()));
  EXPECT_TRUE(streams[0].errors.empty()) << streams[0].errors;
}

TEST(StructuredOutput, JsonObjectAndGrammar) {
  Agent agent;
  EXPECT_EQ(agent.metric("tandem_structured_output_grammars"), 0);
  for (uint32_t i = 0; i < 4; ++i) {
    const json object =
        agent.post("/v1/completions", constrained(randomPrompt(7, 400 + i), 200,
                                                  {{"response_format", {{"type", "json_object"}}}},
                                                  std::optional<uint64_t>(i)));
    const std::string out = text(object);
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out[0], '{') << out;
    if (finish(object) == "stop") {
      EXPECT_TRUE(json::parse(out, nullptr, false).is_object()) << out;
    } else {
      EXPECT_EQ(finish(object), "length");
    }
  }
  const std::string grammar = R"g(root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]?)g";
  for (uint32_t i = 0; i < 6; ++i) {
    const json sum = agent.post(
        "/v1/completions", constrained(randomPrompt(9, 500 + i), 60, {{"guided_grammar", grammar}},
                                       std::optional<uint64_t>(10 + i)));
    const std::string out = text(sum);
    if (finish(sum) != "stop") continue;
    EXPECT_TRUE(fullMatch(R"((?<e>(?<t>[1-9][0-9]?|\((?&e)\))([+-](?&t)){0,3}))", out)) << out;
  }
  // Two grammars compiled (json_object's and this one), each once; their
  // memory counted.
  EXPECT_EQ(agent.metric("tandem_structured_output_grammars"), 2);
  EXPECT_GT(agent.metric("tandem_structured_output_grammar_bytes"), 0);
}

// A small SQL subset that knows its tables' columns: every finished output
// runs on SQLite (Python's sqlite3, an independent SQL parser and planner)
// against those tables, so each is a valid statement, not just text the
// grammar accepts.
TEST(StructuredOutput, SqlSubsetOutputsRunOnSqlite) {
  Agent agent;
  const std::string grammar = R"g(root ::= select ";"
select ::= "SELECT " ucols " FROM users" uwhere? uorder? limit? | "SELECT " ocols " FROM orders" owhere? oorder? limit?
ucols ::= "*" | ucol (", " ucol){0,2}
ocols ::= "*" | ocol (", " ocol){0,3}
ucol ::= "id" | "name" | "age"
ocol ::= "id" | "user_id" | "total" | "status"
uwhere ::= " WHERE " ucol " " op " " value (" AND " ucol " " op " " value){0,2}
owhere ::= " WHERE " ocol " " op " " value (" AND " ocol " " op " " value){0,2}
uorder ::= " ORDER BY " ucol (" ASC" | " DESC")?
oorder ::= " ORDER BY " ocol (" ASC" | " DESC")?
limit ::= " LIMIT " [1-9] [0-9]?
op ::= "=" | "<" | ">" | "<=" | ">=" | "!="
value ::= "-"? [1-9] [0-9]{0,3} | "0" | "'" [a-z]{1,8} "'")g";
  std::vector<std::string> statements;
  for (uint32_t i = 0; i < 8; ++i) {
    std::optional<uint64_t> seed;
    if (i > 0) seed = 700 + i;
    const json answer =
        agent.post("/v1/completions",
                   constrained(randomPrompt(9, 600 + i), 80, {{"guided_grammar", grammar}}, seed));
    if (finish(answer) == "stop") statements.push_back(text(answer));
  }
  ASSERT_FALSE(statements.empty()) << "no statement finished within max_tokens";
  const std::string python = findOnPath("python3");
  ASSERT_FALSE(python.empty()) << "python3 is not on PATH; `make deps` installs it";
  TempDir dir("tandem-sql-test");
  {
    std::ofstream file(dir.path() / "statements.txt");
    for (const std::string& statement : statements) file << statement << "\n";
  }
  const std::string script =
      "import sqlite3, sys\n"
      "db = sqlite3.connect(':memory:')\n"
      "db.execute('CREATE TABLE users(id INTEGER, name TEXT, age INTEGER)')\n"
      "db.execute('CREATE TABLE orders(id INTEGER, user_id INTEGER, total REAL, status TEXT)')\n"
      "for line in open(sys.argv[1]):\n"
      "    try:\n"
      "        db.execute(line.rstrip('\\n')).fetchall()\n"
      "        print('ok')\n"
      "    except Exception as e:\n"
      "        print('error:', e)\n";
  const CommandResult result =
      runToEnd({python, "-c", script, (dir.path() / "statements.txt").string()},
               dir.path() / "stderr.txt", std::chrono::seconds(60));
  ASSERT_EQ(result.exit_status, 0) << result.err;
  std::istringstream lines(result.out);
  size_t index = 0;
  for (std::string line; std::getline(lines, line); ++index) {
    ASSERT_LT(index, statements.size());
    EXPECT_EQ(line, "ok") << statements[index];
  }
  EXPECT_EQ(index, statements.size()) << result.out;
}

// tool_choice "required" on an agent with the hermes parser: the output is
// tool calls of the offered functions with arguments valid for their
// schemas; streamed, the same calls.
TEST(StructuredOutput, ForcedToolCallsComeBackAsToolCalls) {
  Agent agent({"--tool-call-parser", "hermes"});
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"enum": ["Oslo", "Rome", "Lima"]},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "stop_timer", "parameters": {"type": "object",
      "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}},
      "required": ["id"]}}}])");
  for (uint32_t i = 0; i < 4; ++i) {
    json body = {
        {"model", "tiny"},
        {"messages", {{{"role", "user"}, {"content", "weather " + std::to_string(i)}}}},
        {"tools", tools},
        {"tool_choice", i == 3 ? json{{"type", "function"}, {"function", {{"name", "stop_timer"}}}}
                               : json("required")},
        {"max_tokens", 200},
        {"temperature", i == 0 ? 0.0 : 1.0},
        {"seed", 40 + i}};
    // After a complete call the grammar allows another or the end; a random
    // model may chain calls until max_tokens, so one call is asked for but
    // in case 2.
    if (i != 2) body["parallel_tool_calls"] = false;
    const json response = agent.post("/v1/chat/completions", body);
    SCOPED_TRACE(response.dump());
    const json& choice = response["choices"][0];
    if (i == 2 && choice["finish_reason"] == "length") continue;
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    const json& calls = choice["message"]["tool_calls"];
    ASSERT_TRUE(calls.is_array());
    ASSERT_GE(calls.size(), 1u);
    if (i != 2) {
      EXPECT_EQ(calls.size(), 1u);
    }
    for (const json& call : calls) {
      const std::string name = call["function"]["name"];
      const json arguments = json::parse(call["function"]["arguments"].get<std::string>());
      if (i == 3) {
        EXPECT_EQ(name, "stop_timer");
      }
      if (name == "get_weather") {
        EXPECT_TRUE(arguments["city"] == "Oslo" || arguments["city"] == "Rome" ||
                    arguments["city"] == "Lima");
        EXPECT_GE(arguments["days"].get<int>(), 1);
        EXPECT_LE(arguments["days"].get<int>(), 7);
      } else {
        ASSERT_EQ(name, "stop_timer");
        EXPECT_GE(arguments["id"].get<int>(), 0);
        EXPECT_LE(arguments["id"].get<int>(), 99);
      }
    }
    // Streamed: the same calls, in deltas.
    body["stream"] = true;
    httplib::Client client("127.0.0.1", agent.port());
    client.set_read_timeout(60, 0);
    auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    std::map<int, std::pair<std::string, std::string>> streamed;  // index -> name, arguments
    std::istringstream events(res->body);
    for (std::string line; std::getline(events, line);) {
      if (line.rfind("data: {", 0) != 0) continue;
      const json chunk = json::parse(line.substr(6));
      if (chunk["choices"].empty()) continue;
      for (const json& delta : chunk["choices"][0]["delta"].value("tool_calls", json::array())) {
        auto& [name, arguments] = streamed[delta["index"].get<int>()];
        name += delta["function"].value("name", "");
        arguments += delta["function"].value("arguments", "");
      }
    }
    ASSERT_EQ(streamed.size(), calls.size());
    for (size_t k = 0; k < calls.size(); ++k) {
      EXPECT_EQ(streamed[static_cast<int>(k)].first, calls[k]["function"]["name"]);
      EXPECT_EQ(streamed[static_cast<int>(k)].second, calls[k]["function"]["arguments"]);
    }
  }
}

// tool_choice "auto" with a strict function: the model may answer in text,
// but a call, once begun, follows the schema. A random model rarely begins
// one, so the second half resumes a stream whose tokens so far end with
// the <tool_call> tag: the continuation is then a valid call, which the
// parser reads back.
TEST(StructuredOutput, AutoToolChoiceEnforcesStrictArgumentsOnceACallBegins) {
  Agent agent({"--tool-call-parser", "hermes"});
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {
      "type": "object", "additionalProperties": false, "required": ["city", "days"],
      "properties": {"city": {"enum": ["Oslo", "Rome", "Lima"]},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}])");
  auto checkCall = [](const json& call) {
    EXPECT_EQ(call["function"]["name"], "get_weather");
    const json arguments = json::parse(call["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(arguments["city"] == "Oslo" || arguments["city"] == "Rome" ||
                arguments["city"] == "Lima")
        << arguments.dump();
    EXPECT_GE(arguments["days"].get<int>(), 1);
    EXPECT_LE(arguments["days"].get<int>(), 7);
    EXPECT_EQ(arguments.size(), 2u);
  };
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
               {"tools", tools},
               {"tool_choice", "auto"},
               {"parallel_tool_calls", false},
               {"max_tokens", 40}};
  for (uint32_t i = 0; i < 4; ++i) {
    body["temperature"] = i == 0 ? 0.0 : 1.0;
    body["seed"] = 60 + i;
    const json response = agent.post("/v1/chat/completions", body);
    SCOPED_TRACE(response.dump());
    const json& message = response["choices"][0]["message"];
    for (const json& call : message.value("tool_calls", json::array())) checkCall(call);
  }

  const json tokens = agent.post(
      "/tokenize", {{"prompt", "Checking. <tool_call>\n"}, {"add_special_tokens", false}});
  body["resume_token_ids"] = tokens["tokens"];
  body["stream"] = true;
  body["temperature"] = 0.0;
  body["max_tokens"] = 160;
  httplib::Client client("127.0.0.1", agent.port());
  client.set_read_timeout(60, 0);
  auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json call = {{"function", {{"name", ""}, {"arguments", ""}}}};
  std::string finish;
  std::istringstream events(res->body);
  for (std::string line; std::getline(events, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6));
    if (chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
    for (const json& delta : choice["delta"].value("tool_calls", json::array())) {
      EXPECT_EQ(delta["index"], 0);
      call["function"]["name"] =
          call["function"]["name"].get<std::string>() + delta["function"].value("name", "");
      call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() +
                                      delta["function"].value("arguments", "");
    }
  }
  EXPECT_EQ(finish, "tool_calls") << res->body;
  checkCall(call);
}

TEST(StructuredOutput, MaxTokensMidStructureEndsWithLength) {
  Agent agent;
  const json body = constrained(
      randomPrompt(8, 600), 3,
      {{"guided_json", {{"type", "array"}, {"items", {{"type", "string"}}}, {"minItems", 5}}}});
  const json response = agent.post("/v1/completions", body);
  EXPECT_EQ(finish(response), "length");
  EXPECT_EQ(response["usage"]["completion_tokens"], 3);
  EXPECT_EQ(text(response)[0], '[');
}

// A stop token is allowed only where the output is complete, even when
// the grammar allows its text: '"' as a stop token, biased to be picked
// whenever it may be, cannot cut a JSON object after "{" (it did: text "{",
// finish_reason stop); the object ends first.
TEST(StructuredOutput, AStopTokenEndsOnlyACompleteStructure) {
  Agent agent;
  const json tokenized = agent.post("/tokenize", {{"model", "tiny"}, {"prompt", "\""}});
  ASSERT_EQ(tokenized["tokens"].size(), 1u) << tokenized.dump();
  const int quote = tokenized["tokens"][0];
  for (uint32_t i = 0; i < 4; ++i) {
    const json response =
        agent.post("/v1/completions", constrained(randomPrompt(7, 700 + i), 40,
                                                  {{"response_format", {{"type", "json_object"}}},
                                                   {"stop_token_ids", {quote}},
                                                   {"logit_bias", {{std::to_string(quote), 100}}}},
                                                  std::optional<uint64_t>(i)));
    const std::string out = text(response);
    if (finish(response) == "stop") {
      EXPECT_TRUE(json::parse(out, nullptr, false).is_object()) << out;
    } else {
      EXPECT_EQ(finish(response), "length") << response.dump();
    }
  }
}

TEST(StructuredOutput, RefusalsNameTheField) {
  Agent agent;
  int status = 0;
  json error = agent.post("/v1/completions",
                          constrained(randomPrompt(5, 1), 8,
                                      {{"guided_json", {{"type", "string"}, {"format", "ipv9"}}}}),
                          &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "guided_json");
  EXPECT_NE(error["error"]["message"].get<std::string>().find("format"), std::string::npos);
  // Resumed tokens the constraint does not allow.
  json resumed = constrained(randomPrompt(5, 2), 8, {{"guided_choice", {"yes", "no"}}});
  resumed["stream"] = true;
  resumed["resume_token_ids"] = {300};
  error = agent.post("/v1/completions", resumed, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(error["error"]["message"].get<std::string>().find(
                "resume_token_ids[0] is not allowed by the request's structured output"),
            std::string::npos)
      << error.dump();
}

}  // namespace

namespace {

// n > 1: n choices for one prompt. With a seed, choice i is the request
// with seed + i alone (so reproducible and distinct); the prompt is
// computed once (the other choices read its full blocks from the prefix
// cache); streamed, each chunk carries its choice's index and the texts
// equal the whole answer's.
TEST(ParallelChoices, SeededChoicesAreTheSingleRequestsAndShareThePrompt) {
  Agent agent;
  json body = {{"model", "tiny"},    {"prompt", randomPrompt(70, 900)},
               {"max_tokens", 12},   {"temperature", 1.0},
               {"seed", 500},        {"n", 4},
               {"ignore_eos", true}, {"return_token_ids", true}};
  const double hits_before = agent.metric("tandem_prefix_cache_hits_total");
  const json answer = agent.post("/v1/completions", body);
  ASSERT_EQ(answer["choices"].size(), 4u) << answer.dump();
  // 70 tokens: 4 full blocks of 16, read from the cache by choices 1-3.
  EXPECT_EQ(agent.metric("tandem_prefix_cache_hits_total") - hits_before, 3 * 64);
  EXPECT_EQ(answer["usage"]["prompt_tokens"], 70);
  EXPECT_EQ(answer["usage"]["completion_tokens"], 4 * 12);
  std::set<std::vector<int>> distinct;
  for (size_t i = 0; i < 4; ++i) {
    const json& choice = answer["choices"][i];
    EXPECT_EQ(choice["index"], i);
    json single = body;
    single["n"] = 1;
    single["seed"] = 500 + i;
    EXPECT_EQ(choice["token_ids"], agent.post("/v1/completions", single)["choices"][0]["token_ids"])
        << "choice " << i;
    distinct.insert(choice["token_ids"].get<std::vector<int>>());
  }
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_EQ(agent.post("/v1/completions", body)["choices"], answer["choices"]);

  body["stream"] = true;
  httplib::Client client("127.0.0.1", agent.port());
  client.set_read_timeout(60, 0);
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  std::map<int, std::string> texts;
  std::map<int, std::string> finish;
  int done = 0;
  std::istringstream events(res->body);
  for (std::string line; std::getline(events, line);) {
    if (line == "data: [DONE]") ++done;
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6));
    for (const json& choice : chunk["choices"]) {
      texts[choice["index"].get<int>()] += choice["text"].get<std::string>();
      if (choice["finish_reason"].is_string())
        finish[choice["index"].get<int>()] = choice["finish_reason"];
    }
  }
  EXPECT_EQ(done, 1);
  ASSERT_EQ(texts.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(texts[i], answer["choices"][i]["text"]) << i;
    EXPECT_EQ(finish[i], "length");
  }
}

}  // namespace
