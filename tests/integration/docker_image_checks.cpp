#include "tests/integration/docker_image_checks.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <regex>
#include <sstream>

#include "common/subprocess.h"

namespace tandem::testing {
namespace {

// Packages installed for files the programs read rather than load:
// ca-certificates, the CA bundle `tandem-model fetch` verifies https with.
bool providesRuntimeData(const std::string& package) { return package == "ca-certificates"; }

namespace fs = std::filesystem;

bool startsWith(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream stream(text);
  std::vector<std::string> result;
  for (std::string word; stream >> word;) result.push_back(word);
  return result;
}

std::string runAndRead(const std::vector<std::string>& argv, int* exit_status) {
  Subprocess process(argv, "/dev/null");
  std::string out = process.readStdout(std::chrono::seconds(30));
  const int status = process.wait(std::chrono::seconds(5));
  if (exit_status != nullptr) *exit_status = status;
  return out;
}

bool isSanitizerRuntime(const std::string& soname) {
  for (const char* prefix : {"libasan.", "libubsan.", "libtsan.", "liblsan.", "libclang_rt."}) {
    if (startsWith(soname, prefix)) return true;
  }
  return false;
}

void addLddLibraries(const fs::path& binary, std::map<std::string, std::string>& libraries,
                     std::vector<std::string>& problems) {
  int status = -1;
  const std::string out = runAndRead({"ldd", binary.string()}, &status);
  if (status != 0) {
    problems.push_back("ldd " + binary.string() + " failed (exit " + std::to_string(status) + ")");
    return;
  }
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    const std::vector<std::string> parts = words(line);
    if (parts.empty() || startsWith(parts[0], "linux-vdso") || startsWith(parts[0], "linux-gate")) {
      continue;
    }
    std::string soname = fs::path(parts[0]).filename().string();
    std::string path;
    if (parts.size() >= 3 && parts[1] == "=>") {
      if (parts[2] == "not") {
        problems.push_back(binary.string() + " needs " + soname + ", which ldd cannot find");
        continue;
      }
      path = parts[2];
    } else if (startsWith(parts[0], "/")) {
      path = parts[0];
    }
    if (isSanitizerRuntime(soname)) continue;
    libraries.emplace(soname, path);
  }
}

}  // namespace

std::vector<SharedLibrary> sharedLibrariesOf(const std::vector<fs::path>& binaries,
                                             std::vector<std::string>& problems) {
  std::map<std::string, std::string> libraries;
  for (const fs::path& binary : binaries) addLddLibraries(binary, libraries, problems);
  const auto uct = libraries.find("libuct.so.0");
  if (uct != libraries.end() && !uct->second.empty()) {
    std::error_code ignored;
    const fs::path modules = fs::canonical(uct->second, ignored).parent_path() / "ucx";
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(modules, ignored)) {
      const std::string file = entry.path().filename().string();
      // libuct_ib.so.0 and the like: the names UCX opens.
      if (file.size() > 5 && file.compare(file.size() - 5, 5, ".so.0") == 0) {
        found.push_back(entry.path());
        libraries.emplace(file, entry.path().string());
      }
    }
    if (found.empty()) problems.push_back("no UCX transport modules in " + modules.string());
    for (const fs::path& module : found) addLddLibraries(module, libraries, problems);
  }
  std::vector<SharedLibrary> result;
  for (const auto& [soname, path] : libraries) result.push_back({soname, path});
  return result;
}

std::map<std::string, std::string> debianPackagesOf(const std::vector<std::string>& library_paths) {
  // The spellings dpkg may know a library by: as ldd printed it, with or
  // without the merged /usr, and the file a symlink resolves to.
  std::map<std::string, std::vector<std::string>> candidates;
  std::vector<std::string> argv = {"dpkg-query", "-S"};
  for (const std::string& path : library_paths) {
    std::vector<std::string>& spellings = candidates[path];
    spellings.push_back(path);
    spellings.push_back(startsWith(path, "/usr/") ? path.substr(4) : "/usr" + path);
    std::error_code ignored;
    const fs::path resolved = fs::canonical(path, ignored);
    if (!resolved.empty()) spellings.push_back(resolved.string());
    argv.insert(argv.end(), spellings.begin(), spellings.end());
  }
  // One query for all (each dpkg-query reads the whole file database);
  // spellings no package owns only make it exit non-zero.
  const std::string out = runAndRead(argv, nullptr);
  std::map<std::string, std::string> owner_of_file;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    // "libyaml-cpp0.7:amd64: /usr/lib/..."; several owners are comma-separated.
    const size_t separator = line.find(": /");
    if (separator == std::string::npos || startsWith(line, "diversion")) continue;
    const std::string owners = line.substr(0, separator);
    const std::string first = trim(owners.substr(0, owners.find(',')));
    owner_of_file[line.substr(separator + 2)] = first.substr(0, first.find(':'));
  }
  std::map<std::string, std::string> packages;
  for (const auto& [path, spellings] : candidates) {
    packages[path] = "";
    for (const std::string& spelling : spellings) {
      const auto found = owner_of_file.find(spelling);
      if (found != owner_of_file.end()) {
        packages[path] = found->second;
        break;
      }
    }
  }
  return packages;
}

