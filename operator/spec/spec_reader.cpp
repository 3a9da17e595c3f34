#include "operator/spec/spec_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "common/model_source/model_source.h"
#include "common/status.h"

namespace tandem::spec {
namespace {

// Set while a FieldPathRecorder is alive on this thread: every field path read.
thread_local std::vector<std::string>* field_collector = nullptr;

// A plain (unquoted) scalar, as YAML's core schema reads it.
bool isPlain(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::string joined(const std::vector<std::string>& items, const std::string& last_separator) {
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) text += i + 1 == items.size() ? last_separator : ", ";
    text += items[i];
  }
  return text;
}

}  // namespace

std::string integerRangeText(int64_t min, int64_t max) {
  if (max == kNoMax) {
    if (min == 0) return "a non-negative integer";
    if (min == 1) return "a positive integer";
    return "an integer of at least " + std::to_string(min);
  }
  return "an integer between " + std::to_string(min) + " and " + std::to_string(max);
}

FieldPathRecorder::FieldPathRecorder(std::vector<std::string>& paths) { field_collector = &paths; }

FieldPathRecorder::~FieldPathRecorder() { field_collector = nullptr; }

bool FieldPathRecorder::active() { return field_collector != nullptr; }

std::string lineOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return " (line " + std::to_string(mark.line + 1) + ")";
}

[[noreturn]] void fail(const DocumentContext& context, const std::string& path,
                       const std::string& problem, const YAML::Node& node) {
  throw Error(context.where() + ": " + path + " " + problem +
              (context.show_lines ? lineOf(node) : ""));
}

std::string described(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return node.Tag() == "!" ? "the string \"" + node.Scalar() + "\""
                               : "\"" + node.Scalar() + "\"";
    default:
      return "nothing";
  }
}

std::optional<YAML::Node> MapReader::get(const std::string& key) {
  known_.push_back(key);
  if (field_collector != nullptr) field_collector->push_back(pathOf(key));
  const YAML::Node& node = node_;
  const YAML::Node value = node[key];
  if (!value || value.IsNull()) return std::nullopt;
  return value;
}

YAML::Node MapReader::require(const std::string& key) {
  auto value = get(key);
  if (!value) fail(context_, pathOf(key), "is required", node_);
  return *value;
}

void MapReader::rejectUnknown() const {
  std::vector<std::string> seen;
  for (const auto& entry : node_) {
    if (!entry.first.IsScalar()) {
      fail(context_, path_.empty() ? context_.kind : path_,
           "has a key that is not a plain name (got " + described(entry.first) + ")", entry.first);
    }
    const std::string key = entry.first.as<std::string>();
    // YAML forbids it, yaml-cpp takes one of the two: which was meant?
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      fail(context_, pathOf(key), "is given twice", entry.first);
    }
    seen.push_back(key);
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    fail(context_, pathOf(key),
         "is not a field of " + (path_.empty() ? context_.kind : path_) +
             " (accepted: " + joined(known_, " and ") + ")",
         entry.first);
  }
}

void requireMapping(const YAML::Node& node, const std::string& path,
                    const DocumentContext& context) {
  if (!node.IsMap()) fail(context, path, "must be a mapping, got " + described(node), node);
}

void requireList(const YAML::Node& node, const std::string& path, const DocumentContext& context) {
  if (!node.IsSequence()) fail(context, path, "must be a list, got " + described(node), node);
}

int64_t readInteger(const YAML::Node& node, const std::string& path, const DocumentContext& context,
                    int64_t min, int64_t max) {
  int64_t value = 0;
  bool ok = isPlain(node) && YAML::convert<int64_t>::decode(node, value);
  if (!ok || value < min || value > max) {
    std::string accepted = integerRangeText(min, max);
    // An integer past int64 reads as no integer at all: say which ones are.
    if (!ok && max == kNoMax && isPlain(node) && isDecimalInteger(node.Scalar()) &&
        !node.Scalar().starts_with('-')) {
      accepted += " (at most " + std::to_string(kNoMax) + ")";
    }
    fail(context, path, "must be " + accepted + ", got " + described(node), node);
  }
  return value;
}

double readNumber(const YAML::Node& node, const std::string& path, const DocumentContext& context,
                  double min, bool min_exclusive, double max) {
  double value = 0;
  bool ok = isPlain(node) && YAML::convert<double>::decode(node, value) && std::isfinite(value);
  if (!ok || value < min || (min_exclusive && value == min) || value > max) {
    fail(context, path,
         "must be " + numberRangeText(min, min_exclusive, max) + ", got " + described(node), node);
  }
  return value;
}

