// Model sources and the Hub fetch (common/model_source/) against the Hub
// stand-in (tests/support/hub/hub_server.h) serving a generated model, and
// `tandem-model fetch` as a program.
#include "common/model_source/hub_fetch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model_source/model_source.h"
#include "common/subprocess.h"
#include "tests/support/command.h"
#include "tests/support/hub/hub_server.h"
#include "tests/support/test_files.h"
#include "tools/model/test_model.h"

namespace tandem::model_source {
namespace {

namespace fs = std::filesystem;
using testing::HubServer;
using testing::readFile;
using testing::TempDir;
using testing::writeFile;

TEST(ModelSourceTest, ParsesEachScheme) {
  StatusOr<ModelSource> hub = parseModelSource("hf://meta-llama/Llama-3.1-8B-Instruct@v1.0");
  ASSERT_TRUE(hub.isOk()) << hub.status().message();
  EXPECT_EQ(hub->kind, SourceKind::kHuggingFace);
  EXPECT_EQ(hub->repo, "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_EQ(hub->revision, "v1.0");
  EXPECT_EQ(parseModelSource("hf://gpt2")->revision, "main");
  EXPECT_EQ(parseModelSource("hf://org/m@refs/pr/1")->revision, "refs/pr/1");

  StatusOr<ModelSource> claim = parseModelSource("pvc://models/llama/8b/");
  ASSERT_TRUE(claim.isOk()) << claim.status().message();
  EXPECT_EQ(claim->kind, SourceKind::kClaim);
  EXPECT_EQ(claim->claim, "models");
  EXPECT_EQ(claim->path, "llama/8b");
  EXPECT_EQ(parseModelSource("pvc://models")->path, "");

  StatusOr<ModelSource> image = parseModelSource("oci://registry.local:5000/models/tiny:1");
  ASSERT_TRUE(image.isOk());
  EXPECT_EQ(image->kind, SourceKind::kImage);
  EXPECT_EQ(image->image, "registry.local:5000/models/tiny:1");

  StatusOr<ModelSource> path = parseModelSource("/models/tiny");
  ASSERT_TRUE(path.isOk());
  EXPECT_EQ(path->kind, SourceKind::kPath);
  EXPECT_EQ(path->path, "/models/tiny");
}

TEST(ModelSourceTest, RefusesMalformedSourcesSayingWhatIsAccepted) {
  struct Case {
    const char* text;
    const char* expected;
  };
  for (const Case& c :
       {Case{"s3://bucket/model", "hf://, pvc:// and oci://"},
        Case{"hf://org/", "hf://org/name[@revision]"},
        Case{"hf://org/a/b", "hf://org/name[@revision]"},
        Case{"hf://org/name@", "branch, tag or commit"}, Case{"hf://org/na me", "space"},
        // "." named the directory above every revision's.
        Case{"hf://org/name@.", "branch, tag or commit"},
        Case{"hf://org/name@a/.b", "branch, tag or commit"},
        Case{"hf://org/name@a//b", "branch, tag or commit"}, Case{"pvc://Models/x", "claim name"},
        Case{"pvc://models./x", "claim name"}, Case{"pvc://a..b/x", "claim name"},
        Case{"pvc://a.-b", "claim name"}, Case{"pvc://models/../etc", "without '.' or '..'"},
        Case{"oci://", "oci://registry"}, Case{"", "empty"}}) {
    StatusOr<ModelSource> source = parseModelSource(c.text);
    ASSERT_FALSE(source.isOk()) << c.text;
    EXPECT_EQ(source.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(source.status().message().find(c.expected), std::string::npos)
        << source.status().message();
  }
}

TEST(ModelSourceTest, CacheDirectoryIsOnePathPerRepositoryAndRevision) {
  EXPECT_EQ(hubCacheDirectory("/cache/", *parseModelSource("hf://org/name@refs/pr/1")),
            "/cache/hf/models--org--name/refs--pr--1");
  EXPECT_EQ(hubCacheDirectory("/cache", *parseModelSource("hf://gpt2")),
            "/cache/hf/models--gpt2/main");
}

class HubFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tools::TestModelOptions model;
    model.preset = "tiny";
    tools::writeTestModel(model, model_.path());
    commit_ = hub_.publish("tandem/tiny", model_.path(), kExtraFiles);
  }

  HubFetchOptions options(const std::string& revision = "main") const {
    HubFetchOptions options;
    options.repo = "tandem/tiny";
    options.revision = revision;
    options.endpoint = hub_.endpoint();
    options.directory = out_.path() / "model";
    options.retry_delay_s = 0.01;
    return options;
  }

  std::vector<HubServer::Request> cdnRequestsFor(const std::string& sha256) const {
    std::vector<HubServer::Request> matching;
    for (const HubServer::Request& request : hub_.requests()) {
      if (request.server == "cdn" && request.path == "/blobs/" + sha256) {
        matching.push_back(request);
      }
    }
    return matching;
  }

  fs::path fetched(const std::string& name) const { return out_.path() / "model" / name; }

  // Files the repository holds that the agent does not load.
  inline static const std::map<std::string, std::string> kExtraFiles = {
      {"README.md", "# tiny\n"},
      {"pytorch_model.bin", std::string(4096, 'x')},
      {"original/params.json", "{}"},
      // Weights the agent never loads beside model.safetensors.
      {"consolidated.safetensors", std::string(2048, 'c')},
  };

  TempDir model_{"hub-model"};
  TempDir out_{"hub-fetch"};
  HubServer hub_;
  std::string commit_;
};

// A cache directory the fetching user may not write (a shared volume whose
// driver ignored the pod's fsGroup): the error says who the fetch runs as
// and who owns the directory, with its mode. `tandem-model fetch` runs as
// user and group 65534 when the test runs as root (which writes anything).
TEST_F(HubFetchTest, AnUnwritableCacheNamesTheUserAndTheOwner) {
  const bool root = ::geteuid() == 0;
  if (root) {
    // User 65534 must reach the directory: every folder above it searchable.
    for (fs::path up = out_.path().parent_path(); up != up.root_path(); up = up.parent_path()) {
      if ((fs::status(up).permissions() & fs::perms::others_exec) == fs::perms::none) {
        GTEST_SKIP() << up << " is not searchable by other users (TMPDIR)";
      }
    }
  }
  const fs::path locked = out_.path() / "locked";
  fs::create_directories(locked);
  const auto readable = fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                        fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec;
  fs::permissions(out_.path(), readable | fs::perms::owner_write);  // others may look in
  fs::permissions(locked, readable);
  std::vector<std::string> argv = {std::string(TANDEM_BIN_DIR) + "/tandem-model",
                                   "fetch",
                                   "hf://tandem/tiny",
                                   "--dir",
                                   (locked / "model").string(),
                                   "--endpoint",
                                   hub_.endpoint()};
  if (root) {
    argv.insert(argv.begin(),
                {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"});
  }
  const fs::path log = out_.path() / "fetch.stderr";
  Subprocess fetch(argv, log);
  const int status = fetch.wait(std::chrono::seconds(60));
  fs::permissions(locked, fs::perms::owner_all);
  const std::string message = fetch.stderrText();
  EXPECT_NE(status, 0) << message;
  EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
  const std::string user = root ? "65534" : std::to_string(::geteuid());
  const std::string group = root ? "65534" : std::to_string(::getegid());
  EXPECT_NE(message.find("this process runs as uid " + user + ", gid " + group), std::string::npos)
      << message;
  EXPECT_NE(message.find(locked.string() + " is owned by uid " + std::to_string(::geteuid()) +
                         ", gid " + std::to_string(::getegid()) + ", mode 0555"),
            std::string::npos)
      << message;
}

TEST_F(HubFetchTest, FetchesTheFilesTheAgentLoadsAndVerifiesThem) {
  hub_.setPageSize(2);  // the file list comes in pages
  StatusOr<HubFetchResult> result = fetchHubModel(options());
  ASSERT_TRUE(result.isOk()) << result.status().message();
  EXPECT_EQ(result->commit, commit_);
  EXPECT_FALSE(result->already_complete);
  std::vector<std::string> names;
  for (const HubFile& file : result->files) names.push_back(file.path);
  EXPECT_EQ(names,
            (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                      "tokenizer.json", "tokenizer_config.json"}));
  for (const std::string& name : names) {
    EXPECT_EQ(readFile(fetched(name)), readFile(model_.path() / name)) << name;
  }
  for (const char* skipped :
       {"README.md", "pytorch_model.bin", "original", "consolidated.safetensors"}) {
    EXPECT_FALSE(fs::exists(fetched(skipped))) << skipped;
  }
  EXPECT_EQ(result->bytes_downloaded, result->bytes_total);
  EXPECT_FALSE(modelDirectoryProblem(out_.path() / "model").has_value());
  const nlohmann::json marker =
      nlohmann::json::parse(readFile(fetched(".tandem-fetch/complete.json")));
  EXPECT_EQ(marker["commit"], commit_);
  EXPECT_EQ(marker["files"].size(), 5u);
  // Every file was asked at the resolved commit, never at the branch.
  for (const HubServer::Request& request : hub_.requests()) {
    if (request.path.find("/resolve/") != std::string::npos) {
      EXPECT_NE(request.path.find("/resolve/" + commit_ + "/"), std::string::npos) << request.path;
    }
  }
}

// A sharded model: the index and the shards its weight_map names, nothing
// else of the weights (Mistral repositories keep a consolidated copy of
// every weight beside the shards).
TEST_F(HubFetchTest, AShardedModelFetchesTheShardsItsIndexNamesOnly) {
  TempDir sharded("hub-sharded");
  for (const char* name : {"config.json", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(model_.path() / name, sharded.path() / name);
  }
  writeFile(sharded.path() / "model.safetensors.index.json",
            R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}})");
  writeFile(sharded.path() / "model-00001-of-00002.safetensors", std::string(1000, '1'));
  writeFile(sharded.path() / "model-00002-of-00002.safetensors", std::string(1000, '2'));
  writeFile(sharded.path() / "consolidated.safetensors", std::string(2000, 'c'));
  writeFile(sharded.path() / "consolidated.safetensors.index.json", R"({"weight_map": {}})");
  hub_.publish("tandem/sharded", sharded.path(), {});
  HubFetchOptions sharded_options = options();
  sharded_options.repo = "tandem/sharded";
  StatusOr<HubFetchResult> result = fetchHubModel(sharded_options);
  ASSERT_TRUE(result.isOk()) << result.status().message();
  std::vector<std::string> names;
  for (const HubFile& file : result->files) names.push_back(file.path);
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json", "tokenizer.json",
                                             "tokenizer_config.json"}));
  EXPECT_FALSE(fs::exists(fetched("consolidated.safetensors")));
  EXPECT_EQ(readFile(fetched("model-00002-of-00002.safetensors")), std::string(1000, '2'));

  // An index naming a shard the repository lacks is refused, naming both.
  writeFile(sharded.path() / "model.safetensors.index.json",
            R"({"weight_map": {"a": "model-00003-of-00002.safetensors"}})");
  hub_.publish("tandem/broken", sharded.path(), {});
  sharded_options.repo = "tandem/broken";
  sharded_options.directory = out_.path() / "broken";
  StatusOr<HubFetchResult> broken = fetchHubModel(sharded_options);
  ASSERT_FALSE(broken.isOk());
  EXPECT_NE(broken.status().message().find("model-00003-of-00002.safetensors"), std::string::npos)
      << broken.status().message();
}

