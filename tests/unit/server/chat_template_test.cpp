// ChatTemplate: conformance with Hugging Face transformers over real models'
// templates (tests/data/chat_templates: every line of expected.jsonl must
// render byte for byte, or fail, with the template's own message when it
// raised), template choice among named templates, special tokens, start-up
// parse errors, continue_final_message and vLLM's content-format detection.
#include "common/protocol/chat_template.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/protocol/chat_request.h"
#include "common/tokenizer.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace tandem::server {
namespace {

using nlohmann::ordered_json;
using ::tandem::testing::TempDir;
using ::tandem::testing::writeFile;

const std::filesystem::path kDataDir =
    std::filesystem::path(TANDEM_SOURCE_DIR) / "tests/data/chat_templates";

std::string readText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The clock the conformance data was rendered with: 2025-03-07 09:05:03.
jinja::RenderOptions dataClock() {
  std::tm fields{};
  fields.tm_year = 2025 - 1900;
  fields.tm_mon = 2;
  fields.tm_mday = 7;
  fields.tm_hour = 9;
  fields.tm_min = 5;
  fields.tm_sec = 3;
  jinja::RenderOptions options;
  options.now = std::chrono::system_clock::from_time_t(timegm(&fields));
  return options;
}

std::shared_ptr<const ChatTemplate> makeTemplate(const std::string& text,
                                                 ordered_json special = ordered_json::object()) {
  auto created = ChatTemplate::create({{"default", text, "test.jinja"}}, std::move(special));
  EXPECT_TRUE(created.isOk()) << created.status().toString();
  return created.isOk() ? *created : nullptr;
}

std::string renderOk(const ChatTemplate& chat_template, const ChatTemplateInput& input) {
  auto rendered = chat_template.render(input);
  if (auto* error = std::get_if<jinja::TemplateError>(&rendered)) {
    ADD_FAILURE() << error->describe();
    return "";
  }
  return std::get<std::string>(rendered);
}

ordered_json userMessage(const std::string& text) {
  return ordered_json::array({{{"role", "user"}, {"content", text}}});
}

TEST(ChatTemplateConformance, EveryExpectedLine) {
  const ordered_json cases_file = ordered_json::parse(readText(kDataDir / "cases.json"));
  std::map<std::string, ordered_json> cases;
  for (const ordered_json& c : cases_file["cases"]) cases[c["id"].get<std::string>()] = c;
  std::map<std::string, std::shared_ptr<const ChatTemplate>> templates;
  std::map<std::string, std::string> parse_errors;
  const jinja::RenderOptions clock = dataClock();

  std::ifstream expected(kDataDir / "expected.jsonl", std::ios::binary);
  ASSERT_TRUE(expected.good());
  std::string line;
  int total = 0;
  int passed = 0;
  while (std::getline(expected, line)) {
    if (line.empty()) continue;
    ++total;
    const ordered_json entry = ordered_json::parse(line);
    const std::string name = entry["template"].get<std::string>();
    const std::string case_id = entry["case"].get<std::string>();
    SCOPED_TRACE(name + " / " + case_id);
    ASSERT_TRUE(cases.contains(case_id));
    const ordered_json& kwargs = entry["kwargs"];

    // The template's special tokens are in kwargs; one ChatTemplate per
    // template, as a server parses it once.
    if (!templates.contains(name) && !parse_errors.contains(name)) {
      ordered_json special = ordered_json::object();
      for (const char* key : {"bos_token", "eos_token"}) {
        if (kwargs.contains(key)) special[key] = kwargs[key];
      }
      auto created = ChatTemplate::create(
          {{"default", readText(kDataDir / "templates" / name), name}}, special);
      if (created.isOk()) {
        templates[name] = *created;
      } else {
        parse_errors[name] = created.status().message();
      }
    }
    if (parse_errors.contains(name)) {
      ADD_FAILURE() << "template does not parse: " << parse_errors[name];
      continue;
    }

    ChatTemplateInput input;
    input.messages = cases[case_id]["messages"];
    for (const auto& [key, value] : kwargs.items()) {
      if (key == "bos_token" || key == "eos_token") continue;
      if (key == "tools") {
        input.tools = value;
      } else if (key == "documents") {
        input.documents = value;
      } else if (key == "add_generation_prompt") {
        input.add_generation_prompt = value.get<bool>();
      } else if (key == "continue_final_message") {
        input.continue_final_message = value.get<bool>();
      } else {
        input.kwargs[key] = value;
      }
    }
    const auto rendered = templates[name]->render(input, clock);
    const auto* error = std::get_if<jinja::TemplateError>(&rendered);
    bool ok = false;
    if (entry.contains("output")) {
      const std::string want = entry["output"].get<std::string>();
      if (error != nullptr) {
        ADD_FAILURE() << "expected output, got error: " << error->describe();
      } else {
        ok = std::get<std::string>(rendered) == want;
        EXPECT_EQ(std::get<std::string>(rendered), want);
      }
    } else if (entry["raised_by_template"].get<bool>()) {
      ok = error != nullptr && error->raised_by_template &&
           error->message == entry["error"].get<std::string>();
      EXPECT_TRUE(ok) << "expected the template to raise: " << entry["error"] << ", got "
                      << (error ? error->describe() + (error->raised_by_template ? " (raised)" : "")
                                : "output " + std::get<std::string>(rendered));
    } else {
      ok = error != nullptr && !error->raised_by_template;
      EXPECT_TRUE(ok) << "expected a failure like: " << entry["error"] << ", got "
                      << (error ? error->describe() + " (raised by the template)"
                                : "output " + std::get<std::string>(rendered));
    }
    if (ok) ++passed;
  }
  EXPECT_EQ(total, 651);
  RecordProperty("conformance_passed", passed);
  std::printf("chat template conformance: %d of %d lines pass\n", passed, total);
  EXPECT_EQ(passed, total);
}

TEST(ChatTemplate, VariablesAsTransformersPassesThem) {
  // Special tokens are variables; absent ones are undefined; kwargs win.
  const auto chat_template = makeTemplate(
      "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ tools is none }}|"
      "{{ documents is none }}|{{ add_generation_prompt }}|{{ messages[0] | tojson }}|{{ x }}",
      {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  ASSERT_NE(chat_template, nullptr);
  ChatTemplateInput input;
  input.messages = ordered_json::parse(R"([{"role": "user", "zeta": 1, "content": "hi"}])");
  input.add_generation_prompt = true;
  input.kwargs = {{"x", 7}, {"eos_token", "E"}};
  EXPECT_EQ(renderOk(*chat_template, input),
            R"(<s>|E|False|True|True|True|{"role": "user", "zeta": 1, "content": "hi"}|7)");
}

TEST(ChatTemplate, NamedTemplatesToolUseWhenToolsGiven) {
  auto created = ChatTemplate::create(
      {{"default", "plain", "a"}, {"tool_use", "tools:{{ tools | length }}", "b"}},
      ordered_json::object());
  ASSERT_TRUE(created.isOk()) << created.status().toString();
  ChatTemplateInput input;
  input.messages = userMessage("hi");
  EXPECT_EQ(renderOk(**created, input), "plain");
  input.tools = ordered_json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(renderOk(**created, input), "tools:1");

  auto no_default = ChatTemplate::create({{"tool_use", "t", "b"}, {"rag", "r", "c"}}, {});
  ASSERT_TRUE(no_default.isOk());
  input.tools = nullptr;
  auto rendered = (*no_default)->render(input);
  ASSERT_TRUE(std::holds_alternative<jinja::TemplateError>(rendered));
  EXPECT_NE(std::get<jinja::TemplateError>(rendered).message.find(
                "include none named \"default\" for a request without tools"),
            std::string::npos);

  // A lone "tool_use" template serves requests with tools only, as in
  // transformers: it was used for every request.
  auto tool_use_only = ChatTemplate::create({{"tool_use", "tools:{{ tools | length }}", "b"}}, {});
  ASSERT_TRUE(tool_use_only.isOk());
  rendered = (*tool_use_only)->render(input);
  ASSERT_TRUE(std::holds_alternative<jinja::TemplateError>(rendered));
  EXPECT_EQ(std::get<jinja::TemplateError>(rendered).message,
            "this model's chat templates (tool_use) include none named \"default\" for a request "
            "without tools; give one with --chat-template FILE");
  input.tools = ordered_json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(renderOk(**tool_use_only, input), "tools:1");
}

TEST(ChatTemplate, ParseErrorNamesFileAndLine) {
  auto created = ChatTemplate::create(
      {{"default", "line one\n{% for m in messages %}\n{{ m.content }}\n", "/models/x.jinja"}}, {});
  ASSERT_FALSE(created.isOk());
  EXPECT_EQ(
      created.status().message().rfind("/models/x.jinja: chat template does not parse: line ", 0),
      0u)
      << created.status().message();
}

TEST(ChatTemplate, ModelWithoutTemplate) {
  auto created = ChatTemplate::create({}, {});
  ASSERT_TRUE(created.isOk());
  EXPECT_FALSE((*created)->hasTemplate());
  ChatTemplateInput input;
  input.messages = userMessage("hi");
  auto rendered = (*created)->render(input);
  ASSERT_TRUE(std::holds_alternative<jinja::TemplateError>(rendered));
  EXPECT_EQ(std::get<jinja::TemplateError>(rendered).message, ChatTemplate::noTemplateMessage());
  EXPECT_NE(ChatTemplate::noTemplateMessage().find("--chat-template FILE"), std::string::npos);
}

TEST(ChatTemplate, ContinueFinalMessage) {
  const auto chat_template = makeTemplate(
      "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}");
  ASSERT_NE(chat_template, nullptr);
  ChatTemplateInput input;
  input.messages = ordered_json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once upon "}])");
  input.continue_final_message = true;
  // The template trims the tag's space away: the text is cut and stripped.
  EXPECT_EQ(renderOk(*chat_template, input), "<user>Hi</><assistant>Once upon");
  // A list content continues its last text part.
  input.messages[1]["content"] =
      ordered_json::parse(R"([{"type": "text", "text": "A"}, {"type": "text", "text": "B"}])");
  const auto parts = makeTemplate(
      "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
      "{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}END");
  EXPECT_EQ(renderOk(*parts, input), "Hi[A][B");
  // Both options at once fail.
  input.add_generation_prompt = true;
  auto rendered = chat_template->render(input);
  ASSERT_TRUE(std::holds_alternative<jinja::TemplateError>(rendered));
  EXPECT_NE(std::get<jinja::TemplateError>(rendered).message.find("not compatible"),
            std::string::npos);
}

TEST(ChatTemplate, ContentFormatDetection) {
  EXPECT_EQ(makeTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}")->contentFormat(),
            ChatContentFormat::kString);
  EXPECT_EQ(makeTemplate("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}"
                         "{% endfor %}{% endfor %}")
                ->contentFormat(),
            ChatContentFormat::kOpenAi);
  EXPECT_EQ(makeTemplate("{% for m in messages %}{% for p in m.content %}{{ p.text }}"
                         "{% endfor %}{% endfor %}")
                ->contentFormat(),
            ChatContentFormat::kOpenAi);
}

TEST(ChatTemplate, LoadsModelTemplatesAndSpecialTokens) {
  TempDir dir("chat-template-load");
  tools::writeTestModel(tools::TestModelOptions{}, dir.path());
  // Named templates and special tokens given as AddedToken objects.
  ordered_json config = ordered_json::parse(readText(dir.path() / "tokenizer_config.json"));
  config["chat_template"] = ordered_json::array(
      {{{"name", "default"}, {"template", "D{{ bos_token }}{{ pad_token }}"}},
       {{"name", "tool_use"}, {"template", "T{{ additional_special_tokens | length }}"}}});
  config["bos_token"] = {{"content", "<|endoftext|>"}, {"lstrip", false}};
  config["pad_token"] = "<|im_end|>";
  config["additional_special_tokens"] = ordered_json::array({"<|im_start|>", "<|im_end|>"});
  writeFile(dir.path() / "tokenizer_config.json", config.dump());
  const auto tokenizer = Tokenizer::fromDirectory(dir.path());
  EXPECT_EQ(tokenizer->specialTokensMap().value("bos_token", ""), "<|endoftext|>");
  EXPECT_EQ(tokenizer->specialTokensMap().value("eos_token", ""), "<|im_end|>");
  ASSERT_EQ(tokenizer->chatTemplates().size(), 2u);

  auto loaded = ChatTemplate::load(*tokenizer);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  ChatTemplateInput input;
  input.messages = userMessage("hi");
  EXPECT_EQ(renderOk(**loaded, input), "D<|endoftext|><|im_end|>");
  input.tools = ordered_json::array();
  EXPECT_EQ(renderOk(**loaded, input), "T2");

  // --chat-template FILE replaces the model's templates, keeps its tokens.
  writeFile(dir.path() / "override.jinja", "O{{ eos_token }}\n");
  auto overridden = ChatTemplate::load(*tokenizer, dir.path() / "override.jinja");
  ASSERT_TRUE(overridden.isOk()) << overridden.status().toString();
  EXPECT_EQ(renderOk(**overridden, input), "O<|im_end|>");
  auto missing = ChatTemplate::load(*tokenizer, dir.path() / "absent.jinja");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("absent.jinja"), std::string::npos);
  // A directory, a FIFO or a device is refused at start: a directory was
  // an empty template, a FIFO waited for a writer, /dev/zero read on.
  std::filesystem::create_directory(dir.path() / "a-directory");
  ASSERT_EQ(::mkfifo((dir.path() / "a-fifo").c_str(), 0600), 0);
  for (const std::filesystem::path& odd :
       {dir.path() / "a-directory", dir.path() / "a-fifo", std::filesystem::path("/dev/zero")}) {
    auto refused = ChatTemplate::load(*tokenizer, odd);
    ASSERT_FALSE(refused.isOk()) << odd;
    EXPECT_EQ(refused.status().message(), "the chat template file " + odd.string() +
                                              ": not a regular file (accepted: a file, or a "
                                              "link to one)");
  }
}