namespace {

// The OCI annotations every image carries (image-spec annotations.md).
const char* const kOciLabels[] = {
    "org.opencontainers.image.title",   "org.opencontainers.image.description",
    "org.opencontainers.image.source",  "org.opencontainers.image.licenses",
    "org.opencontainers.image.version", "org.opencontainers.image.revision"};

// The directories of Debian's and Ubuntu's default PATH.
const char* const kPathDirectories[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                        "/usr/bin",        "/sbin",          "/bin"};

// UCX's libraries and transport modules (libucp.so.0, libuct_ib.so.0 ...).
bool isUcxLibrary(const std::string& soname) {
  for (const char* prefix : {"libucp", "libuct", "libucs", "libucm"}) {
    if (startsWith(soname, prefix)) return true;
  }
  return false;
}

bool isDigits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
}

bool isUnder(const std::string& path, const std::string& prefix) {
  const std::string normal = fs::path(path).lexically_normal().generic_string();
  const std::string base = fs::path(prefix).lexically_normal().generic_string();
  return normal == base || startsWith(normal, base + "/");
}

class Checker {
 public:
  Checker(const Dockerfile& file, const ImageExpectations& expected)
      : file_(file), expected_(expected), ignore_(expected.dockerignore_text) {}

  std::vector<std::string> run() {
    problems_ = file_.problems;
    if (file_.stages.size() < 2) {
      report(0, "needs a build stage and a final stage, found " +
                    std::to_string(file_.stages.size()) + " stage(s)");
      return problems_;
    }
    for (size_t i = 0; i < file_.stages.size(); ++i) {
      checkBaseImage(i);
      checkCopies(i);
    }
    checkContextCoversBuild();
    const DockerStage& final_stage = file_.stages.back();
    checkUser(final_stage);
    checkLabels(final_stage);
    checkEntrypoint(final_stage);
    checkPackages(final_stage);
    if (!expected_.ucx_prefix.empty()) checkSourceBuiltUcx(final_stage);
    return problems_;
  }

 private:
  void report(int line, const std::string& what) {
    problems_.push_back(file_.name + ":" + std::to_string(line) + ": " + what);
  }

  // Index of the stage `name` (an AS name or a number) before `before`, or -1.
  int stageIndex(const std::string& name, size_t before) const {
    for (size_t i = 0; i < before; ++i) {
      if (file_.stages[i].name == name || std::to_string(i) == name) return static_cast<int>(i);
    }
    return -1;
  }

  void checkBaseImage(size_t index) {
    const DockerStage& stage = file_.stages[index];
    const std::string& image = stage.base_image;
    if (stageIndex(image, index) >= 0) return;
    if (image.empty()) {
      report(stage.line, "FROM names no image");
      return;
    }
    if (image.find("@sha256:") != std::string::npos) return;
    const std::string last =
        image.substr(image.rfind('/') == std::string::npos ? 0 : image.rfind('/') + 1);
    const size_t colon = last.find(':');
    if (colon == std::string::npos) {
      report(stage.line, "base image " + image + " has no tag: pin an exact version tag");
    } else if (last.substr(colon + 1) == "latest") {
      report(stage.line, "base image " + image + " uses the moving tag latest: pin a version");
    } else if (last.substr(colon + 1).empty()) {
      report(stage.line, "base image " + image + " has an empty tag");
    }
  }

  void checkCopies(size_t index) {
    const DockerStage& stage = file_.stages[index];
    for (const DockerCopy& copy : stage.copies) {
      if (copy.from_stage.empty()) {
        checkContextCopy(copy);
      } else {
        checkStageCopy(copy, index);
      }
    }
  }

