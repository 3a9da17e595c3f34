// The WatchStream of api_client.h over an open HTTP stream: the body of a
// `?watch=1` answer is a sequence of JSON lines {"type":..., "object":...};
// next() returns them one at a time as they arrive. Used by api_client.cpp.
#pragma once

#include <memory>
#include <string>

#include "operator/k8s/api_client.h"
#include "operator/k8s/http_transport.h"

namespace tandem::k8s {

class HttpWatchStream : public WatchStream {
 public:
  // `stream` has answered 2xx; `description` ("GET https://…?watch=1") names it in errors.
  HttpWatchStream(std::unique_ptr<HttpStream> stream, std::string description);

  Result<std::optional<WatchEvent>> next() override;
  void cancel() override;

 private:
  // One line of the stream as an event, or the error it stands for.
  Result<std::optional<WatchEvent>> parseLine(const std::string& line) const;

  std::unique_ptr<HttpStream> stream_;
  std::string description_;
  std::string pending_;  // bytes received after the last complete line
  bool ended_ = false;
};

}  // namespace tandem::k8s
