#include "operator/planner/autoscaling_spec.h"

#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "common/json_parse.h"

namespace tandem::planner {
namespace {

constexpr const char* kPath = "spec.autoscaling.";

std::string shown(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// A number in [low, high]; `low_open` makes the low end exclusive, as
// "above 0".
Status readNumber(const nlohmann::json& value, const std::string& field, double low, bool low_open,
                  double high, double& out) {
  const std::string range = std::string(low_open ? "above " : "from ") + number(low) +
                            (low_open ? " and up to " : " to ") + number(high);
  if (!value.is_number()) {
    return invalidArgument(kPath + field + " must be a number " + range + ", got " + shown(value));
  }
  const double read = value.get<double>();
  if (!std::isfinite(read) || read < low || (low_open && read == low) || read > high) {
    return invalidArgument(kPath + field + " must be a number " + range + ", got " + shown(value));
  }
  out = read;
  return Status::ok();
}

Status readInteger(const nlohmann::json& value, const std::string& field, int low, int high,
                   int& out) {
  const std::string message = kPath + field + " must be an integer between " + std::to_string(low) +
                              " and " + std::to_string(high) + ", got " + shown(value);
  if (!value.is_number()) return invalidArgument(message);
  const double read = value.get<double>();
  if (!std::isfinite(read) || std::floor(read) != read || read < low || read > high) {
    return invalidArgument(message);
  }
  out = static_cast<int>(read);
  return Status::ok();
}

struct Field {
  const char* name;
  // The pool kind the field belongs to; nullopt for both.
  std::optional<PoolKind> only_for;
  std::function<Status(const nlohmann::json&, AutoscalingSpec&)> read;
};

Status readOptional(const nlohmann::json& value, const std::string& field, double low,
                    bool low_open, double high, std::optional<double>& out) {
  double read = 0;
  Status status = readNumber(value, field, low, low_open, high, read);
  if (status.isOk()) out = read;
  return status;
}

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      {"minReplicas", std::nullopt,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readInteger(v, "minReplicas", 1, kMaxReplicasLimit, s.min_replicas);
       }},
      {"maxReplicas", std::nullopt,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readInteger(v, "maxReplicas", 1, kMaxReplicasLimit, s.max_replicas);
       }},
      {"targetTTFTSeconds", PoolKind::kPrefill,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readOptional(v, "targetTTFTSeconds", 0, true, 3600, s.target_ttft_seconds);
       }},
      {"targetITLSeconds", PoolKind::kDecode,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readOptional(v, "targetITLSeconds", 0, true, 3600, s.target_itl_seconds);
       }},
      {"targetQueuedPrefillTokensPerReplica", PoolKind::kPrefill,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readOptional(v, "targetQueuedPrefillTokensPerReplica", 0, true, 1e9,
                             s.target_queued_prefill_tokens_per_replica);
       }},
      {"targetRunningSequencesPerReplica", PoolKind::kDecode,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readOptional(v, "targetRunningSequencesPerReplica", 0, true, 1e6,
                             s.target_running_sequences_per_replica);
       }},
      {"targetKVCacheUsage", PoolKind::kDecode,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readOptional(v, "targetKVCacheUsage", 0, true, 1, s.target_kv_cache_usage);
       }},
      {"quantile", std::nullopt,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         double read = 0;
         if (!readNumber(v, "quantile", 0, true, 1, read).isOk() || read >= 1) {
           return invalidArgument(std::string(kPath) +
                                  "quantile must be a number above 0 and below 1, got " + shown(v));
         }
         s.quantile = read;
         return Status::ok();
       }},
      {"windowSeconds", std::nullopt,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readNumber(v, "windowSeconds", 1, false, 3600, s.window_seconds);
       }},
      {"scaleUpStabilizationSeconds", std::nullopt,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readNumber(v, "scaleUpStabilizationSeconds", 0, false, 3600,
                           s.scale_up_stabilization_seconds);
       }},
      {"scaleDownStabilizationSeconds", std::nullopt,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readNumber(v, "scaleDownStabilizationSeconds", 0, false, 3600,
                           s.scale_down_stabilization_seconds);
       }},
      {"maxStep", std::nullopt,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readInteger(v, "maxStep", 1, kMaxReplicasLimit, s.max_step);
       }},
      {"pendingTimeoutSeconds", std::nullopt,
       [](const nlohmann::json& v, AutoscalingSpec& s) {
         return readNumber(v, "pendingTimeoutSeconds", 1, false, 86400, s.pending_timeout_seconds);
       }},
  };
  return kFields;
}

std::string fieldList(PoolKind kind) {
  std::string list;
  for (const Field& field : fields()) {
    if (field.only_for && *field.only_for != kind) continue;
    if (!list.empty()) list += ", ";
    list += field.name;
  }
  return list;
}

}  // namespace

const char* poolKindName(PoolKind kind) {
  return kind == PoolKind::kPrefill ? "prefill" : "decode";
}

double AutoscalingSpec::targetSeconds(PoolKind kind) const {
  const std::optional<double>& target =
      kind == PoolKind::kPrefill ? target_ttft_seconds : target_itl_seconds;
  return target.value_or(0);
}

StatusOr<AutoscalingSpec> parseAutoscalingSpec(const nlohmann::json& value, PoolKind kind) {
  if (!value.is_object()) {
    return invalidArgument("spec.autoscaling must be an object with the fields " + fieldList(kind) +
                           ", got " + shown(value));
  }
  AutoscalingSpec spec;
  for (const auto& [key, field_value] : value.items()) {
    const Field* field = nullptr;
    for (const Field& candidate : fields()) {
      if (key == candidate.name) field = &candidate;
    }
    if (field == nullptr) {
      return invalidArgument(kPath + key +
                             " is not a field of spec.autoscaling; accepted: " + fieldList(kind));
    }
    if (field->only_for && *field->only_for != kind) {
      const char* owner = *field->only_for == PoolKind::kPrefill ? "PrefillPools" : "DecodePools";
      return invalidArgument(kPath + key + " applies to " + owner + " only; a " +
                             poolKindName(kind) + " pool accepts: " + fieldList(kind));
    }
    Status status = field->read(field_value, spec);
    if (!status.isOk()) return status;
  }
  if (!value.contains("maxReplicas")) {
    return invalidArgument(std::string(kPath) + "maxReplicas is required (an integer between " +
                           "minReplicas and " + std::to_string(kMaxReplicasLimit) + ")");
  }
  if (spec.max_replicas < spec.min_replicas) {
    return invalidArgument(std::string(kPath) + "maxReplicas must be at least minReplicas (" +
                           std::to_string(spec.min_replicas) + "), got " +
                           std::to_string(spec.max_replicas));
  }
  if (kind == PoolKind::kPrefill && !spec.target_ttft_seconds) {
    return invalidArgument(std::string(kPath) +
                           "targetTTFTSeconds is required on a PrefillPool (a number of seconds "
                           "above 0 and up to 3600)");
  }
  if (kind == PoolKind::kDecode && !spec.target_itl_seconds) {
    return invalidArgument(std::string(kPath) +
                           "targetITLSeconds is required on a DecodePool (a number of seconds "
                           "above 0 and up to 3600)");
  }
  return spec;
}

StatusOr<AutoscalingSpec> parseAutoscalingSpecText(std::string_view json_text, PoolKind kind) {
  JsonParseError error;
  std::optional<nlohmann::json> value = parseJson(json_text, error);
  if (!value) return invalidArgument("spec.autoscaling is not valid JSON: " + error.detail);
  return parseAutoscalingSpec(*value, kind);
}

}  // namespace tandem::planner
