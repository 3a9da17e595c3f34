// Reasoning parsers on whole outputs in the formats DeepSeek-R1 and Qwen3
// produce, the name registry, and what the streaming side holds back.
#include "common/protocol/reasoning_parser.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace tandem::protocol {
namespace {

ReasoningSplit parse(ReasoningParserKind kind, std::string_view text, bool ended = false) {
  ReasoningOptions options;
  options.kind = kind;
  options.reasoning_ended_in_prompt = ended;
  return parseReasoning(options, text);
}

constexpr auto kR1 = ReasoningParserKind::kDeepSeekR1;
constexpr auto kQwen3 = ReasoningParserKind::kQwen3;

TEST(ReasoningParserRegistry, KnownNamesResolve) {
  EXPECT_EQ(reasoningParserNames(),
            (std::vector<std::string>{"deepseek_r1", "qwen3", "openai_gptoss"}));
  for (const std::string& name : reasoningParserNames()) {
    StatusOr<ReasoningParserKind> kind = reasoningParserFromName(name);
    ASSERT_TRUE(kind.isOk()) << name;
    EXPECT_EQ(reasoningParserName(*kind), name);
  }
}

TEST(ReasoningParserRegistry, UnknownNameNamesTheAcceptedOnes) {
  StatusOr<ReasoningParserKind> kind = reasoningParserFromName("deepseek");
  ASSERT_FALSE(kind.isOk());
  EXPECT_EQ(kind.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kind.status().message(),
            "unknown reasoning parser \"deepseek\" (--reasoning-parser); accepted: deepseek_r1, "
            "qwen3, openai_gptoss");
}

TEST(DeepSeekR1Reasoning, ThinkStartInPromptSplitsAtThinkEnd) {
  ReasoningSplit split = parse(kR1, "9.11 < 9.8 because 0.11 < 0.8.\n</think>\n\n9.8 is greater.");
  EXPECT_EQ(split.reasoning, "9.11 < 9.8 because 0.11 < 0.8.\n");
  EXPECT_EQ(split.content, "\n\n9.8 is greater.");
}

TEST(DeepSeekR1Reasoning, LeadingThinkStartIsDropped) {
  ReasoningSplit split = parse(kR1, "<think>hmm</think>answer");
  EXPECT_EQ(split.reasoning, "hmm");
  EXPECT_EQ(split.content, "answer");
}

TEST(DeepSeekR1Reasoning, WithoutThinkEndAllIsReasoning) {
  ReasoningSplit split = parse(kR1, "<think>still thinking when max_tokens hit");
  EXPECT_EQ(split.reasoning, "still thinking when max_tokens hit");
  EXPECT_EQ(split.content, std::nullopt);
}

TEST(DeepSeekR1Reasoning, EmptyPartsAreAbsent) {
  ReasoningSplit split = parse(kR1, "<think></think>");
  EXPECT_EQ(split.reasoning, std::nullopt);
  EXPECT_EQ(split.content, std::nullopt);
  split = parse(kR1, "</think>just the answer");
  EXPECT_EQ(split.reasoning, std::nullopt);
  EXPECT_EQ(split.content, "just the answer");
  split = parse(kR1, "");
  EXPECT_EQ(split.reasoning, std::nullopt);
  EXPECT_EQ(split.content, std::nullopt);
}

TEST(DeepSeekR1Reasoning, ThinkStartElsewhereIsText) {
  ReasoningSplit split = parse(kR1, "a <think> b</think>c");
  EXPECT_EQ(split.reasoning, "a <think> b");
  EXPECT_EQ(split.content, "c");
}

TEST(Qwen3Reasoning, ThinkBlockSplits) {
  ReasoningSplit split = parse(kQwen3, "<think>\nOkay, the user asks.\n</think>\n\nHello!");
  EXPECT_EQ(split.reasoning, "\nOkay, the user asks.\n");
  EXPECT_EQ(split.content, "\n\nHello!");
}

TEST(Qwen3Reasoning, ThinkEndAloneSplits) {
  // Templates that put <think> in the prompt.
  ReasoningSplit split = parse(kQwen3, "reasoning</think>answer");
  EXPECT_EQ(split.reasoning, "reasoning");
  EXPECT_EQ(split.content, "answer");
}

TEST(Qwen3Reasoning, WithoutThinkEndAllIsContent) {
  ReasoningSplit split = parse(kQwen3, "Hello! How can I help?");
  EXPECT_EQ(split.reasoning, std::nullopt);
  EXPECT_EQ(split.content, "Hello! How can I help?");
  // An output that opened its reasoning is reasoning, cut short or not.
  split = parse(kQwen3, "<think>cut short");
  EXPECT_EQ(split.reasoning, "cut short");
  EXPECT_EQ(split.content, std::nullopt);
}

// As vLLM reads it from the prompt's tokens: the last think tag decides.
TEST(ReasoningEndedIn, TheLastThinkTagOfThePromptDecides) {
  EXPECT_TRUE(reasoningEndedIn("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(reasoningEndedIn("<|im_start|>assistant\n"));
  EXPECT_FALSE(reasoningEndedIn("<｜Assistant｜><think>\n"));
  EXPECT_FALSE(reasoningEndedIn("a<think>b</think>c<think>\n"));
  EXPECT_TRUE(reasoningEndedIn("a<think>b</think>c"));
}

TEST(Qwen3Reasoning, ReasoningEndedInPromptMakesAllContent) {
  for (ReasoningParserKind kind : {kR1, kQwen3}) {
    ReasoningSplit split = parse(kind, "a</think>b", /*ended=*/true);
    EXPECT_EQ(split.reasoning, std::nullopt);
    EXPECT_EQ(split.content, "a</think>b");
  }
}

TEST(ReasoningStream, HoldsBackAPartialThinkEnd) {
  ReasoningStream stream({kR1, false});
  ReasoningPieces pieces = stream.feed("<think>abc</thi");
  EXPECT_EQ(pieces.reasoning, "abc");
  EXPECT_EQ(pieces.content, "");
  pieces = stream.feed("nk>xyz");
  EXPECT_EQ(pieces.reasoning, "");
  EXPECT_EQ(pieces.content, "xyz");
}

TEST(ReasoningStream, PartialTagThatDoesNotCompleteIsText) {
  ReasoningStream stream({kR1, false});
  EXPECT_EQ(stream.feed("<thi").reasoning, "");
  EXPECT_EQ(stream.feed("s").reasoning, "<this");
  EXPECT_EQ(stream.feed(" </thin").reasoning, " ");
  ReasoningPieces last = stream.finish();
  EXPECT_EQ(last.reasoning, "</thin");
  EXPECT_EQ(last.content, "");
}

TEST(ReasoningStream, Qwen3StreamsAnOpenedReasoningAndHoldsAnUndecidedOne) {
  // Opened with <think>: the reasoning streams as it comes (Qwen3 thinking
  // for thousands of tokens used to show nothing until </think>).
  ReasoningStream thinking({kQwen3, false});
  EXPECT_EQ(thinking.feed("<think>step one").reasoning, "step one");
  ReasoningPieces pieces = thinking.feed(" two</think>done");
  EXPECT_EQ(pieces.reasoning, " two");
  EXPECT_EQ(pieces.content, "done");

  // Not opened: undecided until </think> or the end.
  ReasoningStream unopened({kQwen3, false});
  EXPECT_EQ(unopened.feed("step one").reasoning, "");
  pieces = unopened.feed("</think>done");
  EXPECT_EQ(pieces.reasoning, "step one");
  EXPECT_EQ(pieces.content, "done");

  ReasoningStream plain({kQwen3, false});
  EXPECT_EQ(plain.feed("Hello").content, "");
  EXPECT_EQ(plain.finish().content, "Hello");

  ReasoningStream disabled({kQwen3, true});
  EXPECT_EQ(disabled.feed("Hello").content, "Hello");
}

}  // namespace
}  // namespace tandem::protocol
