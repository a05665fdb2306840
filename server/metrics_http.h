// Serves the coordinator's metrics on HTTP GET /metrics (Prometheus text format 0.0.4), and
// whatever else is mounted with Get (the web view of jobs: server/web_ui.h).
#pragma once

#include <absl/status/statusor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace hyscale::server {

// "host:port" or "[v6host]:port" split into its parts; INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address,
                                                          const std::string& flag);

// What a handler sees of a GET request, and what it answers.
struct HttpRequest {
  std::map<std::string, std::string> params;  // query parameters (the first of repeated ones)
  std::string authorization;                  // the Authorization header, "" when absent
};
struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
};
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class MetricsHttpServer {
 public:
  explicit MetricsHttpServer(std::function<std::string()> render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Serves GET `path` (exact match) with `handler`, with headers that confine a page to its own
  // origin (Content-Security-Policy) and keep responses out of caches; call before Start.
  void Get(const std::string& path, HttpHandler handler);

  // Binds `host`:`port` (port 0: any free port) and serves on a thread; returns the bound port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  void Stop();

 private:
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
};

}  // namespace hyscale::server
