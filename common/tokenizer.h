// Hugging Face tokenizer.json with a BPE model: byte-level (GPT-2, Llama 3,
// Qwen style) and SentencePiece-style (Llama 2, Mistral, Mixtral, Gemma:
// spaces written "▁", bytes of unknown characters as "<0xNN>" tokens).
//
// Supported pipeline pieces: normalizers NFC / NFD / NFKC / NFKD / Prepend /
// Replace / Sequence; pre-tokenizers Split (regex, PCRE2 with Unicode
// properties, or literal; all five delimiter behaviours; invert), ByteLevel,
// Metaspace, Sequence; model BPE with merges as "a b" strings or ["a", "b"]
// pairs, ignore_merges, unk_token, fuse_unk, byte_fallback; added tokens
// (special or not) matched before pre-tokenization, honouring lstrip /
// rstrip / single_word / normalized; decoders ByteLevel, ByteFallback,
// Replace, Metaspace, Fuse and Strip after Fuse (alone or in a Sequence);
// post-processors TemplateProcessing (single template) / ByteLevel /
// Sequence for add_special_tokens.
// Unsupported pieces are refused at load with an error naming them and the
// file. tokenizer.json's truncation and padding settings are ignored.
//
// A Tokenizer is immutable after load and safe to use from many threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

using TokenId = int32_t;
// Token ids a tokenizer file may use: [0, kMaxTokenIds). Far above any real
// vocabulary (262,144 is the largest in use), low enough that per-id tables
// stay small whatever a file claims.
inline constexpr int64_t kMaxTokenIds = int64_t{1} << 22;

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json (and DIR/tokenizer_config.json when present, for
  // bos/eos tokens and the chat template). Throws tandem::Error naming the file.
  static std::unique_ptr<Tokenizer> fromDirectory(const std::filesystem::path& dir);
  static std::unique_ptr<Tokenizer> fromFile(const std::filesystem::path& tokenizer_json);
  ~Tokenizer();

  // add_special_tokens applies the post-processor (e.g. Llama 3's BOS).
  // Input that is not valid UTF-8 is read with U+FFFD in place of the bad
  // bytes.
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const;
  // encode() cut to at most `max_ids` ids from the left, as transformers'
  // truncation with truncation_side "left" cuts (vLLM's
  // truncate_prompt_tokens): the ids add_special_tokens adds stay (a BOS
  // still leads), the text's first ids go. `cut` (optional) says whether
  // any went.
  std::vector<TokenId> encodeLast(std::string_view text, bool add_special_tokens, int64_t max_ids,
                                  bool* cut = nullptr) const;
  // Concatenated text of the ids; special tokens are kept unless skipped.
  // Byte sequences that are not valid UTF-8 come out as U+FFFD. Ids outside
  // the vocabulary are skipped.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;
  // decode() as transformers' decode gives it: what the decoder does at
  // the text's start (Llama 2's Strip drops the space its normalizer put in
  // front of the text; a Metaspace decoder the first token's "▁"), and with
  // tokenizer_config.json's clean_up_tokenization_spaces true (Llama 3),
  // " ." becomes "." and the like. For /detokenize, as vLLM's; not for generated text, whose
  // streamed pieces must add up to it, nor for echoed prompts, whose
  // logprobs' text offsets count the tokens' own text.
  std::string decodeAsTransformers(std::span<const TokenId> ids,
                                   bool skip_special_tokens = false) const;

  // Number of ids (the largest id + 1, added tokens included).
  int64_t vocabSize() const;
  // An upper bound on the bytes of input text one id of encode() can stand
  // for, so that a text of N bytes gives at least ceil(N / bound) ids: the
  // longest token's bytes (at least 4, one unknown character), times 4 when
  // a normalizer may compose characters (NFC/NFKC shrink text at most 3x).
  // nullopt when no such bound exists: fuse_unk, a pre-tokenizer that
  // removes text, or added tokens that swallow whitespace (lstrip/rstrip).
  std::optional<int64_t> maxTextBytesPerToken() const;
  // The token's string as in the vocabulary (byte-level form), or nullopt.
  std::optional<std::string> idToToken(TokenId id) const;
  std::optional<TokenId> tokenToId(std::string_view token) const;
  bool isSpecial(TokenId id) const;

  // From tokenizer_config.json (bos_token / eos_token), when present.
  std::optional<TokenId> bosTokenId() const;
  std::optional<TokenId> eosTokenId() const;
  // tokenizer_config.json "chat_template" (empty when absent); the one named
  // "default" when it is a list of named templates.
  const std::string& chatTemplate() const;

  // Every chat template the model directory gives, as transformers reads
  // them: a string "chat_template" is one template named "default"; a list
  // of {name, template} gives each; without either, chat_template.jinja is
  // the "default". `origin` names the file it came from, for error messages.
  struct NamedChatTemplate {
    std::string name;
    std::string text;
    std::string origin;
  };
  const std::vector<NamedChatTemplate>& chatTemplates() const;

  // transformers' special_tokens_map from tokenizer_config.json: bos_token,
  // eos_token, unk_token, sep_token, pad_token, cls_token, mask_token as
  // strings (AddedToken objects give their "content"), and
  // additional_special_tokens as a list of strings. Tokens the file does not
  // set (or sets to null) are absent. An empty object without the file.
  const nlohmann::ordered_json& specialTokensMap() const;

  // The raw bytes a token stands for, as the decoder gives them token by
  // token (byte-level decoded; "▁" as a space and "<0x0A>" as byte 0x0A in
  // SentencePiece-style files; added tokens give their content).
  std::string tokenBytes(TokenId id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenization: feed ids one at a time, get text that is always
// valid UTF-8. Bytes of an incomplete UTF-8 sequence are held back until the
// sequence completes; flush() releases what is left (invalid bytes as U+FFFD).
// Concatenating every push() and flush() equals Tokenizer::decode(all ids).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(TokenId id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace tandem
