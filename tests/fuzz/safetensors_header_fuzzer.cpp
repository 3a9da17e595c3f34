// Fuzzes safetensors files: the input is a whole file (8-byte header length,
// JSON header, data). SafetensorsFile either loads it or throws tandem::Error;
// every tensor it accepts must have dtype x shape bytes, and together they
// must fit in the data area (each one is read in full to prove it is mapped).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "agent/engine/safetensors.h"
#include "common/dtype.h"
#include "common/status.h"
#include "tests/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::FuzzInputFile file("model.safetensors");
  file.write(data, size);
  try {
    tandem::engine::SafetensorsFile safetensors(file.path());
    uint64_t header_length = 0;
    for (size_t i = 0; i < 8; ++i) header_length |= static_cast<uint64_t>(data[i]) << (8 * i);
    const uint64_t data_area = size - 8 - header_length;
    uint64_t total_bytes = 0;
    volatile uint8_t sink = 0;
    for (const auto& [name, tensor] : safetensors.tensors()) {
      uint64_t expected = tandem::dtypeSize(tensor.dtype);
      for (int64_t dim : tensor.shape) expected *= static_cast<uint64_t>(dim);
      if (name != tensor.name || tensor.num_bytes != expected) std::abort();
      if (safetensors.find(name) != &tensor) std::abort();
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      for (size_t i = 0; i < tensor.num_bytes; ++i) sink = sink + bytes[i];
      total_bytes += tensor.num_bytes;
    }
    if (total_bytes > data_area) std::abort();
  } catch (const tandem::Error&) {
  }
  return 0;
}
