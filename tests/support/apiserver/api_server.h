// An in-process stand-in for the Kubernetes API server, for tests only (never
// linked into the product): the subset of the real API that tandem-operator
// and kubectl rely on, served over real HTTP/1.1 (and HTTPS with a generated
// test certificate) on 127.0.0.1, port 0. Its behaviour follows the
// Kubernetes API documentation; docs/testing.md lists where it differs from a
// real API server.
//
// What it serves: discovery (/version, /api, /api/v1, /apis,
// /apis/<group>/<version> with status and scale subresources listed),
// /openapi/v2 and /openapi/v3 enough for kubectl, CRDs registered from YAML
// files (or by POSTing CustomResourceDefinitions), CRUD + list (limit,
// continue, labelSelector, fieldSelector metadata.name/namespace) + watch
// (chunked JSON lines, bookmarks, timeoutSeconds) for the custom kinds,
// Namespaces, Deployments, Services, EndpointSlices, Pods, Leases, Events,
// Secrets, ConfigMaps, ServiceAccounts, Roles, RoleBindings, ClusterRoles,
// ClusterRoleBindings and NetworkPolicies; service-account tokens
// (TokenRequest) and RBAC when enabled; resourceVersion with 409 on a stale update;
// metadata.generation bumped on spec changes only; the status and scale
// subresources (autoscaling/v1 Scale); JSON merge patch, strategic merge
// patch for the built-in kinds as far as kubectl uses it, and server-side
// apply (application/apply-patch+yaml); ownerReference garbage collection.
//
// Thread-safe: hooks may be called from the test thread while clients call.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tandem::testing {

struct ApiServerOptions {
  bool tls = false;  // HTTPS with a generated CA and server certificate (127.0.0.1, localhost)
  // Bearer tokens accepted; empty accepts any request (no authentication).
  // With TLS, a client certificate signed by the test CA is accepted too (its CN is the user).
  std::vector<std::string> tokens;
  int bookmark_interval_ms = 1000;  // how often open watches get a BOOKMARK
  // Role-based access control: requests by service-account users (tokens
  // from TokenRequest, `kubectl create token`) are allowed only as their
  // Roles and ClusterRoles grant (403 Forbidden otherwise). Every other
  // user is a superuser, as is everyone when this is off. Discovery,
  // /version, /openapi and health stay open to every authenticated user.
  bool rbac = false;
  // The address it listens on ("0.0.0.0": every interface, e.g. for pods
  // in containers on a bridge network); url() and kubeconfigs keep 127.0.0.1.
  std::string listen_address = "127.0.0.1";
  // More IP addresses its TLS certificate names, beside 127.0.0.1 (the
  // address containers reach it at).
  std::vector<std::string> certificate_ips;
};

// One answered request: who made it and the status it got.
struct RequestRecord {
  std::string method;
  std::string target;  // path and query, as sent
  std::string user;    // as in requestLog
  std::string token;   // the bearer token presented, "" without one
  int status = 0;      // the HTTP status answered (a watch: when its stream started)
};

// PEM text of the test PKI (generated at start-up with OpenSSL).
struct TestPki {
  std::string ca_certificate;
  std::string server_certificate;
  std::string server_key;
  std::string client_certificate;  // CN "test-client", signed by the CA
  std::string client_key;
};

class ApiServer {
 public:
  explicit ApiServer(ApiServerOptions options = {});
  ~ApiServer();  // stops
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  int port() const;
  // "http://127.0.0.1:PORT" or "https://127.0.0.1:PORT".
  std::string url() const;
  const TestPki& pki() const;
  // Writes a kubeconfig for this server (token, CA data when TLS, the given
  // namespace) and returns its path.
  std::filesystem::path writeKubeconfig(const std::filesystem::path& path,
                                        const std::string& token = "test-token",
                                        const std::string& ns = "default") const;

  // CRDs from YAML files (each may hold several documents), as `kubectl apply` would.
  void registerCrds(const std::filesystem::path& file_or_directory);

  // --- Direct access to the store (as an admin; not counted as writes) ---
  std::optional<nlohmann::json> get(const std::string& api_version, const std::string& kind,
                                    const std::string& ns, const std::string& name) const;
  std::vector<nlohmann::json> list(const std::string& api_version, const std::string& kind,
                                   const std::string& ns) const;
  // Creates or replaces (bumping resourceVersion, generation as the API would); returns the stored
  // object.
  nlohmann::json put(const nlohmann::json& object);
  void remove(const std::string& api_version, const std::string& kind, const std::string& ns,
              const std::string& name);

