// Kubernetes protobuf request bodies decoded by the test API server: each
// kind's message written out byte by byte (field numbers from the
// Kubernetes generated.proto files) and compared with the JSON a JSON client
// sends; malformed bodies answered 400 naming the problem and the byte;
// other kinds 415. Then the same bodies over HTTP: create, update and
// delete (with DeleteOptions preconditions) as helm's release storage does.
#include "tests/support/apiserver/protobuf_body.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/apiserver/api_server.h"
#include "tests/unit/apiserver/api_test_client.h"

namespace tandem::testing {
namespace {

using nlohmann::json;

constexpr const char* kProtobuf = "application/vnd.kubernetes.protobuf";

// One piece of a body written out by hand: an integer is one byte, a
// string literal its characters.
struct Piece {
  Piece(int byte) : text(1, static_cast<char>(byte)) {}  // NOLINT: implicit on purpose
  Piece(const char* characters) : text(characters) {}    // NOLINT: implicit on purpose
  std::string text;
};

std::string bytes(std::initializer_list<Piece> pieces) {
  std::string out;
  for (const Piece& piece : pieces) out += piece.text;
  return out;
}

// A base-128 varint, for the lengths of raw objects in `envelope`.
std::string varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
  return out;
}

// "k8s\0" and a runtime.Unknown: typeMeta {apiVersion = 1, kind = 2} = 1,
// raw = 2, then empty contentEncoding = 3 and contentType = 4, as Go's
// generated marshalling writes them.
std::string envelope(const std::string& api_version, const std::string& kind,
                     const std::string& raw) {
  const std::string type_meta = bytes({0x0a}) + varint(api_version.size()) + api_version +
                                bytes({0x12}) + varint(kind.size()) + kind;
  return std::string("k8s\0", 4) + bytes({0x0a}) + varint(type_meta.size()) + type_meta +
         bytes({0x12}) + varint(raw.size()) + raw + bytes({0x1a, 0x00, 0x22, 0x00});
}

json decoded(const std::string& body) {
  ProtobufBody result = decodeProtobufBody(body);
  EXPECT_TRUE(result.ok()) << (result.error ? result.error->message : "");
  return result.object;
}

// The error message of a body that must be refused with `code`.
std::string refused(const std::string& body, int code) {
  ProtobufBody result = decodeProtobufBody(body);
  EXPECT_FALSE(result.ok());
  if (!result.error) return "";
  EXPECT_EQ(result.error->code, code) << result.error->message;
  EXPECT_EQ(result.error->reason, code == 400 ? "BadRequest" : "UnsupportedMediaType");
  return result.error->message;
}

// The Secret helm stores a release in (sh.helm.release.v1.<release>.v<N>):
// ObjectMeta with every string Go always writes (empty ones too), a zero
// creationTimestamp (seconds -62135596800, a ten-byte varint) and helm's
// labels; 128 bytes, so its length takes two bytes.
// clang-format off
const std::string kReleaseSecret = bytes({
    0x0a, 0x80, 0x01,                                    // metadata = 1, 128 bytes
    0x0a, 0x1c, "sh.helm.release.v1.tandem.v1",          //   name = 1
    0x12, 0x00,                                          //   generateName = 2, empty
    0x1a, 0x06, "tandem",                                //   namespace = 3
    0x22, 0x00, 0x2a, 0x00, 0x32, 0x00,                  //   selfLink, uid, resourceVersion
    0x38, 0x00,                                          //   generation = 7, 0
    0x42, 0x0d,                                          //   creationTimestamp = 8 (skipped)
    0x08, 0x80, 0x92, 0xb8, 0xc3, 0x98, 0xfe, 0xff,      //     seconds = 1, negative
    0xff, 0xff, 0x01,                                    //
    0x10, 0x00,                                          //     nanos = 2
    0x5a, 0x0d, 0x0a, 0x05, "owner", 0x12, 0x04, "helm", //   labels = 11
    0x5a, 0x12, 0x0a, 0x06, "status", 0x12, 0x08, "deployed",
    0x5a, 0x0e, 0x0a, 0x04, "name", 0x12, 0x06, "tandem",
    0x5a, 0x0c, 0x0a, 0x07, "version", 0x12, 0x01, "1",
    0x12, 0x0e, 0x0a, 0x07, "release",                   // data = 2: release =
    0x12, 0x03, 0x00, 0xff, 0x01,                        //   bytes 00 ff 01
    0x1a, 0x12, "helm.sh/release.v1",                    // type = 3
});
// clang-format on

TEST(ProtobufBodyTest, HelmReleaseSecret) {
  const std::string raw =
      kReleaseSecret + bytes({0x22, 0x06, 0x0a, 0x01, "k", 0x12, 0x01, "v",  // stringData = 4
                              0x28, 0x01});                                  // immutable = 5
  EXPECT_EQ(decoded(envelope("v1", "Secret", raw)), json::parse(R"({
      "apiVersion": "v1", "kind": "Secret",
      "metadata": {"name": "sh.helm.release.v1.tandem.v1", "namespace": "tandem",
                   "labels": {"owner": "helm", "status": "deployed", "name": "tandem",
                              "version": "1"}},
      "data": {"release": "AP8B"}, "type": "helm.sh/release.v1",
      "stringData": {"k": "v"}, "immutable": true})"));
}

TEST(ProtobufBodyTest, ConfigMapWholeBody) {
  // clang-format off
  const std::string body = bytes({
      'k', '8', 's', 0x00,                                    // magic
      0x0a, 0x0f, 0x0a, 0x02, "v1", 0x12, 0x09, "ConfigMap",  // typeMeta = 1
      0x12, 0x27,                                             // raw = 2, 39 bytes
      0x0a, 0x0a, 0x0a, 0x08, "settings",                     //   metadata.name
      0x12, 0x0c, 0x0a, 0x04, "mode", 0x12, 0x04, "fast",     //   data = 2
      0x1a, 0x09, 0x0a, 0x03, "bin", 0x12, 0x02, 0x00, 0x80,  //   binaryData = 3
      0x20, 0x00,                                             //   immutable = 4, false
      0x1a, 0x00, 0x22, 0x00,                                 // contentEncoding, contentType
  });
  // clang-format on
  EXPECT_EQ(decoded(body), json::parse(R"({
      "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
      "data": {"mode": "fast"}, "binaryData": {"bin": "AIA="}, "immutable": false})"));
}

TEST(ProtobufBodyTest, NamespaceWithFinalizers) {
  const std::string raw = bytes({
      0x0a, 0x08, 0x0a, 0x06, "tandem",      // metadata.name
      0x12, 0x0c, 0x0a, 0x0a, "kubernetes",  // spec = 2: finalizers = 1
      0x1a, 0x00,                            // status = 3, empty
  });
  EXPECT_EQ(decoded(envelope("v1", "Namespace", raw)), json::parse(R"({
      "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tandem"},
      "spec": {"finalizers": ["kubernetes"]}, "status": {}})"));
}

