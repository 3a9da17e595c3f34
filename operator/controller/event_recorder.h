// core/v1 Events about PrefillPools, DecodePools and Routers (what `kubectl
// describe` shows): involvedObject, reason, message, type Normal or Warning,
// source.component and reportingComponent "tandem-operator", first/last
// timestamp and count 1, named "<object>.<16 random hex digits>".
//
// Recording never fails the caller: an Event that cannot be written is
// logged and dropped. recordOnce() writes a given (object uid, generation,
// reason) at most once per process, so a warning about a spec is not
// repeated on every reconcile. Thread-safe.
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

class EventRecorder {
 public:
  EventRecorder(ApiWriter& writer, std::string instance);

  void record(const Owner& owner, const std::string& type, const std::string& reason,
              const std::string& message);
  void recordOnce(const Owner& owner, const std::string& type, const std::string& reason,
                  const std::string& message);

 private:
  ApiWriter& writer_;
  std::string instance_;
  std::mutex mutex_;
  std::set<std::tuple<std::string, int64_t, std::string>> recorded_;
};

}  // namespace tandem::controller
