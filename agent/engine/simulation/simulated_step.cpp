#include "agent/engine/simulation/simulated_step.h"

#include <vector>

namespace tandem::engine {

StepShape stepShapeOf(const SchedulerOutput& output, int32_t block_size) {
  std::vector<StepChunk> chunks;
  chunks.reserve(output.chunks.size());
  for (const ScheduledChunk& chunk : output.chunks) {
    const bool decode = chunk.num_tokens == 1 && chunk.start >= chunk.sequence->num_prompt_tokens;
    chunks.push_back({chunk.start, chunk.num_tokens, !decode});
  }
  return stepShapeOf(chunks, block_size);
}

}  // namespace tandem::engine