  void checkContextCopy(const DockerCopy& copy) {
    for (const std::string& source : copy.sources) {
      if (startsWith(source, "http://") || startsWith(source, "https://")) {
        report(copy.line, "ADD of a URL (" + source +
                              ") is not verified: fetch it in a RUN and check its digest");
        continue;
      }
      if (source.find_first_of("*?[") != std::string::npos) {
        report(copy.line, "COPY source " + source + " is a glob: name the files");
        continue;
      }
      const fs::path relative = fs::path(source).lexically_normal();
      if (relative.is_absolute() || startsWith(relative.generic_string(), "..")) {
        report(copy.line, "COPY source " + source + " is outside the build context");
        continue;
      }
      if (!fs::exists(expected_.source_dir / relative)) {
        report(copy.line, "COPY source " + source + " does not exist in the repository");
      } else if (ignore_.excludes(relative.generic_string())) {
        report(copy.line, "COPY source " + source + " is excluded by .dockerignore");
      }
    }
  }

  void checkStageCopy(const DockerCopy& copy, size_t index) {
    const int from = stageIndex(copy.from_stage, index);
    if (from < 0) {
      report(copy.line, "COPY --from=" + copy.from_stage + " names no earlier stage of this file");
      return;
    }
    std::set<std::string> targets;
    for (const std::string& run : file_.stages[static_cast<size_t>(from)].run_commands) {
      const std::set<std::string> found = cmakeBuildTargets(run);
      targets.insert(found.begin(), found.end());
    }
    for (const std::string& source : copy.sources) {
      if (!expected_.ucx_prefix.empty() && isUnder(source, expected_.ucx_prefix)) continue;
      const std::string program = fs::path(source).filename().string();
      if (!fs::is_regular_file(expected_.bin_dir / program)) {
        report(copy.line, "COPY --from=" + copy.from_stage + " " + source +
                              ": the build makes no program " + program + " (not in " +
                              expected_.bin_dir.string() + ")");
      } else if (targets.count(program) == 0) {
        report(copy.line, "COPY --from=" + copy.from_stage + " " + source + ": stage " +
                              copy.from_stage + " does not build it (no cmake --build --target " +
                              program + ")");
      } else if (fs::path(source).parent_path().filename() != "bin") {
        report(copy.line, "COPY --from=" + copy.from_stage + " " + source +
                              ": programs are in the build's bin/ folder");
      }
    }
  }

  // Every path CMake reads must be copied into the stage that configures.
  void checkContextCoversBuild() {
    std::vector<std::string> copied;
    int first_line = 0;
    for (const DockerStage& stage : file_.stages) {
      for (const DockerCopy& copy : stage.copies) {
        if (!copy.from_stage.empty()) continue;
        if (first_line == 0) first_line = copy.line;
        for (const std::string& source : copy.sources) {
          copied.push_back(fs::path(source).lexically_normal().generic_string());
        }
      }
    }
    for (const std::string& required : expected_.required_context_paths) {
      const bool covered = std::any_of(copied.begin(), copied.end(), [&](const std::string& c) {
        return c == "." || isUnder(required, c);
      });
      if (!covered) {
        report(first_line, "the build reads " + required + " but no COPY brings it in");
      } else if (ignore_.excludes(required)) {
        report(first_line, "the build reads " + required + " but .dockerignore excludes it");
      }
    }
  }

  void checkUser(const DockerStage& stage) {
    if (stage.user.empty()) {
      report(stage.line, "the final stage sets no USER: it would run as root");
      return;
    }
    const std::string uid = stage.user.substr(0, stage.user.find(':'));
    const std::string gid = stage.user.find(':') == std::string::npos
                                ? ""
                                : stage.user.substr(stage.user.find(':') + 1);
    if (!isDigits(uid) || (!gid.empty() && !isDigits(gid))) {
      report(stage.user_line, "USER " + stage.user +
                                  " is not numeric: Kubernetes' runAsNonRoot can only verify a "
                                  "numeric uid (e.g. 65532:65532)");
    } else if (uid.find_first_not_of('0') == std::string::npos) {
      report(stage.user_line, "USER " + stage.user + " is root");
    }
  }

