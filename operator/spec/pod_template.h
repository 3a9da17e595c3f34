// A pool's or router's spec.template (a pod-template fragment written by its
// user) merged into the pod template the controller generates, with
// Kubernetes' strategic-merge semantics, minus the fields the controller owns.
// A pure function: no I/O, deterministic (same inputs, same JSON), and the
// result never loses a field of the generated template.
//
// Rules (paths in `ignored` start with "template." and name the field the user
// tried to set; a user value equal to the controller's is not listed; a null
// value in the fragment means "not set" and is skipped):
// - metadata.labels, metadata.annotations: the user's keys are added; a key
//   the generated template has keeps its value (listed when the user's differs:
//   template.metadata.labels.<key>). Any other metadata key is listed, unused.
// - spec.nodeSelector: the same union (the controller's keys win, listed
//   as template.spec.nodeSelector.<key> when the user's value differs).
// - spec.affinity, spec.securityContext: deep-merged (user wins on leaves).
// - spec.tolerations, spec.topologySpreadConstraints: the user's list replaces.
// - Lists merged by key: volumes by name (a name the generated template uses
//   keeps its volume: template.spec.volumes[<name>]), imagePullSecrets by name
//   (union), initContainers by name (added; one the generated template has is
//   deep-merged, user wins), containers by name:
//   - a container with a new name is appended as written;
//   - the main container (`main_container`): name, image, command, args,
//     ports and the readiness, liveness and startup probes are the
//     controller's (template.spec.containers[agent].args); env is merged by
//     name (a name the controller sets keeps its entry:
//     template.spec.containers[agent].env[POD_IP]), envFrom appended,
//     volumeMounts merged by mountPath (likewise:
//     template.spec.containers[agent].volumeMounts[/dev/shm]), securityContext
//     and resources deep-merged (user wins), any other key taken as written;
//   - another container the generated template has stays the controller's.
//   List entries without their key (a volume without a name) are listed by
//   index (template.spec.volumes[2]) and unused.
// - Any other spec key (priorityClassName, runtimeClassName, hostIPC,
//   dnsConfig, ...): the user's value, unless it is in `owned_pod_fields`.
// - A map or list given as another type is listed and unused.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::spec {

struct TemplateMergeResult {
  nlohmann::json pod_template;       // {metadata, spec}: `generated` with the fragment merged in
  std::vector<std::string> ignored;  // paths of the user's fields left out, in a stable order
};

// `generated`: a Deployment's spec.template ({metadata: {labels, ...}, spec}).
// `fragment`: the pool's spec.template as written ({metadata: {labels,
// annotations}, spec}); null or {} returns `generated` unchanged.
// `main_container`: the container the controller owns ("agent", "router").
// `owned_pod_fields`: top-level pod spec keys the controller owns for this
// workload ({"terminationGracePeriodSeconds"} for pools).
TemplateMergeResult mergePodTemplate(const nlohmann::json& generated,
                                     const nlohmann::json& fragment,
                                     const std::string& main_container,
                                     const std::vector<std::string>& owned_pod_fields);

}  // namespace tandem::spec
