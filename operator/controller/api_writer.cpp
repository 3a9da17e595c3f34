#include "operator/controller/api_writer.h"

namespace tandem::controller {

using nlohmann::json;

ApiWriter::ApiWriter(k8s::ApiClient& client, bool open, std::function<void()> on_write)
    : client_(client), on_write_(std::move(on_write)), open_(open) {}

bool ApiWriter::mayWrite() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_;
}

void ApiWriter::open() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = true;
}

void ApiWriter::close() {
  std::unique_lock<std::mutex> lock(mutex_);
  open_ = false;
  drained_.wait(lock, [this] { return in_flight_ == 0; });
}

int ApiWriter::writesInFlight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_;
}

ApiWriter::InFlight::InFlight(ApiWriter& writer) : writer_(writer) {
  std::lock_guard<std::mutex> lock(writer_.mutex_);
  entered_ = writer_.open_;
  if (entered_) ++writer_.in_flight_;
}

ApiWriter::InFlight::~InFlight() {
  if (!entered_) return;
  std::lock_guard<std::mutex> lock(writer_.mutex_);
  if (--writer_.in_flight_ == 0) writer_.drained_.notify_all();
}

k8s::ApiError ApiWriter::notLeader() const {
  return k8s::ApiError{0, "NotLeader", "this replica does not hold the leader Lease"};
}

k8s::Result<json> ApiWriter::create(const k8s::ResourceType& type, const std::string& ns,
                                    const json& object) {
  return guarded([&] { return client_.create(type, ns, object); });
}

k8s::Result<json> ApiWriter::apply(const k8s::ResourceType& type, const std::string& ns,
                                   const json& object) {
  return guarded([&] { return client_.apply(type, ns, object); });
}

k8s::Result<k8s::Done> ApiWriter::remove(const k8s::ResourceType& type, const std::string& ns,
                                         const std::string& name) {
  return guarded([&] { return client_.remove(type, ns, name); });
}

k8s::Result<json> ApiWriter::mergePatch(const k8s::ResourceType& type, const std::string& ns,
                                        const std::string& name, const json& patch) {
  return guarded([&] { return client_.mergePatch(type, ns, name, patch); });
}

k8s::Result<json> ApiWriter::readModifyWrite(const k8s::ResourceType& type, const std::string& ns,
                                             const std::string& name,
                                             const std::function<bool(json&)>& mutate,
                                             const std::string& subresource) {
  // In flight from the read to the last retry's write: close() waits for it.
  bool lost_leadership = false;
  bool changed = false;
  auto result = guarded(
      [&] {
        return client_.readModifyWrite(
            type, ns, name,
            [&](json& object) {
              if (!mayWrite()) {
                lost_leadership = true;
                return false;
              }
              changed = mutate(object);
              return changed;
            },
            subresource);
      },
      [&] { return changed && !lost_leadership; });
  if (lost_leadership) return notLeader();
  return result;
}

}  // namespace tandem::controller
