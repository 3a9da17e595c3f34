// The template globals: range, namespace, dict, raise_exception and
// strftime_now (Hugging Face's additions).
#pragma once

#include "common/jinja/evaluator.h"

namespace tandem::jinja {

void installGlobals(Scope& scope);

}  // namespace tandem::jinja
