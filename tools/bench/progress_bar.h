// "[####    ] done/total" on stderr, redrawn in place as work items finish.
// Thread-safe; draws nothing when disabled (callers enable it when stderr is
// a terminal, or when asked to).
#pragma once

#include <cstddef>
#include <mutex>

namespace tandem::bench {

class ProgressBar {
 public:
  ProgressBar(size_t total, bool enabled);

  // One more item done; the last one ends the line.
  void advance();

 private:
  std::mutex mutex_;
  size_t total_;
  size_t done_ = 0;
  bool enabled_;
};

// Whether stderr is a terminal: the default for drawing a progress bar.
bool stderrIsTerminal();

}  // namespace tandem::bench
