// Jinja's tests (`x is name(args)`): defined, none, string, mapping, ...
#pragma once

#include <string>

#include "common/jinja/value.h"

namespace tandem::jinja {

class Evaluator;

bool hasTest(const std::string& name);
// Applies test `name`; throws RenderFailure for unknown tests.
bool applyTest(Evaluator& ev, const std::string& name, const Value& input, const CallArgs& args);

}  // namespace tandem::jinja
