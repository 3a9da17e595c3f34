// Invariant checks for conditions only a Tandem bug can break.
//
// TANDEM_CHECK(cond, msg) aborts the process with file:line and the message when
// `cond` is false; `msg` is anything a std::string is made from (a literal or
// a std::string), evaluated only then. Errors a user can cause (bad input, bad files) never use it:
// they return a Status or throw tandem::Error from start-up code.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define TANDEM_CHECK(cond, msg)                                                        \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      const std::string tandem_check_message(msg);                                     \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   tandem_check_message.c_str());                                      \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)
