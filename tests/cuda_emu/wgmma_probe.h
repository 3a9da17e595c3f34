// The sm_90a probes' launches (wgmma_probe.cu), for instruction_kernels.cu.
#pragma once

#include <cstdint>

namespace tandem::cuda_probe {

// One warpgroup: d = a · b + c by one wgmma m64n128k16 (device pointers;
// a 64 x 16 and b 128 x 16 bf16 bits, row-major; c, d 64 x 128).
void launchWgmmaProbe(const uint16_t* a, const uint16_t* b, const float* c, float* d);
// One block: two 16 x 64 boxes of a rows x k bf16 matrix (device pointer),
// at (row, column) and (row, column + 64), copied by tensor copies
// (bf16RowsTensorMap's 128-byte swizzle) on one barrier's two phases; out
// (4,096 bytes) receives the shared memory they landed in, as it lies.
void launchTensorCopyProbe(const uint16_t* matrix, int64_t rows, int64_t k, int32_t column,
                           int32_t row, uint8_t* out);

}  // namespace tandem::cuda_probe
