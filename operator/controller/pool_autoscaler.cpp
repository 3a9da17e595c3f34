#include "operator/controller/pool_autoscaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <set>

#include "common/logging.h"
#include "operator/planner/autoscaling_spec.h"

namespace tandem::controller {
namespace {

using nlohmann::json;

std::string keyOf(OwnerKind kind, const std::string& ns, const std::string& name) {
  return std::string(ownerKindName(kind)) + "/" + ns + "/" + name;
}

planner::PoolKind plannerKind(OwnerKind kind) {
  return kind == OwnerKind::kPrefillPool ? planner::PoolKind::kPrefill : planner::PoolKind::kDecode;
}

const json& field(const json& object, const char* key) {
  static const json kEmpty = json::object();
  return object.is_object() && object.contains(key) && object[key].is_object() ? object[key]
                                                                               : kEmpty;
}

std::optional<json> conditionOfType(const json& pod, const std::string& type) {
  for (const json& condition : field(pod, "status").value("conditions", json::array())) {
    if (condition.value("type", "") == type) return condition;
  }
  return std::nullopt;
}

bool podReady(const json& pod) {
  if (field(pod, "metadata").contains("deletionTimestamp")) return false;
  if (field(pod, "status").value("phase", "") != "Running") return false;
  const auto ready = conditionOfType(pod, "Ready");
  return ready && ready->value("status", "") == "True";
}

// "2025-01-02T03:04:05Z" (fractional seconds and offsets accepted).
std::optional<std::chrono::system_clock::time_point> parseTimestamp(const std::string& text) {
  std::tm parts{};
  int offset_sign = 0, offset_hours = 0, offset_minutes = 0;
  if (sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &parts.tm_year, &parts.tm_mon, &parts.tm_mday,
             &parts.tm_hour, &parts.tm_min, &parts.tm_sec) != 6) {
    return std::nullopt;
  }
  const size_t zone = text.find_first_of("Z+-", 19);
  if (zone != std::string::npos && text[zone] != 'Z') {
    offset_sign = text[zone] == '+' ? 1 : -1;
    if (sscanf(text.c_str() + zone + 1, "%2d:%2d", &offset_hours, &offset_minutes) != 2) {
      return std::nullopt;
    }
  }
  parts.tm_year -= 1900;
  parts.tm_mon -= 1;
  const time_t seconds = timegm(&parts) - offset_sign * (offset_hours * 3600 + offset_minutes * 60);
  return std::chrono::system_clock::from_time_t(seconds);
}

json plannerCondition(const planner::PlannerCondition& condition, int64_t generation) {
  return {{"type", condition.type},
          {"status", condition.status ? "True" : "False"},
          {"reason", condition.reason},
          {"message", condition.message},
          {"observedGeneration", generation}};
}

}  // namespace

std::vector<std::string> hpaTargets(const std::vector<json>& hpas) {
  std::vector<std::string> targets;
  for (const json& hpa : hpas) {
    const json& ref = field(field(hpa, "spec"), "scaleTargetRef");
    if (!ref.value("apiVersion", "").starts_with("tandem.dev/")) continue;
    const std::string kind = ref.value("kind", "");
    if (kind != "PrefillPool" && kind != "DecodePool") continue;
    targets.push_back(kind + "/" + ref.value("name", ""));
  }
  return targets;
}

std::vector<double> unschedulableSeconds(const std::vector<json>& pods,
                                         std::chrono::system_clock::time_point now) {
  std::vector<double> seconds;
  for (const json& pod : pods) {
    if (field(pod, "status").value("phase", "") != "Pending") continue;
    const auto scheduled = conditionOfType(pod, "PodScheduled");
    if (!scheduled || scheduled->value("status", "") != "False") continue;
    std::string since = scheduled->value("lastTransitionTime", "");
    if (since.empty()) since = field(pod, "metadata").value("creationTimestamp", "");
    const auto start = parseTimestamp(since);
    const double age = start ? std::chrono::duration<double>(now - *start).count() : 0.0;
    seconds.push_back(std::max(0.0, age));
  }
  return seconds;
}

