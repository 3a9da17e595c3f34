// The images in docker/, checked without a container engine: each
// Dockerfile is read and held against the repository (COPY sources,
// .dockerignore, what CMake reads), the build (the programs in
// TANDEM_BIN_DIR and the stage that builds them), the way pods start the
// images (the controller's command, the chart's args) and the libraries the
// programs load (ldd -> dpkg-query -S -> the final stage's apt-get list).
// Altered copies of the real files show that each check catches its fault.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "operator/controller/desired_objects.h"
#include "operator/spec/cluster_spec.h"
#include "tests/integration/docker_image_checks.h"
#include "tests/integration/dockerfile_parser.h"
#include "tests/support/apiserver/yaml_json.h"
#include "tests/support/helm.h"
#include "tests/support/test_files.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Dockerfile;
using testing::ImageExpectations;

const fs::path kSourceDir = TANDEM_SOURCE_DIR;
const fs::path kBinDir = TANDEM_BIN_DIR;

// Packages of Priority required that apt itself depends on, so present in
// every debian:*-slim and ubuntu:* image (and NVIDIA's CUDA images, which
// are built on ubuntu): the C library (libc.so.6, libm.so.6, the dynamic
// loader), the C++ runtime, libgcc_s and zlib.
const std::set<std::string> kBasePackages = {"libc6", "libstdc++6", "libgcc-s1", "zlib1g"};

std::string readSource(const std::string& relative) {
  return testing::readFile(kSourceDir / relative);
}

// CMakeLists.txt and every folder the root CMakeLists.txt adds: what the
// build stage must copy for `cmake -S` to configure.
// The folders the root CMakeLists.txt always configures: its
// add_subdirectory calls outside if() blocks (those inside depend on options
// such as TANDEM_TESTS, which the images' builds turn off).
std::vector<std::string> pathsCMakeReads() {
  std::vector<std::string> paths = {"CMakeLists.txt"};
  std::istringstream text(readSource("CMakeLists.txt"));
  static const std::regex kAdd(R"(^\s*add_subdirectory\(\s*([^\s)]+))");
  static const std::regex kIf(R"(^\s*if\s*\()");
  static const std::regex kEndIf(R"(^\s*endif\s*\()");
  int depth = 0;
  for (std::string line; std::getline(text, line);) {
    std::smatch match;
    if (std::regex_search(line, kIf)) ++depth;
    if (std::regex_search(line, kEndIf)) --depth;
    if (depth == 0 && std::regex_search(line, match, kAdd)) paths.push_back(match[1].str());
  }
  return paths;
}

std::string lines(const std::vector<std::string>& problems) {
  std::string text;
  for (const std::string& problem : problems) text += "  " + problem + "\n";
  return text;
}

bool anyContains(const std::vector<std::string>& problems, const std::string& part) {
  for (const std::string& problem : problems) {
    if (problem.find(part) != std::string::npos) return true;
  }
  return false;
}

// `text` with `from` replaced by `to`; fails the test when `from` is absent,
// so that an alteration can never silently leave the file as it was.
std::string altered(const std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "\"" << from << "\" is not in the Dockerfile";
  if (at == std::string::npos) return text;
  std::string result = text;
  result.replace(at, from.size(), to);
  return result;
}

// The program a pool's pods run (command[0] of the controller's Deployment).
std::string agentCommand() {
  const spec::ClusterSpec cluster = spec::loadClusterSpec(kSourceDir / "examples/cluster.yaml");
  const spec::PoolSpec& pool = cluster.pools.at(0);
  const controller::Owner owner{
      "tandem.dev/v1alpha1", "DecodePool", "serving", pool.name, "uid", 1};
  controller::WorkloadDefaults defaults;
  defaults.agent_image = "ghcr.io/tandem/agent:test";
  const json deployment = controller::desiredPoolDeployment(owner, pool, defaults);
  return deployment["spec"]["template"]["spec"]["containers"][0]["command"][0];
}

std::string routerCommand() {
  const controller::Owner owner{"tandem.dev/v1alpha1", "Router", "serving", "front", "uid", 1};
  controller::WorkloadDefaults defaults;
  defaults.operator_image = "ghcr.io/tandem/operator:test";
  const json deployment =
      controller::desiredRouterDeployment(owner, spec::RouterSpec{}, {"p"}, {"d"}, defaults);
  return deployment["spec"]["template"]["spec"]["containers"][0]["command"][0];
}

