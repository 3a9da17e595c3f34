#include "operator/controller/api_writer.h"

namespace tandem::controller {

using nlohmann::json;

ApiWriter::ApiWriter(k8s::ApiClient& client, std::function<bool()> may_write,
                     std::function<void()> on_write)
    : client_(client), may_write_(std::move(may_write)), on_write_(std::move(on_write)) {}

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
  if (!may_write_()) return notLeader();
  bool lost_leadership = false;
  bool changed = false;
  auto result = client_.readModifyWrite(
      type, ns, name,
      [&](json& object) {
        if (!may_write_()) {
          lost_leadership = true;
          return false;
        }
        changed = mutate(object);
        return changed;
      },
      subresource);
  if (lost_leadership) return notLeader();
  if (result.isOk() && changed) on_write_();
  return result;
}

}  // namespace tandem::controller