  void checkLabels(const DockerStage& stage) {
    for (const char* label : kOciLabels) {
      const auto found = stage.labels.find(label);
      if (found == stage.labels.end()) {
        report(stage.line, std::string("the final stage has no LABEL ") + label);
      } else if (trim(found->second).empty()) {
        report(stage.line, std::string("LABEL ") + label + " is empty");
      }
    }
  }

  void checkEntrypoint(const DockerStage& stage) {
    if (stage.entrypoint_line == 0) {
      report(stage.line,
             "the final stage has no ENTRYPOINT; expected [\"" + expected_.entrypoint + "\"]");
      return;
    }
    if (!stage.entrypoint_exec_form) {
      report(stage.entrypoint_line,
             "ENTRYPOINT is in shell form: use the exec form [\"" + expected_.entrypoint +
                 "\"] so that the pod's args reach the program and signals reach it");
      return;
    }
    if (stage.entrypoint.empty() ||
        fs::path(stage.entrypoint[0]).filename() != expected_.entrypoint) {
      report(stage.entrypoint_line,
             "ENTRYPOINT runs " + (stage.entrypoint.empty() ? "nothing" : stage.entrypoint[0]) +
                 ", but pods run " + expected_.entrypoint);
      return;
    }
    // Pods name the program without a path: it must be on PATH.
    for (const DockerCopy& copy : stage.copies) {
      for (const std::string& source : copy.sources) {
        if (fs::path(source).filename() != expected_.entrypoint) continue;
        const std::string directory =
            (!copy.destination.empty() && copy.destination.back() == '/') || copy.sources.size() > 1
                ? fs::path(copy.destination).lexically_normal().generic_string()
                : fs::path(copy.destination).parent_path().generic_string();
        std::string trimmed = directory;
        while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
        for (const char* on_path : kPathDirectories) {
          if (trimmed == on_path) return;
        }
        report(copy.line, expected_.entrypoint + " is copied to " + copy.destination +
                              ", which is not on the default PATH (/usr/local/bin)");
        return;
      }
    }
    report(stage.entrypoint_line,
           "the final stage copies no " + expected_.entrypoint + " for its ENTRYPOINT");
  }

  void checkPackages(const DockerStage& stage) {
    std::map<std::string, int> installed;  // package -> line
    for (size_t i = 0; i < stage.run_commands.size(); ++i) {
      for (const std::string& package : aptInstallPackages(stage.run_commands[i])) {
        installed.emplace(package, stage.run_lines[i]);
      }
    }
    auto key = [&](const std::string& package) {
      return expected_.compare_families ? packageFamily(package) : package;
    };
    // What the libraries need, by package (or family) -> the libraries.
    std::map<std::string, std::vector<std::string>> needed;
    std::set<std::string> base;
    for (const std::string& package : expected_.base_packages) base.insert(key(package));
    for (const auto& [soname, package] : expected_.library_packages) {
      if (!expected_.ucx_prefix.empty() && isUcxLibrary(soname)) continue;
      if (package.empty()) {
        report(stage.line, "no Debian package provides " + soname);
        continue;
      }
      needed[key(package)].push_back(soname);
    }
    std::set<std::string> installed_keys;
    for (const auto& [package, line] : installed) {
      installed_keys.insert(key(package));
      if (package.find('$') != std::string::npos) {
        report(line, "apt-get install names " + package + ": list packages literally");
      } else if (package.size() > 4 && package.compare(package.size() - 4, 4, "-dev") == 0) {
        report(line, "the final stage installs the development package " + package);
      } else if (!expected_.ucx_prefix.empty() &&
                 (packageFamily(package) == "libucx" || startsWith(package, "ucx"))) {
        report(line, "the final stage installs " + package + ": UCX must come from " +
                         expected_.ucx_prefix + ", built with CUDA in the build stage");
      } else if (needed.count(key(package)) == 0 && !providesRuntimeData(package)) {
        report(line, "the final stage installs " + package +
                         ", which provides none of the libraries its programs load");
      }
    }
    for (const auto& [package, sonames] : needed) {
      if (installed_keys.count(package) != 0 || base.count(package) != 0) continue;
      std::string list;
      for (const std::string& soname : sonames) list += (list.empty() ? "" : ", ") + soname;
      report(stage.line, "the final stage does not install " +
                             (expected_.compare_families ? "a " + package + "* package" : package) +
                             ", needed for " + list);
    }
  }

