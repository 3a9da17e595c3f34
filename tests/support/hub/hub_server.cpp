#include "tests/support/hub/hub_server.h"

#include <httplib.h>
#include <openssl/sha.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/support/apiserver/test_pki.h"
#include "tests/support/httplib_serving.h"

namespace tandem::testing {
namespace {

constexpr int64_t kLfsSizeThreshold = 10ll << 20;

std::string hex(const unsigned char* digest, size_t size) {
  static const char* kHex = "0123456789abcdef";
  std::string text;
  for (size_t i = 0; i < size; ++i) {
    text += kHex[digest[i] >> 4];
    text += kHex[digest[i] & 15];
  }
  return text;
}

std::string sha256Of(const std::string& bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return hex(digest, sizeof(digest));
}

std::string gitBlobIdOf(const std::string& bytes) {
  std::string object = "blob " + std::to_string(bytes.size());
  object.push_back('\0');
  object += bytes;
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(object.data()), object.size(), digest);
  return hex(digest, sizeof(digest));
}

struct File {
  std::string path;
  std::shared_ptr<const std::string> bytes;
  bool lfs = false;
  std::string oid;     // git blob id
  std::string sha256;  // LFS files
};

struct Repo {
  std::string token;
  std::map<std::string, std::string> refs;           // branch → commit
  std::map<std::string, std::vector<File>> commits;  // commit → files, by path
};

void hubError(httplib::Response& res, int status, const std::string& code,
              const std::string& message) {
  res.status = status;
  if (!code.empty()) res.set_header("X-Error-Code", code);
  res.set_header("X-Error-Message", message);
  res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
}

}  // namespace

class HubServer::Impl {
 public:
  Impl(const std::string& host, bool tls)
      : host_(host), scheme_(tls ? "https" : "http"), hub_(makeServer(tls)), cdn_(makeServer(tls)) {
    hub_.Get(R"(/api/models/(.+)/revision/(.+))",
             [this](const httplib::Request& req, httplib::Response& res) {
               record("hub", req);
               revisionInfo(req, res);
             });
    hub_.Get(R"(/api/models/(.+)/tree/(.+))",
             [this](const httplib::Request& req, httplib::Response& res) {
               record("hub", req);
               tree(req, res);
             });
    hub_.Get(R"(/(.+)/resolve/([^/]+)/(.+))",
             [this](const httplib::Request& req, httplib::Response& res) {
               record("hub", req);
               resolve(req, res);
             });
    cdn_.Get(R"(/blobs/([0-9a-f]{64}))",
             [this](const httplib::Request& req, httplib::Response& res) {
               record("cdn", req);
               blob(req, res);
             });
    hub_port_ = hub_.bind_to_any_port(host_);
    cdn_port_ = cdn_.bind_to_any_port(host_);
    if (hub_port_ <= 0 || cdn_port_ <= 0) throw std::runtime_error("hub stand-in: cannot bind");
    hub_thread_ = serveOnThread(hub_);
    cdn_thread_ = serveOnThread(cdn_);
  }

  ~Impl() {
    hub_.stop();
    cdn_.stop();
    hub_thread_.join();
    cdn_thread_.join();
    std::error_code ignored;
    if (!tls_dir_.empty()) std::filesystem::remove_all(tls_dir_, ignored);
  }

  std::string endpoint() const { return scheme_ + "://" + host_ + ":" + std::to_string(hub_port_); }
  std::string cdnEndpoint() const {
    return scheme_ + "://" + host_ + ":" + std::to_string(cdn_port_);
  }
  std::string caCertificate() const { return ca_certificate_; }

  std::string publish(const std::string& repo_id, const std::filesystem::path& directory,
                      const std::map<std::string, std::string>& extra, const std::string& branch,
                      const std::string& token) {
    std::map<std::string, std::string> contents = extra;
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::ostringstream bytes;
      bytes << in.rdbuf();
      contents[entry.path().filename().string()] = bytes.str();
    }
    std::vector<File> files;
    std::string manifest;
    for (auto& [path, bytes] : contents) {
      File file;
      file.path = path;
      file.lfs = path.ends_with(".safetensors") || path.ends_with(".bin") ||
                 static_cast<int64_t>(bytes.size()) > kLfsSizeThreshold;
      file.oid = gitBlobIdOf(bytes);
      if (file.lfs) file.sha256 = sha256Of(bytes);
      file.bytes = std::make_shared<const std::string>(std::move(bytes));
      manifest += path + " " + file.oid + "\n";
      files.push_back(std::move(file));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    Repo& repo = repos_[repo_id];
    repo.token = token;
    const std::string commit =
        gitBlobIdOf(repo_id + "\n" + branch + "\n" + std::to_string(++commits_) + "\n" + manifest);
    repo.commits[commit] = std::move(files);
    repo.refs[branch] = commit;
    return commit;
  }

