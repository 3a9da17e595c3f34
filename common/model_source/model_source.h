// Where a model directory comes from: a pool's spec.model.source. One of
//
//   hf://org/name[@revision]   a Hugging Face Hub repository (revision: a
//                              branch, tag or commit; "main" when not written),
//                              fetched by `tandem-model fetch` (hub_fetch.h);
//   pvc://claim[/path]         a directory on a PersistentVolumeClaim;
//   oci://reference            an OCI image that holds the model's files;
//   /a/path                    a directory the agent can read (today's
//                              spec.model.path).
//
// Parsing is pure and strict: a malformed source is an InvalidArgument whose
// message quotes it and says what is accepted.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace tandem::model_source {

enum class SourceKind { kPath, kHuggingFace, kClaim, kImage };

struct ModelSource {
  SourceKind kind = SourceKind::kPath;
  std::string text;      // as written
  std::string repo;      // kHuggingFace: "org/name" (or "name")
  std::string revision;  // kHuggingFace: "main" when not written
  std::string claim;     // kClaim: the claim's name
  std::string path;      // kClaim: the directory inside it ("" = its root); kPath: the path
  std::string image;     // kImage: the reference, without "oci://"
  bool operator==(const ModelSource&) const = default;
};

StatusOr<ModelSource> parseModelSource(std::string_view text);

// A DNS-1123 subdomain, what Kubernetes accepts as most objects' names (a
// claim's, a Secret's): at most 253 characters, '.'-separated labels of
// lower-case letters, digits and '-', each starting and ending with a
// letter or digit.
bool isDnsSubdomain(std::string_view name);

// The directory, under a cache root, that an hf:// source is fetched into:
// "<root>/hf/models--<org>--<name>/<revision>" (the Hub cache's naming), with
// a revision's "/" written as "--" (refs/pr/1 → refs--pr--1). Every pod of a pool computes the same
// path, so pods that share a cache volume share the download.
std::string hubCacheDirectory(const std::string& root, const ModelSource& source);

}  // namespace tandem::model_source
