#include "agent/engine/safetensors.h"

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/file_text.h"
#include "common/json_parse.h"
#include "common/status.h"

namespace tandem::engine {

namespace {

using nlohmann::json;

constexpr size_t kHeaderLengthBytes = 8;
// Hugging Face's safetensors refuses a longer header (MAX_HEADER_SIZE,
// HeaderTooLarge); its parsed JSON takes some ten times the text, so an
// unbounded one could exhaust memory before any check ran. The largest
// published shards' headers are under 10 MB.
constexpr uint64_t kMaxHeaderLength = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

std::string offsetsText(uint64_t begin, uint64_t end) {
  // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on "[" + std::to_string().
  std::string text = "[";
  text += std::to_string(begin);
  text += ", ";
  text += std::to_string(end);
  text += "]";
  return text;
}

// Bytes of `shape` elements of `dtype`, or nullopt when the product overflows.
std::optional<uint64_t> byteSize(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t bytes = dtypeSize(dtype);
  for (int64_t dim : shape) {
    const auto extent = static_cast<uint64_t>(dim);
    if (extent != 0 && bytes > std::numeric_limits<uint64_t>::max() / extent) return std::nullopt;
    bytes *= extent;
  }
  return bytes;
}

bool isNonNegativeInt(const json& value) {
  return value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0);
}

struct Span {
  uint64_t begin;
  uint64_t end;
  const std::string* name;
};

}  // namespace

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

namespace {

// `lane` repeated across a 64-bit word.
template <typename Bits>
constexpr uint64_t everyLane(Bits lane) {
  uint64_t word = 0;
  for (size_t i = 0; i < sizeof(uint64_t) / sizeof(Bits); ++i) {
    word |= static_cast<uint64_t>(lane) << (8 * sizeof(Bits) * i);
  }
  return word;
}

// The first element whose bits under `exponent` are all ones (an IEEE
// float's NaN or infinity; E4M3's NaN with `exponent` 0x7f). Elements are
// loaded with memcpy: a tensor's data need not be aligned to its size.
// Whole chunks are first asked whether any element matches, a 64-bit word
// (2 to 8 elements) at a time: with y = (word & mask) ^ mask, a matching
// element is a zero lane of y, and (y - ones) & ~y & high is non-zero
// exactly when y has a zero lane (a borrow only crosses into a lane from a
// zero lane below it). The chunk that answers yes, and the tail, are read
// element by element for the index.
template <typename Bits>
std::optional<size_t> firstWithAllOnes(const uint8_t* data, size_t count, Bits exponent) {
  constexpr size_t kLanes = sizeof(uint64_t) / sizeof(Bits);
  constexpr size_t kChunk = 4096;
  constexpr uint64_t kOnes = everyLane<Bits>(1);
  constexpr uint64_t kHigh = everyLane<Bits>(static_cast<Bits>(Bits{1} << (8 * sizeof(Bits) - 1)));
  const uint64_t mask = everyLane<Bits>(exponent);
  size_t begin = 0;
  for (; begin + kChunk <= count; begin += kChunk) {
    uint64_t any = 0;
    for (size_t i = begin; i < begin + kChunk; i += kLanes) {
      uint64_t word;
      std::memcpy(&word, data + i * sizeof(Bits), sizeof(word));
      const uint64_t y = (word & mask) ^ mask;
      any |= (y - kOnes) & ~y & kHigh;
    }
    if (any != 0) break;
  }
  for (size_t i = begin; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));
    if ((bits & exponent) == exponent) return i;
  }
  return std::nullopt;
}

template <typename Bits>
std::optional<NonFiniteElement> firstNonFiniteOf(const TensorInfo& tensor, Bits exponent,
                                                 Bits mantissa, Bits sign) {
  const auto* data = static_cast<const uint8_t*>(tensor.data);
  const std::optional<size_t> index =
      firstWithAllOnes<Bits>(data, tensor.num_bytes / sizeof(Bits), exponent);
  if (!index) return std::nullopt;
  Bits bits;
  std::memcpy(&bits, data + *index * sizeof(Bits), sizeof(Bits));
  const char* kind = (bits & mantissa) != 0 ? "NaN" : (bits & sign) != 0 ? "-inf" : "+inf";
  return NonFiniteElement{*index, kind};
}

}  // namespace

