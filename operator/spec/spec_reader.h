// Strict, typed reading of CRD-shaped YAML documents, internal to tandem_spec
// (cluster_spec.cpp and router_spec.cpp). Every reader either returns the value
// or throws tandem::Error naming where it is and what is accepted:
//
//   cluster.yaml: document 2 (DecodePool "decode"): spec.engine.blockSize must be
//   an integer between 1 and 1024, got "big" (line 14)
//
// A MapReader refuses fields it was not asked for, so a typo is never silently
// ignored. Nothing here keeps state between calls except FieldPathRecorder's
// per-thread list; all functions are safe to call from several threads.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/decimal_text.h"
#include "operator/spec/cluster_spec.h"

namespace tandem::spec {

// No upper bound, for readInteger.
inline constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

// Where a document sits in the file, for messages.
struct DocumentContext {
  std::string source;
  int index = 0;
  std::string kind;
  std::string name;
  // False for objects from the API: their line numbers mean nothing to a user.
  bool show_lines = true;

  // "document 2 (DecodePool \"decode\")"
  std::string label() const {
    std::string text = "document " + std::to_string(index);
    if (!kind.empty()) {
      text += " (" + kind;
      if (!name.empty()) text += " \"" + name + "\"";
      text += ")";
    }
    return text;
  }
  // An object from the API (index 0) is named by `source` alone.
  std::string where() const { return index == 0 ? source : source + ": " + label(); }
};

// While one is alive, every field path a MapReader on this thread looks up is
// appended to `paths` (how the spec field lists are derived from a sample).
// Not nestable.
class FieldPathRecorder {
 public:
  explicit FieldPathRecorder(std::vector<std::string>& paths);
  ~FieldPathRecorder();
  FieldPathRecorder(const FieldPathRecorder&) = delete;
  FieldPathRecorder& operator=(const FieldPathRecorder&) = delete;

  // Whether one is alive on this thread.
  static bool active();
};

// " (line N)" for the node, or "" when it has no position.
std::string lineOf(const YAML::Node& node);

// Throws "<where>: <path> <problem> (line N)".
[[noreturn]] void fail(const DocumentContext& context, const std::string& path,
                       const std::string& problem, const YAML::Node& node);

// How a value was written, for "got ..." in messages.
std::string described(const YAML::Node& node);

// Reads one mapping: fields are taken by name, and whatever was not taken is
// refused as unknown by rejectUnknown(). `context` must outlive the reader.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path, const DocumentContext& context)
      : node_(node), path_(std::move(path)), context_(context) {}

  std::string pathOf(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }
  // The value of `key`, unless absent or null.
  std::optional<YAML::Node> get(const std::string& key);
  // The value of `key`; throws when absent or null.
  YAML::Node require(const std::string& key);
  // Throws for the first key that get() or require() was not asked for.
  void rejectUnknown() const;

 private:
  YAML::Node node_;
  std::string path_;
  const DocumentContext& context_;
  std::vector<std::string> known_;
};

void requireMapping(const YAML::Node& node, const std::string& path,
                    const DocumentContext& context);
void requireList(const YAML::Node& node, const std::string& path, const DocumentContext& context);

// A plain integer in [min, max].
int64_t readInteger(const YAML::Node& node, const std::string& path, const DocumentContext& context,
                    int64_t min, int64_t max = kNoMax);
// A finite number in [min, max]; `min_exclusive` makes the lower bound strict.
double readNumber(const YAML::Node& node, const std::string& path, const DocumentContext& context,
                  double min, bool min_exclusive,
                  double max = std::numeric_limits<double>::infinity());
bool readBool(const YAML::Node& node, const std::string& path, const DocumentContext& context);
// A non-empty scalar, quoted or not.
std::string readString(const YAML::Node& node, const std::string& path,
                       const DocumentContext& context);
