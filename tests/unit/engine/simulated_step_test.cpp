// StepShape built from the scheduler's output: prefill chunks, decode chunks,
// a mix, and generated tokens recomputed after a preemption, each against
// values worked out by hand.
#include "agent/engine/simulation/simulated_step.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace tandem::engine {
namespace {

// A sequence with `prompt` prompt tokens followed by `generated` tokens.
std::unique_ptr<Sequence> sequenceOf(int64_t prompt, int64_t generated) {
  Request request;
  request.prompt.assign(static_cast<size_t>(prompt), 7);
  auto sequence = std::make_unique<Sequence>(std::move(request));
  sequence->tokens.insert(sequence->tokens.end(), static_cast<size_t>(generated), 9);
  return sequence;
}

SchedulerOutput outputOf(std::vector<ScheduledChunk> chunks) {
  SchedulerOutput output;
  for (const ScheduledChunk& chunk : chunks) output.num_tokens += chunk.num_tokens;
  output.chunks = std::move(chunks);
  return output;
}

void expectShape(const StepShape& shape, int64_t prefill_tokens, int64_t decode_sequences,
                 int64_t context_tokens, int64_t prefill_context_products, int64_t kv_blocks_read) {
  EXPECT_EQ(shape.prefill_tokens, prefill_tokens);
  EXPECT_EQ(shape.decode_sequences, decode_sequences);
  EXPECT_EQ(shape.context_tokens, context_tokens);
  EXPECT_EQ(shape.prefill_context_products, prefill_context_products);
  EXPECT_EQ(shape.kv_blocks_read, kv_blocks_read);
}

TEST(StepShapeOf, AWholePromptIsPrefill) {
  auto sequence = sequenceOf(40, 0);
  // 40 tokens attending over 40 positions; blocks of 16: 3 hold them.
  expectShape(stepShapeOf(outputOf({{sequence.get(), 0, 40, true}}), 16), 40, 0, 0, 1600, 3);
}

TEST(StepShapeOf, APromptChunkAttendsOverWhatCameBefore) {
  auto sequence = sequenceOf(100, 0);
  // Tokens [32, 56): 24 new tokens, ending at position 56 → 24 * 56.
  expectShape(stepShapeOf(outputOf({{sequence.get(), 32, 24, false}}), 16), 24, 0, 0, 1344, 4);
}

TEST(StepShapeOf, ADecodeTokenAttendsOverItsWholeContext) {
  auto sequence = sequenceOf(40, 5);
  // The 5th generated token (position 44) computed: 45 positions, 3 blocks.
  expectShape(stepShapeOf(outputOf({{sequence.get(), 44, 1, true}}), 16), 0, 1, 45, 0, 3);
}

TEST(StepShapeOf, AMixedStepAddsEveryChunk) {
  auto decoding_a = sequenceOf(16, 1);   // position 16: 17 positions, 2 blocks
  auto decoding_b = sequenceOf(100, 3);  // position 102: 103 positions, 7 blocks
  auto prefilling = sequenceOf(50, 0);   // tokens [0, 20): 20 * 20, 2 blocks
  auto tail = sequenceOf(50, 0);         // tokens [48, 50): 2 * 50, 4 blocks
  const StepShape shape = stepShapeOf(outputOf({{decoding_a.get(), 16, 1, true},
                                                {decoding_b.get(), 102, 1, true},
                                                {prefilling.get(), 0, 20, false},
                                                {tail.get(), 48, 2, true}}),
                                      16);
  expectShape(shape, 22, 2, 17 + 103, 400 + 100, 2 + 7 + 2 + 4);
}

TEST(StepShapeOf, OneTokenPromptsAndRecomputedOutputAreNotDecode) {
  auto single = sequenceOf(1, 0);              // a 1-token prompt: prefill of 1 at 0
  auto preempted = sequenceOf(30, 10);         // recomputed from 0 after a preemption
  auto last_prompt_token = sequenceOf(33, 0);  // the last prompt token alone (P→D tail)
  const StepShape shape = stepShapeOf(outputOf({{single.get(), 0, 1, true},
                                                {preempted.get(), 0, 40, true},
                                                {last_prompt_token.get(), 32, 1, true}}),
                                      16);
  expectShape(shape, 1 + 40 + 1, 0, 0, 1 + 1600 + 33, 1 + 3 + 3);
}

TEST(StepShapeOf, AnEmptyStepHoldsNothing) {
  expectShape(stepShapeOf(SchedulerOutput{}, 16), 0, 0, 0, 0, 0);
}

}  // namespace
}  // namespace tandem::engine
