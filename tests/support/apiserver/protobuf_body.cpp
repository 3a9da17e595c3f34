#include "tests/support/apiserver/protobuf_body.h"

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "tests/support/apiserver/yaml_json.h"

// Field numbers follow the Kubernetes generated.proto files:
// k8s.io/apimachinery pkg/runtime (Unknown, TypeMeta) and pkg/apis/meta/v1
// (ObjectMeta, OwnerReference, DeleteOptions, Preconditions), k8s.io/api
// core/v1 (Secret, ConfigMap, Namespace, NamespaceSpec, NamespaceStatus,
// ServiceAccount, ObjectReference, LocalObjectReference). A map field is a
// repeated entry message {key = 1, value = 2}.

namespace tandem::testing {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kMagic("k8s\0", 4);
constexpr uint64_t kMaxFieldNumber = (uint64_t{1} << 29) - 1;

// A malformed body; thrown and caught inside this file only
// (decodeProtobufBody answers it as a 400).
class MalformedBody : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

const char* wireTypeName(uint32_t wire_type) {
  switch (wire_type) {
    case kVarint:
      return "varint";
    case kFixed64:
      return "64-bit";
    case kLengthDelimited:
      return "length-delimited";
    case kFixed32:
      return "32-bit";
    default:
      return "group";
  }
}

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or
// code points past U+10FFFF), as JSON strings must be.
bool validUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t continuation = 0;
    uint32_t code_point = 0;
    uint32_t smallest = 0;
    if ((lead & 0xE0) == 0xC0) {
      continuation = 1;
      code_point = lead & 0x1F;
      smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      continuation = 2;
      code_point = lead & 0x0F;
      smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      continuation = 3;
      code_point = lead & 0x07;
      smallest = 0x10000;
    } else {
      return false;
    }
    if (text.size() - i <= continuation) return false;
    for (size_t k = 1; k <= continuation; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    if (code_point < smallest || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return false;
    }
    i += continuation + 1;
  }
  return true;
}

// Reads one message's fields in order. Wire format: each field is a varint
// tag (field number << 3 | wire type) and a value: a varint, 8 bytes, a
// varint length and that many bytes, or 4 bytes.
class MessageReader {
 public:
  // `bytes` lie at byte `offset` of the body; `path` names the message in errors.
  MessageReader(std::string_view bytes, size_t offset, std::string path)
      : bytes_(bytes), offset_(offset), path_(std::move(path)) {}

  // Moves to the next field; false at the end of the message.
  bool next() {
    if (pos_ >= bytes_.size()) return false;
    const size_t tag_at = pos_;
    const uint64_t tag = readVarint("field tag");
    field_ = tag >> 3;
    wire_type_ = static_cast<uint32_t>(tag & 7);
    if (field_ == 0 || field_ > kMaxFieldNumber) {
      fail("field number " + std::to_string(field_) + " is not valid (1 to " +
               std::to_string(kMaxFieldNumber) + " are)",
           tag_at);
    }
    if (wire_type_ == kStartGroup || wire_type_ == kEndGroup) {
      fail("field " + std::to_string(field_) + " has wire type " + std::to_string(wire_type_) +
               " (group), which Kubernetes messages never use",
           tag_at);
    }
    if (wire_type_ > kFixed32) {
      fail("field " + std::to_string(field_) + " has wire type " + std::to_string(wire_type_) +
               ", which does not exist (0, 1, 2 and 5 do)",
           tag_at);
    }
    return true;
  }

  uint64_t field() const { return field_; }

  int64_t int64Value(const char* name) {
    expect(kVarint, name);
    return static_cast<int64_t>(readVarint(name));
  }

  bool boolValue(const char* name) {
    expect(kVarint, name);
    return readVarint(name) != 0;
  }

  // A bytes field's value, any bytes.
  std::string bytesValue(const char* name) { return std::string(lengthDelimited(name)); }

