#include "common/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/status.h"
#include "common/tokenizer_utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// Match data and a JIT stack per thread: pcre2_match_data may not be shared
// between concurrent matches, and creating it per call would cost more than
// most matches do.
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchState() {
    // Only the whole match (pair 0) is ever read.
    match_data = pcre2_match_data_create(1, nullptr);
    match_context = pcre2_match_context_create(nullptr);
    // Long runs of whitespace or punctuation can outgrow the default 32 KiB
    // JIT stack.
    jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (match_context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
    }
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(match_context);
    pcre2_match_data_free(match_data);
  }
};

ThreadMatchState& threadMatchState() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

Regex::Regex(std::string_view pattern, bool literal, std::string_view source) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // A literal (a Split's {"String": ...}) has no classes for UCP to change,
  // and PCRE2 refuses PCRE2_UCP with PCRE2_LITERAL.
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    throw Error(std::string(source) + ": regex '" + std::string(pattern) +
                "' does not compile: " + reinterpret_cast<const char*>(message) + " at offset " +
                std::to_string(error_offset));
  }
  // Without JIT (not built in, or no executable memory) pcre2_match falls
  // back to the interpreter, which gives the same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::forEachMatch(std::string_view subject,
                         const std::function<void(size_t begin, size_t end)>& on_match) const {
  ThreadMatchState& state = threadMatchState();
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t length = subject.size();
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
  size_t offset = 0;
  uint32_t flags = 0;
  while (offset <= length) {
    const int rc = pcre2_match(code, data, length, offset, flags | PCRE2_NO_UTF_CHECK,
                               state.match_data, state.match_context);
    if (rc == PCRE2_ERROR_NOMATCH || rc < 0) {
      // After an empty match the anchored non-empty retry failed: step over
      // one character and search normally. Any other failure (resource
      // limits) ends the search; the rest of the text stays one piece.
      if (flags == 0 || rc != PCRE2_ERROR_NOMATCH || offset >= length) break;
      offset += utf8SequenceLength(static_cast<unsigned char>(subject[offset]));
      flags = 0;
      continue;
    }
    // Read before on_match, whose own matching reuses the thread's state.
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    on_match(start, end);
    offset = end;
    // An empty match must not repeat at the same place: look for a non-empty
    // one there first, as Perl and PCRE2's own demo do.
    flags = start == end ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
  }
}

}  // namespace tandem::tokenizer_internal
