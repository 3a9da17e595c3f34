// The HTTP transport on its own (no engine): the one guard that turns an
// exception escaping a route into a clean 500 carrying the request id, and
// plain routes on the worker pool.
#include "agent/server/http_connection.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

namespace tandem::server {
namespace {

using nlohmann::json;

class Service {
 public:
  Service() : service_(HttpLimits{}, 2, 2) {
    service_.get("/boom", [](const HttpRequest&, HttpResponse&) {
      throw std::runtime_error("secret detail \xff of the failure");
    });
    service_.post(
        "/blocking-boom",
        [](const HttpRequest&, HttpResponse&) { throw std::logic_error("worker failure"); },
        /*blocking=*/true);
    service_.post(
        "/echo",
        [](const HttpRequest& request, HttpResponse& response) {
          response.set_content(request.body, "text/plain");
        },
        /*blocking=*/true);
    port_ = service_.bind("127.0.0.1", 0, 128);
    thread_ = std::thread([this] { service_.serve(); });
  }
  ~Service() {
    service_.stop();
    thread_.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }

 private:
  HttpService service_;
  int port_ = 0;
  std::thread thread_;
};

void expectCleanInternalError(const httplib::Result& res) {
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  const std::string id = res->get_header_value("X-Request-Id");
  EXPECT_EQ(id.size(), 32u);
  for (const auto& [name, value] : res->headers) {
    EXPECT_TRUE(name == "Content-Type" || name == "Content-Length" || name == "X-Request-Id" ||
                name == "Connection")
        << name << ": " << value;
  }
  json body = json::parse(res->body);
  EXPECT_EQ(body["error"]["type"], "server_error");
  const std::string message = body["error"]["message"];
  EXPECT_NE(message.find(id), std::string::npos) << message;
  EXPECT_EQ(message.find("secret"), std::string::npos) << "exception text leaked: " << message;
  EXPECT_EQ(message.find("worker failure"), std::string::npos) << message;
}

TEST(HttpService, ExceptionInARouteIsACleanInternalErrorWithTheRequestId) {
  Service service;
  auto client = service.client();
  expectCleanInternalError(client.Get("/boom"));
  expectCleanInternalError(client.Post("/blocking-boom", "x", "text/plain"));
  // The server keeps serving, on the same keep-alive connection too.
  client.set_keep_alive(true);
  expectCleanInternalError(client.Get("/boom"));
  auto echo = client.Post("/echo", "hello", "text/plain");
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->status, 200);
  EXPECT_EQ(echo->body, "hello");
}

TEST(HttpService, UnknownPathIsA404InTheErrorShape) {
  Service service;
  auto res = service.client().Get("/nowhere");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "not_found_error");
}

}  // namespace
}  // namespace tandem::server
