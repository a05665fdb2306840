// hyscaled: the HyScale coordinator daemon.
//
// Exit codes: 0 after a graceful shutdown (SIGTERM/SIGINT) or --help; 1 when it cannot start
// (store, TLS files, ports); 2 for bad flags.
#include <absl/strings/str_cat.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "planner/profile.h"
#include "proto/constants.h"
#include "proto/rpc.h"
#include "server/coordinator.h"
#include "server/grpc_server.h"
#include "server/metrics_http.h"
#include "server/server_metrics.h"
#include "server/store.h"
#include "server/web_ui.h"
#include "util/log.h"

namespace hyscale::server {
namespace {

// In-flight calls get this long to finish on shutdown before they are cancelled (our streams end
// at once). The server also waits this long at most for idle client connections to close.
constexpr auto kShutdownGrace = std::chrono::seconds(2);
// A finished job's per-job metric series stay this long, so a scrape sees its last values.
constexpr absl::Duration kJobMetricsRetention = absl::Minutes(10);

struct Flags {
  std::string listen = "127.0.0.1:50051";
  std::string data_dir;
  std::string metrics_listen = "127.0.0.1:9464";
  std::string token_file;
  std::string read_token_file;
  std::string tls_cert;
  std::string tls_key;
  int64_t heartbeat_interval_ms = 1000;
  int64_t heartbeat_timeout_ms = 0;  // 0: 3 x the interval
  int64_t restart_backoff_ms = 1000;
  int64_t rendezvous_timeout_ms = 120'000;
  int64_t start_timeout_ms = 60'000;
  int streams_per_host = kDefaultStreamsPerHost;
  int64_t unhealthy_exclusion_ms = 600'000;
  std::string checkpoint_root;
  std::string gpu_profile = "h200";
  std::string calibration;
  std::string log_level = "info";
};

int Fail(const absl::Status& status) {
  util::LogError(status.message());
  return kExitFailed;
}

int Run(const Flags& flags) {
  auto token = rpc::ResolveToken("", flags.token_file, "HYSCALE_TOKEN");
  if (!token.ok()) return Fail(token.status());
  auto read_token = rpc::ResolveToken("", flags.read_token_file, "HYSCALE_READ_TOKEN");
  if (!read_token.ok()) return Fail(read_token.status());
  if (token->empty()) {
    util::LogWarning("no token (--token-file or HYSCALE_TOKEN): auth is off");
    if (!read_token->empty()) {
      return Fail(absl::InvalidArgumentError(
          "read_token_file: a read-only token needs a full one (--token-file)"));
    }
  }
  const rpc::ServerTokens tokens{*token, *read_token};
  auto credentials = rpc::ServerCredentials(flags.tls_cert, flags.tls_key);
  if (!credentials.ok()) return Fail(credentials.status());
  auto metrics_address = SplitHostPort(flags.metrics_listen, "metrics_listen");
  if (!metrics_address.ok()) return Fail(metrics_address.status());
  auto listen = SplitHostPort(flags.listen, "listen");
  if (!listen.ok()) return Fail(listen.status());

  CoordinatorOptions options;
  options.data_dir = flags.data_dir;
  options.checkpoint_root = flags.checkpoint_root;
  options.gpu_profile = flags.gpu_profile;
  options.calibration = flags.calibration;
  options.heartbeat_interval = absl::Milliseconds(flags.heartbeat_interval_ms);
  options.heartbeat_timeout =
      absl::Milliseconds(flags.heartbeat_timeout_ms > 0 ? flags.heartbeat_timeout_ms
                                                        : 3 * flags.heartbeat_interval_ms);
  options.restart_backoff = absl::Milliseconds(flags.restart_backoff_ms);
  options.rendezvous_timeout = absl::Milliseconds(flags.rendezvous_timeout_ms);
  options.start_timeout = absl::Milliseconds(flags.start_timeout_ms);
  options.unhealthy_exclusion = absl::Milliseconds(flags.unhealthy_exclusion_ms);
  SystemClock clock;
  ServerMetrics metrics(kJobMetricsRetention);
  auto coordinator = Coordinator::Open(options, &clock, &metrics);
  if (!coordinator.ok()) return Fail(coordinator.status());

  auto server = GrpcServer::Start(coordinator->get(), tokens, *credentials, flags.listen, &metrics,
                                  flags.streams_per_host);
  if (!server.ok()) return Fail(server.status());

  const WebUi web_ui(coordinator->get(), tokens);  // outlives the server that calls it
  MetricsHttpServer metrics_http([&metrics] { return metrics.Render(); });
  web_ui.Mount(&metrics_http);
  if (metrics_address->second != 0) {
    auto bound = metrics_http.Start(metrics_address->first, metrics_address->second);
    if (!bound.ok()) {
      (*server)->Shutdown(std::chrono::system_clock::now());
      return Fail(bound.status());
    }
    std::printf("hyscaled: metrics on http://%s:%d/metrics, web view on http://%s:%d/\n",
                metrics_address->first.c_str(), *bound, metrics_address->first.c_str(), *bound);
  }
  std::printf("hyscaled: listening on %s:%d\n", listen->first.c_str(), (*server)->port());
  std::fflush(stdout);

  // Liveness, restart backoff and metric expiry run on their own clock, well inside the
  // heartbeat timeout.
  std::mutex mu;
  std::condition_variable stop;
  bool stopping = false;
  std::thread ticker([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping; })) {
      lock.unlock();
      (*coordinator)->Tick();
      lock.lock();
    }
  });

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  int signal = 0;
  sigwait(&signals, &signal);
  util::LogInfo(signal == SIGTERM ? "SIGTERM" : "SIGINT", " received, shutting down");

  // Ends watch, log and assignment streams first, so in-flight calls finish within the grace.
  (*server)->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
  }
  stop.notify_all();
  ticker.join();
  metrics_http.Stop();
  return kExitOk;
}

