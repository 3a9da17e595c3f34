#include "operator/k8s/resource.h"

namespace tandem::k8s {

std::string ResourceType::collectionPath(const std::string& ns) const {
  std::string path = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  if (namespaced && !ns.empty()) path += "/namespaces/" + ns;
  return path + "/" + plural;
}

std::string ResourceType::objectPath(const std::string& ns, const std::string& name,
                                     const std::string& subresource) const {
  std::string path = collectionPath(ns);
  if (!name.empty()) path += "/" + name;
  if (!subresource.empty()) path += "/" + subresource;
  return path;
}

}  // namespace tandem::k8s