std::string podDeletionCost(double requests) {
  constexpr double kMax = 2147483647.0;
  const double clamped =
      std::isfinite(requests) ? std::clamp(std::round(requests), 0.0, kMax) : 0.0;
  return std::to_string(static_cast<int64_t>(clamped));
}

PoolAutoscaler::PoolAutoscaler(
    ApiWriter& writer, EventRecorder& events, std::unique_ptr<PodMetricsSource> source,
    std::function<void(OwnerKind, const std::string&, const std::string&)> on_conditions_changed,
    std::function<std::chrono::system_clock::time_point()> wall_now)
    : writer_(writer),
      events_(events),
      source_(std::move(source)),
      on_conditions_changed_(std::move(on_conditions_changed)),
      wall_now_(std::move(wall_now)) {}

void PoolAutoscaler::round(double now_seconds, const std::vector<AutoscaledPool>& pools) {
  std::set<std::string> planned;
  for (const AutoscaledPool& input : pools) {
    if (!field(input.object, "spec").contains("autoscaling")) continue;
    const json& metadata = field(input.object, "metadata");
    const std::string key =
        keyOf(input.kind, metadata.value("namespace", ""), metadata.value("name", ""));
    planned.insert(key);
    plan(now_seconds, input, key);
  }
  std::vector<Pool> forgotten;
  for (auto it = pools_.begin(); it != pools_.end();) {
    if (planned.count(it->first) > 0) {
      ++it;
      continue;
    }
    TANDEM_LOG(kInfo) << "controller: planner off for " << it->first;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      conditions_.erase(it->first);
      samples_.erase(it->first);
    }
    forgotten.push_back(std::move(it->second));
    it = pools_.erase(it);
  }
  for (const Pool& pool : forgotten) {
    if (on_conditions_changed_) on_conditions_changed_(pool.kind, pool.ns, pool.name);
  }
}

void PoolAutoscaler::plan(double now_seconds, const AutoscaledPool& input, const std::string& key) {
  const json& metadata = field(input.object, "metadata");
  const std::string ns = metadata.value("namespace", "");
  const std::string name = metadata.value("name", "");
  Owner owner = ownerOf(input.object);
  owner.api_version = resourceOf(input.kind).apiVersion();
  owner.kind = ownerKindName(input.kind);
  const planner::PoolKind kind = plannerKind(input.kind);
  StatusOr<planner::AutoscalingSpec> spec =
      planner::parseAutoscalingSpec(field(input.object, "spec")["autoscaling"], kind);
  if (!spec.isOk()) {
    events_.recordOnce(owner, kWarning, "InvalidAutoscaling", spec.status().message());
    return;
  }
  auto it = pools_.find(key);
  if (it == pools_.end() || it->second.window.windowSeconds() != spec->window_seconds) {
    if (it == pools_.end()) {
      TANDEM_LOG(kInfo) << "controller: planner on for " << key << ": replicas "
                        << spec->min_replicas << ".." << spec->max_replicas << ", metrics from "
                        << source_->describe();
      it = pools_
               .emplace(key, Pool{input.kind, ns, name, planner::PoolPlanner(name, kind, *spec),
                                  planner::MetricWindow(planner::agentMetricNames(kind),
                                                        spec->window_seconds)})
               .first;
    } else {
      // A window of a new length starts empty (the planner holds until it
      // has two scrapes).
      it->second.window =
          planner::MetricWindow(planner::agentMetricNames(kind), spec->window_seconds);
    }
  }
  Pool& pool = it->second;
  pool.planner.setSpec(*spec);

  std::vector<json> ready;
  for (const json& pod : input.pods) {
    if (podReady(pod)) ready.push_back(pod);
  }
  for (const auto& [pod, text] : source_->scrape(ready, planner::agentMetricNames(kind))) {
    Status added = pool.window.addScrape(pod, now_seconds, text);
    if (!added.isOk()) {
      TANDEM_LOG(kWarn) << "controller: planner: " << key << ": " << added.message();
    }
  }

  planner::PoolObservation observation;
  observation.now_seconds = now_seconds;
  observation.spec_replicas = field(input.object, "spec").value("replicas", 1);
  observation.ready_replicas = static_cast<int>(ready.size());
  observation.pending_seconds = unschedulableSeconds(input.pods, wall_now_());
  observation.hpa_present = input.hpa_present;
  const planner::Decision decision =
      pool.planner.decide(observation, pool.window.values(now_seconds, spec->quantile));
  if (decision.write && decision.desired_replicas < observation.spec_replicas) {
    setDeletionCosts(ns, ready, pool.window, planner::agentMetricNames(kind));
  }
  applyDecision(owner, input.kind, decision);

  const std::vector<json> conditions = {
      plannerCondition(decision.scaling_conflict, owner.generation),
      plannerCondition(decision.scaling_limited, owner.generation)};
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<json>& kept = conditions_[key];
    changed = kept != conditions;
    kept = conditions;
    samples_[key] = planner::PlannerMetricsSample{ns, name, kind, decision.metrics};
  }
  if (changed && on_conditions_changed_) on_conditions_changed_(input.kind, ns, name);
}

