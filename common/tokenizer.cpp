#include "common/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <utility>

#include "common/file_text.h"
#include "common/json_parse.h"
#include "common/status.h"
#include "common/tokenizer_added.h"
#include "common/tokenizer_bpe.h"
#include "common/tokenizer_pipeline.h"
#include "common/tokenizer_utf8.h"

namespace tandem {

using tokenizer_internal::AddedToken;
using tokenizer_internal::AddedTokenMatcher;
using tokenizer_internal::BpeModel;
using tokenizer_internal::Decoder;
using tokenizer_internal::Normalizer;
using tokenizer_internal::PostProcessor;
using tokenizer_internal::PreTokenizer;
using tokenizer_internal::StringIdTable;

namespace {

// The largest tokenizer.json read: the largest real ones (vocabularies of
// 256k entries and their merges) are some 35 MB.
constexpr uint64_t kMaxTokenizerJsonBytes = 256ull << 20;

// A tokenizer's file read whole; a FIFO, device or directory in its place,
// or a file over `max_bytes`, is refused naming it (common/file_text.h).
std::string readFile(const std::filesystem::path& path, uint64_t max_bytes = kMaxModelJsonBytes) {
  std::optional<std::string> text = readModelFile(path, max_bytes);
  if (!text) throw Error(path.string() + ": file not found");
  return std::move(*text);
}

nlohmann::json parseJsonFile(const std::filesystem::path& path,
                             uint64_t max_bytes = kMaxModelJsonBytes) {
  const std::string text = readFile(path, max_bytes);
  JsonParseError error;
  std::optional<nlohmann::json> root = parseJson(text, error);
  if (!root) throw Error(path.string() + ": invalid JSON: " + error.detail);
  return std::move(*root);
}

const nlohmann::json& fieldOrNull(const nlohmann::json& object, const char* key) {
  static const nlohmann::json kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

const nlohmann::json& checkedModel(const nlohmann::json& root, const std::string& source) {
  if (!root.is_object()) throw Error(source + ": top level must be a JSON object");
  auto model = root.find("model");
  if (model == root.end() || !model->is_object()) {
    throw Error(source + ": \"model\" object is missing");
  }
  auto type = model->find("type");
  // Old files leave the type out; a vocabulary with merges is BPE.
  const std::string model_type = type != model->end() && type->is_string()
                                     ? type->get<std::string>()
                                 : model->contains("merges") ? "BPE"
                                                             : "(none)";
  if (model_type != "BPE") {
    throw Error(source + ": model type '" + model_type + "' is not supported (supported: BPE)");
  }
  return *model;
}

std::vector<AddedToken> parseAddedTokens(const nlohmann::json& root, const std::string& source) {
  std::vector<AddedToken> tokens;
  const nlohmann::json& list = fieldOrNull(root, "added_tokens");
  if (list.is_null()) return tokens;
  if (!list.is_array()) throw Error(source + ": added_tokens must be an array");
  for (const nlohmann::json& entry : list) {
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
        !entry.contains("content") || !entry["content"].is_string()) {
      throw Error(source + ": added token " + entry.dump() +
                  " needs an integer \"id\" and a string \"content\"");
    }
    AddedToken token;
    const int64_t id = entry["id"].get<int64_t>();
    if (id < 0 || id >= kMaxTokenIds) {
      throw Error(source + ": added token " + entry.dump() + " must have an id in [0, " +
                  std::to_string(kMaxTokenIds) + ")");
    }
    token.id = static_cast<TokenId>(id);
    token.content = entry["content"].get<std::string>();
    const std::string what = "added_tokens[" + std::to_string(tokens.size()) + "]";
    using tokenizer_internal::optionalBool;
    token.special = optionalBool(entry, "special", false, source, what);
    token.single_word = optionalBool(entry, "single_word", false, source, what);
    token.lstrip = optionalBool(entry, "lstrip", false, source, what);
    token.rstrip = optionalBool(entry, "rstrip", false, source, what);
    // Hugging Face's default: special tokens are matched on the raw text.
    token.normalized = optionalBool(entry, "normalized", !token.special, source, what);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// bos_token / eos_token: a string, {"content": ...}, or null.
std::optional<std::string> configTokenString(const nlohmann::json& config, const char* key,
                                             const std::string& source) {
  const nlohmann::json& value = fieldOrNull(config, key);
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  throw Error(source + ": " + key + " must be a string, an object with \"content\", or null");
}

}  // namespace

struct Tokenizer::Impl {
  Impl(const nlohmann::json& root, const std::string& source_path)
      : source(source_path),
        model(checkedModel(root, source), source),
        normalizer(fieldOrNull(root, "normalizer"), source),
        pre_tokenizer(fieldOrNull(root, "pre_tokenizer"), source),
        post_processor(fieldOrNull(root, "post_processor"), source),
        decoder(fieldOrNull(root, "decoder"), source),
        added_tokens(parseAddedTokens(root, source)) {
    buildAddedTokenTables();
    post_processor.checkIds(vocab_size, source);
    buildTokenBytes();
    findMaxTextBytesPerToken();
  }

  void findMaxTextBytesPerToken() {
    const bool swallows_whitespace =
        std::any_of(added_tokens.begin(), added_tokens.end(),
                    [](const AddedToken& token) { return token.lstrip || token.rstrip; });
    const std::optional<int64_t> shrink = normalizer.maxShrink();
    if (model.fusesUnknown() || pre_tokenizer.mayRemoveText() || swallows_whitespace || !shrink) {
      return;
    }
    // A token stands for its decoded bytes, or its spelling in the
    // normalized text ("▁the" for " the"), whichever is longer.
    int64_t longest = 4;
    for (TokenId id = 0; id < vocab_size; ++id) {
      longest = std::max<int64_t>(longest, static_cast<int64_t>(token_bytes[id].size()));
      if (const auto token = model.idToToken(id)) {
        longest = std::max<int64_t>(longest, static_cast<int64_t>(token->size()));
      }
    }
    max_text_bytes_per_token = *shrink * longest;
  }

  void buildAddedTokenTables() {
    std::vector<const AddedToken*> raw;
    std::vector<std::string> raw_contents;
    std::vector<const AddedToken*> normalized;
    std::vector<std::string> normalized_contents;
    vocab_size = model.idLimit();
    for (const AddedToken& token : added_tokens) {
      checkAddedTokenId(token);
      // The first of two entries with the same content wins, as in the matcher.
      if (added_by_content.find(token.content) == nullptr) {
        added_by_content.insertOrAssign(token.content, token.id);
      }
      added_by_id.emplace(token.id, &token);
      vocab_size = std::max<int64_t>(vocab_size, int64_t{token.id} + 1);
      if (token.normalized) {
        normalized.push_back(&token);
        normalized_contents.push_back(normalizer.apply(token.content));
      } else {
        raw.push_back(&token);
        raw_contents.push_back(token.content);
      }
    }
    raw_matcher = std::make_unique<AddedTokenMatcher>(raw, raw_contents);
    normalized_matcher = std::make_unique<AddedTokenMatcher>(normalized, normalized_contents);
  }

  // An added token may repeat a vocabulary entry or another added token with
  // the same content (GPT-2's <|endoftext|> is both), never give a second
  // meaning to an id: encoding and decoding would disagree.
  void checkAddedTokenId(const AddedToken& token) const {
    const std::string id = std::to_string(token.id);
    if (auto it = added_by_id.find(token.id);
        it != added_by_id.end() && it->second->content != token.content) {
      const auto [first, second] = std::minmax(it->second->content, token.content);
      throw Error(source + ": added tokens '" + first + "' and '" + second + "' both have id " +
                  id);
    }
    if (const auto vocab_token = model.idToToken(token.id)) {
      std::string decoded;
      const bool same = *vocab_token == token.content ||
                        (tokenizer_internal::appendFromByteLevel(*vocab_token, decoded) &&
                         decoded == token.content);
      if (!same) {
        throw Error(source + ": added token '" + token.content + "' has id " + id +
                    ", which model.vocab gives to '" + std::string(*vocab_token) + "'");
      }
    }
  }

  // Decoding is a concatenation of per-token bytes, so they are worked out
  // once here.
  void buildTokenBytes() {
    token_bytes.resize(static_cast<size_t>(vocab_size));
    special.assign(static_cast<size_t>(vocab_size), false);
    for (TokenId id = 0; id < vocab_size; ++id) {
      if (!decoder.byteLevel()) {
        // Every token goes through the decoder, added ones too (Gemma's
        // added "▁▁" is two spaces), as Hugging Face's decode does.
        if (auto it = added_by_id.find(id); it != added_by_id.end()) {
          special[id] = it->second->special;
          decoder.appendTokenBytes(it->second->content, false, token_bytes[id]);
        } else if (const auto token = model.idToToken(id)) {
          decoder.appendTokenBytes(*token, false, token_bytes[id]);
        }
        continue;
      }
      if (auto it = added_by_id.find(id); it != added_by_id.end()) {
        // Added tokens are written as they read, not in the byte-level
        // alphabet, unless one repeats its vocabulary entry in that
        // alphabet ("Ġthe" for " the"): then its decoded bytes, as Hugging
        // Face's ByteLevel decoder gives them.
        token_bytes[id] = it->second->content;
        special[id] = it->second->special;
        if (const auto token = model.idToToken(id); token && *token == it->second->content) {
          std::string decoded;
          // (Not when those bytes are no text: DeepSeek's added "õ" is
          // byte F5 in that alphabet, which would decode to U+FFFD.)
          if (tokenizer_internal::appendFromByteLevel(*token, decoded) &&
              tokenizer_internal::isValidUtf8(decoded)) {
            token_bytes[id] = std::move(decoded);
          }
        }
      } else if (const auto token = model.idToToken(id)) {
        decoder.appendTokenBytes(*token, false, token_bytes[id]);
      }
    }
  }

  // The token's text as the added tokens or the vocabulary spell it;
  // nullopt for an id neither has.
  std::optional<std::string_view> spelling(TokenId id) const {
    if (auto it = added_by_id.find(id); it != added_by_id.end()) {
      return std::string_view(it->second->content);
    }
    return model.idToToken(id);
  }

  // The bytes of `ids` (ids outside the vocabulary skipped, as Hugging Face
  // does; special ones too when asked), as valid UTF-8 (U+FFFD for bytes
  // that are not). With `decoder_start`, the first token's bytes are the
  // decoder's for a text's first token, and Strip's leading characters are
  // removed: what transformers' decode does at the start.
  std::string decodeBytes(std::span<const TokenId> ids, bool skip_special_tokens,
                          bool decoder_start) const {
    std::string bytes;
    bool first = true;
    for (TokenId id : ids) {
      if (id < 0 || id >= vocab_size) continue;
      if (skip_special_tokens && special[id]) continue;
      if (first && decoder_start && decoder.dropsFirstReplacement()) {
        decoder.appendTokenBytes(spelling(id).value_or(""), /*first=*/true, bytes);
      } else {
        bytes += token_bytes[id];
      }
      first = false;
    }
    if (decoder_start && decoder.stripCount() > 0) {
      std::string strip;
      tokenizer_internal::appendUtf8(decoder.stripChar(), strip);
      size_t start = 0;
      for (int64_t i = 0;
           i < decoder.stripCount() && bytes.compare(start, strip.size(), strip) == 0; ++i) {
        start += strip.size();
      }
      bytes.erase(0, start);
    }
    if (tokenizer_internal::isValidUtf8(bytes)) return bytes;
    return tokenizer_internal::lossyUtf8(bytes);
  }

  // Normalizes, pre-tokenizes and encodes a run of text without raw added
  // tokens in it; `at_start`: nothing comes before it in the input.
  void encodeText(std::string_view text, bool at_start, std::vector<TokenId>& ids) const {
    std::string normalized_storage;
    std::string_view normalized = text;
    if (!normalizer.isIdentity()) {
      normalized_storage = normalizer.apply(text);
      normalized = normalized_storage;
    }
    std::vector<AddedTokenMatcher::Segment> segments;
    if (normalized_matcher->empty()) {
      segments.push_back({0, normalized.size(), -1});
    } else {
      normalized_matcher->split(normalized, segments);
    }
    const tokenizer_internal::WordSink tokenize = [&](std::string_view word) {
      model.tokenize(word, ids);
    };
    for (const AddedTokenMatcher::Segment& segment : segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      pre_tokenizer.apply(normalized.substr(segment.begin, segment.end - segment.begin), tokenize,
                          at_start && segment.begin == 0);
    }
  }

  std::string source;
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  PostProcessor post_processor;
  Decoder decoder;
  std::vector<AddedToken> added_tokens;
  StringIdTable added_by_content;
  std::unordered_map<TokenId, const AddedToken*> added_by_id;
  std::unique_ptr<AddedTokenMatcher> raw_matcher;
  std::unique_ptr<AddedTokenMatcher> normalized_matcher;
  int64_t vocab_size = 0;
  std::vector<std::string> token_bytes;
  std::vector<bool> special;
  std::optional<int64_t> max_text_bytes_per_token;

  std::optional<TokenId> bos_id;
  std::optional<TokenId> eos_id;
  std::string chat_template;
  bool clean_up_tokenization_spaces = false;
  std::vector<Tokenizer::NamedChatTemplate> chat_templates;
  nlohmann::ordered_json special_tokens_map = nlohmann::ordered_json::object();
};

namespace {

// The special tokens (bos/eos ids, the map templates see) a
// tokenizer_config.json or special_tokens_map.json gives; a token it does
// not name keeps what it had.
void loadSpecialTokens(const Tokenizer& tokenizer, Tokenizer::Impl& impl,
                       const nlohmann::json& config, const std::string& source) {
  if (!config.is_object()) throw Error(source + ": top level must be a JSON object");
  auto resolve = [&](const char* key, std::optional<TokenId>& id) {
    auto content = configTokenString(config, key, source);
    if (!content) return;
    id = tokenizer.tokenToId(*content);
    if (!id) {
      throw Error(source + ": " + key + " '" + *content + "' is not a token of " + impl.source);
    }
  };
  resolve("bos_token", impl.bos_id);
  resolve("eos_token", impl.eos_id);
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    if (auto content = configTokenString(config, key, source)) {
      impl.special_tokens_map[key] = *content;
    }
  }
  if (const nlohmann::json& extra = fieldOrNull(config, "additional_special_tokens");
      extra.is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const nlohmann::json& token : extra) {
      if (token.is_string()) {
        list.push_back(token.get<std::string>());
      } else if (token.is_object() && token.contains("content") && token["content"].is_string()) {
        list.push_back(token["content"].get<std::string>());
      } else {
        throw Error(source +
                    ": additional_special_tokens entries must be strings or objects with "
                    "\"content\"");
      }
    }
    impl.special_tokens_map["additional_special_tokens"] = std::move(list);
  }
}

// bos/eos tokens and the chat template from tokenizer_config.json.
void loadConfig(const Tokenizer& tokenizer, Tokenizer::Impl& impl,
                const std::filesystem::path& config_path) {
  const std::string source = config_path.string();
  const nlohmann::json config = parseJsonFile(config_path);
  try {
    loadSpecialTokens(tokenizer, impl, config, source);
    const nlohmann::json& clean_up = fieldOrNull(config, "clean_up_tokenization_spaces");
    if (!clean_up.is_null() && !clean_up.is_boolean()) {
      throw Error(source + ": clean_up_tokenization_spaces must be true or false, got " +
                  clean_up.dump());
    }
    impl.clean_up_tokenization_spaces = clean_up.is_boolean() && clean_up.get<bool>();
    const nlohmann::json& chat_template = fieldOrNull(config, "chat_template");
    if (chat_template.is_string()) {
      impl.chat_template = chat_template.get<std::string>();
      impl.chat_templates.push_back({"default", impl.chat_template, source});
    } else if (chat_template.is_array()) {
      // Several named templates; the one named "default" is for plain chat.
      for (const nlohmann::json& entry : chat_template) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          throw Error(source + ": chat_template entries must be {\"name\": string, " +
                      "\"template\": string}");
        }
        const std::string name = entry["name"].get<std::string>();
        const std::string text = entry["template"].get<std::string>();
        if (name == "default") impl.chat_template = text;
        impl.chat_templates.push_back({name, text, source + " (chat_template " + name + ")"});
      }
    } else if (!chat_template.is_null()) {
      throw Error(source + ": chat_template must be a string or a list of {name, template}");
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(source + ": unexpected content: " + e.what());
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::fromFile(const std::filesystem::path& tokenizer_json) {
  const nlohmann::json root = parseJsonFile(tokenizer_json, kMaxTokenizerJsonBytes);
  try {
    return std::unique_ptr<Tokenizer>(
        new Tokenizer(std::make_unique<Impl>(root, tokenizer_json.string())));
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong JSON type somewhere the checks above do not cover.
    throw Error(tokenizer_json.string() + ": unexpected content: " + e.what());
  }
}

std::unique_ptr<Tokenizer> Tokenizer::fromDirectory(const std::filesystem::path& dir) {
  std::unique_ptr<Tokenizer> tokenizer = fromFile(dir / "tokenizer.json");
  Impl& impl = *tokenizer->impl_;
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    loadConfig(*tokenizer, impl, config_path);
  }
  // Older checkpoints name their special tokens here; as in transformers,
  // what it names wins over tokenizer_config.json.
  const std::filesystem::path map_path = dir / "special_tokens_map.json";
  if (std::filesystem::exists(map_path, ec)) {
    const std::string source = map_path.string();
    try {
      loadSpecialTokens(*tokenizer, impl, parseJsonFile(map_path), source);
    } catch (const nlohmann::json::exception& e) {
      throw Error(source + ": unexpected content: " + e.what());
    }
  }
  // Newer checkpoints keep the template in its own file, which wins over
  // tokenizer_config.json's default, as in transformers (a checkpoint saved
  // by a newer version may keep a stale copy in the config); the config's
  // other named templates stay.
  // A checkpoint with a vision tower (Mistral Small 3.1) may keep it in
  // its processor's chat_template.json instead ({"chat_template": "..."}),
  // which vLLM prefers over the tokenizer's, as the .jinja file.
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  const std::filesystem::path json_path = dir / "chat_template.json";
  std::optional<std::pair<std::string, std::filesystem::path>> file_template;
  if (std::filesystem::exists(jinja_path, ec)) {
    file_template.emplace(readFile(jinja_path), jinja_path);
  } else if (std::filesystem::exists(json_path, ec)) {
    const nlohmann::json processor = parseJsonFile(json_path);
    if (!processor.is_object() || !processor.contains("chat_template") ||
        !processor["chat_template"].is_string()) {
      throw Error(json_path.string() +
                  ": field \"chat_template\" must be a string (the chat template's text)");
    }
    file_template.emplace(processor["chat_template"].get<std::string>(), json_path);
  }
  if (file_template) {
    impl.chat_template = file_template->first;
    std::erase_if(impl.chat_templates, [](const Tokenizer::NamedChatTemplate& named) {
      return named.name == "default";
    });
    impl.chat_templates.insert(impl.chat_templates.begin(),
                               {"default", impl.chat_template, file_template->second.string()});
  }
  return tokenizer;
}

std::vector<TokenId> Tokenizer::encodeLast(std::string_view text, bool add_special_tokens,
                                           int64_t max_ids, bool* cut) const {
  std::vector<TokenId> ids = encode(text, /*add_special_tokens=*/false);
  std::vector<TokenId> added;
  if (add_special_tokens) impl_->post_processor.apply(added);
  const int64_t keep = std::max<int64_t>(0, max_ids - static_cast<int64_t>(added.size()));
  const bool cutting = static_cast<int64_t>(ids.size()) > keep;
  // A fresh vector: the whole text's capacity is not kept with the cut.
  if (cutting) ids = std::vector<TokenId>(ids.end() - keep, ids.end());
  if (cut != nullptr) *cut = cutting;
  if (add_special_tokens) impl_->post_processor.apply(ids);
  return ids;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  // The regex engine needs valid UTF-8; anything else is read the way
  // decode() writes it.
  std::string sanitized;
  if (!tokenizer_internal::isValidUtf8(text)) {
    sanitized = tokenizer_internal::lossyUtf8(text);
    text = sanitized;
  }
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (impl.raw_matcher->empty()) {
    impl.encodeText(text, /*at_start=*/true, ids);
  } else {
    std::vector<AddedTokenMatcher::Segment> segments;
    impl.raw_matcher->split(text, segments);
    for (const AddedTokenMatcher::Segment& segment : segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
      } else {
        impl.encodeText(text.substr(segment.begin, segment.end - segment.begin), segment.begin == 0,
                        ids);
      }
    }
  }
  if (add_special_tokens) impl.post_processor.apply(ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  return impl_->decodeBytes(ids, skip_special_tokens, /*decoder_start=*/false);
}

int64_t Tokenizer::vocabSize() const { return impl_->vocab_size; }

std::optional<int64_t> Tokenizer::maxTextBytesPerToken() const {
  return impl_->max_text_bytes_per_token;
}

std::optional<std::string> Tokenizer::idToToken(TokenId id) const {
  if (const auto token = impl_->spelling(id)) return std::string(*token);
  return std::nullopt;
}

std::optional<TokenId> Tokenizer::tokenToId(std::string_view token) const {
  if (const TokenId* id = impl_->added_by_content.find(token)) return *id;
  return impl_->model.tokenToId(token);
}

bool Tokenizer::isSpecial(TokenId id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id];
}

std::optional<TokenId> Tokenizer::bosTokenId() const { return impl_->bos_id; }
std::optional<TokenId> Tokenizer::eosTokenId() const { return impl_->eos_id; }
const std::string& Tokenizer::chatTemplate() const { return impl_->chat_template; }

std::string Tokenizer::decodeAsTransformers(std::span<const TokenId> ids,
                                            bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::string text = impl.decodeBytes(ids, skip_special_tokens, /*decoder_start=*/true);
  if (!impl.clean_up_tokenization_spaces) return text;
  // transformers' clean_up_tokenization: these replacements, in this order.
  static constexpr std::pair<std::string_view, std::string_view> kCleanUps[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kCleanUps) {
    std::string out;
    out.reserve(text.size());
    for (size_t at = 0;;) {
      const size_t found = text.find(from, at);
      out.append(text, at, found == std::string::npos ? std::string::npos : found - at);
      if (found == std::string::npos) break;
      out += to;
      at = found + from.size();
    }
    text = std::move(out);
  }
  return text;
}
const std::vector<Tokenizer::NamedChatTemplate>& Tokenizer::chatTemplates() const {
  return impl_->chat_templates;
}
const nlohmann::ordered_json& Tokenizer::specialTokensMap() const {
  return impl_->special_tokens_map;
}

std::string Tokenizer::tokenBytes(TokenId id) const {
  if (id < 0 || id >= impl_->vocab_size) return {};
  return impl_->token_bytes[id];
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(TokenId id) {
  if (skip_special_tokens_ && tokenizer_.isSpecial(id)) return {};
  pending_ += tokenizer_.tokenBytes(id);
  std::string out;
  const size_t consumed = tokenizer_internal::appendLossyUtf8(pending_, out, /*final=*/false);
  pending_.erase(0, consumed);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = tokenizer_internal::lossyUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace tandem
