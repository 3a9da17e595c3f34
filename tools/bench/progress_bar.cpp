#include "tools/bench/progress_bar.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace tandem::bench {

ProgressBar::ProgressBar(size_t total, bool enabled)
    : total_(total), enabled_(enabled && total > 0) {}

void ProgressBar::advance() {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  if (done_ == total_) return;
  ++done_;
  constexpr size_t kWidth = 40;
  const size_t filled = done_ * kWidth / total_;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu", std::string(filled, '#').c_str(),
               std::string(kWidth - filled, ' ').c_str(), done_, total_);
  if (done_ == total_) std::fputc('\n', stderr);
  std::fflush(stderr);
}

bool stderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

}  // namespace tandem::bench