  // A string field's value, which must be UTF-8.
  std::string stringValue(const char* name) {
    std::string_view value = lengthDelimited(name);
    if (!validUtf8(value)) {
      const size_t value_at = offset_ + pos_ - value.size();
      throw MalformedBody(path_ + ": field " + std::to_string(field_) + " (" + name +
                          ") is not valid UTF-8 (its value starts at byte " +
                          std::to_string(value_at) + ")");
    }
    return std::string(value);
  }

  // An embedded message field, named `path` in errors (by default this
  // message's path and the field's name).
  MessageReader message(const char* name, std::string path = "") {
    std::string_view value = lengthDelimited(name);
    const size_t value_at = offset_ + pos_ - value.size();
    return MessageReader(value, value_at, path.empty() ? path_ + "." + name : std::move(path));
  }

  // Skips the current field's value (a field this decoder does not keep).
  void skip() {
    switch (wire_type_) {
      case kVarint:
        readVarint("value");
        break;
      case kFixed64:
        fixed(8, "value");
        break;
      case kFixed32:
        fixed(4, "value");
        break;
      default:
        lengthDelimited("value");
        break;
    }
  }

  void rename(std::string path) { path_ = std::move(path); }

 private:
  [[noreturn]] void fail(const std::string& what, size_t at) const {
    throw MalformedBody(path_ + ": " + what + " at byte " + std::to_string(offset_ + at));
  }

  void expect(uint32_t wire_type, const char* name) const {
    if (wire_type_ != wire_type) {
      throw MalformedBody(path_ + ": field " + std::to_string(field_) + " (" + name +
                          ") has wire type " + std::to_string(wire_type_) + " (" +
                          wireTypeName(wire_type_) + "), expected " + std::to_string(wire_type) +
                          " (" + wireTypeName(wire_type) + ")");
    }
  }

  uint64_t readVarint(const char* what) {
    const size_t start = pos_;
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= bytes_.size()) {
        fail(std::string("truncated varint (") + what + "): the message ends inside it", start);
      }
      const auto byte = static_cast<unsigned char>(bytes_[pos_++]);
      value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    fail(std::string("varint (") + what + ") longer than 10 bytes", start);
  }

  void fixed(size_t size, const char* what) {
    if (bytes_.size() - pos_ < size) {
      fail("truncated " + std::to_string(size * 8) + "-bit " + what + ": " +
               std::to_string(bytes_.size() - pos_) + " bytes left",
           pos_);
    }
    pos_ += size;
  }

  std::string_view lengthDelimited(const char* name) {
    expect(kLengthDelimited, name);
    const size_t length_at = pos_;
    const uint64_t length = readVarint("length");
    const size_t left = bytes_.size() - pos_;
    if (length > left) {
      fail("field " + std::to_string(field_) + " (" + name + "): length " + std::to_string(length) +
               " runs past the end of the message (" + std::to_string(left) + " bytes left)",
           length_at);
    }
    std::string_view value = bytes_.substr(pos_, static_cast<size_t>(length));
    pos_ += static_cast<size_t>(length);
    return value;
  }

  std::string_view bytes_;
  size_t offset_;
  std::string path_;
  size_t pos_ = 0;
  uint64_t field_ = 0;
  uint32_t wire_type_ = 0;
};

// A field's type: a scalar, or one of the messages decoded here (map entries
// included).
enum Type : uint8_t {
  kString,   // UTF-8 text
  kBytes,    // any bytes; base64 in JSON
  kInt64,    // a varint
  kBool,     // a varint, 0 or 1
  kSkipped,  // a field the stand-in does not keep (set by servers, never by a client)
  // Every other value is a message.
  kStringEntry,  // a map<string, string>'s entry
  kBytesEntry,   // a map<string, bytes>'s entry
  kTypeMeta,
  kObjectMeta,
  kOwnerReference,
  kSecret,
  kConfigMap,
  kNamespace,
  kNamespaceSpec,
  kNamespaceStatus,
  kServiceAccount,
  kObjectReference,
  kLocalObjectReference,
  kDeleteOptions,
  kPreconditions,
};

