#include "operator/controller/event_recorder.h"

#include <xxhash.h>

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
  create(owner, type, reason, message, eventName(owner.name, randomHex()),
         /*quiet_if_exists=*/false);
}

void EventRecorder::create(const Owner& owner, const std::string& type, const std::string& reason,
                           const std::string& message, const std::string& name,
                           bool quiet_if_exists) {
  const std::string now = nowRfc3339();
  const nlohmann::json event = {{"apiVersion", "v1"},
                                {"kind", "Event"},
                                {"metadata", {{"name", name}, {"namespace", owner.ns}}},
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
  if (!result.isOk() && !(quiet_if_exists && result.error().isAlreadyExists())) {
    TANDEM_LOG(kWarn) << "controller: event " << reason << " on " << owner.kind << " " << owner.ns
                      << "/" << owner.name << " not recorded: " << result.error().toString();
  }
}

void EventRecorder::forget(const Owner& owner, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = recorded_.lower_bound({owner.uid, reason, ""});
  bool any = false;
  while (it != recorded_.end() && std::get<0>(*it) == owner.uid && std::get<1>(*it) == reason) {
    it = recorded_.erase(it);
    any = true;
  }
  if (any) forgotten_.emplace(owner.uid, reason);
}

void EventRecorder::recordOnce(const Owner& owner, const std::string& type,
                               const std::string& reason, const std::string& message) {
  bool recurrence = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    constexpr size_t kMaxRemembered = 4096;
    if (recorded_.size() >= kMaxRemembered) recorded_.clear();
    if (forgotten_.size() >= kMaxRemembered) forgotten_.clear();
    if (!recorded_.emplace(owner.uid, reason, message).second) return;
    recurrence = forgotten_.erase({owner.uid, reason}) > 0;
  }
  if (recurrence) {
    record(owner, type, reason, message);
    return;
  }
  // The name the owner, reason and message determine: a second create,
  // from a restarted controller or the next leader, finds it (409).
  const std::string key = owner.uid + '\0' + reason + '\0' + message;
  create(owner, type, reason, message,
         eventName(owner.name, hex64(XXH3_64bits(key.data(), key.size()))),
         /*quiet_if_exists=*/true);
}

}  // namespace tandem::controller