void PoolAutoscaler::applyDecision(const Owner& owner, OwnerKind kind,
                                   const planner::Decision& decision) {
  if (decision.write) {
    const int replicas = decision.desired_replicas;
    auto written = writer_.readModifyWrite(
        resourceOf(kind), owner.ns, owner.name,
        [replicas](json& scale) {
          if (!scale.contains("spec") || !scale["spec"].is_object()) scale["spec"] = json::object();
          if (scale["spec"].value("replicas", -1) == replicas) return false;
          scale["spec"]["replicas"] = replicas;
          return true;
        },
        "scale");
    if (!written.isOk()) {
      // The next round sees the old replicas and decides again.
      TANDEM_LOG(kWarn) << "controller: planner: " << owner.kind << " " << owner.ns << "/"
                        << owner.name << ": writing " << replicas
                        << " replicas failed: " << written.error().toString();
      return;
    }
  }
  if (decision.event) {
    TANDEM_LOG(kInfo) << "controller: planner: " << owner.kind << " " << owner.ns << "/"
                      << owner.name << ": " << decision.event->reason << ": "
                      << decision.event->message;
    events_.record(owner, decision.event->type, decision.event->reason, decision.event->message);
  }
}

void PoolAutoscaler::setDeletionCosts(const std::string& ns, const std::vector<json>& pods,
                                      const planner::MetricWindow& window,
                                      const planner::MetricNames& names) {
  for (const json& pod : pods) {
    const json& metadata = field(pod, "metadata");
    const std::string name = metadata.value("name", "");
    const std::optional<double> running = window.latestGauge(name, names.running_sequences);
    const std::optional<double> waiting = window.latestGauge(name, names.waiting_sequences);
    if (!running && !waiting) continue;  // never scraped: its annotation is left as it is
    const std::string cost = podDeletionCost(running.value_or(0) + waiting.value_or(0));
    const json& annotations = field(metadata, "annotations");
    const auto existing = annotations.find(kPodDeletionCost);
    if (existing != annotations.end() && existing->is_string() && *existing == cost) continue;
    auto written =
        writer_.mergePatch(k8s::resources::kPods, ns, name,
                           {{"metadata", {{"annotations", {{kPodDeletionCost, cost}}}}}});
    if (!written.isOk()) {
      // The ReplicaSet then ranks this pod by its older cost (or none).
      TANDEM_LOG(kWarn) << "controller: planner: pod " << ns << "/" << name << ": writing "
                        << kPodDeletionCost << " failed: " << written.error().toString();
    }
  }
}

std::vector<json> PoolAutoscaler::conditionsFor(OwnerKind kind, const std::string& ns,
                                                const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = conditions_.find(keyOf(kind, ns, name));
  return it == conditions_.end() ? std::vector<json>{} : it->second;
}

std::string PoolAutoscaler::metricsText() const {
  std::vector<planner::PlannerMetricsSample> samples;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, sample] : samples_) samples.push_back(sample);
  }
  return planner::plannerMetricsText(samples);
}

}  // namespace tandem::controller