// Where a field's value goes in its message's JSON object, as Go's
// encoding/json puts the field of the Go struct.
enum Placement : uint8_t {
  kOmitEmpty,    // `omitempty`: left out when "", 0 or false; the last non-empty value stays
  kWhenPresent,  // a pointer (or a struct) in Go: written when on the wire, even if empty
  kAlways,       // no `omitempty`: written as "", 0 or false when not on the wire
  kRepeated,     // a slice: each occurrence appended to an array
  kMap,          // a map: each occurrence an entry message {key, value} added to an object
};

// One field of a message: its number in generated.proto, its JSON name (also
// the name errors give it), its type and where it goes.
struct Field {
  Type message;  // the message the field belongs to
  uint64_t number;
  const char* name;
  Type type;
  Placement placement;  // unused for kSkipped
};

// Every field of every message decoded here; a field number its message does
// not list is skipped.
constexpr Field kFields[] = {
    {kStringEntry, 1, "key", kString, kAlways},
    {kStringEntry, 2, "value", kString, kAlways},
    {kBytesEntry, 1, "key", kString, kAlways},
    {kBytesEntry, 2, "value", kBytes, kAlways},

    // runtime.TypeMeta, in the envelope.
    {kTypeMeta, 1, "apiVersion", kString, kWhenPresent},
    {kTypeMeta, 2, "kind", kString, kWhenPresent},

    {kObjectMeta, 1, "name", kString, kOmitEmpty},
    {kObjectMeta, 2, "generateName", kString, kOmitEmpty},
    {kObjectMeta, 3, "namespace", kString, kOmitEmpty},
    {kObjectMeta, 4, "selfLink", kSkipped, kOmitEmpty},
    {kObjectMeta, 5, "uid", kString, kOmitEmpty},
    {kObjectMeta, 6, "resourceVersion", kString, kOmitEmpty},
    {kObjectMeta, 7, "generation", kInt64, kOmitEmpty},
    {kObjectMeta, 8, "creationTimestamp", kSkipped, kOmitEmpty},
    {kObjectMeta, 9, "deletionTimestamp", kSkipped, kOmitEmpty},
    {kObjectMeta, 10, "deletionGracePeriodSeconds", kSkipped, kOmitEmpty},
    {kObjectMeta, 11, "labels", kStringEntry, kMap},
    {kObjectMeta, 12, "annotations", kStringEntry, kMap},
    {kObjectMeta, 13, "ownerReferences", kOwnerReference, kRepeated},
    {kObjectMeta, 14, "finalizers", kString, kRepeated},
    {kObjectMeta, 17, "managedFields", kSkipped, kOmitEmpty},

    {kOwnerReference, 1, "kind", kString, kAlways},
    {kOwnerReference, 3, "name", kString, kAlways},
    {kOwnerReference, 4, "uid", kString, kAlways},
    {kOwnerReference, 5, "apiVersion", kString, kAlways},
    {kOwnerReference, 6, "controller", kBool, kWhenPresent},
    {kOwnerReference, 7, "blockOwnerDeletion", kBool, kWhenPresent},

    {kSecret, 1, "metadata", kObjectMeta, kWhenPresent},
    {kSecret, 2, "data", kBytesEntry, kMap},
    {kSecret, 3, "type", kString, kOmitEmpty},
    {kSecret, 4, "stringData", kStringEntry, kMap},
    {kSecret, 5, "immutable", kBool, kWhenPresent},

    {kConfigMap, 1, "metadata", kObjectMeta, kWhenPresent},
    {kConfigMap, 2, "data", kStringEntry, kMap},
    {kConfigMap, 3, "binaryData", kBytesEntry, kMap},
    {kConfigMap, 4, "immutable", kBool, kWhenPresent},

    {kNamespace, 1, "metadata", kObjectMeta, kWhenPresent},
    {kNamespace, 2, "spec", kNamespaceSpec, kWhenPresent},
    {kNamespace, 3, "status", kNamespaceStatus, kWhenPresent},
    {kNamespaceSpec, 1, "finalizers", kString, kRepeated},
    {kNamespaceStatus, 1, "phase", kString, kOmitEmpty},
    {kNamespaceStatus, 2, "conditions", kSkipped, kOmitEmpty},

    {kServiceAccount, 1, "metadata", kObjectMeta, kWhenPresent},
    {kServiceAccount, 2, "secrets", kObjectReference, kRepeated},
    {kServiceAccount, 3, "imagePullSecrets", kLocalObjectReference, kRepeated},
    {kServiceAccount, 4, "automountServiceAccountToken", kBool, kWhenPresent},
    {kObjectReference, 1, "kind", kString, kOmitEmpty},
    {kObjectReference, 2, "namespace", kString, kOmitEmpty},
    {kObjectReference, 3, "name", kString, kOmitEmpty},
    {kObjectReference, 4, "uid", kString, kOmitEmpty},
    {kObjectReference, 5, "apiVersion", kString, kOmitEmpty},
    {kObjectReference, 6, "resourceVersion", kString, kOmitEmpty},
    {kObjectReference, 7, "fieldPath", kString, kOmitEmpty},
    {kLocalObjectReference, 1, "name", kString, kOmitEmpty},

    {kDeleteOptions, 1, "gracePeriodSeconds", kInt64, kWhenPresent},
    {kDeleteOptions, 2, "preconditions", kPreconditions, kWhenPresent},
    {kDeleteOptions, 3, "orphanDependents", kBool, kWhenPresent},
    {kDeleteOptions, 4, "propagationPolicy", kString, kWhenPresent},
    {kDeleteOptions, 5, "dryRun", kString, kRepeated},
    {kDeleteOptions, 6, "ignoreStoreReadErrorWithClusterBreakingPotential", kBool, kWhenPresent},
    {kPreconditions, 1, "uid", kString, kWhenPresent},
    {kPreconditions, 2, "resourceVersion", kString, kWhenPresent},
};

