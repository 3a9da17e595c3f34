// The helm binary the tests run ($TANDEM_HELM overrides; k8s_tools.h).
#pragma once

#include <string>

#include "tests/support/k8s_tools.h"

namespace tandem::testing {

inline std::string helmPath() { return k8sToolPath("helm", "TANDEM_HELM"); }

}  // namespace tandem::testing
