// The wgmma probe's launch (wgmma_probe.cu), for instruction_kernels.cu.
#pragma once

#include <cstdint>

namespace tandem::cuda_probe {

// One warpgroup: d = a · b + c by one wgmma m64n128k16 (device pointers;
// a 64 x 16 and b 128 x 16 bf16 bits, row-major; c, d 64 x 128).
void launchWgmmaProbe(const uint16_t* a, const uint16_t* b, const float* c, float* d);

}  // namespace tandem::cuda_probe
