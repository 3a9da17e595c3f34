// Minimal leveled logging to stderr, safe to call from any thread.
//
//   TANDEM_LOG(kInfo) << "loaded " << n << " tensors";
//
// The level threshold comes from TANDEM_LOG_LEVEL (debug|info|warn|error,
// any case, warning too), default info; another value is said on stderr.
// Each line is written with one call so lines never interleave.
#pragma once

#include <sstream>

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

bool logEnabled(LogLevel level);

class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace tandem

#define TANDEM_LOG(level)                                 \
  if (!::tandem::logEnabled(::tandem::LogLevel::level)) { \
  } else                                                  \
    ::tandem::LogLine(::tandem::LogLevel::level, __FILE__, __LINE__)
