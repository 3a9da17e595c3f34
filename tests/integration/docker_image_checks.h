// The checks an image definition in docker/ must pass without a container
// engine: pinned base images; COPY sources that exist in the repository and
// survive .dockerignore, and that include everything CMake reads; COPY
// --from sources that name an earlier stage and a program that stage builds
// (or the prefix of a UCX built from source); a final stage with a non-root
// numeric USER, the OCI labels and an exec-form ENTRYPOINT on PATH; and a
// final stage whose apt-get packages are exactly the packages of the shared
// libraries its binaries load (no -dev package, nothing extra).
//
// checkDockerfile is pure: the library -> package table comes from
// sharedLibrariesOf and debianPackagesOf (ldd and dpkg-query on this Debian
// 12 machine), computed once per image. Messages read
// "<file>:<line>: <what is wrong>"; an empty list means the file passes.
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/integration/dockerfile_parser.h"

namespace tandem::testing {

struct SharedLibrary {
  std::string soname;  // e.g. libyaml-cpp.so.0.7
  std::string path;    // as ldd resolved it
};

// ldd of each binary, merged by soname. Sanitizer runtimes (libasan ...) are
// left out: they belong to sanitizer builds, never to an image. When UCX's
// libuct is among them, the transport modules it opens at run time (the
// ucx/ folder beside it) are added with their own libraries. A library ldd
// cannot find, or a failing ldd, is reported in `problems`.
std::vector<SharedLibrary> sharedLibrariesOf(const std::vector<std::filesystem::path>& binaries,
                                             std::vector<std::string>& problems);

// The Debian package that installed each of `library_paths` (dpkg-query -S,
// trying the merged-/usr spellings and the resolved file), "" for a path no
// package owns.
std::map<std::string, std::string> debianPackagesOf(const std::vector<std::string>& library_paths);

// What one image is checked against.
struct ImageExpectations {
  std::filesystem::path source_dir;  // the build context (repository root)
  std::filesystem::path bin_dir;     // where the build puts its programs
  std::string dockerignore_text;
  // Paths the build stage must copy from the context (CMakeLists.txt and
  // the folders it adds).
  std::vector<std::string> required_context_paths;
  std::string entrypoint;  // the program pods run: their command[0]
  // soname -> Debian package, for every library the final stage's binaries
  // load (sharedLibrariesOf + debianPackagesOf on this Debian 12 machine).
  std::map<std::string, std::string> library_packages;
  // Packages every image of the base distribution has, so never installed.
  std::set<std::string> base_packages;
  // Compare package families (packageFamily): the image's distribution is
  // not the machine's, so names differ by version suffix.
  bool compare_families = false;
  // Install prefix of a UCX built from source in a build stage ("" when the
  // image takes the distribution's UCX): its libraries must be copied from
  // there, found by the loader, and no UCX package installed.
  std::string ucx_prefix;
};

std::vector<std::string> checkDockerfile(const Dockerfile& file, const ImageExpectations& expected);

// The file names of what the final stage copies from earlier stages, less
// what lies under `ucx_prefix` (when not empty).
std::vector<std::string> finalStageBinaries(const Dockerfile& file, const std::string& ucx_prefix);

}  // namespace tandem::testing
