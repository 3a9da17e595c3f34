// The HTTP/1.1 front as a client on a raw socket sees it: pipelined requests
// answered in order, malformed framing refused, idle connections that cost
// the others nothing, a client that leaves before its answer freeing its
// blocks, and bad bytes in JSON answered with a clean 400. The agent and the
// router share the front (common/http): malformed requests and slow header
// streams get the same answer from both; the router forwards /tokenize and
// /detokenize to an agent and cancels a chat template render whose client
// left.
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_socket.h"
#include "tests/support/agent_server.h"

namespace {

using nlohmann::json;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary

// A blocking TCP connection to the agent with a deadline on every read.
class RawConnection {
 public:
  explicit RawConnection(int port) { fd_ = tandem::connectLoopback(port); }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send(const std::string& bytes) { return tandem::sendAll(fd_, bytes); }
  // Whether the peer still holds the connection open: nothing to read and
  // no end of stream.
  bool heldOpenByPeer() const {
    char byte;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

  struct Response {
    int status = 0;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    std::string header(const std::string& name) const {
      for (const auto& [key, value] : headers) {
        if (lower(key) == lower(name)) return value;
      }
      return "";
    }
  };

  // The next response (Content-Length or chunked body); nullopt when the
  // connection closes or nothing comes within the timeout.
  std::optional<Response> readResponse(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t head_end;
    while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(deadline)) return std::nullopt;
    }
    Response response;
    std::string head = buffer_.substr(0, head_end);
    buffer_.erase(0, head_end + 4);
    size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    response.status = std::stoi(status_line.substr(status_line.find(' ') + 1, 3));
    while (line_end != std::string::npos) {
      const size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string line = head.substr(start, line_end - start);
      const size_t colon = line.find(':');
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      response.headers.emplace_back(line.substr(0, colon), value);
    }
    if (lower(response.header("Transfer-Encoding")) == "chunked") {
      for (;;) {
        size_t size_end;
        while ((size_end = buffer_.find("\r\n")) == std::string::npos) {
          if (!fill(deadline)) return std::nullopt;
        }
        const size_t size = std::stoul(buffer_.substr(0, size_end), nullptr, 16);
        while (buffer_.size() < size_end + 2 + size + 2) {
          if (!fill(deadline)) return std::nullopt;
        }
        response.body += buffer_.substr(size_end + 2, size);
        buffer_.erase(0, size_end + 2 + size + 2);
        if (size == 0) break;
      }
    } else {
      const std::string length = response.header("Content-Length");
      const size_t size = length.empty() ? 0 : std::stoul(length);
      while (buffer_.size() < size) {
        if (!fill(deadline)) return std::nullopt;
      }
      response.body = buffer_.substr(0, size);
      buffer_.erase(0, size);
    }
    return response;
  }

 private:
  static std::string lower(std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  }
  bool fill(std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd entry{fd_, POLLIN, 0};
    if (::poll(&entry, 1, static_cast<int>(left.count())) <= 0) return false;
    char chunk[16384];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string buffer_;
};

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// `tandem-operator router` in front of one decode agent, on a free port.
class RouterProcess {
 public:
  RouterProcess(const Agent& decode, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {std::string(TANDEM_BIN_DIR) + "/tandem-operator",
                                     "router",
                                     "--port",
                                     "0",
                                     "--decode",
                                     "decode-0=127.0.0.1:" + std::to_string(decode.port()),
                                     "--poll-interval",
                                     "0.1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    process_ = std::make_unique<ChildProcess>(argv, logs_.path() / "stderr");
    const std::string line =
        process_->waitForLine("router listening on ", std::chrono::seconds(60));
    if (line.empty()) throw std::runtime_error("router did not start: " + process_->stderrText());
    port_ = std::stoi(line.substr(line.rfind(':') + 1));
  }
  int port() const { return port_; }
  std::unique_ptr<httplib::Client> client(int read_timeout_s = 60) const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(read_timeout_s, 0);
    return c;
  }
  // Healthy: the model learned from the agent, the agent healthy.
  bool healthy() const {
    auto res = client()->Get("/health");
    return res && res->status == 200;
  }
  double metric(const std::string& name, const std::string& label_filter = "") const {
    auto res = client()->Get("/metrics");
    return res ? tandem::prometheusSample(res->body, name, label_filter).value_or(-1) : -1;
  }
  std::string stderrText() const { return process_->stderrText(); }

