// A small Dockerfile reader for the checks of the images in docker/
// (docker_image_checks.h), made for what docker/*.Dockerfile use: line
// continuations, comments, ARG/ENV substitution (${X}, $X, ${X:-word},
// ${X:+word}) outside RUN, FROM ... AS, COPY/ADD flags and JSON form,
// LABEL/ENV key=value pairs, USER and ENTRYPOINT. Also the two readings of
// RUN text the checks need (apt-get install lists, cmake --build targets),
// .dockerignore rules and package-name families. Pure functions.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace tandem::testing {

struct DockerCopy {
  int line = 0;
  bool is_add = false;
  std::string from_stage;  // --from=, empty for the build context
  std::vector<std::string> sources;
  std::string destination;
};

struct DockerStage {
  int line = 0;  // of its FROM
  std::string name;
  std::string base_image;  // variables substituted
  std::vector<DockerCopy> copies;
  std::vector<std::string> run_commands;  // as written (the shell expands them)
  std::vector<int> run_lines;
  std::string user;
  int user_line = 0;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> env;
  std::vector<std::string> entrypoint;
  bool entrypoint_exec_form = false;
  int entrypoint_line = 0;
  std::map<std::string, std::string> variables;  // ARG and ENV values in scope
};

struct Dockerfile {
  std::string name;                                // for messages, e.g. "docker/agent.Dockerfile"
  std::map<std::string, std::string> global_args;  // ARGs before the first FROM
  std::vector<DockerStage> stages;
  std::vector<std::string> problems;  // parse errors and undeclared variables
};

Dockerfile parseDockerfile(const std::string& name, const std::string& text);

// The packages `apt-get install` (or `apt install`) names in one RUN command;
// words with a variable are kept as written.
std::vector<std::string> aptInstallPackages(const std::string& run_command);

// The words following each `--target` of a `cmake --build` in `run_command`.
std::set<std::string> cmakeBuildTargets(const std::string& run_command);

// .dockerignore rules: `*`, `?` and `**` globs on paths relative to the
// context root and `!` exceptions. A rule applies to a path it matches or
// whose parent folder it matches; the last rule that applies decides.
class DockerIgnore {
 public:
  explicit DockerIgnore(const std::string& text);
  bool excludes(const std::string& path) const;

 private:
  struct Rule {
    std::string pattern;
    bool exception = false;
  };
  std::vector<Rule> rules_;
};

// A Debian package name without its version suffix and t64 mark, so that
// Debian 12's and Ubuntu 24.04's names of one library compare equal:
// libyaml-cpp0.7 and libyaml-cpp0.8 -> libyaml-cpp, libssl3t64 -> libssl.
std::string packageFamily(const std::string& package);

}  // namespace tandem::testing
