// Fuzzes local mode's cluster file and the router file: parseClusterSpec and
// parseRouterSpec either return a spec or throw tandem::Error (a YAML library
// exception escaping, another exception or a sanitizer report is a finding).
// An accepted cluster has a DecodePool and uniquely named pools.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "common/status.h"
#include "operator/spec/cluster_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::spec;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ClusterSpec cluster = parseClusterSpec(text, "cluster.yaml");
    bool has_decode = false;
    std::set<std::string> names;
    for (const PoolSpec& pool : cluster.pools) {
      has_decode = has_decode || pool.kind == PoolKind::kDecode;
      if (!names.insert(pool.name).second) std::abort();
    }
    if (!has_decode) std::abort();
  } catch (const tandem::Error&) {
  }
  try {
    parseRouterSpec(text, "router.yaml");
  } catch (const tandem::Error&) {
  }
  return 0;
}
