// Runs a Tandem binary as a child process for integration tests: argv in,
// stdout read line by line (to learn the bound port), stderr kept in a file
// for failure messages, signals, exit status. Killed on destruction. The
// class lives in common/subprocess.h, shared with tandem-bench.
#pragma once

#include "common/subprocess.h"
#include "tests/support/test_files.h"

namespace tandem::testing {

using ChildProcess = ::tandem::Subprocess;

}  // namespace tandem::testing
