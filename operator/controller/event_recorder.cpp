#include "operator/controller/event_recorder.h"

#include <random>

#include "common/hex.h"
#include "common/logging.h"
#include "operator/k8s/resource.h"

namespace tandem::controller {
namespace {

std::string randomHex() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return hex64(generator());
}

}  // namespace

std::string eventName(const std::string& object, const std::string& suffix) {
  constexpr size_t kMaxName = 253;
  std::string prefix = object.substr(0, kMaxName - 1 - suffix.size());
  while (!prefix.empty() && (prefix.back() == '-' || prefix.back() == '.')) prefix.pop_back();
  return prefix + "." + suffix;
}

EventRecorder::EventRecorder(ApiWriter& writer, std::string instance)
    : writer_(writer), instance_(std::move(instance)) {}

void EventRecorder::record(const Owner& owner, const std::string& type, const std::string& reason,
                           const std::string& message) {
  const std::string now = nowRfc3339();
  const nlohmann::json event = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"name", eventName(owner.name, randomHex())}, {"namespace", owner.ns}}},
      {"involvedObject",
       {{"apiVersion", owner.api_version},
        {"kind", owner.kind},
        {"name", owner.name},
        {"namespace", owner.ns},
        {"uid", owner.uid}}},
      {"reason", reason},
      {"message", message},
      {"type", type},
      {"source", {{"component", "tandem-operator"}}},
      {"reportingComponent", "tandem-operator"},
      {"reportingInstance", instance_},
      {"firstTimestamp", now},
      {"lastTimestamp", now},
      {"count", 1}};
  auto result = writer_.create(k8s::resources::kEvents, owner.ns, event);
  if (!result.isOk()) {
    TANDEM_LOG(kWarn) << "controller: event " << reason << " on " << owner.kind << " " << owner.ns
                      << "/" << owner.name << " not recorded: " << result.error().toString();
  }
}

void EventRecorder::forget(const Owner& owner, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = recorded_.lower_bound({owner.uid, reason, ""});
  while (it != recorded_.end() && std::get<0>(*it) == owner.uid && std::get<1>(*it) == reason) {
    it = recorded_.erase(it);
  }
}

void EventRecorder::recordOnce(const Owner& owner, const std::string& type,
                               const std::string& reason, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    constexpr size_t kMaxRemembered = 4096;
    if (recorded_.size() >= kMaxRemembered) recorded_.clear();
    if (!recorded_.emplace(owner.uid, reason, message).second) return;
  }
  record(owner, type, reason, message);
}

}  // namespace tandem::controller