// chat_template.jinja wins over tokenizer_config.json's default template, as
// in transformers; the config's other named templates stay.
TEST(ChatTemplate, TheJinjaFileWinsOverTheConfigsDefault) {
  TempDir dir("chat-template-file");
  tools::writeTestModel(tools::TestModelOptions{}, dir.path());
  ordered_json config = ordered_json::parse(readText(dir.path() / "tokenizer_config.json"));
  config["chat_template"] = ordered_json::array(
      {{{"name", "default"}, {"template", "CONFIG"}}, {{"name", "tool_use"}, {"template", "T"}}});
  writeFile(dir.path() / "tokenizer_config.json", config.dump());
  writeFile(dir.path() / "chat_template.jinja", "FILE{{ messages[0].content }}");
  const auto tokenizer = Tokenizer::fromDirectory(dir.path());
  ASSERT_EQ(tokenizer->chatTemplates().size(), 2u);
  auto loaded = ChatTemplate::load(*tokenizer);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  ChatTemplateInput input;
  input.messages = userMessage("hi");
  EXPECT_EQ(renderOk(**loaded, input), "FILEhi");
  input.tools = ordered_json::array();
  EXPECT_EQ(renderOk(**loaded, input), "T");
  // A config template as a plain string loses to the file the same way.
  config["chat_template"] = "CONFIG";
  writeFile(dir.path() / "tokenizer_config.json", config.dump());
  auto plain = ChatTemplate::load(*Tokenizer::fromDirectory(dir.path()));
  ASSERT_TRUE(plain.isOk());
  input.tools = nullptr;
  EXPECT_EQ(renderOk(**plain, input), "FILEhi");
}

