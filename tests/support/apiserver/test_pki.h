// A throw-away public key infrastructure for the test API server, made with
// the OpenSSL API at start-up: a self-signed CA, a server certificate for
// IP:127.0.0.1, DNS:localhost and the given extra IPs, and a client certificate (CN "test-client"),
// both signed by the CA. Keys are EC P-256. Certificates are valid for a day.
// Failures throw std::runtime_error (start-up code only).
#pragma once

#include <string>
#include <vector>

#include "tests/support/apiserver/api_server.h"

namespace tandem::testing {

TestPki generateTestPki(const std::vector<std::string>& extra_ips = {});

// The subject CN of a PEM certificate ("" when it has none or does not parse).
std::string certificateCommonName(const std::string& certificate_pem);

}  // namespace tandem::testing