TEST(ProtobufBodyTest, ServiceAccountAndTheRestOfObjectMeta) {
  // clang-format off
  const std::string raw = bytes({
      0x0a, 0x57,                                          // metadata, 87 bytes
      0x12, 0x07, "worker-",                               //   generateName = 2
      0x2a, 0x03, "u-1",                                   //   uid = 5
      0x32, 0x02, "42",                                    //   resourceVersion = 6
      0x38, 0x03,                                          //   generation = 7
      0x62, 0x0a, 0x0a, 0x01, "a", 0x12, 0x05, "b c d",    //   annotations = 12
      0x6a, 0x23,                                          //   ownerReferences = 13
      0x0a, 0x0a, "Deployment",                            //     kind = 1
      0x1a, 0x03, "web",                                   //     name = 3
      0x22, 0x03, "u-0",                                   //     uid = 4
      0x2a, 0x07, "apps/v1",                               //     apiVersion = 5
      0x30, 0x01, 0x38, 0x00,                              //     controller, blockOwnerDeletion
      0x72, 0x10, "example.com/keep",                      //   finalizers = 14
      0x12, 0x0f,                                          // secrets = 2 (ObjectReference)
      0x1a, 0x05, "token", 0x12, 0x06, "tandem",           //   name = 3, namespace = 2
      0x1a, 0x07, 0x0a, 0x05, "pulls",                     // imagePullSecrets = 3
      0x20, 0x00,                                          // automountServiceAccountToken = 4
  });
  // clang-format on
  EXPECT_EQ(decoded(envelope("v1", "ServiceAccount", raw)), json::parse(R"({
      "apiVersion": "v1", "kind": "ServiceAccount",
      "metadata": {"generateName": "worker-", "uid": "u-1", "resourceVersion": "42",
                   "generation": 3, "annotations": {"a": "b c d"},
                   "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "web", "uid": "u-0", "controller": true,
                                        "blockOwnerDeletion": false}],
                   "finalizers": ["example.com/keep"]},
      "secrets": [{"name": "token", "namespace": "tandem"}],
      "imagePullSecrets": [{"name": "pulls"}], "automountServiceAccountToken": false})"));
}

