// core/v1 Events about PrefillPools, DecodePools and Routers (what `kubectl
// describe` shows): involvedObject, reason, message, type Normal or Warning,
// source.component and reportingComponent "tandem-operator", first/last
// timestamp and count 1, named "<object>.<16 random hex digits>" (eventName).
//
// Recording never fails the caller: an Event that cannot be written is
// logged and dropped. recordOnce() writes a given (object uid, reason,
// message) at most once per process, so a warning about a spec is not
// repeated on every reconcile, nor at every scaling step (a write of
// spec.replicas through /scale is a new generation), and a change that
// changes the warning's text is warned again. Past 4,096 remembered
// warnings the memory starts over (each may then be written once more):
// objects that were deleted leave theirs. Thread-safe.
#pragma once

#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "operator/controller/api_writer.h"
#include "operator/controller/object_meta.h"

namespace tandem::controller {

inline constexpr const char* kNormal = "Normal";
inline constexpr const char* kWarning = "Warning";

// "<object>.<suffix>", the object's name cut so that the whole stays a
// DNS subdomain of at most 253 characters (no '-' or '.' left before the
// dot): an object named with 237 characters or more would otherwise never
// have an Event, as the API server refuses the name.
std::string eventName(const std::string& object, const std::string& suffix);

class EventRecorder {
 public:
  EventRecorder(ApiWriter& writer, std::string instance);

  void record(const Owner& owner, const std::string& type, const std::string& reason,
              const std::string& message);
  // Records the Event once per owner, reason and message: under a name
  // those determine, so that a restarted controller (or the next leader),
  // which remembers nothing, finds it there and writes nothing again.
  void recordOnce(const Owner& owner, const std::string& type, const std::string& reason,
                  const std::string& message);
  // Forgets what recordOnce wrote for the owner with `reason` (the condition
  // it warned of is over), so a recurrence is warned again (as a new Event).
  void forget(const Owner& owner, const std::string& reason);

 private:
  void create(const Owner& owner, const std::string& type, const std::string& reason,
              const std::string& message, const std::string& name, bool quiet_if_exists);

  ApiWriter& writer_;
  std::string instance_;
  std::mutex mutex_;
  std::set<std::tuple<std::string, std::string, std::string>> recorded_;
  std::set<std::pair<std::string, std::string>> forgotten_;  // (uid, reason) forget() ended
};

}  // namespace tandem::controller
