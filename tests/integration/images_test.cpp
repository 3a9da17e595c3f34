// Tandem's images built for real from this checkout and run: `scripts/
// images.sh` (what `make images` runs) makes a Debian 12 base from the apt
// archive with mmdebstrap and builds docker/agent-cpu.Dockerfile and
// docker/operator.Dockerfile with the container engine `make deps` installs
// (podman), compiling the programs in their build stage. Then, against the
// built images:
//  - each runs as uid 65532 with the OCI labels of this commit;
//  - the operator answers --help for its controller and router on a
//    read-only root filesystem, and its controller, run from the image
//    against the Kubernetes API stand-in, reconciles the example PrefillPool
//    into its Deployment and Service;
//  - the CPU agent, and where a CUDA toolkit is the GPU agent built here
//    (docker/agent-gpu-local.Dockerfile, with --device cpu), serve the tiny
//    test model from a read-only root filesystem as uid 65532, and their
//    greedy tokens equal those of the agent built on the host (same
//    sources, same Debian compiler: the same bits); SIGTERM through `podman
//    stop` drains each and it exits 0 well within the grace period, as PID 1
//    of its container;
//  - both are pushed as `make push REGISTRY=127.0.0.1:PORT` does to a
//    local registry (Debian's docker-registry), under the names the chart's
//    image.registry gives them; skopeo reads the operator's labels and the
//    digest the push reported back; it is pulled into an empty image store
//    with that digest, and run from there.
// The build stages are lent this build's compiler cache read-only (images.sh
// --ccache; none when the build compiles without one), so the programs the
// host build just compiled are not compiled again; a cache without them
// (another compiler, another header) only makes the stage compile, and what
// runs is checked the same way.
// One test, because the build is one long step every check needs (alone on 2
// cores, from a fresh base: about 15 minutes with nothing cached, 6 with the
// cache; docs/images.md).
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/loopback_socket.h"
#include "common/subprocess.h"
#include "tests/support/agent_server.h"
#include "tests/support/apiserver/api_server.h"
#include "tests/support/command.h"
#include "tests/support/kubectl.h"
#include "tests/support/test_files.h"
#include "tests/support/test_helpers.h"

namespace {

namespace fs = std::filesystem;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary
using nlohmann::json;
using std::chrono::seconds;
using tandem::testing::ApiServer;
using tandem::testing::ApiServerOptions;
using tandem::testing::Kubectl;
using tandem::testing::KubectlResult;

const fs::path kSourceDir = TANDEM_SOURCE_DIR;
const fs::path kBinDir = TANDEM_BIN_DIR;

// Runs argv to its end (or the deadline) with `env`; stderr kept in `work`.
CommandResult runCommand(const std::vector<std::string>& argv, const fs::path& work,
                         std::chrono::milliseconds timeout,
                         const std::vector<std::pair<std::string, std::string>>& env = {}) {
  static int calls = 0;
  return runToEnd(argv, work / ("command-" + std::to_string(++calls) + ".err"), timeout, env);
}

std::string describe(const CommandResult& r) {
  return "exit " + std::to_string(r.exit_status) + "\nstdout:\n" + r.out.substr(0, 4000) +
         "\nstderr (last 4000 bytes):\n" +
         (r.err.size() > 4000 ? r.err.substr(r.err.size() - 4000) : r.err);
}

bool onPath(const std::string& program) {
  return std::system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0;
}

// A copy of the tiny test model that uid 65532 can read (test directories
// are 0700 and root's).
fs::path worldReadableCopy(const fs::path& model, const fs::path& parent) {
  const fs::path copy = parent / "model";
  fs::copy(model, copy, fs::copy_options::recursive);
  ::chmod(parent.c_str(), 0755);
  ::chmod(copy.c_str(), 0755);
  for (const auto& entry : fs::directory_iterator(copy)) ::chmod(entry.path().c_str(), 0644);
  return copy;
}

class Images : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!onPath("podman")) {
      FAIL() << "podman is not installed: `make deps` installs it (with mmdebstrap, runc, "
                "skopeo and docker-registry) for this test and `make images`";
    }
  }

  // podman ARGS..., with the engine configuration images.sh wrote.
  CommandResult podman(const std::vector<std::string>& args,
                       std::chrono::milliseconds timeout = seconds(120)) {
    std::vector<std::string> argv = {"podman"};
    argv.insert(argv.end(), args.begin(), args.end());
    return runCommand(argv, work_.path(), timeout, engine_env_);
  }

  // podman run of `image` named `name` (removed on exit), read-only, on
  // the host's network, with one read-only `volume` (HOST:CONTAINER:ro):
  // the argv for a Subprocess that keeps it in the foreground.
  static std::vector<std::string> containerArgv(const std::string& name, const std::string& volume,
                                                const std::string& image,
                                                const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"podman",    "run",  "--rm",     "--name", name, "--read-only",
                                     "--network", "host", "--volume", volume,   image};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  std::string inspect(const std::string& image, const std::string& format) {
    const CommandResult r = podman({"image", "inspect", "--format", format, image});
    EXPECT_EQ(r.exit_status, 0) << describe(r);
    std::string text = r.out;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  }

  TempDir work_{"tandem-images-test"};
  // The build tree's images folder: the base and the layer cache stay in the
  // engine's storage between runs, so a second run builds nothing anew.
  fs::path out_ = kBinDir.parent_path() / "images-test";
  std::vector<std::pair<std::string, std::string>> engine_env_;
};

