// TANDEM_RETURN_IF_ERROR for the structured-output compilers.
#pragma once

#include "common/status.h"

// Returns the Status of `expr` from the enclosing function (which returns a
// Status or a StatusOr) when it is not OK.
#define TANDEM_RETURN_IF_ERROR(expr)                   \
  do {                                                 \
    ::tandem::Status tandem_status_ = (expr);          \
    if (!tandem_status_.isOk()) return tandem_status_; \
  } while (0)