TEST(ProtobufBodyTest, DeleteOptionsOfAnyGroupVersion) {
  const std::string raw = bytes({
      0x08, 0x1e,                                        // gracePeriodSeconds = 1
      0x12, 0x0a, 0x0a, 0x03, "u-1", 0x12, 0x03, "100",  // preconditions = 2
      0x22, 0x0a, "Foreground",                          // propagationPolicy = 4
      0x2a, 0x03, "All",                                 // dryRun = 5
      0x18, 0x00,                                        // orphanDependents = 3
  });
  const json expected = json::parse(R"({
      "kind": "DeleteOptions", "gracePeriodSeconds": 30,
      "preconditions": {"uid": "u-1", "resourceVersion": "100"},
      "propagationPolicy": "Foreground", "dryRun": ["All"], "orphanDependents": false})");
  for (const std::string api_version : {"v1", "meta.k8s.io/v1", "apps/v1"}) {
    json with_version = expected;
    with_version["apiVersion"] = api_version;
    EXPECT_EQ(decoded(envelope(api_version, "DeleteOptions", raw)), with_version);
  }
}

TEST(ProtobufBodyTest, UnknownFieldsOfEveryWireTypeAreSkipped) {
  // clang-format off
  const std::string raw = bytes({
      0x0a, 0x0a,                                          // metadata
      0x0a, 0x01, "s",                                     //   name
      0x78, 0x07,                                          //   field 15, varint
      0x8a, 0x01, 0x02, 0x0a, 0x00,                        //   managedFields = 17
      0x31, 1, 2, 3, 4, 5, 6, 7, 8,                        // field 6, 64-bit
      0x3d, 1, 2, 3, 4,                                    // field 7, 32-bit
      0x42, 0x03, "abc",                                   // field 8, length-delimited
      0x48, 0xff, 0xff, 0x03,                              // field 9, three-byte varint
      0x1a, 0x06, "Opaque",                                // type
  });
  // clang-format on
  const std::string body = envelope("v1", "Secret", raw) + bytes({0x48, 0x01});  // Unknown's 9
  EXPECT_EQ(decoded(body), json::parse(R"({"apiVersion": "v1", "kind": "Secret",
                                           "metadata": {"name": "s"}, "type": "Opaque"})"));
}

TEST(ProtobufBodyTest, OtherKindsAre415NamingTheKindAndJson) {
  const std::string deployment =
      refused(envelope("apps/v1", "Deployment", bytes({0x0a, 0x03, 0x0a, 0x01, "d"})), 415);
  EXPECT_NE(deployment.find("not apps/v1 Deployment"), std::string::npos) << deployment;
  EXPECT_NE(deployment.find("application/json, which is accepted for every kind"),
            std::string::npos)
      << deployment;
  const std::string other_version = refused(envelope("v2", "Secret", ""), 415);
  EXPECT_NE(other_version.find("not v2 Secret"), std::string::npos) << other_version;
  const std::string encoded =
      refused(std::string("k8s\0", 4) +
                  bytes({0x0a, 0x0a, 0x0a, 0x02, "v1", 0x12, 0x04, "Kind", 0x1a, 0x04, "gzip"}),
              415);
  EXPECT_NE(encoded.find("contentEncoding \"gzip\""), std::string::npos) << encoded;
}