TEST_F(Images, BuiltFromTheCheckoutTheyRunServePushAndPull) {
  // ---- build ----
  // The GPU agent image built here too where a CUDA toolkit is (it is not a
  // Debian package, so `make deps` does not install one).
  const bool cuda_toolkit = fs::exists("/usr/local/cuda/bin/nvcc");
  if (!cuda_toolkit) RecordProperty("agent_gpu_local", "not built: no /usr/local/cuda/bin/nvcc");
  const fs::path cache_folder = TANDEM_CCACHE_FOLDER;
  const std::string ccache = fs::is_directory(cache_folder) ? cache_folder.string() : "none";
  std::vector<std::string> build = {(kSourceDir / "scripts/images.sh").string(), "--out",
                                    out_.string(), "--ccache", ccache};
  if (cuda_toolkit) build.insert(build.end(), {"--only", "all"});
  const CommandResult built = runCommand(build, work_.path(), std::chrono::minutes(45));
  ASSERT_EQ(built.exit_status, 0) << describe(built);
  std::ifstream listing(out_ / "images.json");
  ASSERT_TRUE(listing) << "images.sh wrote no images.json";
  const json summary = json::parse(listing);
  // The engine configuration the build used (the one images.sh wrote, or
  // the caller's own CONTAINERS_CONF), for every podman call below.
  const std::string conf = summary.value("containers_conf", "");
  if (!conf.empty()) engine_env_ = {{"CONTAINERS_CONF", conf}};
  std::map<std::string, std::string> tags;
  for (const json& image : summary.at("images")) {
    EXPECT_GT(image.at("bytes").get<double>(), 0) << image.dump();
    tags[image.at("name").get<std::string>()] = image.at("tag").get<std::string>();
    RecordProperty(image.at("name").get<std::string>() + "_bytes",
                   std::to_string(image.at("bytes").get<int64_t>()));
    RecordProperty(image.at("name").get<std::string>() + "_build_seconds",
                   std::to_string(image.at("build_seconds").get<int64_t>()));
  }
  ASSERT_EQ(tags.size(), cuda_toolkit ? 3u : 2u) << summary.dump();
  EXPECT_EQ(summary.at("ccache"), ccache);
  const std::string agent = tags.at("agent-cpu");
  const std::string operator_image = tags.at("operator");
  const std::string revision = summary.at("revision").get<std::string>();
  EXPECT_EQ(revision.size(), 40u) << "the checkout's commit names the images: " << revision;

  // ---- what the images say about themselves ----
  for (const auto& [key, image] : tags) {
    SCOPED_TRACE(image);
    EXPECT_EQ(inspect(image, "{{.Config.User}}"), "65532:65532");
    EXPECT_EQ(inspect(image, "{{index .Config.Labels \"org.opencontainers.image.revision\"}}"),
              revision);
    EXPECT_EQ(inspect(image, "{{index .Config.Labels \"org.opencontainers.image.version\"}}"),
              "0.1.0");
  }
  EXPECT_EQ(inspect(agent, "{{json .Config.Entrypoint}}"), R"(["tandem-agent"])");
  EXPECT_EQ(inspect(operator_image, "{{json .Config.Entrypoint}}"), R"(["tandem-operator"])");

  // ---- the operator's programs start, read-only, as uid 65532 ----
  for (const char* sub : {"controller", "router"}) {
    const CommandResult help =
        podman({"run", "--rm", "--read-only", operator_image, sub, "--help"});
    EXPECT_EQ(help.exit_status, 0) << describe(help);
    EXPECT_NE(help.out.find("Usage"), std::string::npos) << describe(help);
  }

  // ---- the operator's controller, from the image, reconciles a pool ----
  {
    ApiServerOptions options;
    options.tls = true;  // as a cluster's: the kubeconfig carries the CA
    ApiServer api(options);
    api.setDeploymentControllerAuto(true);
    const fs::path kube = work_.path() / "kube";
    fs::create_directories(kube);
    ::chmod(work_.path().c_str(), 0755);
    ::chmod(kube.c_str(), 0755);
    const fs::path kubeconfig = api.writeKubeconfig(kube / "config", "admin", "default");
    ::chmod(kubeconfig.c_str(), 0644);  // uid 65532 reads it
    Kubectl admin(kubeconfig, work_.path() / "kubectl");
    const KubectlResult crds = admin.run({"apply", "-f", (kSourceDir / "crds").string()});
    ASSERT_EQ(crds.exit_status, 0) << crds.err;
    for (const char* file : {"secret.yaml", "prefillpool.yaml"}) {
      const KubectlResult applied =
          admin.run({"apply", "-f", (kSourceDir / "examples/kubernetes" / file).string()});
      ASSERT_EQ(applied.exit_status, 0) << file << ": " << applied.err;
    }
    const std::string controller_name =
        "tandem-images-test-controller-" + std::to_string(::getpid());
    podman({"rm", "--force", controller_name});
    tandem::Subprocess controller(
        containerArgv(controller_name, kubeconfig.string() + ":/kube/config:ro", operator_image,
                      {"controller", "--kubeconfig", "/kube/config", "--namespace", "default",
                       "--metrics-port", "0", "--default-agent-image", agent}),
        work_.path() / "controller.err", engine_env_);
    ASSERT_FALSE(controller.waitForLine("controller started", seconds(60)).empty())
        << controller.stderrText();
    ASSERT_TRUE(eventually(
        [&] {
          return api.get("apps/v1", "Deployment", "default", "prefill").has_value() &&
                 api.get("v1", "Service", "default", "prefill").has_value();
        },
        seconds(60), std::chrono::milliseconds(100)))
        << controller.stderrText();
    const json deployment = *api.get("apps/v1", "Deployment", "default", "prefill");
    EXPECT_EQ(deployment["spec"]["template"]["spec"]["containers"][0]["image"],
              "ghcr.io/tandem/agent:0.1.0")
        << "the pool's own spec.image wins over the default";
    const CommandResult stopped = podman({"stop", "--time", "30", controller_name}, seconds(60));
    EXPECT_EQ(stopped.exit_status, 0) << describe(stopped);
    EXPECT_EQ(controller.wait(seconds(30)), 0) << controller.stderrText();
  }

  // ---- each agent image serves, with the host agent's tokens, and drains on SIGTERM ----
  TempDir model_parent("tandem-images-model");
  const fs::path model = worldReadableCopy(tinyModelDir(), model_parent.path());
  Agent host;
  std::vector<std::string> agent_images = {agent};
  if (tags.count("agent-gpu-local") != 0) agent_images.push_back(tags.at("agent-gpu-local"));
  for (const std::string& image : agent_images) {
    SCOPED_TRACE(image);
    const std::string name = "tandem-images-test-agent-" + std::to_string(::getpid());
    podman({"rm", "--force", name});
    // --device cpu: the GPU image's agent, compiled with CUDA, serves on the
    // CPU where there is no GPU (and the CPU image's takes the flag too).
    tandem::Subprocess served(
        containerArgv(name, model.string() + ":/model:ro", image,
                      {"serve", "--model", "/model", "--device", "cpu", "--port", "0", "--host",
                       "127.0.0.1", "--served-model-name", "tiny"}),
        work_.path() / "agent.err", engine_env_);
    const std::string line = served.waitForLine("listening on ", seconds(120));
    ASSERT_FALSE(line.empty()) << "the agent in its container did not start:\n"
                               << served.stderrText();
    httplib::Client contained("127.0.0.1", std::stoi(line.substr(line.rfind(':') + 1)));
    contained.set_read_timeout(60, 0);
    auto health = contained.Get("/health");
    ASSERT_TRUE(health) << "no answer from /health";
    EXPECT_EQ(health->status, 200) << health->body;
    for (uint32_t seed : {5u, 6u}) {
      const json body = greedy(randomPrompt(40, seed), 12);
      auto res = contained.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(res) << "no answer from the contained agent";
      ASSERT_EQ(res->status, 200) << res->body;
      EXPECT_EQ(tokenIds(json::parse(res->body)), tokenIds(host.post("/v1/completions", body)))
          << "seed " << seed;
    }
    const auto stop_start = std::chrono::steady_clock::now();
    const CommandResult stopped = podman({"stop", "--time", "30", name}, seconds(60));
    EXPECT_EQ(stopped.exit_status, 0) << describe(stopped);
    EXPECT_EQ(served.wait(seconds(30)), 0) << "the agent's exit (137: killed after the grace "
                                              "period)\n"
                                           << served.stderrText();
    EXPECT_LT(std::chrono::steady_clock::now() - stop_start, seconds(20));
    EXPECT_NE(served.stderrText().find("draining"), std::string::npos) << served.stderrText();
  }

  // ---- pushed to a registry, read back, pulled and run ----
  ASSERT_TRUE(onPath("docker-registry")) << "`make deps` installs docker-registry";
  const int port = tandem::freeLoopbackPort();
  const fs::path registry_config = work_.path() / "registry.yml";
  std::ofstream(registry_config) << "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: "
                                 << (work_.path() / "registry").string()
                                 << "\nhttp:\n  addr: 127.0.0.1:" << port << "\n";
  tandem::Subprocess registry({"docker-registry", "serve", registry_config.string()},
                              work_.path() / "registry.err");
  httplib::Client registry_client("127.0.0.1", port);
  ASSERT_TRUE(eventually(
      [&] {
        auto res = registry_client.Get("/v2/");
        return res && res->status == 200;
      },
      seconds(30), std::chrono::milliseconds(100)))
      << registry.stderrText();
  // What `make push REGISTRY=...` runs (the images are built already: the
  // layer cache makes it a push).
  const CommandResult pushed =
      runCommand({(kSourceDir / "scripts/images.sh").string(), "--out", out_.string(), "--push",
                  "127.0.0.1:" + std::to_string(port)},
                 work_.path(), std::chrono::minutes(20));
  ASSERT_EQ(pushed.exit_status, 0) << describe(pushed);
  std::ifstream pushed_listing(out_ / "images.json");
  const json after_push = json::parse(pushed_listing);
  std::map<std::string, json> by_name;
  for (const json& image : after_push.at("images")) by_name[image.at("name")] = image;
  const std::string remote = by_name.at("operator").at("pushed");
  // The chart's image.registry maps ghcr.io/tandem/operator to this name.
  EXPECT_EQ(remote, "127.0.0.1:" + std::to_string(port) + "/tandem/operator:0.1.0");
  EXPECT_EQ(by_name.at("agent-cpu").at("pushed"),
            "127.0.0.1:" + std::to_string(port) + "/tandem/agent:0.1.0-cpu");
  const CommandResult read_back = runCommand(
      {"skopeo", "inspect", "--tls-verify=false", "docker://" + remote}, work_.path(), seconds(60));
  ASSERT_EQ(read_back.exit_status, 0) << describe(read_back);
  const json remote_info = json::parse(read_back.out);
  EXPECT_EQ(remote_info.at("Labels").at("org.opencontainers.image.revision"), revision);
  EXPECT_EQ(remote_info.at("Digest"), by_name.at("operator").at("digest"))
      << "the digest the push reported is the one the registry serves";
  // Pulled into an empty image store (its own root), so every layer comes
  // from the registry; the main store is left as it was.
  const fs::path store = work_.path() / "store";
  const std::vector<std::string> empty = {"--root", (store / "root").string(), "--runroot",
                                          (store / "run").string()};
  auto in_empty = [&](std::vector<std::string> args) {
    args.insert(args.begin(), empty.begin(), empty.end());
    return args;
  };
  ASSERT_EQ(podman(in_empty({"images", "--quiet"})).out, "") << "the new store is empty";
  const CommandResult pulled =
      podman(in_empty({"pull", "--tls-verify=false", remote}), seconds(300));
  ASSERT_EQ(pulled.exit_status, 0) << describe(pulled);
  const std::string repository = remote.substr(0, remote.rfind(':'));
  const CommandResult digests = podman(in_empty(
      {"image", "inspect", "--format", "{{range .RepoDigests}}{{println .}}{{end}}", remote}));
  EXPECT_NE(digests.out.find(repository + "@" + remote_info.at("Digest").get<std::string>()),
            std::string::npos)
      << "the pulled image's digest is the one the registry serves\n"
      << describe(digests);
  const CommandResult ran =
      podman(in_empty({"run", "--rm", "--read-only", remote, "router", "--help"}));
  EXPECT_EQ(ran.exit_status, 0) << describe(ran);
  podman(in_empty({"rmi", "--all", "--force"}));
  // The pushed names go from the main store (the images keep their own).
  podman({"rmi", remote, by_name.at("agent-cpu").at("pushed").get<std::string>()});
}

}  // namespace
