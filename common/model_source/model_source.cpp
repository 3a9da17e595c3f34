#include "common/model_source/model_source.h"

#include <cctype>

namespace tandem::model_source {
namespace {

constexpr std::string_view kHubScheme = "hf://";
constexpr std::string_view kClaimScheme = "pvc://";
constexpr std::string_view kImageScheme = "oci://";

// A Hub name part (org or repo): letters, digits, '-', '_', '.', not starting
// or ending with '-' or '.', at most 96 characters (the Hub's rule).
bool isHubName(std::string_view part) {
  if (part.empty() || part.size() > 96) return false;
  for (char c : part) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return part.front() != '-' && part.front() != '.' && part.back() != '-' && part.back() != '.' &&
         part.find("..") == std::string_view::npos;
}

bool hasSpaceOrControl(std::string_view text) {
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) ||
        std::iscntrl(static_cast<unsigned char>(c))) {
      return true;
    }
  }
  return false;
}

// A relative path without "." or ".." components and without empty ones.
bool isPlainRelativePath(std::string_view path) {
  if (path.empty()) return true;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

Status malformed(std::string_view text, const char* accepted) {
  return invalidArgument("model source \"" + std::string(text) + "\" is not valid: " + accepted);
}

}  // namespace

bool isDnsSubdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  auto alnum = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c));
  };
  // Labels separated by '.', each starting and ending with a letter or digit.
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('.', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view label = name.substr(start, end - start);
    if (label.empty() || !alnum(label.front()) || !alnum(label.back())) return false;
    for (char c : label) {
      if (!alnum(c) && c != '-') return false;
    }
    start = end + 1;
  }
  return true;
}

StatusOr<ModelSource> parseModelSource(std::string_view text) {
  ModelSource source;
  source.text = std::string(text);
  if (text.empty()) return invalidArgument("model source is empty");
  if (hasSpaceOrControl(text)) {
    return malformed(text, "it holds a space or a control character");
  }
  if (text.starts_with(kHubScheme)) {
    source.kind = SourceKind::kHuggingFace;
    std::string_view rest = text.substr(kHubScheme.size());
    std::string_view revision = "main";
    if (size_t at = rest.find('@'); at != std::string_view::npos) {
      revision = rest.substr(at + 1);
      rest = rest.substr(0, at);
      // As git's ref names: no empty component, none starting with '.'
      // (".", which named the directory above every revision's, or "a/.b").
      if (revision.empty() || revision.find("..") != std::string_view::npos ||
          revision.front() == '/' || revision.back() == '/' || revision.front() == '.' ||
          revision.find("/.") != std::string_view::npos ||
          revision.find("//") != std::string_view::npos) {
        return malformed(text, "expected hf://org/name@revision with a branch, tag or commit");
      }
    }
    const size_t slash = rest.find('/');
    const bool two_parts = slash != std::string_view::npos;
    if ((two_parts && (!isHubName(rest.substr(0, slash)) || !isHubName(rest.substr(slash + 1)))) ||
        (!two_parts && !isHubName(rest))) {
      return malformed(text,
                       "expected hf://org/name[@revision] (letters, digits, '-', '_' and '.' in "
                       "each name)");
    }
    source.repo = std::string(rest);
    source.revision = std::string(revision);
    return source;
  }
  if (text.starts_with(kClaimScheme)) {
    source.kind = SourceKind::kClaim;
    std::string_view rest = text.substr(kClaimScheme.size());
    const size_t slash = rest.find('/');
    std::string_view claim = rest.substr(0, slash);
    std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
    while (path.ends_with('/')) path.remove_suffix(1);
    if (!isDnsSubdomain(claim)) {
      return malformed(text,
                       "expected pvc://claim[/path] with a claim name of lower-case "
                       "letters, digits, '-' and '.'");
    }
    if (!isPlainRelativePath(path)) {
      return malformed(text, "the path inside the claim must be relative, without '.' or '..'");
    }
    source.claim = std::string(claim);
    source.path = std::string(path);
    return source;
  }
  if (text.starts_with(kImageScheme)) {
    source.kind = SourceKind::kImage;
    source.image = std::string(text.substr(kImageScheme.size()));
    if (source.image.empty() || source.image.find("://") != std::string::npos) {
      return malformed(text, "expected oci://registry/repository[:tag][@digest]");
    }
    return source;
  }
  if (size_t scheme = text.find("://"); scheme != std::string_view::npos) {
    return malformed(text, "accepted schemes are hf://, pvc:// and oci://, or a plain path");
  }
  source.kind = SourceKind::kPath;
  source.path = std::string(text);
  return source;
}

std::string hubCacheDirectory(const std::string& root, const ModelSource& source) {
  auto dashed = [](const std::string& text) {
    std::string out;
    for (char c : text) {
      if (c == '/') {
        out += "--";
      } else {
        out += c;
      }
    }
    return out;
  };
  std::string base = root;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + "/hf/models--" + dashed(source.repo) + "/" + dashed(source.revision);
}

}  // namespace tandem::model_source