std::optional<NonFiniteElement> firstNonFinite(const TensorInfo& tensor) {
  switch (tensor.dtype) {
    case DType::kF32:
      return firstNonFiniteOf<uint32_t>(tensor, 0x7f800000u, 0x007fffffu, 0x80000000u);
    case DType::kBF16:
      return firstNonFiniteOf<uint16_t>(tensor, 0x7f80, 0x007f, 0x8000);
    case DType::kF16:
      return firstNonFiniteOf<uint16_t>(tensor, 0x7c00, 0x03ff, 0x8000);
    case DType::kF8E4M3:
      // E4M3 (the "fn" variant safetensors stores) has no infinity: all
      // ones below the sign is its NaN, so "mantissa" is that whole mask.
      return firstNonFiniteOf<uint8_t>(tensor, 0x7f, 0x7f, 0x80);
    case DType::kU8:
      return std::nullopt;
  }
  return std::nullopt;
}

std::string elementPosition(const std::vector<int64_t>& shape, size_t index) {
  std::vector<int64_t> position(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const auto extent = static_cast<size_t>(std::max<int64_t>(shape[d], 1));
    position[d] = static_cast<int64_t>(index % extent);
    index /= extent;
  }
  return shapeText(position);
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  void* mapping = MAP_FAILED;
  uint64_t file_size = 0;
  int map_error = 0;
  {
    // A FIFO or a device in the file's place is refused, not waited on.
    const std::optional<RegularFile> opened = RegularFile::open(path);
    if (!opened) throw Error(file + ": cannot open: " + std::strerror(ENOENT));
    file_size = opened->size();
    if (file_size < kHeaderLengthBytes) {
      throw Error(file + ": truncated: file size " + std::to_string(file_size) +
                  " is less than the 8-byte header length");
    }
    mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, opened->fd(), 0);
    map_error = errno;
    // Closed here: the mapping keeps the file alive.
  }
  if (mapping == MAP_FAILED) throw Error(file + ": cannot mmap: " + std::strerror(map_error));
  mapping_ = mapping;
  mapping_size_ = file_size;

  // The destructor does not run when the constructor throws.
  try {
    const auto* bytes = static_cast<const uint8_t*>(mapping_);
    uint64_t header_length = 0;
    for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
      header_length |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    }
    if (header_length > file_size - kHeaderLengthBytes) {
      throw Error(file + ": truncated: header length " + std::to_string(header_length) +
                  " exceeds file size " + std::to_string(file_size));
    }
    if (header_length > kMaxHeaderLength) {
      throw Error(file + ": header length " + std::to_string(header_length) + " is more than the " +
                  std::to_string(kMaxHeaderLength) +
                  " bytes a safetensors header may have (Hugging Face's safetensors refuses it "
                  "too)");
    }
    const uint8_t* header_begin = bytes + kHeaderLengthBytes;
    const uint8_t* data = header_begin + header_length;
    const uint64_t data_size = file_size - kHeaderLengthBytes - header_length;

    JsonParseError parse_error;
    std::optional<json> parsed = parseJson(
        std::string_view(reinterpret_cast<const char*>(header_begin), header_length), parse_error);
    if (!parsed) {
      throw Error(file + ": header is not valid JSON (" +
                  (parse_error.byte > 0
                       ? "syntax error at byte " + std::to_string(parse_error.byte) + " of " +
                             std::to_string(header_length)
                       : parse_error.detail) +
                  ")");
    }
    json header = std::move(*parsed);
    if (!header.is_object()) throw Error(file + ": header is not a JSON object");

    std::vector<Span> spans;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const json& entry = it.value();
      if (name == kMetadataKey) {
        if (!entry.is_object()) throw Error(file + ": __metadata__ is not a JSON object");
        continue;
      }
      const std::string where = file + ": tensor " + name + ": ";
      if (!entry.is_object()) throw Error(where + "entry is not a JSON object");

      auto dtype_it = entry.find("dtype");
      if (dtype_it == entry.end() || !dtype_it->is_string()) {
        throw Error(where +
                    "\"dtype\" missing or not a string (accepted: F32, BF16, F16, F8_E4M3)");
      }
      const std::string dtype_name = dtype_it->get<std::string>();
      std::optional<DType> dtype = dtypeFromSafetensorsName(dtype_name);
      if (!dtype) {
        throw Error(where + "dtype \"" + dtype_name +
                    "\" is not supported (accepted: F32, BF16, F16, F8_E4M3)");
      }

      auto shape_it = entry.find("shape");
      if (shape_it == entry.end() || !shape_it->is_array() ||
          !std::all_of(shape_it->begin(), shape_it->end(), isNonNegativeInt)) {
        throw Error(where + "\"shape\" must be an array of non-negative integers, got " +
                    (shape_it == entry.end() ? std::string("nothing") : shape_it->dump()));
      }
      std::vector<int64_t> shape;
      for (const json& dim : *shape_it) {
        const auto extent = dim.get<uint64_t>();
        if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw Error(where + "shape " + shape_it->dump() + " is too large");
        }
        shape.push_back(static_cast<int64_t>(extent));
      }

      auto offsets_it = entry.find("data_offsets");
      if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
          !isNonNegativeInt((*offsets_it)[0]) || !isNonNegativeInt((*offsets_it)[1]) ||
          (*offsets_it)[0].get<uint64_t>() > (*offsets_it)[1].get<uint64_t>()) {
        throw Error(where + "\"data_offsets\" must be [begin, end] with 0 <= begin <= end, got " +
                    (offsets_it == entry.end() ? std::string("nothing") : offsets_it->dump()));
      }
      const auto begin = (*offsets_it)[0].get<uint64_t>();
      const auto end = (*offsets_it)[1].get<uint64_t>();
      if (end > data_size) {
        throw Error(where + "data_offsets " + offsetsText(begin, end) +
                    " extend past end of file (size " + std::to_string(file_size) + ", data area " +
                    std::to_string(data_size) + " bytes after the header)");
      }
      std::optional<uint64_t> expected = byteSize(*dtype, shape);
      if (!expected || *expected != end - begin) {
        throw Error(where + "data_offsets " + offsetsText(begin, end) + " hold " +
                    std::to_string(end - begin) + " bytes, but " + dtype_name + " x shape " +
                    shapeText(shape) + " needs " +
                    (expected ? std::to_string(*expected) : std::string("more than 2^64")));
      }

      TensorInfo tensor;
      tensor.name = name;
      tensor.dtype = *dtype;
      tensor.shape = std::move(shape);
      tensor.data = data + begin;
      tensor.num_bytes = static_cast<size_t>(end - begin);
      auto [inserted, unused] = tensors_.emplace(name, std::move(tensor));
      spans.push_back({begin, end, &inserted->first});
    }

    // Empty tensors occupy no bytes and cannot overlap anything.
    std::erase_if(spans, [](const Span& span) { return span.begin == span.end; });
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : *a.name < *b.name;
    });
    for (size_t i = 1; i < spans.size(); ++i) {
      if (spans[i].begin < spans[i - 1].end) {
        throw Error(file + ": tensors " + *spans[i - 1].name + " " +
                    offsetsText(spans[i - 1].begin, spans[i - 1].end) + " and " + *spans[i].name +
                    " " + offsetsText(spans[i].begin, spans[i].end) + " overlap");
      }
    }
    // The tensors fill the data area, without a gap or a tail, as
    // Hugging Face's safetensors requires: bytes no tensor names would be
    // mapped and digested (the model's identity) for nothing.
    uint64_t covered = 0;
    for (const Span& span : spans) {
      if (span.begin != covered) {
        throw Error(file + ": data area bytes " + offsetsText(covered, span.begin) +
                    " belong to no tensor (before " + *span.name +
                    "); a safetensors file's tensors fill its data area without gaps");
      }
      covered = span.end;
    }
    if (covered != data_size) {
      throw Error(file + ": the last " + std::to_string(data_size - covered) +
                  " bytes of the data area (from offset " + std::to_string(covered) + " of " +
                  std::to_string(data_size) +
                  ") belong to no tensor; a safetensors file's tensors fill its data area "
                  "exactly");
    }
  } catch (...) {
    ::munmap(mapping_, mapping_size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

uint64_t SafetensorsFile::contentDigest() const { return XXH3_64bits(mapping_, mapping_size_); }

size_t SafetensorsFile::dropPages(const void* data, size_t bytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const auto mapping = reinterpret_cast<uintptr_t>(mapping_);
  if (begin < mapping || bytes > mapping_size_ || begin - mapping > mapping_size_ - bytes) {
    return 0;
  }
  // Whole pages inside the range only: its neighbours' pages stay mapped.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t end = (begin + bytes) / page * page;
  if (end <= first) return 0;
  // The mapping is private, read-only and never written, so dropping its
  // pages loses nothing: the next read faults them in from the file.
  if (::madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED) != 0) return 0;
  return end - first;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::optional<uint64_t> SafetensorsWriter::checkedSize(const std::string& name, DType dtype,
                                                       const std::vector<int64_t>& shape) const {
  if (name.empty() || name == kMetadataKey) {
    throw Error("safetensors writer: invalid tensor name \"" + name + "\"");
  }
  if (entries_.count(name) != 0) {
    throw Error("safetensors writer: tensor " + name + " added twice");
  }
  for (int64_t dim : shape) {
    if (dim < 0)
      throw Error("safetensors writer: tensor " + name + " has shape " + shapeText(shape));
  }
  return byteSize(dtype, shape);
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  const std::optional<uint64_t> expected = checkedSize(name, dtype, shape);
  if (!expected || *expected != bytes.size()) {
    throw Error("safetensors writer: tensor " + name + " has " + std::to_string(bytes.size()) +
                " bytes, but " + dtypeSafetensorsName(dtype) + " x shape " + shapeText(shape) +
                " needs " + (expected ? std::to_string(*expected) : std::string("more")));
  }
  const uint64_t size = bytes.size();
  entries_.emplace(name, Entry{dtype, std::move(shape), size, std::move(bytes), {}});
}

void SafetensorsWriter::addStreamed(const std::string& name, DType dtype,
                                    std::vector<int64_t> shape, ByteSource source) {
  const std::optional<uint64_t> size = checkedSize(name, dtype, shape);
  if (!size) {
    throw Error("safetensors writer: tensor " + name + ": " + dtypeSafetensorsName(dtype) +
                " x shape " + shapeText(shape) + " is too large");
  }
  entries_.emplace(name, Entry{dtype, std::move(shape), *size, {}, std::move(source)});
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  // Data in order of dtype size, widest first, then name (as the
  // safetensors library lays tensors out), so that with the data area
  // 8-byte aligned every tensor is aligned to its dtype; nlohmann::json
  // sorts keys, so equal contents give equal bytes.
  std::vector<const std::pair<const std::string, Entry>*> order;
  for (const auto& item : entries_) order.push_back(&item);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtypeSize(a->second.dtype) > dtypeSize(b->second.dtype);
  });
  json header = json::object();
  header[kMetadataKey] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto* item : order) {
    const auto& [name, entry] = *item;
    header[name] = {
        {"dtype", dtypeSafetensorsName(entry.dtype)},
        {"shape", entry.shape},
        {"data_offsets", {offset, offset + entry.size}},
    };
    offset += entry.size;
  }
  std::string header_text = header.dump();
  // Aligns the data area (and with the order above every tensor) to 8 bytes.
  header_text.append(
      (kHeaderLengthBytes - header_text.size() % kHeaderLengthBytes) % kHeaderLengthBytes, ' ');
  uint8_t length_bytes[kHeaderLengthBytes];
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    length_bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(header_text.size()) >> (8 * i));
  }

  // A temporary file then rename, so readers never see a half-written file.
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw Error(temporary.string() + ": cannot create: " + std::strerror(errno));
    }
    out.write(reinterpret_cast<const char*>(length_bytes), sizeof length_bytes);
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    try {
      for (const auto* item : order) {
        const auto& [name, entry] = *item;
        if (!entry.source) {
          out.write(reinterpret_cast<const char*>(entry.bytes.data()),
                    static_cast<std::streamsize>(entry.bytes.size()));
          continue;
        }
        const std::streamoff before = out.tellp();
        entry.source(out);
        const std::streamoff written = out.tellp() - before;
        if (out && static_cast<uint64_t>(written) != entry.size) {
          throw Error("safetensors writer: tensor " + name + ": its source wrote " +
                      std::to_string(written) + " bytes, not " + std::to_string(entry.size));
        }
      }
    } catch (...) {
      out.close();
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw;
    }
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw Error(temporary.string() + ": write failed: " + std::strerror(errno));
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw Error(path.string() + ": cannot rename " + temporary.filename().string() +
                " into place: " + error.message());
  }
}

}  // namespace tandem::engine