struct Image {
  std::string path;  // relative to the repository root
  std::string text;
  Dockerfile file;
  ImageExpectations expected;
};

// Reads docker/<name> and everything its checks compare with; the library
// table is made once per image (ldd and dpkg-query are the slow part).
Image loadImage(const std::string& name, const std::string& entrypoint, bool other_distribution) {
  Image image;
  image.path = "docker/" + name;
  image.text = readSource(image.path);
  image.file = testing::parseDockerfile(image.path, image.text);
  ImageExpectations& expected = image.expected;
  expected.source_dir = kSourceDir;
  expected.bin_dir = kBinDir;
  expected.dockerignore_text = readSource(".dockerignore");
  expected.required_context_paths = pathsCMakeReads();
  expected.entrypoint = entrypoint;
  expected.base_packages = kBasePackages;
  expected.compare_families = other_distribution;
  const auto prefix = image.file.global_args.find("UCX_PREFIX");
  if (prefix != image.file.global_args.end()) expected.ucx_prefix = prefix->second;

  std::vector<fs::path> binaries;
  for (const std::string& program : testing::finalStageBinaries(image.file, expected.ucx_prefix)) {
    binaries.push_back(kBinDir / program);
  }
  std::vector<std::string> problems;
  const std::vector<testing::SharedLibrary> libraries =
      testing::sharedLibrariesOf(binaries, problems);
  std::vector<std::string> paths;
  for (const testing::SharedLibrary& library : libraries) paths.push_back(library.path);
  const std::map<std::string, std::string> packages = testing::debianPackagesOf(paths);
  for (const testing::SharedLibrary& library : libraries) {
    expected.library_packages[library.soname] = packages.at(library.path);
  }
  EXPECT_TRUE(problems.empty()) << lines(problems);
  return image;
}

std::vector<std::string> check(const Image& image, const std::string& text) {
  return testing::checkDockerfile(testing::parseDockerfile(image.path, text), image.expected);
}

class DockerImagesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cpu_agent_ = new Image(loadImage("agent-cpu.Dockerfile", agentCommand(), false));
    gpu_agent_ = new Image(loadImage("agent.Dockerfile", agentCommand(), true));
    gpu_local_agent_ = new Image(loadImage("agent-gpu-local.Dockerfile", agentCommand(), false));
    operator_ = new Image(loadImage("operator.Dockerfile", routerCommand(), false));
  }
  static void TearDownTestSuite() {
    delete cpu_agent_;
    delete gpu_agent_;
    delete gpu_local_agent_;
    delete operator_;
  }
  static Image* cpu_agent_;
  static Image* gpu_agent_;
  static Image* gpu_local_agent_;
  static Image* operator_;
};

Image* DockerImagesTest::cpu_agent_ = nullptr;
Image* DockerImagesTest::gpu_agent_ = nullptr;
Image* DockerImagesTest::gpu_local_agent_ = nullptr;
Image* DockerImagesTest::operator_ = nullptr;

TEST_F(DockerImagesTest, PodsRunTheProgramsTheImagesHold) {
  EXPECT_EQ(agentCommand(), "tandem-agent");
  EXPECT_EQ(routerCommand(), "tandem-operator");
}

TEST_F(DockerImagesTest, CpuAgentImagePasses) {
  const std::vector<std::string> problems = check(*cpu_agent_, cpu_agent_->text);
  EXPECT_TRUE(problems.empty()) << lines(problems);
  // The agent loads UCX, and UCX's transport modules their RDMA libraries.
  const auto& packages = cpu_agent_->expected.library_packages;
  EXPECT_EQ(packages.at("libucp.so.0"), "libucx0");
  EXPECT_EQ(packages.at("libibverbs.so.1"), "libibverbs1");
  EXPECT_EQ(packages.at("libyaml-cpp.so.0.7"), "libyaml-cpp0.7");
}

TEST_F(DockerImagesTest, OperatorImagePasses) {
  const std::vector<std::string> problems = check(*operator_, operator_->text);
  EXPECT_TRUE(problems.empty()) << lines(problems);
  EXPECT_EQ(operator_->expected.library_packages.count("libucp.so.0"), 0u);
}