// The row of `message`'s field `number`; null for a number it does not list.
const Field* fieldNumbered(Type message, uint64_t number) {
  for (const Field& field : kFields) {
    if (field.message == message && field.number == number) return &field;
  }
  return nullptr;
}

// The value Go writes for a field without omitempty that is not set.
Json zeroValue(Type type) {
  switch (type) {
    case kString:
    case kBytes:
      return "";
    case kInt64:
      return 0;
    case kBool:
      return false;
    default:
      return Json::object();
  }
}

Json decodeMessage(MessageReader reader, Type message);

// Reads the reader's current field, as `field` describes it, into `object`.
void decodeField(MessageReader& reader, const Field& field, Json& object) {
  Json value;
  switch (field.type) {
    case kString:
      value = reader.stringValue(field.name);
      break;
    case kBytes:
      value = base64Encode(reader.bytesValue(field.name));
      break;
    case kInt64:
      value = reader.int64Value(field.name);
      break;
    case kBool:
      value = reader.boolValue(field.name);
      break;
    case kSkipped:
      reader.skip();
      return;
    default:
      value = decodeMessage(reader.message(field.name), field.type);
  }
  switch (field.placement) {
    case kOmitEmpty:
      if (value != "" && value != 0 && value != false) object[field.name] = std::move(value);
      break;
    case kWhenPresent:
    case kAlways:
      object[field.name] = std::move(value);
      break;
    case kRepeated:
      object[field.name].push_back(std::move(value));
      break;
    case kMap: {
      Json& map = object[field.name];
      if (!map.is_object()) map = Json::object();
      map[value.at("key").get<std::string>()] = std::move(value.at("value"));
      break;
    }
  }
}

// Any message, as JSON, from its rows in kFields. No message holds a field of
// its own type, so a body cannot make this recurse deeper than the table does.
Json decodeMessage(MessageReader reader, Type message) {
  Json object = Json::object();
  for (const Field& field : kFields) {
    if (field.message == message && field.placement == kAlways) {
      object[field.name] = zeroValue(field.type);
    }
  }
  while (reader.next()) {
    if (const Field* field = fieldNumbered(message, reader.field())) {
      decodeField(reader, *field, object);
    } else {
      reader.skip();
    }
  }
  return object;
}