 private:
  TempDir logs_{"tandem-router-test-logs"};
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
};

// An error body in OpenAI's shape: {"error": {"message": string, "type":
// string, "param", "code"}}.
void expectOpenAiError(const std::string& text, const std::string& where) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(body.is_object()) << where << ": " << text;
  ASSERT_TRUE(body.contains("error") && body["error"].is_object()) << where << ": " << text;
  const json& error = body["error"];
  EXPECT_TRUE(error.contains("message") && error["message"].is_string()) << where << ": " << text;
  EXPECT_TRUE(error.contains("type") && error["type"].is_string()) << where << ": " << text;
  EXPECT_TRUE(error.contains("param") && error.contains("code")) << where << ": " << text;
}

// Sends a request head one byte at a time, a byte every 250 ms, never ending
// it, until the server closes the connection (true) or `deadline` passes;
// `answered` is what the server sent meanwhile.
bool slowHeaderIsCut(int port, std::chrono::seconds deadline, std::string& answered) {
  RawConnection connection(port);
  if (!connection.connected()) return false;
  const std::string head = "POST /tokenize HTTP/1.1\r\nHost: agent\r\nX-Slow: ";
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (size_t i = 0; std::chrono::steady_clock::now() < end; ++i) {
    const std::string byte(1, i < head.size() ? head[i] : 'a');
    if (!connection.send(byte)) return true;
    pollfd entry{connection.fd(), POLLIN, 0};
    if (::poll(&entry, 1, 250) > 0) {
      char chunk[4096];
      const ssize_t n = ::recv(connection.fd(), chunk, sizeof chunk, 0);
      if (n <= 0) return true;  // closed (or reset) by the server
      answered.append(chunk, static_cast<size_t>(n));
    }
  }
  return false;
}

TEST(HttpConformance, PipelinedRequestsAreAnsweredInOrder) {
  Agent agent;
  RawConnection connection(agent.port());
  ASSERT_TRUE(connection.connected());
  const std::string completion = greedy(randomPrompt(6, 31), 4).dump();
  // Three requests in one write, before reading any answer.
  ASSERT_TRUE(connection.send(post("/tokenize", R"({"prompt":"a"})") +
                              post("/v1/completions", completion) +
                              post("/tokenize", R"({"prompt":"a b c d"})")));
  auto first = connection.readResponse();
  auto second = connection.readResponse();
  auto third = connection.readResponse();
  ASSERT_TRUE(first && second && third) << "fewer than three answers on the connection";
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(second->status, 200);
  EXPECT_EQ(third->status, 200);
  EXPECT_EQ(json::parse(first->body)["count"], 1) << first->body;
  EXPECT_EQ(tokenIds(json::parse(second->body)).size(), 4u) << second->body;
  EXPECT_EQ(json::parse(third->body)["count"], 4) << third->body;
}

TEST(HttpConformance, ConflictingContentLengthsAreRefused) {
  Agent agent;
  RawConnection connection(agent.port());
  const std::string body = R"({"prompt":"abc"})";
  ASSERT_TRUE(
      connection.send("POST /tokenize HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
                      "Content-Length: " +
                      std::to_string(body.size()) + "\r\nContent-Length: 5\r\n\r\n" + body));
  auto response = connection.readResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 400) << response->body;
  EXPECT_NE(response->body.find("Content-Length"), std::string::npos) << response->body;
}

