#include "server/metrics_http.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <httplib.h>
#include <sys/socket.h>

#include <utility>

namespace hyscale::server {

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address,
                                                          const std::string& flag) {
  const auto colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected HOST:PORT with a port in [0, 65535] (got '", address, "')"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": host is empty"));
  return std::make_pair(host, port);
}

MetricsHttpServer::MetricsHttpServer(std::function<std::string()> render)
    : http_(std::make_unique<httplib::Server>()) {
  http_->Get("/metrics",
             [render = std::move(render)](const httplib::Request&, httplib::Response& response) {
               response.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
             });
  // Bounded waits, so a stuck scraper cannot hold a thread forever.
  http_->set_read_timeout(5, 0);
  http_->set_write_timeout(5, 0);
  // cpp-httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and
  // take half its requests. SO_REUSEADDR alone still allows a quick restart after TIME_WAIT.
  http_->set_socket_options([](int socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

void MetricsHttpServer::Get(const std::string& path, HttpHandler handler) {
  http_->Get(path, [handler = std::move(handler)](const httplib::Request& request,
                                                  httplib::Response& response) {
    HttpRequest in;
    for (const auto& [name, value] : request.params) in.params.emplace(name, value);
    in.authorization = request.get_header_value("Authorization");
    const HttpResponse out = handler(in);
    // Mounted routes are the web view: its page loads only its own script and JSON (the CSS is
    // inline), nobody may frame it, and job data is never cached or content-sniffed.
    response.set_header("Content-Security-Policy",
                        "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                        "frame-ancestors 'none'");
    response.set_header("X-Content-Type-Options", "nosniff");
    response.set_header("Cache-Control", "no-store");
    response.status = out.status;
    response.set_content(out.body, out.content_type);
  });
}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
}

absl::StatusOr<int> MetricsHttpServer::Start(const std::string& host, int port) {
  const int bound = port == 0                         ? http_->bind_to_any_port(host)
                    : http_->bind_to_port(host, port) ? port
                                                      : -1;
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics_listen: cannot bind ", host, ":", port, " (is the port in use?)"));
  }
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return bound;
}

void MetricsHttpServer::Stop() {
  if (!thread_.joinable()) return;
  http_->stop();
  thread_.join();
}

}  // namespace hyscale::server