struct DecodedKind {
  const char* kind;
  bool core_v1;  // only as apiVersion v1; otherwise in any group version
  Type message;
};

constexpr DecodedKind kDecodedKinds[] = {
    {"Secret", true, kSecret},
    {"ConfigMap", true, kConfigMap},
    {"Namespace", true, kNamespace},
    {"ServiceAccount", true, kServiceAccount},
    {"DeleteOptions", false, kDeleteOptions},
};

ApiError unsupportedKind(const std::string& api_version, const std::string& kind) {
  return ApiError{415, "UnsupportedMediaType",
                  "the test API server decodes application/vnd.kubernetes.protobuf bodies of "
                  "v1 Secret, ConfigMap, Namespace and ServiceAccount and of DeleteOptions only, "
                  "not " +
                      (api_version.empty() ? "" : api_version + " ") + kind +
                      "; send it as application/json, which is accepted for every kind "
                      "(kubectl apply -f and create -f send JSON)"};
}

std::string hexBytes(std::string_view bytes) {
  std::string text;
  for (const char byte : bytes) {
    char hex[4];
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(byte));
    if (!text.empty()) text += ' ';
    text += hex;
  }
  return text;
}

}  // namespace

ProtobufBody decodeProtobufBody(std::string_view body) {
  ProtobufBody result;
  try {
    if (body.size() < kMagic.size() || body.substr(0, kMagic.size()) != kMagic) {
      throw MalformedBody(
          "the body does not start with the 4-byte magic \"k8s\\0\" (6b 38 73 00) " +
          std::string(body.empty()
                          ? "(it is empty)"
                          : "(it starts " + hexBytes(body.substr(0, kMagic.size())) + ")"));
    }
    MessageReader unknown(body.substr(kMagic.size()), kMagic.size(), "runtime.Unknown");
    // The envelope by hand: `raw` is decoded only once typeMeta names its kind.
    Json type_meta = Json::object();
    std::string content_encoding;
    std::optional<MessageReader> raw;
    while (unknown.next()) {
      switch (unknown.field()) {
        case 1:
          // A repeated typeMeta merges into the earlier one, field by field.
          type_meta.update(decodeMessage(unknown.message("typeMeta"), kTypeMeta));
          break;
        case 2:
          raw.emplace(unknown.message("raw"));
          break;
        case 3:
          content_encoding = unknown.stringValue("contentEncoding");
          break;
        default:
          unknown.skip();
      }
    }
    const std::string api_version = type_meta.value("apiVersion", "");
    const std::string kind = type_meta.value("kind", "");
    if (kind.empty()) {
      throw MalformedBody(
          "runtime.Unknown: typeMeta.kind is missing; a protobuf body must name its kind");
    }
    if (!content_encoding.empty()) {
      result.error =
          ApiError{415, "UnsupportedMediaType",
                   "the test API server does not decode protobuf bodies whose raw "
                   "object has contentEncoding \"" +
                       content_encoding + "\"; send it unencoded, or as application/json"};
      return result;
    }
    const DecodedKind* known = nullptr;
    for (const DecodedKind& candidate : kDecodedKinds) {
      if (kind == candidate.kind && (!candidate.core_v1 || api_version == "v1")) known = &candidate;
    }
    if (known == nullptr) {
      result.error = unsupportedKind(api_version, kind);
      return result;
    }
    MessageReader object = raw ? *raw : MessageReader({}, body.size(), "");
    object.rename(kind);
    result.object = decodeMessage(object, known->message);
    if (!api_version.empty()) result.object["apiVersion"] = api_version;
    result.object["kind"] = kind;
  } catch (const MalformedBody& error) {
    result.object = nullptr;
    result.error =
        badRequest(std::string("the protobuf request body is malformed: ") + error.what());
  }
  return result;
}

}  // namespace tandem::testing