TEST(HttpConformance, HeaderLineWithoutColonIsRefused) {
  Agent agent;
  RawConnection connection(agent.port());
  const std::string body = R"({"prompt":"abc"})";
  ASSERT_TRUE(
      connection.send("POST /tokenize HTTP/1.1\r\nHost: agent\r\nX-Broken header line\r\n"
                      "Content-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body));
  auto response = connection.readResponse();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 400) << response->body;
}

TEST(HttpConformance, InvalidUtf8InAnyStringIsA400NamingIt) {
  Agent agent;
  struct Case {
    std::string path;
    std::string body;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"a\xff\"}"},
      {"/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"hi\",\"user\":\"\xc3\x28\"}"},
      {"/v1/chat/completions",
       "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}"},
      {"/tokenize", "{\"prompt\":\"\xf8\x88\x80\x80\x80\"}"},
      {"/detokenize", "{\"tokens\":[1,2],\"model\":\"\xc0\xaf\"}"},
  };
  // What a response may carry; never an exception's text.
  const std::set<std::string> allowed = {"content-type", "content-length", "connection",
                                         "keep-alive", "x-request-id"};
  for (const Case& c : cases) {
    auto res = agent.client()->Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res) << c.path;
    EXPECT_EQ(res->status, 400) << c.path << " → " << res->body;
    for (const auto& [name, value] : res->headers) {
      std::string key = name;
      for (char& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      EXPECT_TRUE(allowed.count(key)) << c.path << " sent header " << name << ": " << value;
    }
    json body = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(body.is_object()) << c.path << " → " << res->body;
    EXPECT_EQ(body["error"]["type"], "invalid_request_error") << res->body;
    EXPECT_NE(body["error"]["message"].get<std::string>().find("not valid UTF-8"),
              std::string::npos)
        << res->body;
  }
  // Still serving.
  EXPECT_EQ(tokenIds(agent.post("/v1/completions", greedy(randomPrompt(5, 32), 2))).size(), 2u);
}

TEST(HttpConformance, NulByteInAQueryValueAppearsWholeInTheError) {
  Agent agent;
  RawConnection connection(agent.port());
  // A value cut at the NUL would read as 5 and open the event stream.
  ASSERT_TRUE(connection.send("GET /v1/kv_events?since=5%00abc HTTP/1.1\r\nHost: agent\r\n\r\n"));
  auto response = connection.readResponse(std::chrono::seconds(15));
  ASSERT_TRUE(response) << "no whole answer: the value was taken as a number";
  EXPECT_EQ(response->status, 400) << response->body;
  json error = json::parse(response->body)["error"];
  EXPECT_EQ(error["param"], "since");
  const std::string message = error["message"];
  EXPECT_NE(message.find("5\\u0000abc"), std::string::npos) << message;
}

TEST(HttpConformance, IdleConnectionsDoNotDelayARequest) {
  Agent agent;
  constexpr int kIdle = 300;
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < kIdle; ++i) {
    idle.push_back(std::make_unique<RawConnection>(agent.port()));
    ASSERT_TRUE(idle.back()->connected()) << "connection " << i;
  }
  // The agent has accepted every one of them (one request on one of them
  // answered means the accept loop went past the others).
  RawConnection probe(agent.port());
  ASSERT_TRUE(probe.send(post("/v1/completions", greedy(randomPrompt(8, 33), 3).dump())));
  auto response = probe.readResponse(std::chrono::seconds(120));
  ASSERT_TRUE(response) << "no answer while " << kIdle << " idle connections are open";
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(tokenIds(json::parse(response->body)).size(), 3u);
  // The idle connections were not closed to make room for it.
  int open = 0;
  for (const auto& connection : idle) open += connection->heldOpenByPeer() ? 1 : 0;
  EXPECT_EQ(open, kIdle);
}

TEST(HttpConformance, ClientGoneBeforeAWholeAnswerFreesItsBlocks) {
  Agent agent({"--num-blocks", "64"}, smallModelDir());
  ASSERT_TRUE(eventually([&] { return agent.metric("tandem_kv_cache_free_blocks") == 64; }));
  {
    RawConnection connection(agent.port());
    ASSERT_TRUE(connection.send(post("/v1/completions", greedy(randomPrompt(50, 34), 900).dump())));
    ASSERT_TRUE(eventually([&] { return agent.metric("tandem_num_requests_running") == 1; }));
  }  // closed before the answer
  EXPECT_TRUE(eventually([&] {
    return agent.metric("tandem_num_requests_running") == 0 &&
           agent.metric("tandem_kv_cache_free_blocks") == 64;
  })) << agent.metricsText();
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"abort\""), 1);
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"length\""), 0);
}

