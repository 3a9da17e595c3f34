// What a simulated agent's engine step holds, in the terms a StepProfile
// prices (step_profile.h): built from the scheduler's choice for the step.
//
// A chunk is a decode chunk when it computes exactly one token at a position
// past the prompt (the token sampled by the step before); every other chunk
// (a prompt, a piece of one, or generated tokens recomputed after a
// preemption) is prefill. For a decode chunk at position p the sequence
// attends over p + 1 positions; a prefill chunk of n tokens starting at s
// contributes n * (s + n) to prefill_context_products. Every chunk reads the
// blocks that hold positions [0, s + n).
//
// Pure function; safe from any thread.
#pragma once

#include <cstdint>

#include "agent/engine/scheduler.h"
#include "agent/engine/simulation/step_profile.h"

namespace tandem::engine {

StepShape stepShapeOf(const SchedulerOutput& output, int32_t block_size);

}  // namespace tandem::engine