TEST_F(HubFetchTest, ResumesAfterTheConnectionIsCutMidFile) {
  const std::string weights = readFile(model_.path() / "model.safetensors");
  const int64_t cut = static_cast<int64_t>(weights.size() / 3);
  hub_.cutAfter("model.safetensors", cut);
  StatusOr<HubFetchResult> result = fetchHubModel(options());
  ASSERT_TRUE(result.isOk()) << result.status().message();
  EXPECT_EQ(readFile(fetched("model.safetensors")), weights);
  const auto requests = cdnRequestsFor(fileSha256(model_.path() / "model.safetensors"));
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].range, "");
  EXPECT_EQ(requests[1].range, "bytes=" + std::to_string(cut) + "-");
  EXPECT_EQ(result->bytes_downloaded, result->bytes_total);  // nothing read twice
}

TEST_F(HubFetchTest, AnInterruptedFetchIsIncompleteAndTheNextOneResumesIt) {
  const std::string weights = readFile(model_.path() / "model.safetensors");
  const int64_t cut = static_cast<int64_t>(weights.size() / 2);
  hub_.cutAfter("model.safetensors", cut, /*times=*/1);
  HubFetchOptions first = options();
  first.retries = 0;
  StatusOr<HubFetchResult> failed = fetchHubModel(first);
  ASSERT_FALSE(failed.isOk());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("model.safetensors incomplete"), std::string::npos)
      << failed.status().message();
  std::optional<std::string> problem = modelDirectoryProblem(out_.path() / "model");
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("incomplete download"), std::string::npos) << *problem;

  StatusOr<HubFetchResult> resumed = fetchHubModel(options());
  ASSERT_TRUE(resumed.isOk()) << resumed.status().message();
  EXPECT_EQ(readFile(fetched("model.safetensors")), weights);
  const auto requests = cdnRequestsFor(fileSha256(model_.path() / "model.safetensors"));
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range, "bytes=" + std::to_string(cut) + "-");
  EXPECT_FALSE(modelDirectoryProblem(out_.path() / "model").has_value());
}