std::string numberRangeText(double min, bool min_exclusive, double max) {
  std::ostringstream text;
  text << std::setprecision(15) << "a number " << (min_exclusive ? "greater than " : "of at least ")
       << min;
  if (std::isfinite(max)) text << " and at most " << max;
  return text.str();
}

bool readBool(const YAML::Node& node, const std::string& path, const DocumentContext& context) {
  bool value = false;
  if (!isPlain(node) || !YAML::convert<bool>::decode(node, value)) {
    fail(context, path, "must be true or false, got " + described(node), node);
  }
  return value;
}

std::string readString(const YAML::Node& node, const std::string& path,
                       const DocumentContext& context) {
  if (!node.IsScalar() || node.Scalar().empty()) {
    fail(context, path, "must be a non-empty string, got " + described(node), node);
  }
  return node.Scalar();
}

std::vector<std::string> readStringList(const YAML::Node& node, const std::string& path,
                                        const DocumentContext& context, bool allow_empty) {
  requireList(node, path, context);
  std::vector<std::string> items;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item_path = path + "[" + std::to_string(i) + "]";
    if (!allow_empty) {
      items.push_back(readString(node[i], item_path, context));
    } else if (node[i].IsScalar()) {
      items.push_back(node[i].Scalar());
    } else {
      fail(context, item_path, "must be a string, got " + described(node[i]), node[i]);
    }
  }
  return items;
}

void refuseOwnedFlags(const std::vector<std::string>& args, std::span<const OwnedFlag> owned,
                      const YAML::Node& node, const DocumentContext& context) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    for (const OwnedFlag& entry : owned) {
      const std::string_view flag = entry.flag;
      if (arg == flag ||
          (arg.starts_with(flag) && arg.size() > flag.size() && arg[flag.size()] == '=')) {
        fail(context, "spec.extraArgs[" + std::to_string(i) + "]",
             "gives " + std::string(flag) + ", which Tandem sets itself: " + entry.instead,
             node[i]);
      }
    }
  }
}

std::string readEnum(const YAML::Node& node, const std::string& path,
                     const DocumentContext& context, const std::vector<std::string>& accepted) {
  const std::string value = node.IsScalar() ? node.Scalar() : "";
  if (std::find(accepted.begin(), accepted.end(), value) == accepted.end()) {
    fail(context, path, "must be " + joined(accepted, " or ") + ", got " + described(node), node);
  }
  return value;
}

nlohmann::json toJson(const YAML::Node& node, const DocumentContext& context,
                      const std::string& path) {
  switch (node.Type()) {
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& item : node) {
        array.push_back(toJson(item, context, path + "[" + std::to_string(array.size()) + "]"));
      }
      return array;
    }
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) {
          fail(context, path,
               "has a key that is not a plain name (got " + described(entry.first) + ")",
               entry.first);
        }
        const std::string key = entry.first.as<std::string>();
        // YAML forbids it, yaml-cpp keeps both: which was meant?
        if (object.contains(key)) fail(context, path + "." + key, "is given twice", entry.first);
        object[key] = toJson(entry.second, context, path + "." + key);
      }
      return object;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return text;
      if (text == "true" || text == "True" || text == "TRUE") return true;
      if (text == "false" || text == "False" || text == "FALSE") return false;
      if (text == "null" || text == "Null" || text == "NULL" || text == "~") return nullptr;
      const bool integer = isDecimalInteger(text);
      if (integer) {
        try {
          return std::stoll(text);
        } catch (const std::out_of_range&) {
        }
      }
      if (integer || scanDecimal(text, 0, DecimalForm{}) == text.size()) {
        // A number past the double range (1e400) stays text, so that the
        // field's own check names it instead of std::stod throwing.
        const double value = std::strtod(text.c_str(), nullptr);
        if (std::isfinite(value)) return value;
      }
      return text;
    }
    default:
      return nullptr;
  }
}

// A list of mappings, each with a non-empty string `name`; with `only_name`,
// nothing else.
void requireNamedList(const YAML::Node& list, const std::string& path,
                      const DocumentContext& context, bool only_name) {
  requireList(list, path, context);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string item_path = path + "[" + std::to_string(i) + "]";
    requireMapping(list[i], item_path, context);
    MapReader item(list[i], item_path, context);
    readString(item.require("name"), item.pathOf("name"), context);
    if (only_name) item.rejectUnknown();
  }
}