  // --- Hooks ---
  // Replaces the accepted bearer tokens (empty: accept any request), e.g. to
  // test token rotation. Open watches are not affected.
  void setTokens(std::vector<std::string> tokens);
  // Writes (POST, PUT, PATCH, DELETE) answered with 2xx, per user (the bearer
  // token, or the client certificate's CN; "anonymous" without either).
  std::map<std::string, uint64_t> writesByUser() const;
  uint64_t writesBy(const std::string& user) const;
  // Every request seen: "METHOD PATH?QUERY user", in order. The user of a
  // service-account token is "system:serviceaccount:NS:NAME".
  std::vector<std::string> requestLog() const;
  // Every request answered, in the order the answers started.
  std::vector<RequestRecord> answeredRequests() const;
  // The next `count` PUT/PATCH on objects of `kind` (any kind when empty) get 409 Conflict.
  void injectConflicts(int count, const std::string& kind = "");
  // Forgets watch history: open watches get an ERROR event with a 410 Status
  // (reason Expired) and end; a watch from an older resourceVersion, or a
  // list continued with an older continue token, gets 410 (a plain list with
  // resourceVersion N means "not older than N" and is served).
  void compactHistory();
  // Ends every open watch stream (as a server restart or timeout would).
  void closeWatches();
  // The next `count` watch requests get 200 and one ERROR event with a 410
  // Expired Status, whatever their version.
  void injectWatchesGone(int count);
  // Loses every object and all history, as a server restarted on a fresh
  // store does: watches end, and versions start again from 1, so a client's
  // last version is one this server has not reached.
  void restartEmpty();
  // Stops answering: accepted connections are held without an answer until
  // resumed (to test client timeouts).
  void setStalled(bool stalled);
  // Plays the Deployment controller and kubelet: whenever a Deployment's spec
  // changes, and on each call of this, its status is set as if every replica
  // of the current template were running and ready (`ready` false: none ready),
  // and pods labelled like the template exist for it (named
  // <deployment>-<template hash>-<i>, owned by the Deployment; no ReplicaSets).
  // Once called, automatic mode stays on; each call also clears the manual
  // statuses set with setDeploymentStatus.
  void setDeploymentControllerAuto(bool ready);
  // Sets one Deployment's status fields directly (replicas, updatedReplicas,
  // readyReplicas, availableReplicas = ready, observedGeneration = generation,
  // condition Available = ready >= spec.replicas). That Deployment is then
  // left alone by automatic mode until setDeploymentControllerAuto is called.
  void setDeploymentStatus(const std::string& ns, const std::string& name, int64_t replicas,
                           int64_t updated, int64_t ready);
  // Gives a Deployment room for only `pods` scheduled pods (nullopt: all):
  // the rest stay Pending, PodScheduled False with reason Unschedulable, as
  // on a cluster whose nodes are full (see DeploymentSimulator).
  void setSchedulableReplicas(const std::string& ns, const std::string& deployment,
                              std::optional<int64_t> pods);
  // The podIP given to each new scheduled pod (default 10.244.0.<i + 2>).
  void setPodIps(std::function<std::string(const std::string& ns, const std::string& pod)> ips);
  // Pods' status is written by a kubelet stand-in (PodRunner) instead of
  // the Deployment stand-in: new pods start Pending (scheduled, no IP), their
  // status is never overwritten, and a Deployment counts as ready the pods
  // whose Ready condition is True. Call podStatusChanged after each write.
  void setPodsRunByKubelet();
  // Writes a pod's status as the kubelet does (PUT on the status
  // subresource with the object's resourceVersion): false when the pod is
  // gone or was changed since it was read. Then its Deployment's status is
  // brought up to date.
  bool updatePodStatus(const nlohmann::json& pod);
  // A token for ServiceAccount `name` in `ns` (TokenRequest, as the kubelet
  // asks for a pod's projected token); "" when the ServiceAccount does not exist.
  std::string serviceAccountToken(const std::string& ns, const std::string& name);
  // Current resourceVersion of the store.
  uint64_t resourceVersion() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::testing
