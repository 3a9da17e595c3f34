// The agent's HTTP/1.1 layer as a client on a raw socket sees it: pipelined
// requests answered in order, malformed framing refused, idle connections
// that cost the others nothing, a client that leaves before its answer
// freeing its blocks, and bad bytes in JSON answered with a clean 400.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tests/support/agent_server.h"

namespace {

using nlohmann::json;
using namespace ::tandem::testing;  // NOLINT: the test vocabulary

// A blocking TCP connection to the agent with a deadline on every read.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
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

}  // namespace