bool isQuantity(const std::string& text) {
  // A number and its exponent, or a number without one and one suffix.
  if (scanDecimal(text, 0, DecimalForm{}) == text.size()) return true;
  const size_t end = scanDecimal(text, 0, DecimalForm{.exponent = false});
  if (end == std::string_view::npos) return false;
  const std::string_view suffix = std::string_view(text).substr(end);
  static constexpr std::string_view kSuffixes[] = {"",  "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n",
                                                   "u", "m",  "k",  "M",  "G",  "T",  "P",  "E"};
  return std::find(std::begin(kSuffixes), std::end(kSuffixes), suffix) != std::end(kSuffixes);
}

std::string readQuantity(const YAML::Node& node, const std::string& path,
                         const DocumentContext& context) {
  if (!node.IsScalar() || !isQuantity(node.Scalar()) || node.Scalar().starts_with('-')) {
    fail(context, path,
         "must be a quantity of at least 0 such as 1, 500m, 8Gi or 1e9, got " + described(node),
         node);
  }
  return node.Scalar();
}

void checkResources(const YAML::Node& node, const std::string& path,
                    const DocumentContext& context) {
  requireMapping(node, path, context);
  MapReader resources(node, path, context);
  for (const char* key : {"limits", "requests"}) {
    if (auto quantities = resources.get(key)) {
      requireMapping(*quantities, resources.pathOf(key), context);
      for (const auto& entry : *quantities) {
        readQuantity(entry.second, resources.pathOf(key) + "." + entry.first.as<std::string>(),
                     context);
      }
    }
  }
  if (auto claims = resources.get("claims")) {
    requireNamedList(*claims, resources.pathOf("claims"), context, /*only_name=*/true);
  }
  resources.rejectUnknown();
}

std::string readObjectName(const YAML::Node& node, const std::string& path,
                           const DocumentContext& context) {
  const std::string name = readString(node, path, context);
  if (!model_source::isDnsSubdomain(name)) {
    fail(context, path,
         "must be a Kubernetes object name (a DNS-1123 subdomain: lower-case letters, digits, "
         "'-' and '.', starting and ending with a letter or digit, at most 253 characters), got " +
             described(node),
         node);
  }
  return name;
}

namespace {

// A Secret's data key (IsConfigMapKey): letters, digits, '-', '_' and '.',
// at most 253, not "." or "..", not starting with "..".
std::string readSecretDataKey(const YAML::Node& node, const std::string& path,
                              const DocumentContext& context) {
  const std::string key = readString(node, path, context);
  const bool valid =
      key.size() <= 253 && !key.starts_with("..") && key != "." &&
      std::all_of(key.begin(), key.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
      });
  if (!valid) {
    fail(context, path,
         "must be a Secret key (letters, digits, '-', '_' and '.', at most 253 characters, not "
         "\".\" or starting with \"..\"), got " +
             described(node),
         node);
  }
  return key;
}

}  // namespace

SecretKeyRef readSecretKeyRef(const YAML::Node& node, const std::string& path,
                              const DocumentContext& context, const std::string& default_key) {
  requireMapping(node, path, context);
  MapReader reader(node, path, context);
  SecretKeyRef ref;
  ref.name = readObjectName(reader.require("name"), reader.pathOf("name"), context);
  std::optional<YAML::Node> key =
      default_key.empty() ? std::optional(reader.require("key")) : reader.get("key");
  ref.key = key ? readSecretDataKey(*key, reader.pathOf("key"), context) : default_key;
  reader.rejectUnknown();
  return ref;
}

ModelVolumeSpec readModelVolume(const YAML::Node& node, const std::string& path,
                                const DocumentContext& context) {
  requireMapping(node, path, context);
  MapReader reader(node, path, context);
  ModelVolumeSpec volume;
  if (auto claim = reader.get("persistentVolumeClaim")) {
    const std::string claim_path = reader.pathOf("persistentVolumeClaim");
    requireMapping(*claim, claim_path, context);
    MapReader claim_reader(*claim, claim_path, context);
    volume.claim_name = readObjectName(claim_reader.require("claimName"),
                                       claim_reader.pathOf("claimName"), context);
    if (auto read_only = claim_reader.get("readOnly")) {
      volume.claim_read_only = readBool(*read_only, claim_reader.pathOf("readOnly"), context);
    }
    claim_reader.rejectUnknown();
  }
  if (auto host = reader.get("hostPath")) {
    const std::string host_path = reader.pathOf("hostPath");
    requireMapping(*host, host_path, context);
    MapReader host_reader(*host, host_path, context);
    volume.host_path = readString(host_reader.require("path"), host_reader.pathOf("path"), context);
    host_reader.rejectUnknown();
  }
  if (auto sub_path = reader.get("subPath")) {
    volume.sub_path = readString(*sub_path, reader.pathOf("subPath"), context);
  }
  reader.rejectUnknown();
  // The field-listing sample sets both sources to reach every field.
  const bool listing_fields = FieldPathRecorder::active();
  if (!listing_fields && volume.claim_name.empty() == volume.host_path.empty()) {
    fail(context, path, "must set one of persistentVolumeClaim and hostPath", node);
  }
  return volume;
}