TEST_F(HubFetchTest, RefusesAFileWhoseBytesDoNotMatchItsHashNamingIt) {
  hub_.corrupt("model.safetensors");
  StatusOr<HubFetchResult> lfs = fetchHubModel(options());
  ASSERT_FALSE(lfs.isOk());
  EXPECT_EQ(lfs.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(lfs.status().message().find("model.safetensors: the SHA-256 of the downloaded bytes"),
            std::string::npos)
      << lfs.status().message();
  EXPECT_FALSE(fs::exists(fetched("model.safetensors")));
  EXPECT_FALSE(fs::exists(fetched(".tandem-fetch/model.safetensors.part")));
  EXPECT_TRUE(modelDirectoryProblem(out_.path() / "model").has_value());

  TempDir other("hub-fetch-other");
  HubServer hub;
  hub.publish("tandem/tiny", model_.path());
  hub.corrupt("config.json");
  HubFetchOptions regular = options();
  regular.endpoint = hub.endpoint();
  regular.directory = other.path();
  StatusOr<HubFetchResult> plain = fetchHubModel(regular);
  ASSERT_FALSE(plain.isOk());
  EXPECT_NE(plain.status().message().find("config.json: the git blob id"), std::string::npos)
      << plain.status().message();
}

// A body longer than the file list gives the file is cut where the list
// ends it, and refused: a server sending without end fills no volume.
TEST_F(HubFetchTest, ABodyLongerThanTheListSaysIsRefusedAndNotWrittenPastIt) {
  hub_.lengthen("model.safetensors", 4 << 20);
  const int64_t size = static_cast<int64_t>(fs::file_size(model_.path() / "model.safetensors"));
  HubFetchOptions watched = options();
  std::atomic<int64_t> most_written{0};
  watched.progress = [&](const std::string& file, int64_t done, int64_t) {
    if (file == "model.safetensors" && done > most_written) most_written = done;
  };
  StatusOr<HubFetchResult> result = fetchHubModel(watched);
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(result.status().message().find(
                "model.safetensors: the Hub sent more than the " +
                std::to_string(fs::file_size(model_.path() / "model.safetensors")) +
                " bytes its file list gives it"),
            std::string::npos)
      << result.status().message();
  EXPECT_FALSE(fs::exists(fetched(".tandem-fetch/model.safetensors.part")));
  EXPECT_FALSE(fs::exists(fetched("model.safetensors")));
  EXPECT_LE(most_written.load(), size);
}

// An empty file (a chat template left empty) is fetched as one, and a file
// list naming a file with a control character (a NUL cut the file's path
// short, onto the fetch's own state files) is refused.
TEST_F(HubFetchTest, AnEmptyFileIsFetchedAndControlCharactersInNamesAreRefused) {
  hub_.publish("tandem/tiny", model_.path(), {{"chat_template.jinja", ""}});
  StatusOr<HubFetchResult> result = fetchHubModel(options());
  ASSERT_TRUE(result.isOk()) << result.status().message();
  ASSERT_TRUE(fs::exists(fetched("chat_template.jinja")));
  EXPECT_EQ(fs::file_size(fetched("chat_template.jinja")), 0u);

  hub_.publish("tandem/tiny", model_.path(), {{std::string("lock\0.safetensors", 17), "weights"}});
  HubFetchOptions other = options();
  other.directory = out_.path() / "other";
  StatusOr<HubFetchResult> refused = fetchHubModel(other);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("the file list names a file with a control character"),
            std::string::npos)
      << refused.status().message();
}

