// Invariant checks for conditions only a Tandem bug can break.
//
// TANDEM_CHECK(cond, msg) aborts the process with file:line and the message when
// `cond` is false. Errors a user can cause (bad input, bad files) never use it:
// they return a Status or throw tandem::Error from start-up code.
#pragma once

#include <cstdio>
#include <cstdlib>

#define TANDEM_CHECK(cond, msg)                                                                \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, (msg)); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