const std::vector<std::string> kPodTemplateSpecFields = {
    "nodeSelector",       "tolerations",      "affinity",      "topologySpreadConstraints",
    "priorityClassName",  "runtimeClassName", "schedulerName", "serviceAccountName",
    "imagePullSecrets",   "securityContext",  "volumes",       "containers",
    "initContainers",     "hostNetwork",      "hostIPC",       "dnsPolicy",
    "enableServiceLinks", "resourceClaims"};

nlohmann::json readPodTemplate(const YAML::Node& node, const std::string& path,
                               const DocumentContext& context) {
  requireMapping(node, path, context);
  MapReader reader(node, path, context);
  nlohmann::json fragment = nlohmann::json::object();
  if (auto metadata = reader.get("metadata")) {
    const std::string metadata_path = path + ".metadata";
    requireMapping(*metadata, metadata_path, context);
    MapReader metadata_reader(*metadata, metadata_path, context);
    for (const char* key : {"labels", "annotations"}) {
      auto value = metadata_reader.get(key);
      if (!value) continue;
      const std::string map_path = metadata_reader.pathOf(key);
      requireMapping(*value, map_path, context);
      nlohmann::json map = nlohmann::json::object();
      for (const auto& entry : *value) {
        const std::string name = entry.first.as<std::string>();
        if (!entry.second.IsScalar()) {
          fail(context, map_path + "." + name, "must be a string, got " + described(entry.second),
               entry.second);
        }
        map[name] = entry.second.Scalar();
      }
      fragment["metadata"][key] = map;
    }
    metadata_reader.rejectUnknown();
  }
  if (auto spec = reader.get("spec")) {
    const std::string spec_path = path + ".spec";
    requireMapping(*spec, spec_path, context);
    MapReader spec_reader(*spec, spec_path, context);
    nlohmann::json pod = nlohmann::json::object();
    for (const std::string& key : kPodTemplateSpecFields) {
      auto value = spec_reader.get(key);
      if (!value) continue;
      const std::string field_path = spec_reader.pathOf(key);
      if (key == "containers" || key == "initContainers" || key == "volumes" ||
          key == "imagePullSecrets" || key == "resourceClaims") {
        // Only the names are read here: the rest is the API server's to check.
        requireNamedList(*value, field_path, context, /*only_name=*/false);
      }
      pod[key] = toJson(*value, context, field_path);
    }
    spec_reader.rejectUnknown();
    fragment["spec"] = pod;
  }
  reader.rejectUnknown();
  return fragment;
}

// An intOrString bound of a PodDisruptionBudget: a whole number ≥ 0 or a
// percentage from "0%" to "100%".
nlohmann::json readBudgetBound(const YAML::Node& node, const std::string& path,
                               const DocumentContext& context) {
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  if (!text.empty() && text.back() == '%') {
    const std::string digits = text.substr(0, text.size() - 1);
    const bool number = !digits.empty() && digits.size() <= 3 &&
                        digits.find_first_not_of("0123456789") == std::string::npos;
    if (number && std::stoi(digits) <= 100) return text;
    fail(context, path,
         "must be a whole number or a percentage from 0% to 100%, got " + described(node), node);
  }
  return readInteger(node, path, context, 0, 100000);
}

DisruptionBudgetSpec readDisruptionBudget(const YAML::Node& node, const DocumentContext& context) {
  const std::string path = "spec.disruptionBudget";
  requireMapping(node, path, context);
  MapReader reader(node, path, context);
  DisruptionBudgetSpec budget;
  if (auto value = reader.get("enabled"))
    budget.enabled = readBool(*value, path + ".enabled", context);
  std::optional<YAML::Node> max = reader.get("maxUnavailable");
  std::optional<YAML::Node> min = reader.get("minAvailable");
  reader.rejectUnknown();
  if (max && min) {
    fail(context, path,
         "sets both maxUnavailable and minAvailable: a PodDisruptionBudget takes one", node);
  }
  if (max) budget.max_unavailable = readBudgetBound(*max, path + ".maxUnavailable", context);
  if (min) budget.min_available = readBudgetBound(*min, path + ".minAvailable", context);
  return budget;
}

}  // namespace tandem::spec
