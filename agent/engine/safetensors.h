// Reading and writing the safetensors format.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON mapping
// tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the byte after the header) plus an optional "__metadata__", then
// the data. SafetensorsFile memory-maps a file read-only and validates the
// header completely before anything is used; every error names the file and,
// where there is one, the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace tandem::engine {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping
  size_t num_bytes = 0;
};

// "[4096, 11008]": a shape as error messages print it.
std::string shapeText(const std::vector<int64_t>& shape);

// The first element of a tensor that is not a finite number.
struct NonFiniteElement {
  size_t index = 0;  // in row-major order
  // "NaN", "+inf" or "-inf".
  const char* kind = "NaN";
};

// The first NaN or infinity in `tensor`'s data, for the float dtypes (F32,
// BF16, F16, and F8_E4M3, whose only non-finite value is NaN); nullopt when
// every element is finite, and for U8 (bytes whose meaning the tensor's use
// gives: packed MXFP4 values, their scales). Reads every byte: a scan of
// memory-bound speed, a chunk of elements at a time, its element found
// again only in a chunk holding one.
std::optional<NonFiniteElement> firstNonFinite(const TensorInfo& tensor);

// "[3, 17]": the row-major `index` of an element as its position in `shape`.
std::string elementPosition(const std::vector<int64_t>& shape, size_t index);

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws tandem::Error on any problem
  // (unreadable, truncated, bad JSON, unknown dtype, offsets out of range or
  // overlapping, byte size not matching dtype x shape).
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  // Drops the whole pages of [data, data + bytes) from this process's
  // memory when the range lies in this file's mapping; a later read maps
  // them in again from the file, so nothing is lost. Returns the bytes
  // dropped (0 for a range outside the mapping).
  size_t dropPages(const void* data, size_t bytes) const;
  // xxh3-64 of the whole file (header and every tensor's bytes): reads all
  // of it.
  uint64_t contentDigest() const;

 private:
  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

// Builds a safetensors file. Output is byte-deterministic: tensors are laid
// out in name order and the header JSON has sorted keys, padded with spaces
// so the data starts 8-byte aligned.
class SafetensorsWriter {
 public:
  // Writes a tensor's bytes to `out` when the file is written; must write
  // exactly dtype size x the shape's element count bytes.
  using ByteSource = std::function<void(std::ostream& out)>;

  void add(const std::string& name, DType dtype, std::vector<int64_t> shape,
           std::vector<uint8_t> bytes);
  // A tensor whose bytes are produced while the file is written, so a file
  // larger than memory can be built; a source writing the wrong number of
  // bytes fails write() naming the tensor.
  void addStreamed(const std::string& name, DType dtype, std::vector<int64_t> shape,
                   ByteSource source);
  // Writes to `path` (via a temporary file and rename); throws tandem::Error.
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t size = 0;           // bytes
    std::vector<uint8_t> bytes;  // or, when empty and size > 0, from source
    ByteSource source;
  };
  // The name and shape checks of add() and addStreamed(); the byte size
  // (nullopt when the size overflows).
  std::optional<uint64_t> checkedSize(const std::string& name, DType dtype,
                                      const std::vector<int64_t>& shape) const;
  std::map<std::string, Entry> entries_;
};

}  // namespace tandem::engine
