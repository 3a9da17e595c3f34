// The Jinja parser: builds the syntax tree (ast.h) from lexer tokens.
// Refuses statements that would load other templates (include, import,
// extends, from, block) and bounds nesting so hostile input cannot exhaust
// the stack.
#pragma once

#include <cstddef>
#include <vector>

#include "common/jinja/ast.h"
#include "common/jinja/lexer.h"

namespace tandem::jinja {

// Parses a whole template; throws SyntaxFailure with the line of the error.
// `max_depth` bounds block and expression nesting (Limits::max_call_depth).
Body parseTemplate(const std::vector<Token>& tokens, size_t max_depth);

}  // namespace tandem::jinja