  void setPageSize(int entries) {
    std::lock_guard<std::mutex> lock(mutex_);
    page_size_ = std::max(1, entries);
  }
  void cutAfter(const std::string& file, int64_t bytes, int times) {
    std::lock_guard<std::mutex> lock(mutex_);
    cuts_[file] = {bytes, times};
  }
  void corrupt(const std::string& file) {
    std::lock_guard<std::mutex> lock(mutex_);
    corrupt_.insert(file);
  }
  void lengthen(const std::string& file, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    lengthen_[file] = bytes;
  }
  std::vector<Request> requests() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  void record(const char* server, const httplib::Request& req) {
    std::lock_guard<std::mutex> lock(mutex_);
    requests_.push_back(
        {server, req.path, req.get_header_value("Range"), req.get_header_value("Authorization")});
  }

  // The repository and commit a request names, or an error answer written
  // to `res` (nullptr). Called with mutex_ held.
  const std::vector<File>* find(const httplib::Request& req, httplib::Response& res,
                                const std::string& repo_id, const std::string& revision,
                                std::string& commit) {
    const std::string authorization = req.get_header_value("Authorization");
    auto repo = repos_.find(repo_id);
    if (repo == repos_.end()) {
      hubError(res, authorization.empty() ? 401 : 404, "RepoNotFound",
               "Repository Not Found for url: " + endpoint() + req.path + ".");
      return nullptr;
    }
    if (!repo->second.token.empty() && authorization != "Bearer " + repo->second.token) {
      if (authorization.empty()) {
        hubError(res, 401, "GatedRepo",
                 "Access to model " + repo_id +
                     " is restricted. You must have access to it and be authenticated to "
                     "access it. Please log in.");
      } else {
        hubError(res, 403, "GatedRepo",
                 "Access to model " + repo_id +
                     " is restricted and you are not in the "
                     "authorized list.");
      }
      return nullptr;
    }
    commit = revision;
    if (auto ref = repo->second.refs.find(revision); ref != repo->second.refs.end()) {
      commit = ref->second;
    }
    auto files = repo->second.commits.find(commit);
    if (files == repo->second.commits.end()) {
      hubError(res, 404, "RevisionNotFound", "Invalid rev id: " + revision);
      return nullptr;
    }
    return &files->second;
  }

  void revisionInfo(const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string repo_id = req.matches[1];
    std::string commit;
    const std::vector<File>* files = find(req, res, repo_id, req.matches[2], commit);
    if (files == nullptr) return;
    nlohmann::json siblings = nlohmann::json::array();
    for (const File& file : *files) siblings.push_back({{"rfilename", file.path}});
    const bool gated = !repos_[repo_id].token.empty();
    res.set_content(
        nlohmann::json{{"_id", commit.substr(0, 24)},
                       {"id", repo_id},
                       {"modelId", repo_id},
                       {"sha", commit},
                       {"private", false},
                       {"gated", gated ? nlohmann::json("auto") : nlohmann::json(false)},
                       {"siblings", siblings}}
            .dump(),
        "application/json");
  }

  void tree(const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string repo_id = req.matches[1];
    const std::string revision = req.matches[2];
    std::string commit;
    const std::vector<File>* files = find(req, res, repo_id, revision, commit);
    if (files == nullptr) return;
    size_t cursor = req.has_param("cursor") ? std::stoul(req.get_param_value("cursor")) : 0;
    nlohmann::json page = nlohmann::json::array();
    size_t end = std::min(files->size(), cursor + static_cast<size_t>(page_size_));
    for (size_t i = cursor; i < end; ++i) {
      const File& file = (*files)[i];
      nlohmann::json entry = {{"type", "file"},
                              {"oid", file.oid},
                              {"size", static_cast<int64_t>(file.bytes->size())},
                              {"path", file.path}};
      if (file.lfs) {
        entry["lfs"] = {{"oid", file.sha256},
                        {"size", static_cast<int64_t>(file.bytes->size())},
                        {"pointerSize", 134}};
      }
      page.push_back(std::move(entry));
    }
    if (end < files->size()) {
      std::ostringstream link;
      link << "<" << endpoint() << "/api/models/" << repo_id << "/tree/" << revision
           << "?cursor=" << end << ">; rel=\"next\"";
      res.set_header("Link", link.str());
    }
    res.set_content(page.dump(), "application/json");
  }

  void resolve(const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string commit;
    const std::vector<File>* files = find(req, res, req.matches[1], req.matches[2], commit);
    if (files == nullptr) return;
    const std::string path = req.matches[3];
    auto file =
        std::find_if(files->begin(), files->end(), [&](const File& f) { return f.path == path; });
    if (file == files->end()) {
      hubError(res, 404, "EntryNotFound", path + " does not exist on \"" + commit + "\"");
      return;
    }
    res.set_header("X-Repo-Commit", commit);
    if (file->lfs) {
      res.status = 302;
      res.set_header("ETag", "\"" + file->sha256 + "\"");
      res.set_header("X-Linked-Etag", "\"" + file->sha256 + "\"");
      res.set_header("X-Linked-Size", std::to_string(file->bytes->size()));
      res.set_header("Location", cdnEndpoint() + "/blobs/" + file->sha256);
      return;
    }
    res.set_header("ETag", "\"" + file->oid + "\"");
    serve(res, *file);
  }

