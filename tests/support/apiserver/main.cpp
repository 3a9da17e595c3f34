// tandem-test-apiserver: the test Kubernetes API server as a process, for
// trying kubectl or the operator by hand. Prints "apiserver listening on
// URL", optionally writes a kubeconfig, and serves until interrupted.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "tests/support/apiserver/api_server.h"

int main(int argc, char** argv) {
  CLI::App app{"In-process Kubernetes API server stand-in, for tests"};
  std::string kubeconfig_out;
  std::string crds;
  bool tls = false;
  bool rbac = false;
  std::string token = "test-token";
  app.add_option("--kubeconfig-out", kubeconfig_out, "write a kubeconfig for this server here");
  app.add_option("--crds", crds, "register the CRDs of this file or directory");
  app.add_flag("--tls", tls, "serve HTTPS with a generated test CA");
  app.add_flag("--rbac", rbac, "check service-account users' requests against RBAC");
  app.add_option("--token", token, "bearer token written into the kubeconfig");
  CLI11_PARSE(app, argc, argv);
  try {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    tandem::testing::ApiServerOptions options;
    options.tls = tls;
    options.rbac = rbac;
    tandem::testing::ApiServer server(options);
    if (!crds.empty()) server.registerCrds(crds);
    if (!kubeconfig_out.empty()) server.writeKubeconfig(kubeconfig_out, token);
    std::cout << "apiserver listening on " << server.url() << std::endl;
    int received = 0;
    sigwait(&signals, &received);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tandem-test-apiserver: %s\n", error.what());
    return 1;
  }
  return 0;
}
