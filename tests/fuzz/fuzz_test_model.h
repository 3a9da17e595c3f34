// The tokenizer and chat template of a generated tiny test model, for
// harnesses that parse OpenAI request bodies: the model is written to a
// temporary directory, read, and the directory removed again.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "common/protocol/chat_template.h"
#include "common/protocol/openai_protocol.h"
#include "common/tokenizer.h"
#include "tools/model/test_model.h"

namespace tandem::fuzz {

// The tiny model's tokenizer (kept for the process's life), with `limits`
// set for it: served name "tiny-model", max_model_len 128, its vocabulary
// and ChatML template.
inline const Tokenizer* loadTinyModel(server::ServerLimits& limits) {
  std::string dir = (std::filesystem::temp_directory_path() / "tandem-fuzz-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  tools::writeTestModel(tools::TestModelOptions{}, dir);
  const Tokenizer* tokenizer = Tokenizer::fromDirectory(dir).release();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  limits.served_model_name = "tiny-model";
  limits.max_model_len = 128;
  limits.vocab_size = tokenizer->vocabSize();
  auto chat_template = server::ChatTemplate::load(*tokenizer);
  if (!chat_template.isOk()) std::abort();
  limits.chat_template = *chat_template;
  return tokenizer;
}

}  // namespace tandem::fuzz
