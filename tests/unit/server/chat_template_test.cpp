// ChatML rendering: output equal to what Hugging Face's Jinja rendering gives
// (jinja2 with trim_blocks and lstrip_blocks; the expected strings below were
// produced that way), the spellings of ChatML that are accepted, and the
// templates that are refused.
#include "common/protocol/chat_template.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace tandem::server {
namespace {

using ::tandem::testing::TempDir;

// The chat template of a generated test model, as its tokenizer reads it
// from tokenizer_config.json.
const std::string& testModelTemplate() {
  static const std::string kTemplate = [] {
    TempDir dir("chat-template-test");
    tools::writeTestModel(tools::TestModelOptions{}, dir.path());
    return Tokenizer::fromDirectory(dir.path())->chatTemplate();
  }();
  return kTemplate;
}

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."}, {"user", "Hi there!\nHow are you?"},
    {"assistant", "Fine."},       {"tool", "{\"x\": 1}"},
    {"user", "Ünïcödé ✓"},
};

// jinja2 3.1.6 rendering of the test model's template over kConversation.
const std::string kExpectedWithoutPrompt =
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi there!\nHow are you?<|im_end|>\n"
    "<|im_start|>assistant\nFine.<|im_end|>\n"
    "<|im_start|>tool\n{\"x\": 1}<|im_end|>\n"
    "<|im_start|>user\nÜnïcödé ✓<|im_end|>\n";
const std::string kExpectedWithPrompt = kExpectedWithoutPrompt + "<|im_start|>assistant\n";

std::string render(const std::string& chat_template, const std::vector<ChatMessage>& messages,
                   ChatTemplateOptions options = {}) {
  auto result = renderChatTemplate(chat_template, messages, options);
  EXPECT_TRUE(result.isOk()) << result.status().toString();
  return result.isOk() ? result.value() : std::string();
}

TEST(ChatTemplate, TestModelTemplateIsChatMl) {
  ASSERT_FALSE(testModelTemplate().empty());
  EXPECT_NE(testModelTemplate().find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(isChatMlTemplate(testModelTemplate()));
}

TEST(ChatTemplate, RendersLikeJinjaWithGenerationPrompt) {
  EXPECT_EQ(render(testModelTemplate(), kConversation), kExpectedWithPrompt);
}

TEST(ChatTemplate, RendersLikeJinjaWithoutGenerationPrompt) {
  ChatTemplateOptions options;
  options.add_generation_prompt = false;
  EXPECT_EQ(render(testModelTemplate(), kConversation, options), kExpectedWithoutPrompt);
}

TEST(ChatTemplate, SingleUserMessage) {
  EXPECT_EQ(render(testModelTemplate(), {{"user", "Hello"}}),
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, EmptyContentRendersEmpty) {
  EXPECT_EQ(render(testModelTemplate(), {{"user", ""}}),
            "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ContinueFinalMessageLeavesItOpen) {
  // vLLM renders without the generation prompt and cuts after the final
  // message's content.
  ChatTemplateOptions options;
  options.add_generation_prompt = false;
  options.continue_final_message = true;
  EXPECT_EQ(render(testModelTemplate(), {{"user", "Count to three."}, {"assistant", "One, two,"}},
                   options),
            "<|im_start|>user\nCount to three.<|im_end|>\n<|im_start|>assistant\nOne, two,");
}

TEST(ChatTemplate, ContinueFinalMessageConflictsWithGenerationPrompt) {
  ChatTemplateOptions options;
  options.continue_final_message = true;  // add_generation_prompt stays true
  auto result = renderChatTemplate(testModelTemplate(), kConversation, options);
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(),
            "add_generation_prompt and continue_final_message cannot both be true; set "
            "add_generation_prompt to false to continue the final message");
}

TEST(ChatTemplate, EmptyMessagesRefused) {
  auto result = renderChatTemplate(testModelTemplate(), {}, {});
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "messages must not be empty");
}

// Other spellings of the same template; jinja2 renders each exactly like the
// test model's template (checked with kConversation, both settings of
// add_generation_prompt).
const char* const kEquivalentSpellings[] = {
    // Pretty-printed with whitespace control and attribute access.
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n",
    // Double quotes and folded literals.
    "{% for message in messages %}{{\"<|im_start|>\" + message[\"role\"] + \"\\n\" + "
    "message[\"content\"] + \"<|im_end|>\\n\"}}{% endfor %}{% if add_generation_prompt "
    "%}{{\"<|im_start|>assistant\\n\"}}{% endif %}",
    // Block tags on their own lines (trim_blocks, lstrip_blocks) and a comment.
    "{% for message in messages %}\n"
    "    {#- a comment #}\n"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}\n"
    "{%- endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{% endif %}\n",
};

TEST(ChatTemplate, EquivalentSpellingsAccepted) {
  for (const char* spelling : kEquivalentSpellings) {
    SCOPED_TRACE(spelling);
    EXPECT_TRUE(isChatMlTemplate(spelling));
    EXPECT_EQ(render(spelling, kConversation), kExpectedWithPrompt);
  }
}

// Each renders differently from plain ChatML under Jinja, so each is refused.
const char* const kRefusedTemplates[] = {
    // A newline after the expression is output (trim_blocks only trims block
    // tags): jinja2 renders "<|im_end|>\n\n" per message.
    "{% for message in messages %}\n"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}\n"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    // Qwen2.5-style default system prompt.
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
    "%}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
    "%}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif "
    "%}",
    // No generation prompt branch.
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
    // Llama 3.
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = "
    "bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    // Unterminated tag.
    "{% for message in messages %}{{'<|im_start|>' + message['role']",
};

TEST(ChatTemplate, OtherTemplatesRefused) {
  for (const char* chat_template : kRefusedTemplates) {
    SCOPED_TRACE(chat_template);
    EXPECT_FALSE(isChatMlTemplate(chat_template));
    auto result = renderChatTemplate(chat_template, kConversation, {});
    ASSERT_FALSE(result.isOk());
    EXPECT_EQ(result.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(result.status().message(),
              "chat template of this model is not supported yet (only ChatML)");
  }
}

TEST(ChatTemplate, MissingTemplateRefused) {
  EXPECT_FALSE(isChatMlTemplate(""));
  auto result = renderChatTemplate("", kConversation, {});
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(result.status().message(),
            "this model has no chat template (tokenizer_config.json has no chat_template); use "
            "/v1/completions with a prompt instead");
}

}  // namespace
}  // namespace tandem::server
