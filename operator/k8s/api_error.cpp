#include "operator/k8s/api_error.h"

namespace tandem::k8s {

std::string ApiError::toString() const {
  std::string text;
  if (code != 0) text = std::to_string(code) + " ";
  text += reason.empty() ? std::string("Error") : reason;
  if (!message.empty()) text += ": " + message;
  return text;
}

}  // namespace tandem::k8s