TEST(ProtobufBodyTest, MalformedBodiesAre400NamingTheProblem) {
  struct Case {
    std::string body;
    std::string message;  // a part of the 400's message
  };
  // In envelope("v1", "Secret", raw) a short raw starts at byte 20.
  const Case cases[] = {
      {"", "does not start with the 4-byte magic \"k8s\\0\" (6b 38 73 00) (it is empty)"},
      {"{\"kind\":\"Secret\"}", "(it starts 7b 22 6b 69)"},
      {bytes({'k', '8', 's', 0x01, 0x0a, 0x00}), "(it starts 6b 38 73 01)"},
      {bytes({'k', '8', 's', 0x00, 0x8a}),
       "runtime.Unknown: truncated varint (field tag): the message ends inside it at byte 4"},
      {envelope("v1", "Secret", bytes({0x0a, 0x02, 0x38, 0x80})),
       "Secret.metadata: truncated varint (generation): the message ends inside it at byte 23"},
      {envelope("v1", "Secret", bytes({0x0a, 0x05, 0x0a, 0x01})),
       "Secret: field 1 (metadata): length 5 runs past the end of the message (2 bytes left) at "
       "byte 21"},
      {bytes({'k', '8', 's', 0x00, 0x0a, 0x7f, 0x0a}),
       "runtime.Unknown: field 1 (typeMeta): length 127 runs past the end of the message (1 "
       "bytes left) at byte 5"},
      {envelope("v1", "Secret", bytes({0x0a, 0x02, 0x08, 0x01})),
       "Secret.metadata: field 1 (name) has wire type 0 (varint), expected 2 (length-delimited)"},
      {envelope("v1", "Secret", bytes({0x0a, 0x04, 0x0a, 0x02, 0xc3, 0x28})),
       "Secret.metadata: field 1 (name) is not valid UTF-8 (its value starts at byte 24)"},
      {envelope("v1", "Secret", bytes({0x0b})),
       "Secret: field 1 has wire type 3 (group), which Kubernetes messages never use at byte 20"},
      {envelope("v1", "Secret", bytes({0x0e})), "field 1 has wire type 6, which does not exist"},
      {envelope("v1", "Secret", bytes({0x02, 0x00})), "Secret: field number 0 is not valid"},
      {envelope("v1", "Secret",
                bytes({0x38, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})),
       "Secret: varint (value) longer than 10 bytes at byte 21"},
      {envelope("v1", "Secret", bytes({0x31, 1, 2, 3})),
       "Secret: truncated 64-bit value: 3 bytes left at byte 21"},
      {envelope("v1", "Secret", bytes({0x3d, 1})),
       "Secret: truncated 32-bit value: 1 bytes left at byte 21"},
      {std::string("k8s\0", 4) + bytes({0x0a, 0x04, 0x0a, 0x02, "v1"}),
       "runtime.Unknown: typeMeta.kind is missing"},
  };
  for (const Case& c : cases) {
    const std::string message = refused(c.body, 400);
    EXPECT_EQ(message.rfind("the protobuf request body is malformed: ", 0), 0u) << message;
    EXPECT_NE(message.find(c.message), std::string::npos)
        << "message: " << message << "\nexpected to contain: " << c.message;
  }
}

// --- over HTTP --------------------------------------------------------------

// A Secret named `name` with label status=`status` (and resourceVersion
// `version` when not empty) and data.release = 00 ff 01.
std::string releaseSecret(const std::string& name, const std::string& status,
                          const std::string& version) {
  std::string meta = bytes({0x0a}) + varint(name.size()) + name;
  if (!version.empty()) meta += bytes({0x32}) + varint(version.size()) + version;
  const std::string label = bytes({0x0a, 0x06, "status", 0x12}) + varint(status.size()) + status;
  meta += bytes({0x5a}) + varint(label.size()) + label;
  return envelope("v1", "Secret",
                  bytes({0x0a}) + varint(meta.size()) + meta +
                      bytes({0x12, 0x0e, 0x0a, 0x07, "release", 0x12, 0x03, 0x00, 0xff, 0x01, 0x1a,
                             0x12, "helm.sh/release.v1"}));
}

// DeleteOptions {preconditions {uid}} as client-go's typed Delete sends them.
std::string deleteWithUid(const std::string& uid) {
  const std::string preconditions = bytes({0x0a}) + varint(uid.size()) + uid;
  return envelope("v1", "DeleteOptions",
                  bytes({0x12}) + varint(preconditions.size()) + preconditions);
}

