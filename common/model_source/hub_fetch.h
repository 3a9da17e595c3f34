// Fetching a model from a Hugging Face Hub repository into a directory the
// agent loads: `tandem-model fetch`, the init container of a pool whose
// source is hf://, and local mode.
//
// The protocol is the Hub's public HTTP API (what huggingface_hub speaks):
//   GET {endpoint}/api/models/{repo}/revision/{revision}   → {"sha": commit, ...}
//   GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true
//       → [{"type", "path", "size", "oid", "lfs": {"oid": sha256, "size"}}],
//         paged by a `Link: <url>; rel="next"` header
//   GET {endpoint}/{repo}/resolve/{commit}/{path}
//       → the bytes, or a redirect (LFS files: to a CDN, followed without the
//         token); `Range: bytes=N-` resumes
// with `Authorization: Bearer <token>` when a token is given, and the Hub's
// `X-Error-Code` header (RepoNotFound, GatedRepo, RevisionNotFound,
// EntryNotFound) read into messages.
//
// What is fetched: the top-level files the agent loads (config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, chat_template.jinja/.json, *.safetensors and their
// index), nothing else, several at a time. The revision is resolved to its
// commit first and every file is read at that commit, so a branch that moves
// mid-fetch cannot mix two versions.
//
// On disk, in `directory`: each file is downloaded to
// .tandem-fetch/<name>.part (a cut connection or a killed process resumes
// from its size), verified — size, and the SHA-256 the Hub lists for an LFS
// file or the git blob id for any other — then renamed into place. Last,
// .tandem-fetch/complete.json records the repository, revision, commit and
// files. A directory holding .tandem-fetch/ without complete.json is an
// incomplete download (modelDirectoryProblem). Pods that share the directory
// (a pool's cache volume) take an exclusive lock on .tandem-fetch/lock, so
// one downloads and the others then find it complete.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace tandem::model_source {

struct HubFetchOptions {
  std::string repo;                                 // "org/name"
  std::string revision = "main";                    // branch, tag or commit
  std::string endpoint = "https://huggingface.co";  // a mirror's URL; no trailing path needed
  std::string token;                                // empty: anonymous
  // Where the token comes from, for messages: "HF_TOKEN", "the Secret hf/token".
  std::string token_source = "HF_TOKEN";
  std::filesystem::path directory;
  int parallel = 4;  // files downloaded at once
  int retries = 5;   // per file, after a cut connection or a 5xx, resuming
  double connect_timeout_s = 10;
  double read_timeout_s = 60;  // no byte for this long fails the attempt
  double retry_delay_s = 0.5;  // doubled after each retry of a file
  std::string ca_file;         // PEM bundle for https; empty: the system's
  // Only the files a tokenizer and chat template need (isTokenizerFile): a
  // router's copy. Such a fetch keeps files it does not list, and a later
  // whole-model fetch does not take its directory for complete.
  bool tokenizer_only = false;
  // Called from the downloading threads (serialised) as bytes arrive.
  std::function<void(const std::string& file, int64_t done, int64_t size)> progress;
  // Once set, the fetch stops as soon as it can (between a download's
  // chunks; a metadata call runs to its answer or timeout): Aborted.
  const std::atomic<bool>* cancel = nullptr;
};

struct HubFile {
  std::string path;
  int64_t size = 0;
  std::string git_oid;  // the git blob id (SHA-1 of "blob <size>\0" + bytes)
  std::string sha256;   // LFS files only
};

struct HubFetchResult {
  std::string commit;
  std::vector<HubFile> files;  // what the directory now holds, sorted by path
  int64_t bytes_total = 0;
  int64_t bytes_downloaded = 0;   // over the network this run (resumes count what was new)
  bool already_complete = false;  // complete.json named this commit: nothing fetched
  // Not empty when the Hub could not be asked and a complete download of the
  // same revision was kept: why the Hub could not be asked.
  std::string offline;
};

// Fetches the repository's model files into options.directory (created).
// Errors: PermissionDenied (401/403, naming token_source), NotFound (the
// repository, revision or a file), DataLoss (a file whose bytes do not match
// the Hub's hash: removed, named), Unavailable (the endpoint unreachable or
// failing after the retries), FailedPrecondition (the directory unusable).
StatusOr<HubFetchResult> fetchHubModel(const HubFetchOptions& options);

// Whether `path` (a top-level file name in a repository) is one the agent
// loads; one a tokenizer and chat template need (config.json, tokenizer and
// chat template files, generation_config.json).
bool isModelFile(const std::string& path);
bool isTokenizerFile(const std::string& path);

// Why an agent must not load `directory` (an incomplete or failed download
// in it), or nullopt when nothing says so.
std::optional<std::string> modelDirectoryProblem(const std::filesystem::path& directory);

// The git blob id of a file (what the Hub lists as a non-LFS file's oid).
std::string gitBlobId(const std::filesystem::path& file);
// A file's SHA-256, lower-case hex.
std::string fileSha256(const std::filesystem::path& file);

}  // namespace tandem::model_source