// A processor's chat_template.json (Mistral Small 3.1 keeps its template
// there) wins over tokenizer_config.json's default the same way, and
// loses to chat_template.jinja; one whose template is not a string is
// refused naming the file.
TEST(ChatTemplate, AProcessorsJsonFileWinsOverTheConfigsDefault) {
  TempDir dir("chat-template-processor");
  tools::writeTestModel(tools::TestModelOptions{}, dir.path());
  ordered_json config = ordered_json::parse(readText(dir.path() / "tokenizer_config.json"));
  config["chat_template"] = "CONFIG";
  writeFile(dir.path() / "tokenizer_config.json", config.dump());
  writeFile(dir.path() / "chat_template.json",
            R"({"chat_template": "JSON{{ messages[0].content }}"})");
  ChatTemplateInput input;
  input.messages = userMessage("hi");
  auto loaded = ChatTemplate::load(*Tokenizer::fromDirectory(dir.path()));
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  EXPECT_EQ(renderOk(**loaded, input), "JSONhi");
  writeFile(dir.path() / "chat_template.jinja", "FILE{{ messages[0].content }}");
  loaded = ChatTemplate::load(*Tokenizer::fromDirectory(dir.path()));
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  EXPECT_EQ(renderOk(**loaded, input), "FILEhi");
  std::filesystem::remove(dir.path() / "chat_template.jinja");
  writeFile(dir.path() / "chat_template.json", R"({"chat_template": ["JSON"]})");
  try {
    Tokenizer::fromDirectory(dir.path());
    ADD_FAILURE() << "a chat_template.json without a string template was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir.path() / "chat_template.json").string() +
                                         ": field \"chat_template\" must be a string"),
              std::string::npos)
        << e.what();
  }
}