class ProtobufHttpTest : public ::testing::Test {
 protected:
  JsonAnswer send(const std::string& method, const std::string& path, const std::string& body) {
    httplib::Client client("127.0.0.1", server_.port());
    const httplib::Headers headers = {
        {"Accept", "application/vnd.kubernetes.protobuf, application/json"}};
    httplib::Result result = method == "POST" ? client.Post(path.c_str(), headers, body, kProtobuf)
                             : method == "PUT"
                                 ? client.Put(path.c_str(), headers, body, kProtobuf)
                                 : client.Delete(path.c_str(), headers, body, kProtobuf);
    JsonAnswer answer;
    if (!result) return answer;
    answer.status = result->status;
    answer.headers = result->headers;
    answer.text = result->body;
    answer.body = json::parse(result->body, nullptr, false);
    return answer;
  }

  ApiServer server_;
  ApiTestClient client_{server_};
};

constexpr const char* kSecrets = "/api/v1/namespaces/tandem/secrets";

TEST_F(ProtobufHttpTest, HelmReleaseStorageCreateUpdateDelete) {
  const std::string path = std::string(kSecrets) + "/sh.helm.release.v1.tandem.v1";
  const JsonAnswer created =
      send("POST", kSecrets, releaseSecret("sh.helm.release.v1.tandem.v1", "deployed", ""));
  ASSERT_EQ(created.status, 201) << created.text;
  EXPECT_EQ(created.header("Content-Type"), "application/json");
  EXPECT_EQ(created.body["metadata"]["namespace"], "tandem");

  JsonAnswer stored = client_.get(path);
  ASSERT_EQ(stored.status, 200) << stored.text;
  EXPECT_EQ(stored.body["type"], "helm.sh/release.v1");
  EXPECT_EQ(stored.body["data"], json({{"release", "AP8B"}}));
  EXPECT_EQ(stored.body["metadata"]["labels"], json({{"status", "deployed"}}));

  const std::string version = stored.body["metadata"]["resourceVersion"];
  const JsonAnswer updated =
      send("PUT", path, releaseSecret("sh.helm.release.v1.tandem.v1", "superseded", version));
  ASSERT_EQ(updated.status, 200) << updated.text;
  EXPECT_EQ(client_.get(path).body["metadata"]["labels"]["status"], "superseded");
  // A stale resourceVersion is refused as for a JSON body.
  EXPECT_EQ(send("PUT", path, releaseSecret("sh.helm.release.v1.tandem.v1", "x", version)).status,
            409);

  const JsonAnswer wrong_uid = send("DELETE", path, deleteWithUid("not-its-uid"));
  EXPECT_EQ(wrong_uid.status, 409) << wrong_uid.text;
  EXPECT_NE(wrong_uid.body.value("message", "").find("UID in precondition: not-its-uid"),
            std::string::npos)
      << wrong_uid.text;
  const std::string uid = stored.body["metadata"]["uid"];
  const JsonAnswer deleted = send("DELETE", path, deleteWithUid(uid));
  EXPECT_EQ(deleted.status, 200) << deleted.text;
  EXPECT_EQ(client_.get(path).status, 404);
}

TEST_F(ProtobufHttpTest, UnknownKindIs415AndMalformedIs400) {
  const JsonAnswer deployment =
      send("POST", "/apis/apps/v1/namespaces/tandem/deployments",
           envelope("apps/v1", "Deployment", bytes({0x0a, 0x03, 0x0a, 0x01, "d"})));
  EXPECT_EQ(deployment.status, 415) << deployment.text;
  EXPECT_EQ(deployment.body["reason"], "UnsupportedMediaType");
  EXPECT_NE(deployment.body.value("message", "").find("apps/v1 Deployment"), std::string::npos);

  const JsonAnswer truncated =
      send("POST", kSecrets, envelope("v1", "Secret", bytes({0x0a, 0x02, 0x38, 0x80})));
  EXPECT_EQ(truncated.status, 400) << truncated.text;
  EXPECT_EQ(truncated.body["reason"], "BadRequest");
  EXPECT_NE(truncated.body.value("message", "").find("truncated varint"), std::string::npos);
  EXPECT_EQ(client_.get(kSecrets).body["items"].size(), 0u);
}

}  // namespace
}  // namespace tandem::testing
