// A Hugging Face Hub stand-in for tests, written from the Hub's HTTP API as
// its documentation and its Python client describe it: two HTTP servers on
// one host, the Hub and the CDN its LFS files redirect to.
//
// The Hub (endpoint()):
//   GET /api/models/{repo}/revision/{revision}  {"id", "sha", "siblings": [{"rfilename"}]}
//   GET /api/models/{repo}/tree/{revision}      [{"type": "file", "path", "size", "oid",
//                                                 "lfs": {"oid", "size", "pointerSize"}}],
//                                                pageSize() entries a page, the next page
//                                                in `Link: <url>; rel="next"`
//   GET /{repo}/resolve/{revision}/{path}       a regular file's bytes (ETag: its git
//                                                blob id), or for an LFS file a 302 to
//                                                the CDN with X-Linked-Etag (its SHA-256)
//                                                and X-Linked-Size; X-Repo-Commit always
// Errors carry X-Error-Code and X-Error-Message: an unknown repository is 401
// RepoNotFound without a token (the Hub does not say whether a private one
// exists), 404 with one; a gated repository without its token is 401
// GatedRepo, with another token 403; an unknown revision 404
// RevisionNotFound; an unknown file 404 EntryNotFound.
// The CDN (/blobs/{sha256}): the bytes, with Range requests (206), and no
// authentication (the Hub's CDN URLs are signed; this one's are not).
//
// Where it differs from the Hub: plain HTTP unless asked for TLS; no git, no xet storage, no
// HEAD-only metadata calls, no rate limits; which files are LFS is decided by name
// (*.safetensors, *.bin) or size (over 10 MiB), as the Hub's default
// .gitattributes and its size rule do.
//
// Faults for tests: a file's CDN answer cut after N bytes (the connection
// closed mid-body), a file served with a flipped byte (its listed hashes
// unchanged). Every request is recorded. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::testing {

class HubServer {
 public:
  struct Request {
    std::string server;  // "hub" or "cdn"
    std::string path;
    std::string range;          // the Range header, "" when none
    std::string authorization;  // the Authorization header, "" when none
  };

  // Listens on `host` (two ephemeral ports); 127.0.0.1 by default. With
  // `tls`, both speak https with a certificate for 127.0.0.1 signed by a
  // throw-away CA (caCertificate()).
  explicit HubServer(const std::string& host = "127.0.0.1", bool tls = false);
  ~HubServer();
  HubServer(const HubServer&) = delete;
  HubServer& operator=(const HubServer&) = delete;

  // "http://host:port" (https with tls), what a client's endpoint is set to.
  std::string endpoint() const;
  // The CA that signed the servers' certificate (PEM; "" without tls).
  std::string caCertificate() const;

  // A new commit on `branch` of `repo` (created) holding every regular file
  // of `directory` (top level) plus `extra` files; returns the commit's id.
  // A non-empty `token` makes the repository gated: that bearer token only.
  std::string publish(const std::string& repo, const std::filesystem::path& directory,
                      const std::map<std::string, std::string>& extra = {},
                      const std::string& branch = "main", const std::string& token = "");

  void setPageSize(int entries);
  // The CDN closes the connection after `bytes` of `file`'s body, the next
  // `times` times it is asked for it.
  void cutAfter(const std::string& file, int64_t bytes, int times = 1);
  // `file` is served with one byte changed from now on.
  void corrupt(const std::string& file);
  // `file` is served with `bytes` more bytes than its listing gives it from
  // now on.
  void lengthen(const std::string& file, int64_t bytes);

  std::vector<Request> requests() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::testing