// Each case as sent by a client, and the status both servers answer.
TEST(HttpConformance, MalformedRequestsGetTheSameAnswerFromTheAgentAndTheRouter) {
  Agent agent;
  RouterProcess router(agent, {});
  struct Case {
    std::string name;
    std::string bytes;
    int status;
  };
  const std::string body = R"({"prompt":"abc"})";
  const std::vector<Case> cases = {
      {"Content-Length with Transfer-Encoding: chunked",
       "POST /tokenize HTTP/1.1\r\nHost: agent\r\nContent-Length: 5\r\n"
       "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      // RFC 9112 section 6.1: a coding the server does not decode is 501;
      // it was read as plain chunked, the body still gzipped.
      {"Transfer-Encoding: gzip, chunked",
       "POST /tokenize HTTP/1.1\r\nHost: agent\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
       "5\r\nabcde\r\n0\r\n\r\n",
       501},
      // Chunked applied twice, or no coding at all, was read as a request
      // without a body, and the body's bytes as the next request (here a
      // GET that was answered too): a proxy reading the RFC sees one.
      {"Transfer-Encoding: chunked, chunked",
       "POST /tokenize HTTP/1.1\r\nHost: agent\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
       "GET /v1/models HTTP/1.1\r\nHost: agent\r\n\r\n",
       400},
      {"an empty Transfer-Encoding",
       "POST /tokenize HTTP/1.1\r\nHost: agent\r\nTransfer-Encoding: \r\n\r\n"
       "GET /v1/models HTTP/1.1\r\nHost: agent\r\n\r\n",
       400},
      {"a header line without a colon",
       "POST /tokenize HTTP/1.1\r\nHost: agent\r\nX-Broken header line\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body,
       400},
      {"a 20 KB header",
       "POST /tokenize HTTP/1.1\r\nHost: agent\r\nX-Big: " + std::string(20000, 'a') +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
       431},
      {"a 70 MB Content-Length",
       "POST /tokenize HTTP/1.1\r\nHost: agent\r\nContent-Length: " +
           std::to_string(70 * 1000 * 1000) + "\r\n\r\n",
       413},
  };
  for (const Case& c : cases) {
    std::string bodies[2];
    const int ports[2] = {agent.port(), router.port()};
    for (int i = 0; i < 2; ++i) {
      const std::string where = std::string(i == 0 ? "agent" : "router") + ", " + c.name;
      RawConnection connection(ports[i]);
      ASSERT_TRUE(connection.connected()) << where;
      ASSERT_TRUE(connection.send(c.bytes)) << where;
      auto response = connection.readResponse(std::chrono::seconds(15));
      ASSERT_TRUE(response) << where << ": no answer";
      EXPECT_EQ(response->status, c.status) << where << ": " << response->body;
      EXPECT_EQ(response->header("X-Request-Id").size(), 32u) << where;
      expectOpenAiError(response->body, where);
      bodies[i] = response->body;
      // The connection is not reused after a refused request.
      EXPECT_FALSE(connection.readResponse(std::chrono::seconds(15))) << where;
    }
    EXPECT_EQ(bodies[0], bodies[1]) << c.name;
  }
  EXPECT_TRUE(eventually([&] { return router.healthy(); })) << router.stderrText();
}

// A client sending its head a byte at a time is cut at the request timeout
// (from the first byte), with no answer: --request-timeout 2 on both.
TEST(HttpConformance, ASlowHeaderStreamIsCutAtTheRequestTimeoutByBoth) {
  Agent agent({"--request-timeout", "2"});
  RouterProcess router(agent, {"--request-timeout", "2"});
  std::string agent_answer, router_answer;
  bool agent_cut = false;
  std::thread agent_client(
      [&] { agent_cut = slowHeaderIsCut(agent.port(), std::chrono::seconds(30), agent_answer); });
  const bool router_cut = slowHeaderIsCut(router.port(), std::chrono::seconds(30), router_answer);
  agent_client.join();
  EXPECT_TRUE(router_cut) << "the router kept a slow head open";
  EXPECT_TRUE(agent_cut) << "the agent kept a slow head open";
  EXPECT_EQ(router_answer, "");
  EXPECT_EQ(agent_answer, "");
  EXPECT_TRUE(eventually([&] { return router.healthy(); })) << router.stderrText();
}

// --max-connections on both: at the bound, a new connection closes the
// connection idle longest (a second at least), and the others stay;
// tandem_http_connections_over_limit_total counts it.
TEST(HttpConformance, OverMaxConnectionsBothCloseTheConnectionIdleLongest) {
  Agent agent({"--max-connections", "3"});
  Agent behind_router;  // the router's polls are connections to it, not to `agent`
  RouterProcess router(behind_router, {"--max-connections", "3"});
  ASSERT_TRUE(eventually([&] { return router.healthy(); })) << router.stderrText();
  for (const auto& [name, port] : {std::pair<std::string, int>{"agent", agent.port()},
                                   std::pair<std::string, int>{"router", router.port()}}) {
    auto value = [](const std::string& text, const std::string& metric, const std::string& labels) {
      return tandem::prometheusSample(text, metric, labels).value_or(-1);
    };
    // Three keep-alive clients, answered once each, idle in this order.
    std::vector<std::unique_ptr<RawConnection>> idle;
    for (int i = 0; i < 3; ++i) {
      idle.push_back(std::make_unique<RawConnection>(port));
      ASSERT_TRUE(idle.back()->send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) << name;
      ASSERT_TRUE(idle.back()->readResponse()) << name << " " << i;
      // The server marks it idle once its answer is written, just after
      // the client may have read it.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    RawConnection fourth(port);
    ASSERT_TRUE(fourth.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) << name;
    auto answer = fourth.readResponse();
    ASSERT_TRUE(answer) << name;
    EXPECT_EQ(answer->status, 200) << name;
    EXPECT_FALSE(idle[0]->readResponse(std::chrono::seconds(10))) << name << ": still open";
    for (int i = 1; i < 3; ++i) EXPECT_TRUE(idle[i]->heldOpenByPeer()) << name << " " << i;
    idle.clear();
    // Scraped over `fourth`: a new connection, made before the server has
    // seen the others close, would be over the bound and close one more.
    std::string text;
    EXPECT_TRUE(eventually([&] {
      if (!fourth.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")) return false;
      auto metrics = fourth.readResponse();
      text = metrics ? metrics->body : std::string();
      return value(text, "tandem_http_connections", "state=\"idle\"") == 0 &&
             value(text, "tandem_http_connections", "state=\"active\"") == 1;
    })) << name
        << ": " << text;
    fourth.close();
    EXPECT_EQ(value(text, "tandem_http_max_connections", ""), 3) << name;
    EXPECT_EQ(value(text, "tandem_http_connections_over_limit_total", "action=\"closed_idle\""), 1)
        << name << ": " << text;
    EXPECT_EQ(value(text, "tandem_http_connections_over_limit_total", "action=\"refused\""), 0)
        << name;
  }
}

// /tokenize and /detokenize through the router are an agent's own answers;
// the agents' KV transfer calls are not served by the router.
TEST(HttpConformance, TheRouterForwardsTokenizeAndDetokenizeToAnAgent) {
  Agent agent;
  RouterProcess router(agent, {});
  ASSERT_TRUE(eventually([&] { return router.healthy(); }, std::chrono::seconds(60)))
      << router.stderrText();
  struct Call {
    std::string path;
    std::string body;
  };
  const std::vector<Call> calls = {
      {"/tokenize", R"({"prompt":"a b c d","add_special_tokens":false})"},
      {"/tokenize", R"({"prompt":"a b","return_token_strs":true})"},
      {"/detokenize", R"({"tokens":[97,268,266]})"},
      {"/tokenize", R"({"prompt":17})"},       // a 400 naming the field
      {"/detokenize", R"({"tokens":"abc"})"},  // a 400 too
  };
  for (const Call& call : calls) {
    auto direct = agent.client()->Post(call.path.c_str(), call.body, "application/json");
    auto routed = router.client()->Post(call.path.c_str(), call.body, "application/json");
    ASSERT_TRUE(direct && routed) << call.path << " " << call.body;
    EXPECT_EQ(routed->status, direct->status) << call.path << " " << call.body;
    EXPECT_EQ(routed->body, direct->body) << call.path << " " << call.body;
  }
  auto tokens = router.client()->Post("/tokenize", R"({"prompt":"a b c d"})", "application/json");
  ASSERT_TRUE(tokens);
  EXPECT_EQ(tokens->status, 200);
  EXPECT_EQ(json::parse(tokens->body)["count"], 4) << tokens->body;

  auto transfer =
      router.client()->Post("/v1/kv_transfer/hold", R"({"token_ids":[1,2,3]})", "application/json");
  ASSERT_TRUE(transfer);
  EXPECT_EQ(transfer->status, 404);
  expectOpenAiError(transfer->body, "/v1/kv_transfer/hold");
  EXPECT_EQ(json::parse(transfer->body)["error"]["type"], "not_found_error");
}

// A chat template that loops until its work budget ends it (about a second
// of rendering; the budget is common/jinja's, see docs/chat.md).
constexpr const char* kLoopingTemplate =
    "{%- for i in range(1000000) -%}{%- set x = 'ab' * 2000000 -%}{%- endfor -%}"
    "{{ messages[0]['content'] }}";

// Clients that leave while their chat templates render: the renders are
// cancelled (counted as client aborts at the parse stage), the io threads
// answer meanwhile, and the one worker is free again at once. Uncancelled,
// the 30 renders would hold the worker for half a minute.
TEST(HttpConformance, ARouterClientLeavingDuringRenderingCancelsIt) {
  TempDir dir("tandem-render-cancel");
  const fs::path loop = dir.write("loop.jinja", kLoopingTemplate);
  Agent agent;
  RouterProcess router(agent, {"--chat-template", loop.string(), "--worker-threads", "1"});
  ASSERT_TRUE(eventually([&] { return router.healthy(); }, std::chrono::seconds(60)))
      << router.stderrText();
  constexpr int kClients = 30;
  json message = {{"role", "user"}, {"content", "hi"}};
  json chat = {{"model", "tiny"}, {"messages", json::array({message})}, {"max_tokens", 2}};
  std::vector<std::unique_ptr<RawConnection>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawConnection>(router.port()));
    ASSERT_TRUE(clients.back()->connected());
    ASSERT_TRUE(clients.back()->send(post("/v1/chat/completions", chat.dump())));
  }
  // Renders hold the worker; the io threads still answer.
  auto health = router.client(/*read_timeout_s=*/10)->Get("/health");
  ASSERT_TRUE(health) << "no /health answer while templates render";
  EXPECT_EQ(health->status, 200);
  for (auto& client : clients) client->close();
  EXPECT_TRUE(eventually(
      [&] {
        return router.metric("tandem_router_client_aborts_total", "stage=\"parse\"") == kClients;
      },
      std::chrono::seconds(15)))
      << router.metric("tandem_router_client_aborts_total", "stage=\"parse\"")
      << " renders ended of " << kClients;
  auto res =
      router.client(/*read_timeout_s=*/15)
          ->Post("/v1/completions", greedy(randomPrompt(6, 40), 2).dump(), "application/json");
  ASSERT_TRUE(res) << "the worker is still busy";
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(agent.metric("tandem_requests_total", "finish_reason=\"length\""), 1)
      << "only the completion reached the agent";
}

}  // namespace
