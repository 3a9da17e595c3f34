// The CUDA compute backend: device memory, one stream, and kernels that keep
// the batch-invariance contract of kernels/backend.h by construction (see
// docs/cuda.md for each kernel's argument). Only kernels/registry.cpp and the
// GPU tests include this header; it needs no CUDA headers.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace tandem::kernels::cuda {

// CUDA devices visible now; 0 when there is no driver or no device.
int deviceCount();

// A backend on device `device` (0-based). Throws tandem::Error with the CUDA
// error text when the device cannot be used.
std::unique_ptr<Backend> makeCudaBackend(int device);

}  // namespace tandem::kernels::cuda