// A list of strings, each non-empty (readString) unless `allow_empty`.
std::vector<std::string> readStringList(const YAML::Node& node, const std::string& path,
                                        const DocumentContext& context, bool allow_empty = false);
// A flag Tandem writes on a command line itself, and what to do instead.
struct OwnedFlag {
  const char* flag;
  const char* instead;
};
// Fails naming spec.extraArgs[i] when args[i] is one of `owned` ("--flag"
// or "--flag=value"): given again there it would win (a flag's last value
// does) and break what was built around it. `node`: the extraArgs list.
void refuseOwnedFlags(const std::vector<std::string>& args, std::span<const OwnedFlag> owned,
                      const YAML::Node& node, const DocumentContext& context);
// One of `accepted`.
std::string readEnum(const YAML::Node& node, const std::string& path,
                     const DocumentContext& context, const std::vector<std::string>& accepted);

// A YAML value as JSON, reading plain scalars as YAML's core schema does.
nlohmann::json toJson(const YAML::Node& node, const DocumentContext& context,
                      const std::string& path);

// A Kubernetes quantity as the API server parses it: a number ("1", "0.5",
// ".5", "-2") and one suffix, binary (Ki Mi Gi Ti Pi Ei), decimal (n u m k M
// G T P E) or an exponent ("1e3", "2E-2"). A string that is not one makes
// the object it sits in fail to decode there.
bool isQuantity(const std::string& text);
// A scalar that is a quantity (isQuantity) and not negative (every
// quantity a pool takes is an amount: resources, a size limit, which a real
// API server refuses negative in the Deployment), or a failure at `path`
// naming what was found.
std::string readQuantity(const YAML::Node& node, const std::string& path,
                         const DocumentContext& context);

// Kubernetes resource requirements (limits, requests, claims): not used in
// local mode, but their shape and quantities are still checked.
void checkResources(const YAML::Node& node, const std::string& path,
                    const DocumentContext& context);

// spec.template (Kubernetes only): a pod template fragment, {metadata:
// {labels, annotations}, spec: {...}}, as JSON. The pod spec may set only the
// fields listed in kPodTemplateSpecFields; labels and annotations are string
// maps; containers, initContainers, volumes and imagePullSecrets are lists of
// mappings with a name. Their contents are otherwise the API server's to
// validate (the CRD's schema). Empty object when unset.
extern const std::vector<std::string> kPodTemplateSpecFields;
nlohmann::json readPodTemplate(const YAML::Node& node, const std::string& path,
                               const DocumentContext& context);

// spec.model.volume / spec.modelVolume: one of persistentVolumeClaim and hostPath.
// The Secret key spec.apiKeySecretRef reads when its key is not written.
inline constexpr const char* kApiKeySecretKey = "api-key";

// The name of a Kubernetes object (a Secret, a PersistentVolumeClaim): a
// DNS-1123 subdomain (model_source::isDnsSubdomain), as the API server
// requires; a failure at `path` says what is accepted.
std::string readObjectName(const YAML::Node& node, const std::string& path,
                           const DocumentContext& context);

// A {name, key} Secret key reference (name an object name, key letters,
// digits, '-', '_' and '.'); `default_key` ("" = required) when the key is
// not written.
SecretKeyRef readSecretKeyRef(const YAML::Node& node, const std::string& path,
                              const DocumentContext& context, const std::string& default_key = "");

ModelVolumeSpec readModelVolume(const YAML::Node& node, const std::string& path,
                                const DocumentContext& context);

// An intOrString bound of a PodDisruptionBudget or a rollout: a whole number
// from 0 to 100000, or a percentage from "0%" to "100%".
nlohmann::json readBudgetBound(const YAML::Node& node, const std::string& path,
                               const DocumentContext& context);
// spec.disruptionBudget of a pool or a Router.
DisruptionBudgetSpec readDisruptionBudget(const YAML::Node& node, const DocumentContext& context);

}  // namespace tandem::spec