// `hyscaled backup --data-dir D --to FILE`: a consistent copy of D/hyscale.db, also while a
// coordinator serves from it.
int Backup(int argc, char** argv) {
  std::string data_dir, to;
  CLI::App app{"hyscaled backup: a consistent snapshot of the store, also while it is served"};
  app.add_option("--data-dir", data_dir, "The coordinator's --data-dir")->required();
  app.add_option("--to", to, "The copy to write (replaced once complete)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  }
  const std::string path = (std::filesystem::path(data_dir) / "hyscale.db").string();
  if (!std::filesystem::exists(path)) {
    return Fail(absl::NotFoundError(absl::StrCat("data_dir: no ", path)));
  }
  if (auto status = Store::Backup(path, to); !status.ok()) return Fail(status);
  std::printf("hyscaled: backed up %s to %s\n", path.c_str(), to.c_str());
  return kExitOk;
}

}  // namespace
}  // namespace hyscale::server

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "backup") {
    return hyscale::server::Backup(argc - 1, argv + 1);
  }
  // Block the shutdown signals before any thread starts, so only sigwait in Run sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  hyscale::server::Flags flags;
  CLI::App app{"hyscaled: the HyScale coordinator"};
  app.add_option("--listen", flags.listen, "gRPC address HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--data-dir", flags.data_dir, "Directory of hyscale.db and job logs")->required();
  app.add_option("--metrics-listen", flags.metrics_listen,
                 "HTTP address of /metrics and the web view HOST:PORT (port 0 disables)")
      ->capture_default_str();
  app.add_option("--token-file", flags.token_file,
                 "File holding the bearer token (else env HYSCALE_TOKEN; none: auth off)");
  app.add_option("--read-token-file", flags.read_token_file,
                 "File holding a read-only bearer token: reads (get, list, watch, logs, plan, "
                 "workers) but no submit, cancel or worker call (else env HYSCALE_READ_TOKEN)");
  app.add_option("--tls-cert", flags.tls_cert, "PEM certificate chain (TLS with --tls-key)");
  app.add_option("--tls-key", flags.tls_key, "PEM private key (TLS with --tls-cert)");
  // A duration in milliseconds within [min, max], shown with its default.
  const auto milliseconds_option = [&app](const char* name, int64_t& value, const char* help,
                                          int64_t min, int64_t max) {
    app.add_option(name, value, help)->capture_default_str()->check(CLI::Range(min, max));
  };
  milliseconds_option("--heartbeat-interval-ms", flags.heartbeat_interval_ms,
                      "Heartbeat interval told to workers", 10, 3'600'000);
  app.add_option("--heartbeat-timeout-ms", flags.heartbeat_timeout_ms,
                 "Silence after which a worker is lost (default 3 x interval)")
      ->check(CLI::Range(int64_t{10}, int64_t{86'400'000}));
  milliseconds_option("--restart-backoff-ms", flags.restart_backoff_ms,
                      "Wait before the first restart of a failed job; doubles per restart", 0,
                      3'600'000);
  milliseconds_option("--rendezvous-timeout-ms", flags.rendezvous_timeout_ms,
                      "Time rank 0 of a multi-rank job gets to publish its rendezvous address "
                      "before the attempt fails",
                      100, 86'400'000);
  milliseconds_option("--start-timeout-ms", flags.start_timeout_ms,
                      "Time a placed rank gets to report its trainer started before the attempt "
                      "fails and its worker is excluded from placement",
                      100, 86'400'000);
  milliseconds_option("--unhealthy-exclusion-ms", flags.unhealthy_exclusion_ms,
                      "How long a worker that did not start a rank in time gets no placements", 0,
                      86'400'000);
  app.add_option("--max-streams-per-host", flags.streams_per_host,
                 "Watch and log streams one client host may hold open at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 100'000));
  app.add_option("--checkpoint-root", flags.checkpoint_root,
                 "Where jobs' checkpoint directories go (default <data-dir>/checkpoints)");
  app.add_option("--gpu-profile", flags.gpu_profile,
                 "Planner device profile of GPU jobs (planner/profile.h)")
      ->capture_default_str()
      ->check(CLI::IsMember(hyscale::server::planner::BuiltinProfileNames()));
  app.add_option("--calibration", flags.calibration,
                 "Calibration file from hyscale-calibrate: replaces figures of the profile it was "
                 "measured on (cpu, else --gpu-profile) for AUTO planning");
  app.add_option("--log-level", flags.log_level, "Least level logged: info, warning or error")
      ->capture_default_str();
  app.footer(
      "Also: hyscaled backup --data-dir D --to FILE (a consistent copy of the store, while it is "
      "served)\n"
      "Exit codes:\n  0  shut down by SIGTERM/SIGINT (or --help)\n"
      "  1  cannot start: store, TLS files, token file, calibration file or ports\n"
      "  2  bad flags");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (auto status = hyscale::util::SetMinLogLevel(flags.log_level); !status.ok()) {
    hyscale::util::LogError(status.message());
    return 2;
  }
  return hyscale::server::Run(flags);
}