// The GPU agent built here: the CPU image's final stage (the CUDA runtime is
// linked statically; libcuda comes from the node's driver at run time), a
// build stage configured with CUDA against a mounted toolkit.
TEST_F(DockerImagesTest, LocalGpuAgentImagePasses) {
  const std::vector<std::string> problems = check(*gpu_local_agent_, gpu_local_agent_->text);
  EXPECT_TRUE(problems.empty()) << lines(problems);
  EXPECT_EQ(gpu_local_agent_->expected.library_packages.count("libcudart.so.13"), 0u);
  EXPECT_NE(gpu_local_agent_->text.find("-DTANDEM_CUDA=ON"), std::string::npos);
  EXPECT_EQ(gpu_local_agent_->file.stages.back().base_image,
            cpu_agent_->file.stages.back().base_image);
}

// The instructions of a Dockerfile's first stage (comments and blank lines
// left out): what a builder's layer cache keys on.
std::string firstStageInstructions(const std::string& text) {
  std::istringstream lines(text);
  std::string stage;
  bool in_stage = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("FROM ")) {
      if (in_stage) break;
      in_stage = true;
    }
    if (in_stage && !line.empty() && !line.starts_with("#")) stage += line + "\n";
  }
  return stage;
}

// One compile for the three Debian images: their build stages are the same
// instruction for instruction (docs/images.md), and the GPU agent's CUDA
// stage builds on it.
TEST_F(DockerImagesTest, TheDebianImagesShareOneBuildStage) {
  const std::string cpu = firstStageInstructions(cpu_agent_->text);
  EXPECT_NE(cpu.find("cmake --build"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("-DTANDEM_CUDA=OFF"), std::string::npos) << cpu;
  EXPECT_EQ(firstStageInstructions(operator_->text), cpu);
  EXPECT_EQ(firstStageInstructions(gpu_local_agent_->text), cpu);
  const auto& stages = gpu_local_agent_->file.stages;
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_EQ(stages[1].base_image, stages[0].name);
}

TEST_F(DockerImagesTest, GpuAgentImagePasses) {
  const std::vector<std::string> problems = check(*gpu_agent_, gpu_agent_->text);
  EXPECT_TRUE(problems.empty()) << lines(problems);
  EXPECT_EQ(gpu_agent_->expected.ucx_prefix, "/opt/ucx");
  const auto& args = gpu_agent_->file.global_args;
  EXPECT_EQ(args.at("CUDA_VERSION").rfind("13.0.", 0), 0u) << args.at("CUDA_VERSION");
  EXPECT_EQ(args.at("UBUNTU_VERSION"), "24.04");
  EXPECT_EQ(gpu_agent_->file.stages.back().base_image,
            "nvidia/cuda:" + args.at("CUDA_VERSION") + "-runtime-ubuntu24.04");
}

TEST_F(DockerImagesTest, VersionLabelsDefaultToTheProjectVersion) {
  // CMake's project() version is the chart's appVersion: the images say the same.
  const std::string chart = readSource("charts/tandem/Chart.yaml");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(chart, match, std::regex(R"(appVersion:\s*"?([0-9.]+))")));
  for (const Image* image : {cpu_agent_, gpu_agent_, operator_}) {
    EXPECT_EQ(image->file.stages.back().labels.at("org.opencontainers.image.version"), match[1])
        << image->path;
  }
}

TEST_F(DockerImagesTest, BuildStagesInstallOnlyTheProjectsBuildPackages) {
  // The Debian builders install a subset of `make deps`'s list, so a name
  // that Debian 12 lacks would already break `make deps`.
  const std::string makefile = readSource("Makefile");
  std::smatch match;
  ASSERT_TRUE(
      std::regex_search(makefile, match, std::regex(R"(DEB_PACKAGES :=((?:[^\n]*\\\n)*[^\n]*))")));
  std::set<std::string> deps;
  std::istringstream words(std::regex_replace(match[1].str(), std::regex(R"(\\\n)"), " "));
  for (std::string word; words >> word;) deps.insert(word);
  for (const Image* image : {cpu_agent_, operator_}) {
    for (const std::string& run : image->file.stages.front().run_commands) {
      for (const std::string& package : testing::aptInstallPackages(run)) {
        EXPECT_EQ(deps.count(package), 1u) << image->path << " installs " << package;
      }
    }
  }
}

TEST_F(DockerImagesTest, ChartArgsAndRouterArgsReachTheOperatorsSubcommands) {
  // The chart gives the operator container only args: the image's
  // ENTRYPOINT must be the program, and args[0] one of its subcommands.
  const testing::TempDir temp("tandem-docker");
  const fs::path& work = temp.path();
  Subprocess helm({testing::helmPath(), "template", "tandem",
                   (kSourceDir / "charts/tandem").string(), "--namespace", "llm"},
                  work / "helm.err",
                  {{"HOME", work.string()},
                   {"HELM_CACHE_HOME", (work / "cache").string()},
                   {"HELM_CONFIG_HOME", (work / "config").string()},
                   {"HELM_DATA_HOME", (work / "data").string()}});
  const std::string rendered = helm.readStdout(std::chrono::seconds(60));
  ASSERT_EQ(helm.wait(std::chrono::seconds(5)), 0) << helm.stderrText();
  json container;
  for (const json& object : testing::yamlDocumentsToJson(rendered)) {
    if (object.value("kind", "") == "Deployment") {
      container = object["spec"]["template"]["spec"]["containers"][0];
    }
  }
  ASSERT_TRUE(container.is_object()) << "the chart renders no Deployment";
  EXPECT_FALSE(container.contains("command")) << container.dump();
  ASSERT_TRUE(container["args"].is_array() && !container["args"].empty());
  EXPECT_EQ(container["args"][0], "controller");
  EXPECT_EQ(container["securityContext"]["runAsUser"], 65532);
  EXPECT_EQ(container["securityContext"]["readOnlyRootFilesystem"], true);
  EXPECT_EQ(operator_->file.stages.back().user, "65532:65532");

  const std::vector<std::string> subcommands = {container["args"][0].get<std::string>(), "router"};
  for (const std::string& subcommand : subcommands) {
    Subprocess program({(kBinDir / "tandem-operator").string(), subcommand, "--help"}, "");
    program.readStdout(std::chrono::seconds(30));
    EXPECT_EQ(program.wait(std::chrono::seconds(10)), 0) << "tandem-operator " << subcommand;
  }
}

// --- Each check catches its fault, on altered copies of the real files. ---

TEST_F(DockerImagesTest, MissingRuntimePackageIsReported) {
  const auto problems = check(*cpu_agent_, altered(cpu_agent_->text, " libyaml-cpp0.7 ", " "));
  EXPECT_TRUE(
      anyContains(problems, "does not install libyaml-cpp0.7, needed for libyaml-cpp.so.0.7"))
      << lines(problems);
  const auto gpu = check(*gpu_agent_, altered(gpu_agent_->text, " libcpp-httplib0.14t64 ", " "));
  EXPECT_TRUE(anyContains(gpu, "a libcpp-httplib* package, needed for libcpp-httplib.so.0.11"))
      << lines(gpu);
  // UCX's modules need libibverbs: the agent's ldd alone would miss it.
  const auto rdma = check(*cpu_agent_, altered(cpu_agent_->text, " libibverbs1 ", " "));
  EXPECT_TRUE(anyContains(rdma, "libibverbs.so.1")) << lines(rdma);
}

TEST_F(DockerImagesTest, ExtraAndDevelopmentPackagesAreReported) {
  const auto extra =
      check(*operator_, altered(operator_->text, " libxxhash0 ", " libxxhash0 curl "));
  EXPECT_TRUE(anyContains(extra, "installs curl, which provides none of the libraries"))
      << lines(extra);
  // The operator does not load UCX: its image must not carry it.
  const auto ucx =
      check(*operator_, altered(operator_->text, " libxxhash0 ", " libxxhash0 libucx0 "));
  EXPECT_TRUE(anyContains(ucx, "installs libucx0")) << lines(ucx);
  const auto dev = check(*cpu_agent_, altered(cpu_agent_->text, " libssl3 ", " libssl-dev "));
  EXPECT_TRUE(anyContains(dev, "development package libssl-dev")) << lines(dev);
  EXPECT_TRUE(anyContains(dev, "does not install libssl3")) << lines(dev);
}

TEST_F(DockerImagesTest, UcxPackageInTheGpuImageIsReported) {
  const auto problems =
      check(*gpu_agent_, altered(gpu_agent_->text, " libnuma1 ", " libnuma1 libucx0 "));
  EXPECT_TRUE(anyContains(problems, "installs libucx0: UCX must come from /opt/ucx"))
      << lines(problems);
}

TEST_F(DockerImagesTest, BadContextCopiesAreReported) {
  const auto missing =
      check(*cpu_agent_, altered(cpu_agent_->text, "COPY agent agent", "COPY agnt agent"));
  EXPECT_TRUE(anyContains(missing, "COPY source agnt does not exist")) << lines(missing);
  EXPECT_TRUE(anyContains(missing, "the build reads agent but no COPY brings it in"))
      << lines(missing);
  const auto ignored = check(
      *operator_, altered(operator_->text, "COPY tools tools", "COPY tools tools\nCOPY docs docs"));
  EXPECT_TRUE(anyContains(ignored, "COPY source docs is excluded by .dockerignore"))
      << lines(ignored);
  const auto dropped = check(*gpu_agent_, altered(gpu_agent_->text, "COPY kernels kernels\n", ""));
  EXPECT_TRUE(anyContains(dropped, "the build reads kernels but no COPY brings it in"))
      << lines(dropped);
}

TEST_F(DockerImagesTest, BadStageCopiesAreReported) {
  const auto stage = check(*operator_, altered(operator_->text, "--from=build", "--from=builder"));
  EXPECT_TRUE(anyContains(stage, "--from=builder names no earlier stage")) << lines(stage);
  const auto unknown =
      check(*operator_, altered(operator_->text, "bin/tandem-operator /usr/local/bin/",
                                "bin/tandem-operatr /usr/local/bin/"));
  EXPECT_TRUE(anyContains(unknown, "the build makes no program tandem-operatr")) << lines(unknown);
  // A program the build makes, but not this stage.
  const auto not_built = check(
      *cpu_agent_,
      altered(cpu_agent_->text, "--target tandem-agent tandem-model", "--target tandem-agent"));
  EXPECT_TRUE(anyContains(not_built, "does not build it (no cmake --build --target tandem-model)"))
      << lines(not_built);
}

TEST_F(DockerImagesTest, RootOrUnlabelledOrUnpinnedImagesAreReported) {
  const auto root = check(*cpu_agent_, altered(cpu_agent_->text, "USER 65532:65532", "USER root"));
  EXPECT_TRUE(anyContains(root, "USER root is not numeric")) << lines(root);
  const auto zero = check(*operator_, altered(operator_->text, "USER 65532:65532", "USER 0"));
  EXPECT_TRUE(anyContains(zero, "USER 0 is root")) << lines(zero);
  const auto label = check(
      *gpu_agent_, altered(gpu_agent_->text, "org.opencontainers.image.revision=", "revision="));
  EXPECT_TRUE(anyContains(label, "no LABEL org.opencontainers.image.revision")) << lines(label);
  const auto latest =
      check(*operator_, altered(operator_->text, "debian:12.11-slim", "debian:latest"));
  EXPECT_TRUE(anyContains(latest, "uses the moving tag latest")) << lines(latest);
  const auto untagged = check(*operator_, altered(operator_->text, "debian:12.11-slim", "debian"));
  EXPECT_TRUE(anyContains(untagged, "base image debian has no tag")) << lines(untagged);
}

TEST_F(DockerImagesTest, WrongEntrypointsAreReported) {
  const auto shell = check(*cpu_agent_, altered(cpu_agent_->text, R"(ENTRYPOINT ["tandem-agent"])",
                                                "ENTRYPOINT tandem-agent"));
  EXPECT_TRUE(anyContains(shell, "ENTRYPOINT is in shell form")) << lines(shell);
  const auto other = check(*operator_, altered(operator_->text, R"(ENTRYPOINT ["tandem-operator"])",
                                               R"(ENTRYPOINT ["tandem-agent"])"));
  EXPECT_TRUE(anyContains(other, "but pods run tandem-operator")) << lines(other);
  const auto off_path =
      check(*operator_, altered(operator_->text, "bin/tandem-operator /usr/local/bin/",
                                "bin/tandem-operator /opt/tandem/"));
  EXPECT_TRUE(anyContains(off_path, "not on the default PATH")) << lines(off_path);
}

TEST_F(DockerImagesTest, UcxBuildFaultsAreReported) {
  const auto commit = check(
      *gpu_agent_, altered(gpu_agent_->text, "ARG UCX_COMMIT=8a6b06fb", "ARG UCX_COMMIT=8a6b06f"));
  EXPECT_TRUE(anyContains(commit, "UCX_COMMIT must default to a full 40-hex commit id"))
      << lines(commit);
  const auto cuda =
      check(*gpu_agent_, altered(gpu_agent_->text, "--with-cuda=/usr/local/cuda ", ""));
  EXPECT_TRUE(anyContains(cuda, "UCX is not configured --with-cuda")) << lines(cuda);
  const auto runtime =
      check(*gpu_agent_, altered(gpu_agent_->text, "${CUDA_VERSION}-runtime-", "12.9.1-runtime-"));
  EXPECT_TRUE(anyContains(runtime, "is not nvidia/cuda:13.0")) << lines(runtime);
  const auto copied = check(
      *gpu_agent_,
      altered(gpu_agent_->text, "COPY --from=build ${UCX_PREFIX}/lib ${UCX_PREFIX}/lib\n", ""));
  EXPECT_TRUE(anyContains(copied, "does not copy /opt/ucx/lib")) << lines(copied);
  // A global ARG not declared again in the final stage is empty there.
  const auto undeclared = check(
      *gpu_agent_, altered(gpu_agent_->text, "runtime-ubuntu${UBUNTU_VERSION}\nARG UCX_PREFIX\n",
                           "runtime-ubuntu${UBUNTU_VERSION}\n"));
  EXPECT_TRUE(anyContains(undeclared, "${UCX_PREFIX} is not declared in this stage"))
      << lines(undeclared);
}

TEST(DockerfileParserTest, ReadsContinuationsFlagsAndJsonForms) {
  const Dockerfile file = testing::parseDockerfile("t", R"(ARG BASE=debian:12.11-slim
ARG DIR=/opt/x
FROM ${BASE} AS build
RUN apt-get update \
    # a comment inside a continued RUN
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
         a b && echo done
FROM $BASE
ARG DIR
LABEL one="x y" two=${DIR}/z
COPY --from=build --chown=1:1 ["${DIR}/a b", "/dst/"]
USER 10:10
ENTRYPOINT ["prog", "--flag"]
)");
  ASSERT_TRUE(file.problems.empty()) << lines(file.problems);
  ASSERT_EQ(file.stages.size(), 2u);
  EXPECT_EQ(file.stages[0].name, "build");
  EXPECT_EQ(file.stages[1].base_image, "debian:12.11-slim");
  EXPECT_EQ(testing::aptInstallPackages(file.stages[0].run_commands[0]),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(file.stages[1].labels.at("one"), "x y");
  EXPECT_EQ(file.stages[1].labels.at("two"), "/opt/x/z");
  ASSERT_EQ(file.stages[1].copies.size(), 1u);
  EXPECT_EQ(file.stages[1].copies[0].from_stage, "build");
  EXPECT_EQ(file.stages[1].copies[0].sources, (std::vector<std::string>{"/opt/x/a b"}));
  EXPECT_EQ(file.stages[1].copies[0].destination, "/dst/");
  EXPECT_EQ(file.stages[1].user, "10:10");
  EXPECT_TRUE(file.stages[1].entrypoint_exec_form);
  EXPECT_EQ(file.stages[1].entrypoint, (std::vector<std::string>{"prog", "--flag"}));
}

TEST(DockerfileParserTest, DockerIgnoreRulesAndPackageFamilies) {
  const testing::DockerIgnore ignore("# c\nbuild\nbuild-*\n**/*.swp\ndocs\n!docs/keep.md\n");
  EXPECT_TRUE(ignore.excludes("build"));
  EXPECT_TRUE(ignore.excludes("build/bin/tandem-agent"));
  EXPECT_TRUE(ignore.excludes("build-docker/CMakeCache.txt"));
  EXPECT_TRUE(ignore.excludes("agent/x.swp"));
  EXPECT_TRUE(ignore.excludes("docs/images.md"));
  EXPECT_FALSE(ignore.excludes("docs/keep.md"));
  EXPECT_FALSE(ignore.excludes("agent/builder.cpp"));
  EXPECT_FALSE(ignore.excludes("tools/build"));
  EXPECT_FALSE(ignore.excludes("."));

  EXPECT_EQ(testing::packageFamily("libyaml-cpp0.7"), testing::packageFamily("libyaml-cpp0.8"));
  EXPECT_EQ(testing::packageFamily("libssl3t64"), "libssl");
  EXPECT_EQ(testing::packageFamily("libcpp-httplib0.14t64"), "libcpp-httplib");
  EXPECT_EQ(testing::packageFamily("libnl-route-3-200"), "libnl-route");
  EXPECT_NE(testing::packageFamily("libnl-route-3-200"), testing::packageFamily("libnl-3-200"));
  EXPECT_EQ(testing::cmakeBuildTargets("cmake --build b -j4 --target x y && strip x"),
            (std::set<std::string>{"x", "y"}));
}

}  // namespace
}  // namespace tandem