  void checkSourceBuiltUcx(const DockerStage& stage) {
    const std::string& prefix = expected_.ucx_prefix;
    bool copies_libraries = false;
    for (const DockerCopy& copy : stage.copies) {
      if (copy.from_stage.empty()) continue;
      for (const std::string& source : copy.sources) {
        if (isUnder(prefix + "/lib", source)) copies_libraries = true;
      }
    }
    if (!copies_libraries) {
      report(stage.line, "the final stage does not copy " + prefix + "/lib from the UCX build");
    }
    bool loader_knows = false;
    const auto library_path = stage.env.find("LD_LIBRARY_PATH");
    if (library_path != stage.env.end() &&
        library_path->second.find(prefix + "/lib") != std::string::npos) {
      loader_knows = true;
    }
    for (const std::string& run : stage.run_commands) {
      if (run.find("ld.so.conf.d") != std::string::npos &&
          run.find("ldconfig") != std::string::npos) {
        loader_knows = true;
      }
    }
    if (!loader_knows) {
      report(stage.line, "nothing tells the loader about " + prefix +
                             "/lib (an /etc/ld.so.conf.d entry and ldconfig, or LD_LIBRARY_PATH)");
    }
    // The build stage: UCX from a pinned commit, with CUDA, and Tandem
    // configured against it.
    bool with_cuda = false;
    bool checks_commit = false;
    bool tandem_uses_it = false;
    for (size_t i = 0; i + 1 < file_.stages.size(); ++i) {
      for (const std::string& run : file_.stages[i].run_commands) {
        if (run.find("--with-cuda") != std::string::npos) with_cuda = true;
        if (run.find("rev-parse") != std::string::npos &&
            run.find("UCX_COMMIT") != std::string::npos) {
          checks_commit = true;
        }
        if (run.find("CMAKE_PREFIX_PATH") != std::string::npos &&
            (run.find("UCX_PREFIX") != std::string::npos ||
             run.find(prefix) != std::string::npos)) {
          tandem_uses_it = true;
        }
      }
    }
    if (!with_cuda) report(file_.stages[0].line, "UCX is not configured --with-cuda");
    if (!checks_commit) {
      report(file_.stages[0].line,
             "the UCX checkout is not compared with UCX_COMMIT (git rev-parse)");
    }
    if (!tandem_uses_it) {
      report(file_.stages[0].line, "Tandem is not configured with CMAKE_PREFIX_PATH=" + prefix);
    }
    const auto commit = file_.global_args.find("UCX_COMMIT");
    static const std::regex kCommit("[0-9a-f]{40}");
    if (commit == file_.global_args.end() || !std::regex_match(commit->second, kCommit)) {
      report(file_.stages[0].line, "ARG UCX_COMMIT must default to a full 40-hex commit id");
    }
    if (file_.global_args.count("UCX_VERSION") == 0) {
      report(file_.stages[0].line, "no ARG UCX_VERSION before the first FROM");
    }
    // The runtime image must be the devel image's twin.
    const std::string& build_image = file_.stages[0].base_image;
    const size_t devel = build_image.find("-devel-");
    if (devel == std::string::npos) {
      report(file_.stages[0].line,
             "the build stage's image " + build_image + " is not a CUDA -devel- image");
    } else {
      std::string runtime = build_image;
      runtime.replace(devel, 7, "-runtime-");
      if (stage.base_image != runtime) {
        report(stage.line, "the final image " + stage.base_image + " is not " + runtime +
                               ", the runtime image matching the build stage's");
      }
    }
  }

  const Dockerfile& file_;
  const ImageExpectations& expected_;
  DockerIgnore ignore_;
  std::vector<std::string> problems_;
};

}  // namespace

std::vector<std::string> checkDockerfile(const Dockerfile& file,
                                         const ImageExpectations& expected) {
  return Checker(file, expected).run();
}

std::vector<std::string> finalStageBinaries(const Dockerfile& file, const std::string& ucx_prefix) {
  std::vector<std::string> binaries;
  if (file.stages.empty()) return binaries;
  for (const DockerCopy& copy : file.stages.back().copies) {
    if (copy.from_stage.empty()) continue;
    for (const std::string& source : copy.sources) {
      if (!ucx_prefix.empty() && isUnder(source, ucx_prefix)) continue;
      binaries.push_back(fs::path(source).filename().string());
    }
  }
  return binaries;
}

}  // namespace tandem::testing
