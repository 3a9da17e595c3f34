// The API resources Tandem reads and writes, named as the REST paths name them:
// /api/v1/namespaces/NS/services, /apis/apps/v1/namespaces/NS/deployments, ...
#pragma once

#include <string>

namespace tandem::k8s {

struct ResourceType {
  std::string group;    // "" for the core group
  std::string version;  // "v1", "v1alpha1"
  std::string plural;   // "deployments"
  std::string kind;     // "Deployment"
  bool namespaced = true;

  // "apps/v1" or "v1" (core).
  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
  // The collection path: "/apis/apps/v1/namespaces/NS/deployments", or without
  // the namespace part when `ns` is empty (all namespaces, or cluster-scoped).
  std::string collectionPath(const std::string& ns) const;
  // The collection path plus "/NAME" and "/SUBRESOURCE" when given.
  std::string objectPath(const std::string& ns, const std::string& name,
                         const std::string& subresource = "") const;
  bool operator==(const ResourceType&) const = default;
};

namespace resources {
inline const ResourceType kPrefillPools{"tandem.dev", "v1alpha1", "prefillpools", "PrefillPool"};
inline const ResourceType kDecodePools{"tandem.dev", "v1alpha1", "decodepools", "DecodePool"};
inline const ResourceType kRouters{"tandem.dev", "v1alpha1", "routers", "Router"};
inline const ResourceType kDeployments{"apps", "v1", "deployments", "Deployment"};
inline const ResourceType kServices{"", "v1", "services", "Service"};
inline const ResourceType kPods{"", "v1", "pods", "Pod"};
inline const ResourceType kPodDisruptionBudgets{"policy", "v1", "poddisruptionbudgets",
                                                "PodDisruptionBudget"};
inline const ResourceType kEvents{"", "v1", "events", "Event"};
inline const ResourceType kEndpointSlices{"discovery.k8s.io", "v1", "endpointslices",
                                          "EndpointSlice"};
inline const ResourceType kHorizontalPodAutoscalers{"autoscaling", "v2", "horizontalpodautoscalers",
                                                    "HorizontalPodAutoscaler"};
inline const ResourceType kLeases{"coordination.k8s.io", "v1", "leases", "Lease"};
inline const ResourceType kCustomResourceDefinitions{
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", false};
}  // namespace resources

}  // namespace tandem::k8s