TEST_F(HubFetchTest, AGatedRepositoryNeedsItsTokenAndTheTokenNeverReachesTheCdn) {
  hub_.publish("tandem/gated", model_.path(), {}, "main", "hf_secret");
  HubFetchOptions gated = options();
  gated.repo = "tandem/gated";
  gated.token_source = "the Secret hf-token (key token)";

  StatusOr<HubFetchResult> anonymous = fetchHubModel(gated);
  ASSERT_FALSE(anonymous.isOk());
  EXPECT_EQ(anonymous.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(anonymous.status().message().find("401 GatedRepo"), std::string::npos)
      << anonymous.status().message();
  EXPECT_NE(anonymous.status().message().find("no token was given: set the Secret hf-token"),
            std::string::npos)
      << anonymous.status().message();

  gated.token = "hf_wrong";
  StatusOr<HubFetchResult> wrong = fetchHubModel(gated);
  ASSERT_FALSE(wrong.isOk());
  EXPECT_NE(wrong.status().message().find("403"), std::string::npos);
  EXPECT_NE(wrong.status().message().find("the token from the Secret hf-token (key token)"),
            std::string::npos)
      << wrong.status().message();

  // A token with a control character inside is refused before anything is
  // asked; a Secret made from a file ending in a newline works.
  gated.token = "hf_se\x1b[31mcret";
  StatusOr<HubFetchResult> control = fetchHubModel(gated);
  ASSERT_FALSE(control.isOk());
  EXPECT_EQ(control.status().message(),
            "the Secret hf-token (key token) holds a control character; a Hub token has none");

  gated.token = "hf_secret\r\n";
  StatusOr<HubFetchResult> granted = fetchHubModel(gated);
  ASSERT_TRUE(granted.isOk()) << granted.status().message();
  int hub_with_token = 0;
  for (const HubServer::Request& request : hub_.requests()) {
    if (request.server == "cdn") {
      EXPECT_EQ(request.authorization, "") << request.path;
    }
    if (request.server == "hub" && request.authorization == "Bearer hf_secret") ++hub_with_token;
  }
  EXPECT_GT(hub_with_token, 0);
}

TEST_F(HubFetchTest, AMissingRevisionOrRepositoryIsNamed) {
  StatusOr<HubFetchResult> revision = fetchHubModel(options("v9"));
  ASSERT_FALSE(revision.isOk());
  EXPECT_EQ(revision.status().code(), StatusCode::kNotFound);
  EXPECT_NE(revision.status().message().find("revision \"v9\" not found"), std::string::npos)
      << revision.status().message();

  HubFetchOptions missing = options();
  missing.repo = "tandem/absent";
  StatusOr<HubFetchResult> repo = fetchHubModel(missing);
  ASSERT_FALSE(repo.isOk());
  EXPECT_NE(repo.status().message().find("RepoNotFound"), std::string::npos)
      << repo.status().message();
  EXPECT_NE(repo.status().message().find("tandem/absent"), std::string::npos);

  HubFetchOptions unreachable = options();
  unreachable.endpoint = "http://127.0.0.1:1";
  StatusOr<HubFetchResult> nobody = fetchHubModel(unreachable);
  ASSERT_FALSE(nobody.isOk());
  EXPECT_EQ(nobody.status().code(), StatusCode::kUnavailable);
}

TEST_F(HubFetchTest, AFetchOfACompleteDirectoryDownloadsOnlyWhatANewCommitChanged) {
  ASSERT_TRUE(fetchHubModel(options()).isOk());
  const size_t asked = hub_.requests().size();
  StatusOr<HubFetchResult> again = fetchHubModel(options());
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_TRUE(again->already_complete);
  EXPECT_EQ(hub_.requests().size(), asked + 1);  // the revision's commit, nothing else

  // A new commit on main: one file changed, one gone.
  TempDir changed("hub-model-changed");
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"}) {
    fs::copy_file(model_.path() / name, changed.path() / name);
  }
  changed.write("tokenizer_config.json", readFile(model_.path() / "tokenizer_config.json") + " ");
  const std::string commit = hub_.publish("tandem/tiny", changed.path());
  StatusOr<HubFetchResult> updated = fetchHubModel(options());
  ASSERT_TRUE(updated.isOk()) << updated.status().message();
  EXPECT_EQ(updated->commit, commit);
  EXPECT_EQ(updated->bytes_downloaded,
            static_cast<int64_t>(fs::file_size(changed.path() / "tokenizer_config.json")));
  EXPECT_EQ(readFile(fetched("tokenizer_config.json")),
            readFile(changed.path() / "tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(fetched("generation_config.json")));

  // The Hub gone: the complete download of the same revision is kept.
  HubFetchOptions offline = options();
  offline.endpoint = "http://127.0.0.1:1";
  StatusOr<HubFetchResult> kept = fetchHubModel(offline);
  ASSERT_TRUE(kept.isOk()) << kept.status().message();
  EXPECT_EQ(kept->commit, commit);
  EXPECT_FALSE(kept->offline.empty());

  // Without one, the error names the source, as every other does.
  offline.directory = out_.path() / "elsewhere";
  StatusOr<HubFetchResult> unreachable = fetchHubModel(offline);
  ASSERT_FALSE(unreachable.isOk());
  EXPECT_EQ(unreachable.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(unreachable.status().message().starts_with("hf://tandem/tiny@main: GET "))
      << unreachable.status().message();
}

// A router's copy: config, tokenizer and chat template only; a whole-model
// fetch into the same directory does not take it for complete.
TEST_F(HubFetchTest, ATokenizerOnlyFetchIsNeverTakenForTheModel) {
  HubFetchOptions tokenizer = options();
  tokenizer.tokenizer_only = true;
  StatusOr<HubFetchResult> small = fetchHubModel(tokenizer);
  ASSERT_TRUE(small.isOk()) << small.status().message();
  EXPECT_FALSE(fs::exists(fetched("model.safetensors")));
  EXPECT_EQ(readFile(fetched("tokenizer.json")), readFile(model_.path() / "tokenizer.json"));

  StatusOr<HubFetchResult> whole = fetchHubModel(options());
  ASSERT_TRUE(whole.isOk()) << whole.status().message();
  EXPECT_FALSE(whole->already_complete);
  EXPECT_EQ(readFile(fetched("model.safetensors")), readFile(model_.path() / "model.safetensors"));
  StatusOr<HubFetchResult> again = fetchHubModel(tokenizer);
  ASSERT_TRUE(again.isOk());
  EXPECT_TRUE(again->already_complete);  // a model holds a tokenizer
  EXPECT_TRUE(fs::exists(fetched("model.safetensors")));
}

// https: the Hub's certificate is verified, against --ca-file's CA here
// (the system's bundle otherwise, which does not know this one).
TEST_F(HubFetchTest, FetchesOverHttpsVerifyingTheCertificate) {
  HubServer secure("127.0.0.1", /*tls=*/true);
  secure.publish("tandem/tiny", model_.path());
  HubFetchOptions https = options();
  https.endpoint = secure.endpoint();
  ASSERT_EQ(https.endpoint.rfind("https://", 0), 0u);
  const fs::path ca = out_.write("ca.crt", secure.caCertificate());

  StatusOr<HubFetchResult> unknown_ca = fetchHubModel(https);
  ASSERT_FALSE(unknown_ca.isOk());
  EXPECT_EQ(unknown_ca.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(unknown_ca.status().message().find(
                "the server's TLS certificate was not verified (its CA is in neither the "
                "system's CA bundle; give --ca-file)"),
            std::string::npos)
      << unknown_ca.status().message();

  https.ca_file = ca.string();
  https.directory = out_.path() / "secure";
  StatusOr<HubFetchResult> verified = fetchHubModel(https);
  ASSERT_TRUE(verified.isOk()) << verified.status().message();
  EXPECT_EQ(readFile(out_.path() / "secure" / "model.safetensors"),
            readFile(model_.path() / "model.safetensors"));
}

TEST_F(HubFetchTest, TheCommandFetchesAndReportsAFailureInTheTerminationLog) {
  const std::string binary = std::string(TANDEM_BIN_DIR) + "/tandem-model";
  const fs::path directory = out_.path() / "cli";
  testing::CommandResult ok = testing::runToEnd({binary, "fetch", "hf://tandem/tiny", "--dir",
                                                 directory.string(), "--endpoint", hub_.endpoint()},
                                                out_.path() / "ok.err", std::chrono::seconds(60));
  ASSERT_EQ(ok.exit_status, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("fetched commit " + commit_), std::string::npos) << ok.out;
  EXPECT_EQ(readFile(directory / "model.safetensors"),
            readFile(model_.path() / "model.safetensors"));

  const fs::path log = out_.path() / "termination-log";
  std::ofstream(log).flush();  // the log exists, as Kubernetes creates it
  testing::CommandResult bad = testing::runToEnd(
      {binary, "fetch", "hf://tandem/tiny@v9", "--cache-dir", out_.path().string(),
       "--termination-log", log.string()},
      out_.path() / "bad.err", std::chrono::seconds(60), {{"HF_ENDPOINT", hub_.endpoint()}});
  EXPECT_EQ(bad.exit_status, 1);
  EXPECT_NE(bad.err.find("revision \"v9\" not found"), std::string::npos) << bad.err;
  EXPECT_NE(readFile(log).find("revision \"v9\" not found"), std::string::npos) << readFile(log);
}

}  // namespace
}  // namespace tandem::model_source
