#include "common/model_source/hub_fetch.h"

#include <fcntl.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

namespace tandem::model_source {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStateDirectory = ".tandem-fetch";
constexpr const char* kCompleteFile = "complete.json";
constexpr const char* kLockFile = "lock";
constexpr int kMaxRedirects = 5;
constexpr size_t kMaxMetadataBytes = 64u << 20;

// "https://host:port" and "/path?query" of an absolute URL.
struct Url {
  std::string origin;
  std::string target;
};

std::optional<Url> splitUrl(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return std::nullopt;
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") return std::nullopt;
  const size_t path_start = url.find('/', scheme_end + 3);
  Url parts;
  parts.origin = url.substr(0, path_start);
  parts.target = path_start == std::string::npos ? "/" : url.substr(path_start);
  if (parts.origin.size() <= scheme_end + 3) return std::nullopt;
  return parts;
}

// Percent-encodes every byte but RFC 3986's unreserved ones (and '/' when kept).
std::string percentEncode(const std::string& text, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

struct Reply {
  int status = 0;
  httplib::Headers headers;
  std::string body;  // when the body was not given to a sink
  std::string url;   // the last URL asked (after redirects)

  std::string header(const char* name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// What a failed exchange means, in words (cpp-httplib names only the enum).
std::string describeFailure(httplib::Error error, const HubFetchOptions& options) {
  switch (error) {
    case httplib::Error::Connection:
      return "cannot connect";
    case httplib::Error::ConnectionTimeout: {
      std::ostringstream text;
      text << "no connection within " << options.connect_timeout_s << " s";
      return text.str();
    }
    case httplib::Error::Read:
      return "the connection closed or stalled mid-answer";
    case httplib::Error::Write:
      return "the connection closed while sending";
    case httplib::Error::SSLConnection:
      return "the TLS handshake failed";
    case httplib::Error::SSLServerVerification:
      return "the server's TLS certificate was not verified (its CA is in neither " +
             (options.ca_file.empty() ? std::string("the system's CA bundle; give --ca-file")
                                      : "--ca-file " + options.ca_file) +
             ")";
    default:
      return httplib::to_string(error);
  }
}

// A sink for a 2xx body: told the answer's status first (return false to
// refuse the body), then the bytes (return false to stop reading).
struct BodySink {
  std::function<bool(const Reply&)> begin;
  std::function<bool(const char*, size_t)> write;
};

class HubHttp {
 public:
  explicit HubHttp(const HubFetchOptions& options) : options_(options) {
    if (auto endpoint = splitUrl(options.endpoint)) endpoint_origin_ = endpoint->origin;
  }

  // GET `url`, following redirects (relative ones on the same origin, and
  // absolute ones, which lose the token when they leave the endpoint's origin).
  StatusOr<Reply> get(const std::string& url, const httplib::Headers& extra,
                      const BodySink* sink = nullptr) const {
    std::string current = url;
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
      std::optional<Url> parts = splitUrl(current);
      if (!parts) return invalidArgument("not an http(s) URL: " + current);
      httplib::Client client(parts->origin);
      client.set_follow_location(false);
      client.set_keep_alive(false);
      client.set_decompress(true);
      client.set_connection_timeout(std::chrono::duration<double>(options_.connect_timeout_s));
      client.set_read_timeout(std::chrono::duration<double>(options_.read_timeout_s));
      if (!options_.ca_file.empty()) client.set_ca_cert_path(options_.ca_file);
      httplib::Headers headers = extra;
      headers.emplace("User-Agent", "tandem-model");
      if (!options_.token.empty() && parts->origin == endpoint_origin_) {
        headers.emplace("Authorization", "Bearer " + options_.token);
      }
      Reply reply;
      reply.url = current;
      bool streaming = false;
      bool too_big = false;
      httplib::Result result = client.Get(
          parts->target, headers,
          [&](const httplib::Response& response) {
            reply.status = response.status;
            reply.headers = response.headers;
            streaming = sink != nullptr && response.status >= 200 && response.status < 300;
            return !streaming || sink->begin(reply);
          },
          [&](const char* data, size_t size) {
            if (streaming) return sink->write(data, size);
            if (reply.body.size() + size > kMaxMetadataBytes) {
              too_big = true;
              return false;
            }
            reply.body.append(data, size);
            return true;
          });
      if (too_big) return unavailable("GET " + current + ": the answer exceeds 64 MiB");
      if (!result) {
        if (result.error() == httplib::Error::Canceled && reply.status != 0 && !streaming) {
          return reply;  // the sink refused the body of this status
        }
        return unavailable("GET " + current + ": " + describeFailure(result.error(), options_));
      }
      const int status = reply.status;
      const bool redirect =
          status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
      if (!redirect) return reply;
      std::string location = reply.header("Location");
      if (location.empty()) return unavailable("GET " + current + ": redirect without a Location");
      current = location.front() == '/' ? parts->origin + location : location;
    }
    return unavailable("GET " + url + ": more than 5 redirects");
  }

 private:
  const HubFetchOptions& options_;
  std::string endpoint_origin_;
};

// ASCII's control characters (0x00-0x1f, 0x7f), whatever the locale.
bool isControl(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }

// The Hub's own words for an error answer: X-Error-Code / X-Error-Message,
// else the JSON body's "error".
std::string hubErrorText(const Reply& reply) {
  std::string code = reply.header("X-Error-Code");
  std::string message = reply.header("X-Error-Message");
  if (message.empty()) {
    nlohmann::json body = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_object() && body.contains("error") && body["error"].is_string()) {
      message = body["error"].get<std::string>();
    }
  }
  std::string text = std::to_string(reply.status);
  if (!code.empty()) text += " " + code;
  if (!message.empty()) text += ": " + message;
  // One line of a readable length whatever the server sent: control
  // characters (newlines, terminal escapes) become spaces, and the advice
  // that may follow must fit a termination message (4,096 bytes).
  std::replace_if(text.begin(), text.end(), isControl, ' ');
  constexpr size_t kMaxText = 1024;
  if (text.size() > kMaxText) text = text.substr(0, kMaxText) + "...";
  return text;
}

// A name with a byte a file name should not hold: a control character
// (NUL would cut the path short).
bool hasControlCharacter(std::string_view text) {
  return std::any_of(text.begin(), text.end(), isControl);
}

// A string member of a JSON object, "" when absent or of another type.
std::string stringMember(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

class Fetcher {
 public:
  explicit Fetcher(const HubFetchOptions& options)
      : options_(options),
        http_(options),
        endpoint_(trimSlash(options.endpoint)),
        name_("hf://" + options.repo + "@" + options.revision),
        state_(options.directory / kStateDirectory) {}

  StatusOr<HubFetchResult> run();

 private:
  static std::string trimSlash(std::string text) {
    while (!text.empty() && text.back() == '/') text.pop_back();
    return text;
  }

  // An error answer as a Status saying what was asked and what to do.
  Status answerError(const Reply& reply, const std::string& what) const;
  // GET of one of the Hub's JSON answers; no answer is an error naming the
  // source.
  StatusOr<Reply> getJson(const std::string& url) const;
  // " (runs as uid U ...; D is owned by ...)" for a permission error; "".
  std::string ownerHint(const std::error_code& error) const;
  StatusOr<std::string> resolveCommit();
  StatusOr<std::vector<HubFile>> listFiles(const std::string& commit);
  Status download(const HubFile& file);
  // Leaves in `files` only the weight files the agent loads (downloading
  // the index first when the model is sharded).
  Status keepLoadedWeights(std::vector<HubFile>& files);
  Status verify(const fs::path& path, const HubFile& file) const;
  std::optional<nlohmann::json> readMarker() const;
  Status writeMarker(const std::string& commit, const std::vector<HubFile>& files) const;
  void report(const std::string& file, int64_t done, int64_t size);

  const HubFetchOptions& options_;
  HubHttp http_;
  std::string endpoint_;
  std::string name_;  // "hf://org/name@revision", for messages
  fs::path state_;
  std::string commit_;  // what the revision resolved to
  std::atomic<int64_t> downloaded_{0};
  std::atomic<bool> stop_{false};  // another file failed
  // stop_, or the caller cancelled.
  bool stopping() const { return stop_ || (options_.cancel != nullptr && options_.cancel->load()); }
  std::mutex progress_mutex_;
};

Status Fetcher::answerError(const Reply& reply, const std::string& what) const {
  const std::string hub = hubErrorText(reply);
  const std::string code = reply.header("X-Error-Code");
  if (reply.status == 401 || reply.status == 403) {
    std::string advice =
        options_.token.empty()
            ? "no token was given: set " + options_.token_source + " to a token with read access"
            : "the token from " + options_.token_source + " has no access to it";
    return permissionDenied(name_ + ": the Hub refused " + what + " (" + hub + "); " + advice);
  }
  if (reply.status == 404) {
    if (code == "RevisionNotFound") {
      return notFound(name_ + ": revision \"" + options_.revision + "\" not found on " + endpoint_ +
                      " (" + hub + ")");
    }
    if (code == "RepoNotFound") {
      return notFound(name_ + ": repository " + options_.repo + " not found on " + endpoint_ +
                      " (" + hub + "); a private repository needs a token in " +
                      options_.token_source);
    }
    return notFound(name_ + ": " + what + " not found (" + hub + ")");
  }
  return unavailable(name_ + ": " + what + " failed: " + hub);
}

StatusOr<Reply> Fetcher::getJson(const std::string& url) const {
  StatusOr<Reply> reply = http_.get(url, {{"Accept", "application/json"}});
  if (!reply.isOk()) return Status(reply.status().code(), name_ + ": " + reply.status().message());
  return reply;
}

StatusOr<std::string> Fetcher::resolveCommit() {
  const std::string url = endpoint_ + "/api/models/" + percentEncode(options_.repo, true) +
                          "/revision/" + percentEncode(options_.revision, false);
  StatusOr<Reply> reply = getJson(url);
  if (!reply.isOk()) return reply.status();
  if (reply->status != 200) return answerError(*reply, "the revision's metadata");
  nlohmann::json body = nlohmann::json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("sha") || !body["sha"].is_string()) {
    return unavailable(name_ + ": the answer of " + url + " has no commit (\"sha\")");
  }
  std::string commit = body["sha"].get<std::string>();
  const bool hex = commit.size() == 40 && std::all_of(commit.begin(), commit.end(), [](char c) {
                     return std::isxdigit(static_cast<unsigned char>(c));
                   });
  if (!hex) return unavailable(name_ + ": the Hub's commit \"" + commit + "\" is not a git hash");
  return commit;
}

// The value of `Link: <url>; rel="next"`, or "".
std::string nextPage(const std::string& link) {
  size_t pos = 0;
  while (pos < link.size()) {
    const size_t open = link.find('<', pos);
    if (open == std::string::npos) break;
    const size_t close = link.find('>', open);
    if (close == std::string::npos) break;
    const size_t end = std::min(link.find(',', close), link.size());
    if (link.substr(close, end - close).find("rel=\"next\"") != std::string::npos) {
      return link.substr(open + 1, close - open - 1);
    }
    pos = end + 1;
  }
  return "";
}

StatusOr<std::vector<HubFile>> Fetcher::listFiles(const std::string& commit) {
  std::vector<HubFile> files;
  std::string url =
      endpoint_ + "/api/models/" + percentEncode(options_.repo, true) + "/tree/" + commit;
  for (int page = 0; !url.empty(); ++page) {
    if (page >= 1000) return unavailable(name_ + ": the file list has more than 1,000 pages");
    StatusOr<Reply> reply = getJson(url);
    if (!reply.isOk()) return reply.status();
    if (reply->status != 200) return answerError(*reply, "the file list");
    nlohmann::json entries =
        nlohmann::json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
    if (!entries.is_array()) return unavailable(name_ + ": the file list is not a JSON array");
    for (const nlohmann::json& entry : entries) {
      if (!entry.is_object() || stringMember(entry, "type") != "file") continue;
      HubFile file;
      file.path = stringMember(entry, "path");
      const bool wanted =
          options_.tokenizer_only ? isTokenizerFile(file.path) : isModelFile(file.path);
      if (file.path.find('/') != std::string::npos || !wanted) continue;
      if (hasControlCharacter(file.path)) {
        return unavailable(name_ + ": the file list names a file with a control character");
      }
      auto size_of = [](const nlohmann::json& object) -> std::optional<int64_t> {
        auto size = object.find("size");
        if (size == object.end() || !size->is_number_integer() || size->get<int64_t>() < 0) {
          return std::nullopt;
        }
        return size->get<int64_t>();
      };
      std::optional<int64_t> size = size_of(entry);
      file.git_oid = stringMember(entry, "oid");
      if (auto lfs = entry.find("lfs"); lfs != entry.end() && lfs->is_object()) {
        file.sha256 = stringMember(*lfs, "oid");
        if (lfs->contains("size")) size = size_of(*lfs);
      }
      if (!size) {
        return unavailable(name_ + ": the file list gives " + file.path +
                           " no size (a whole number of bytes)");
      }
      file.size = *size;
      if (file.sha256.empty() && file.git_oid.empty()) {
        return unavailable(name_ + ": the file list gives " + file.path + " no hash to verify");
      }
      files.push_back(std::move(file));
    }
    url = nextPage(reply->header("Link"));
  }
  std::sort(files.begin(), files.end(),
            [](const HubFile& a, const HubFile& b) { return a.path < b.path; });
  if (auto twice =
          std::adjacent_find(files.begin(), files.end(),
                             [](const HubFile& a, const HubFile& b) { return a.path == b.path; });
      twice != files.end()) {
    return unavailable(name_ + ": the file list names " + twice->path + " twice");
  }
  auto has = [&](auto predicate) { return std::any_of(files.begin(), files.end(), predicate); };
  if (!has([](const HubFile& f) { return f.path == "config.json"; })) {
    return notFound(name_ + " (commit " + commit + ") has no config.json");
  }
  if (!options_.tokenizer_only &&
      !has([](const HubFile& f) { return f.path.ends_with(".safetensors"); })) {
    return failedPrecondition(name_ + " (commit " + commit +
                              ") has no .safetensors file; the agent loads safetensors weights");
  }
  return files;
}

void Fetcher::report(const std::string& file, int64_t done, int64_t size) {
  if (!options_.progress) return;
  std::lock_guard<std::mutex> lock(progress_mutex_);
  options_.progress(file, done, size);
}

Status Fetcher::verify(const fs::path& path, const HubFile& file) const {
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (error || static_cast<int64_t>(size) != file.size) {
    return dataLoss(file.path + ": downloaded " + std::to_string(error ? 0 : size) +
                    " bytes, the Hub lists " + std::to_string(file.size));
  }
  if (!file.sha256.empty()) {
    const std::string actual = fileSha256(path);
    if (actual != file.sha256) {
      return dataLoss(file.path + ": the SHA-256 of the downloaded bytes is " + actual +
                      ", the Hub lists " + file.sha256);
    }
  } else {
    const std::string actual = gitBlobId(path);
    if (actual != file.git_oid) {
      return dataLoss(file.path + ": the git blob id of the downloaded bytes is " + actual +
                      ", the Hub lists " + file.git_oid);
    }
  }
  return Status::ok();
}

Status Fetcher::download(const HubFile& file) {
  const fs::path final_path = options_.directory / file.path;
  const fs::path part = state_ / (file.path + ".part");
  std::error_code error;
  // A file already in place (a resumed fetch, or one the last commit shared)
  // is kept when it verifies.
  if (fs::exists(final_path, error) && verify(final_path, file).isOk()) {
    report(file.path, file.size, file.size);
    return Status::ok();
  }
  const std::string url = endpoint_ + "/" + percentEncode(options_.repo, true) + "/resolve/" +
                          commit_ + "/" + percentEncode(file.path, true);
  double delay = options_.retry_delay_s;
  std::string last_failure;
  for (int attempt = 0; attempt <= options_.retries && !stopping(); ++attempt) {
    if (attempt > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      delay *= 2;
    }
    int64_t offset = fs::exists(part, error) ? static_cast<int64_t>(fs::file_size(part, error)) : 0;
    if (offset > file.size) {
      fs::remove(part, error);
      offset = 0;
    }
    const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return failedPrecondition(part.string() + ": cannot be written");
    if (offset == file.size) {  // whole (an empty file is created whole)
      ::close(fd);
      break;
    }
    httplib::Headers headers = {{"Accept-Encoding", "identity"}};
    if (offset > 0) headers.emplace("Range", "bytes=" + std::to_string(offset) + "-");
    int64_t done = offset;
    bool write_failed = false;
    bool too_long = false;  // more bytes than the file list gives the file
    std::string bad_range;  // a 206 whose Content-Range does not start at `offset`
    BodySink sink;
    sink.begin = [&](const Reply& reply) {
      if (reply.status == 206) {
        // "bytes START-END/SIZE" must start where the part ends.
        const std::string range = reply.header("Content-Range");
        if (!range.starts_with("bytes " + std::to_string(offset) + "-")) {
          bad_range = range;
          return false;
        }
        return true;
      }
      if (offset > 0 && ::ftruncate(fd, 0) != 0) return false;  // the whole file is coming
      done = 0;
      return true;
    };
    sink.write = [&](const char* data, size_t size) {
      if (stopping()) return false;
      if (static_cast<uint64_t>(file.size - done) < size) {
        too_long = true;  // written no further: a body without end fills no volume
        return false;
      }
      while (size > 0) {
        const ssize_t written = ::write(fd, data, size);
        if (written <= 0) {
          write_failed = true;
          return false;
        }
        data += written;
        size -= static_cast<size_t>(written);
        done += written;
        downloaded_ += written;
      }
      report(file.path, done, file.size);
      return true;
    };
    StatusOr<Reply> reply = http_.get(url, headers, &sink);
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (write_failed || !synced) {
      return failedPrecondition(part.string() + ": writing failed (is the volume full?)");
    }
    if (too_long) {
      fs::remove(part, error);
      return dataLoss(name_ + ": " + file.path + ": the Hub sent more than the " +
                      std::to_string(file.size) +
                      " bytes its file list gives it; the part was removed");
    }
    if (!bad_range.empty()) {  // start again from the first byte
      fs::remove(part, error);
      last_failure = "GET " + url + ": asked for bytes from " + std::to_string(offset) +
                     ", the answer's Content-Range is \"" + bad_range + "\"";
      continue;
    }
    if (!reply.isOk()) {
      last_failure = reply.status().message();
      continue;  // a cut connection or no answer: resume
    }
    const int status = reply->status;
    if (status == 206 || status == 200) {
      if (done >= file.size) break;
      last_failure = "GET " + reply->url + ": the body ended after " + std::to_string(done) +
                     " of " + std::to_string(file.size) + " bytes";
      continue;
    }
    if (status == 416) {  // the part is not a prefix of what the server has
      fs::remove(part, error);
      last_failure = "GET " + reply->url + ": 416 Range Not Satisfiable";
      continue;
    }
    if (status == 429 || status >= 500) {
      last_failure = "GET " + reply->url + ": " + hubErrorText(*reply);
      continue;
    }
    return answerError(*reply, file.path);
  }
  if (stopping()) return Status(StatusCode::kAborted, "stopped");
  const int64_t have =
      fs::exists(part, error) ? static_cast<int64_t>(fs::file_size(part, error)) : 0;
  if (have != file.size) {
    return unavailable(name_ + ": " + file.path + " incomplete after " +
                       std::to_string(options_.retries + 1) + " attempts (" + std::to_string(have) +
                       " of " + std::to_string(file.size) +
                       " bytes; the next fetch resumes): " + last_failure);
  }
  if (Status verified = verify(part, file); !verified.isOk()) {
    fs::remove(part, error);
    return dataLoss(name_ + ": " + verified.message() + "; the file was removed");
  }
  fs::rename(part, final_path, error);
  if (error) return failedPrecondition(final_path.string() + ": " + error.message());
  return Status::ok();
}

std::optional<nlohmann::json> Fetcher::readMarker() const {
  std::ifstream in(state_ / kCompleteFile);
  if (!in) return std::nullopt;
  nlohmann::json marker = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!marker.is_object() || !marker.contains("files") || !marker["files"].is_array()) {
    return std::nullopt;
  }
  return marker;
}

void syncDirectory(const fs::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

Status Fetcher::writeMarker(const std::string& commit, const std::vector<HubFile>& files) const {
  nlohmann::json listed = nlohmann::json::array();
  for (const HubFile& file : files) {
    nlohmann::json entry = {{"path", file.path}, {"size", file.size}};
    if (!file.sha256.empty()) entry["sha256"] = file.sha256;
    if (!file.git_oid.empty()) entry["oid"] = file.git_oid;
    listed.push_back(std::move(entry));
  }
  const nlohmann::json marker = {{"repo", options_.repo},
                                 {"revision", options_.revision},
                                 {"commit", commit},
                                 {"scope", options_.tokenizer_only ? "tokenizer" : "model"},
                                 {"files", listed}};
  const fs::path temporary = state_ / "complete.json.tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << marker.dump(2) << "\n";
    if (!out.flush()) return failedPrecondition(temporary.string() + ": cannot be written");
  }
  std::error_code error;
  fs::rename(temporary, state_ / kCompleteFile, error);
  if (error) return failedPrecondition((state_ / kCompleteFile).string() + ": " + error.message());
  syncDirectory(options_.directory);
  syncDirectory(state_);
  return Status::ok();
}

// The files a marker lists, in HubFile form.
std::vector<HubFile> markerFiles(const nlohmann::json& marker) {
  std::vector<HubFile> files;
  for (const nlohmann::json& entry : marker["files"]) {
    if (!entry.is_object()) continue;
    HubFile file;
    file.path = entry.value("path", "");
    file.size = entry.value("size", int64_t{0});
    file.sha256 = entry.value("sha256", "");
    file.git_oid = entry.value("oid", "");
    files.push_back(std::move(file));
  }
  return files;
}

// Holds an exclusive flock on a file for its lifetime.
class DirectoryLock {
 public:
  explicit DirectoryLock(const fs::path& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace

Status Fetcher::keepLoadedWeights(std::vector<HubFile>& files) {
  // The agent loads model.safetensors when there is one, else the shards
  // model.safetensors.index.json names: other weight files (Mistral's
  // consolidated.safetensors beside its shards, another index) would double
  // the download for nothing.
  auto named = [&](const std::string& path) {
    return std::any_of(files.begin(), files.end(),
                       [&](const HubFile& file) { return file.path == path; });
  };
  auto isWeights = [](const std::string& path) {
    return path.ends_with(".safetensors") || path.ends_with(".safetensors.index.json");
  };
  std::set<std::string> wanted;
  if (named("model.safetensors")) {
    wanted.insert("model.safetensors");
  } else if (named("model.safetensors.index.json")) {
    const HubFile& index = *std::find_if(files.begin(), files.end(), [](const HubFile& file) {
      return file.path == "model.safetensors.index.json";
    });
    if (Status fetched = download(index); !fetched.isOk()) return fetched;
    std::ifstream in(options_.directory / index.path, std::ios::binary);
    const nlohmann::json root = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    const auto map = root.is_object() ? root.find("weight_map") : root.end();
    if (!root.is_object() || map == root.end() || !map->is_object()) {
      return unavailable(name_ + ": " + index.path + " has no weight_map object");
    }
    wanted.insert(index.path);
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string()) {
        return unavailable(name_ + ": " + index.path + ": weight_map." + tensor +
                           " is not a file name");
      }
      if (!named(shard.get<std::string>())) {
        return unavailable(name_ + ": " + index.path + " names " + shard.get<std::string>() +
                           " (for " + tensor + "), which the repository does not hold");
      }
      wanted.insert(shard.get<std::string>());
    }
  } else {
    return Status::ok();  // the agent will say what is missing
  }
  std::erase_if(files, [&](const HubFile& file) {
    return isWeights(file.path) && wanted.count(file.path) == 0;
  });
  return Status::ok();
}

// For a directory this process may not write: who it runs as, and who owns
// the nearest existing directory above the target, with its mode (a shared
// cache volume whose driver ignored the pod's fsGroup, say).
std::string Fetcher::ownerHint(const std::error_code& error) const {
  if (error != std::errc::permission_denied && error != std::errc::operation_not_permitted &&
      error != std::errc::read_only_file_system) {
    return "";
  }
  fs::path existing = state_;
  std::error_code ignored;
  while (existing.has_parent_path() && existing != existing.root_path() &&
         !fs::exists(existing, ignored)) {
    existing = existing.parent_path();
  }
  struct stat info {};
  std::ostringstream hint;
  hint << " (this process runs as uid " << ::geteuid() << ", gid " << ::getegid();
  if (::stat(existing.c_str(), &info) == 0) {
    hint << "; " << existing.string() << " is owned by uid " << info.st_uid << ", gid "
         << info.st_gid << ", mode " << std::oct << std::setw(4) << std::setfill('0')
         << (info.st_mode & 07777) << std::dec;
  }
  hint << ": the directory must be writable by this user or group)";
  return hint.str();
}

StatusOr<HubFetchResult> Fetcher::run() {
  if (options_.repo.empty()) return invalidArgument("no repository to fetch");
  if (options_.directory.empty()) return invalidArgument("no directory to fetch into");
  if (!splitUrl(endpoint_)) {
    return invalidArgument("the Hub endpoint \"" + options_.endpoint +
                           "\" is not an http:// or https:// URL");
  }
  std::error_code error;
  fs::create_directories(state_, error);
  if (error) return failedPrecondition(state_.string() + ": " + error.message() + ownerHint(error));
  DirectoryLock lock(state_ / kLockFile);
  if (!lock.held()) return failedPrecondition((state_ / kLockFile).string() + ": cannot lock");

  StatusOr<std::string> commit = resolveCommit();
  const std::optional<nlohmann::json> marker = readMarker();
  auto complete = [&](const std::string& commit_text) -> std::optional<HubFetchResult> {
    if (!marker || marker->value("commit", "") != commit_text) return std::nullopt;
    // A tokenizer's copy is not a model; a model holds a tokenizer.
    if (!options_.tokenizer_only && marker->value("scope", "model") != "model") return std::nullopt;
    HubFetchResult result;
    result.commit = commit_text;
    result.files = markerFiles(*marker);
    for (const HubFile& file : result.files) {
      std::error_code ignored;
      if (static_cast<int64_t>(fs::file_size(options_.directory / file.path, ignored)) !=
          file.size) {
        return std::nullopt;
      }
      result.bytes_total += file.size;
    }
    result.already_complete = true;
    return result;
  };
  if (!commit.isOk()) {
    // The Hub unreachable: a complete download of the same revision serves
    // (as the Hub's own client falls back to its cache), said in `offline`.
    if (commit.status().code() == StatusCode::kUnavailable && marker &&
        marker->value("revision", "") == options_.revision) {
      if (std::optional<HubFetchResult> cached = complete(marker->value("commit", ""))) {
        cached->offline = commit.status().message();
        return *cached;
      }
    }
    return commit.status();
  }
  if (std::optional<HubFetchResult> cached = complete(*commit)) return *cached;
  HubFetchResult result;
  result.commit = *commit;
  commit_ = *commit;
  StatusOr<std::vector<HubFile>> files = listFiles(*commit);
  if (!files.isOk()) return files.status();
  if (stopping()) return Status(StatusCode::kAborted, "stopped");
  // From here the directory changes: it is incomplete until the marker is back.
  fs::remove(state_ / kCompleteFile, error);
  syncDirectory(state_);
  if (!options_.tokenizer_only) {
    if (Status kept = keepLoadedWeights(*files); !kept.isOk()) return kept;
  }

  std::atomic<size_t> next{0};
  std::mutex failure_mutex;
  std::optional<Status> failure;
  auto worker = [&] {
    for (size_t i = next++; i < files->size() && !stopping(); i = next++) {
      Status status = download((*files)[i]);
      if (!status.isOk()) {
        std::lock_guard<std::mutex> guard(failure_mutex);
        if (!failure) failure = status;
        stop_ = true;
      }
    }
  };
  const int threads = std::clamp(options_.parallel, 1, 64);
  std::vector<std::thread> pool;
  for (int i = 1; i < std::min<int>(threads, static_cast<int>(files->size())); ++i) {
    pool.emplace_back(worker);
  }
  worker();
  for (std::thread& thread : pool) thread.join();
  if (failure) return *failure;

  // Files the previous commit had and this one has not go, with stray parts.
  std::set<std::string> kept;
  for (const HubFile& file : *files) kept.insert(file.path);
  if (marker && !options_.tokenizer_only) {
    for (const HubFile& old : markerFiles(*marker)) {
      if (!kept.count(old.path) && old.path.find('/') == std::string::npos && !old.path.empty()) {
        fs::remove(options_.directory / old.path, error);
      }
    }
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(state_, error)) {
    if (entry.path().extension() == ".part") fs::remove(entry.path(), error);
  }
  if (Status written = writeMarker(*commit, *files); !written.isOk()) return written;
  for (const HubFile& file : *files) result.bytes_total += file.size;
  result.bytes_downloaded = downloaded_;
  result.files = std::move(*files);
  return result;
}

bool isTokenizerFile(const std::string& path) {
  static const std::set<std::string> kNames = {
      "config.json",           "generation_config.json",  "tokenizer.json",
      "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
      "chat_template.json",
  };
  return kNames.count(path) > 0;
}

bool isModelFile(const std::string& path) {
  return isTokenizerFile(path) || path.ends_with(".safetensors") ||
         path.ends_with(".safetensors.index.json");
}

std::optional<std::string> modelDirectoryProblem(const fs::path& directory) {
  std::error_code error;
  if (!fs::is_directory(directory / kStateDirectory, error)) return std::nullopt;
  if (fs::exists(directory / kStateDirectory / kCompleteFile, error)) return std::nullopt;
  return "model directory " + directory.string() +
         " holds an incomplete download (.tandem-fetch/complete.json is missing); "
         "`tandem-model fetch` completes it";
}

namespace {

std::string digestFile(const fs::path& file, const EVP_MD* type, const std::string& prefix) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  &EVP_MD_CTX_free);
  EVP_DigestInit_ex(context.get(), type, nullptr);
  EVP_DigestUpdate(context.get(), prefix.data(), prefix.size());
  std::ifstream in(file, std::ios::binary);
  std::vector<char> buffer(1u << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(context.get(), buffer.data(), in.gcount());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(context.get(), digest, &size);
  static const char* kHex = "0123456789abcdef";
  std::string text;
  for (unsigned int i = 0; i < size; ++i) {
    text += kHex[digest[i] >> 4];
    text += kHex[digest[i] & 15];
  }
  return text;
}

}  // namespace

std::string gitBlobId(const fs::path& file) {
  std::error_code error;
  const auto size = fs::file_size(file, error);
  std::string header = "blob " + std::to_string(error ? 0 : size);
  header.push_back('\0');
  return digestFile(file, EVP_sha1(), header);
}

std::string fileSha256(const fs::path& file) { return digestFile(file, EVP_sha256(), ""); }

StatusOr<HubFetchResult> fetchHubModel(const HubFetchOptions& options) {
  // As the Hub's own client takes a token: line breaks out, blanks around
  // it off (a Secret made from a file often ends in a newline, which would
  // break the Authorization header).
  HubFetchOptions cleaned = options;
  std::erase_if(cleaned.token, [](char c) { return c == '\r' || c == '\n'; });
  const size_t first = cleaned.token.find_first_not_of(" \t");
  cleaned.token =
      first == std::string::npos
          ? std::string()
          : cleaned.token.substr(first, cleaned.token.find_last_not_of(" \t") - first + 1);
  if (hasControlCharacter(cleaned.token)) {
    return invalidArgument(options.token_source +
                           " holds a control character; a Hub token has none");
  }
  Fetcher fetcher(cleaned);
  return fetcher.run();
}

}  // namespace tandem::model_source