// special_tokens_map.json names special tokens (older checkpoints keep them
// only there); as in transformers, what it names wins over
// tokenizer_config.json, and templates see it.
TEST(ChatTemplate, SpecialTokensMapNamesTheSpecialTokens) {
  TempDir dir("chat-template-special-map");
  tools::writeTestModel(tools::TestModelOptions{}, dir.path());
  ordered_json config = ordered_json::parse(readText(dir.path() / "tokenizer_config.json"));
  config.erase("bos_token");
  config["eos_token"] = "<|im_end|>";
  config["chat_template"] = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}";
  writeFile(dir.path() / "tokenizer_config.json", config.dump());
  writeFile(dir.path() / "special_tokens_map.json",
            R"({"bos_token": "<|im_start|>",
                "eos_token": {"content": "<|endoftext|>", "lstrip": false}})");
  const auto tokenizer = Tokenizer::fromDirectory(dir.path());
  EXPECT_EQ(tokenizer->specialTokensMap().value("bos_token", ""), "<|im_start|>");
  EXPECT_EQ(tokenizer->specialTokensMap().value("eos_token", ""), "<|endoftext|>");
  EXPECT_EQ(tokenizer->eosTokenId(), tokenizer->tokenToId("<|endoftext|>"));
  auto loaded = ChatTemplate::load(*tokenizer);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  ChatTemplateInput input;
  input.messages = userMessage("hi");
  EXPECT_EQ(renderOk(**loaded, input), "<|im_start|>hi<|endoftext|>");
  // A token the map names that the vocabulary lacks is refused naming it.
  writeFile(dir.path() / "special_tokens_map.json", R"({"eos_token": "<|nope|>"})");
  try {
    Tokenizer::fromDirectory(dir.path());
    ADD_FAILURE() << "an unknown eos_token was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("special_tokens_map.json: eos_token '<|nope|>'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem::server

namespace tandem::server {
namespace {

// The agent loop's second turn as clients send it: the assistant's message
// sent back with content null beside its tool_calls (openai-python,
// LangChain), and the tool's result. Through the request path every real
// template renders it exactly as with content "" (vLLM's reading of null);
// null reaching the templates failed 8 of them ("argument of type
// 'NoneType' is not iterable"). Empty tool_calls are no calls.
TEST(ChatTemplate, AnAssistantsNullContentBesideToolCallsRendersAsEmpty) {
  auto turn = [](const ordered_json& content, const ordered_json& calls) {
    ordered_json assistant = {{"role", "assistant"}, {"content", content}};
    if (!calls.is_null()) assistant["tool_calls"] = calls;
    return ordered_json{
        {"messages",
         {{{"role", "user"}, {"content", "What time is it in Paris?"}},
          assistant,
          {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "12:00"}}}},
        {"tools",
         {{{"type", "function"},
           {"function",
            {{"name", "get_time"},
             {"description", "the time"},
             {"parameters",
              {{"type", "object"}, {"properties", {{"tz", {{"type", "string"}}}}}}}}}}}}};
  };
  const ordered_json calls = {
      {{"id", "call_1"},
       {"type", "function"},
       {"function", {{"name", "get_time"}, {"arguments", "{\"tz\": \"CET\"}"}}}}};
  int rendered = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kDataDir / "templates")) {
    SCOPED_TRACE(entry.path().filename().string());
    auto chat_template =
        makeTemplate(readText(entry.path()), {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    ASSERT_NE(chat_template, nullptr);
    const auto with_empty = renderChatRequest(turn("", calls), chat_template.get());
    const auto with_null = renderChatRequest(turn(nullptr, calls), chat_template.get());
    ASSERT_EQ(with_null.isOk(), with_empty.isOk())
        << (with_null.isOk() ? with_empty.error().message : with_null.error().message);
    if (!with_empty.isOk()) continue;  // the template refuses the turn itself
    EXPECT_EQ(with_null.value(), with_empty.value());
    ++rendered;
    // No calls at all: an empty list is none.
    const auto without = renderChatRequest(turn("", nullptr), chat_template.get());
    const auto empty_list =
        renderChatRequest(turn(nullptr, ordered_json::array()), chat_template.get());
    ASSERT_EQ(empty_list.isOk(), without.isOk());
    if (without.isOk()) {
      EXPECT_EQ(empty_list.value(), without.value());
    }
  }
  EXPECT_GE(rendered, 15);
}

// A tool's result given as text parts renders as the same text given as a
// string, whatever the template's content format (GLM-4.6's, "openai",
// printed the parts as Python dicts).
TEST(ChatTemplate, AToolsTextPartsRenderAsItsText) {
  auto turn = [](const ordered_json& result) {
    return ordered_json{{"messages",
                         {{{"role", "user"}, {"content", "Time?"}},
                          {{"role", "assistant"}, {"content", "Checking."}},
                          {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", result}}}}};
  };
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kDataDir / "templates")) {
    SCOPED_TRACE(entry.path().filename().string());
    auto chat_template =
        makeTemplate(readText(entry.path()), {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    ASSERT_NE(chat_template, nullptr);
    const auto as_text = renderChatRequest(turn("12:00"), chat_template.get());
    const auto as_parts = renderChatRequest(
        turn(ordered_json::array({{{"type", "text"}, {"text", "12:00"}}})), chat_template.get());
    ASSERT_EQ(as_parts.isOk(), as_text.isOk());
    if (!as_text.isOk()) continue;
    EXPECT_EQ(as_parts.value(), as_text.value());
    ++compared;
  }
  EXPECT_GE(compared, 15);
}

}  // namespace
}  // namespace tandem::server