  void blob(const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string sha256 = req.matches[1];
    for (const auto& [id, repo] : repos_) {
      for (const auto& [commit, files] : repo.commits) {
        for (const File& file : files) {
          if (file.lfs && file.sha256 == sha256) {
            res.set_header("ETag", "\"" + sha256 + "\"");
            serve(res, file);
            return;
          }
        }
      }
    }
    res.status = 404;
  }

  // The body of `file` from a content provider (so httplib applies a Range),
  // with the faults set for it. Called with mutex_ held.
  void serve(httplib::Response& res, const File& file) {
    std::shared_ptr<const std::string> bytes = file.bytes;
    if (corrupt_.count(file.path) && !bytes->empty()) {
      auto changed = std::make_shared<std::string>(*bytes);
      (*changed)[changed->size() / 2] ^= 0x5a;
      bytes = changed;
    }
    if (auto extra = lengthen_.find(file.path); extra != lengthen_.end()) {
      auto longer = std::make_shared<std::string>(*bytes);
      longer->append(static_cast<size_t>(extra->second), 'x');
      bytes = longer;
    }
    int64_t cut = -1;
    if (auto fault = cuts_.find(file.path); fault != cuts_.end() && fault->second.second > 0) {
      cut = fault->second.first;
      --fault->second.second;
    }
    res.set_header("Accept-Ranges", "bytes");
    auto sent = std::make_shared<int64_t>(0);
    res.set_content_provider(
        bytes->size(), "application/octet-stream",
        [bytes, cut, sent](size_t offset, size_t length, httplib::DataSink& sink) {
          // A cut counts the bytes of this answer's body, wherever it starts.
          size_t chunk = std::min<size_t>(length, 64 * 1024);
          if (cut >= 0)
            chunk = std::min<size_t>(chunk, static_cast<size_t>(std::max<int64_t>(cut - *sent, 0)));
          if (chunk == 0) return false;  // closes the connection mid-body
          sink.write(bytes->data() + offset, chunk);
          *sent += static_cast<int64_t>(chunk);
          return true;
        });
  }

  // A plain server, or one with a certificate for 127.0.0.1 from a fresh CA.
  httplib::Server& makeServer(bool tls) {
    if (!tls) return *servers_.emplace_back(std::make_unique<httplib::Server>());
    if (ca_certificate_.empty()) {
      const TestPki pki = generateTestPki();
      ca_certificate_ = pki.ca_certificate;
      char pattern[] = "/tmp/tandem-hub-tls-XXXXXX";
      if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("hub stand-in: mkdtemp");
      tls_dir_ = pattern;
      std::ofstream(tls_dir_ / "server.crt") << pki.server_certificate;
      std::ofstream(tls_dir_ / "server.key") << pki.server_key;
    }
    return *servers_.emplace_back(std::make_unique<httplib::SSLServer>(
        (tls_dir_ / "server.crt").c_str(), (tls_dir_ / "server.key").c_str()));
  }

  const std::string host_;
  const std::string scheme_;
  std::string ca_certificate_;
  std::filesystem::path tls_dir_;
  std::vector<std::unique_ptr<httplib::Server>> servers_;
  httplib::Server& hub_;
  httplib::Server& cdn_;
  int hub_port_ = 0;
  int cdn_port_ = 0;
  std::thread hub_thread_;
  std::thread cdn_thread_;
  mutable std::mutex mutex_;
  std::map<std::string, Repo> repos_;
  int64_t commits_ = 0;
  int page_size_ = 50;
  std::map<std::string, std::pair<int64_t, int>> cuts_;
  std::set<std::string> corrupt_;
  std::map<std::string, int64_t> lengthen_;
  std::vector<Request> requests_;
};

HubServer::HubServer(const std::string& host, bool tls)
    : impl_(std::make_unique<Impl>(host, tls)) {}
HubServer::~HubServer() = default;
std::string HubServer::endpoint() const { return impl_->endpoint(); }
std::string HubServer::caCertificate() const { return impl_->caCertificate(); }
std::string HubServer::publish(const std::string& repo, const std::filesystem::path& directory,
                               const std::map<std::string, std::string>& extra,
                               const std::string& branch, const std::string& token) {
  return impl_->publish(repo, directory, extra, branch, token);
}
void HubServer::setPageSize(int entries) { impl_->setPageSize(entries); }
void HubServer::cutAfter(const std::string& file, int64_t bytes, int times) {
  impl_->cutAfter(file, bytes, times);
}
void HubServer::corrupt(const std::string& file) { impl_->corrupt(file); }
void HubServer::lengthen(const std::string& file, int64_t bytes) { impl_->lengthen(file, bytes); }
std::vector<HubServer::Request> HubServer::requests() const { return impl_->requests(); }

}  // namespace tandem::testing
