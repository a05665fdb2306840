// service_load_bench: load on a real hyscaled (started here with a fresh data dir, or --server).
//   (a) SubmitJob throughput and latency with durable writes, jobs that are never placed;
//   (b) 1,000 simulated workers heartbeating and running jobs: scheduling and heartbeat latency;
//   (c) 10,000 concurrent WatchJob streams: the coordinator's memory and threads, and the fan-out
//       of a cancellation to every watcher.
// Client-side latencies are exact; the server's side comes from its /metrics histograms (their
// quantiles are bucket upper bounds). Prints a table, and JSON with --json. Not a test.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/service/hyscaled_process.h"
#include "bench/service/latency.h"
#include "bench/service/load_client.h"
#include "bench/service/metrics_scrape.h"
#include "bench/service/submit_load.h"
#include "bench/service/watch_load.h"
#include "bench/service/worker_load.h"
#include "proto/rpc.h"

namespace hyscale::bench {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitBadFlags = 2;

struct Flags {
  std::string hyscaled = HYSCALED_PATH;
  std::string server;   // host:port of a running coordinator; empty: start one per phase
  std::string metrics;  // host:port of its /metrics (with --server)
  std::string token_file;
  std::string tls_ca;
  std::string data_root = std::filesystem::temp_directory_path().string();
  bool keep_data = false;
  bool shared_server = false;  // phase (b) on phase (a)'s server, its jobs still queued
  std::vector<std::string> phases = {"a", "b"};
  int channels = 4;
  int64_t heartbeat_interval_ms = 1000;  // for a coordinator started here
  SubmitLoadOptions submit;
  WorkerLoadOptions workers;
  WatchLoadOptions watch;
  std::string json_path;  // "-": stdout
};

// The coordinator a phase runs against.
struct Server {
  std::string address;
  std::string metrics_host;
  int metrics_port = 0;                      // 0: no /metrics
  std::unique_ptr<HyscaledProcess> process;  // null with --server
  std::string data_dir;
};

struct Row {
  std::string phase;
  std::string what;
  LatencySummary latency;
};

struct ServerRow {
  std::string phase;
  std::string what;
  HistogramSample histogram;
};

class Report {
 public:
  void Add(const std::string& phase, const std::string& what, const LatencyRecorder& latency) {
    rows_.push_back({phase, what, latency.Summarize()});
  }
  void AddServer(const std::string& phase, const std::string& what, const HistogramSample& h) {
    if (h.count > 0) server_rows_.push_back({phase, what, h});
  }
  void Note(const std::string& phase, const std::string& line) { notes_.push_back({phase, line}); }
  nlohmann::json& Json() { return json_; }

  void Print(std::FILE* out) const {
    std::fprintf(out, "%-5s %-46s %8s %10s %10s %10s %10s\n", "phase", "client-side latency",
                 "count", "p50 ms", "p99 ms", "max ms", "mean ms");
    for (const Row& row : rows_) {
      std::fprintf(out, "%-5s %-46s %8lld %10.2f %10.2f %10.2f %10.2f\n", row.phase.c_str(),
                   row.what.c_str(), static_cast<long long>(row.latency.count), row.latency.p50_ms,
                   row.latency.p99_ms, row.latency.max_ms, row.latency.mean_ms);
    }
    if (!server_rows_.empty()) {
      std::fprintf(out, "\n%-5s %-46s %8s %10s %10s %10s\n", "phase",
                   "server-side (hyscaled /metrics histograms)", "count", "p50 <= ms", "p99 <= ms",
                   "mean ms");
      for (const ServerRow& row : server_rows_) {
        std::fprintf(out, "%-5s %-46s %8.0f %10s %10s %10.3f\n", row.phase.c_str(),
                     row.what.c_str(), row.histogram.count,
                     Bound(row.histogram.QuantileUpperBound(0.5)).c_str(),
                     Bound(row.histogram.QuantileUpperBound(0.99)).c_str(),
                     row.histogram.MeanSeconds() * 1000);
      }
    }
    std::fprintf(out, "\n");
    for (const auto& [phase, line] : notes_)
      std::fprintf(out, "(%s) %s\n", phase.c_str(), line.c_str());
  }

  nlohmann::json ToJson() const {
    nlohmann::json json = json_;
    for (const Row& row : rows_) {
      json["client_latency_ms"].push_back({{"phase", row.phase},
                                           {"what", row.what},
                                           {"count", row.latency.count},
                                           {"p50", row.latency.p50_ms},
                                           {"p99", row.latency.p99_ms},
                                           {"max", row.latency.max_ms},
                                           {"mean", row.latency.mean_ms}});
    }
    for (const ServerRow& row : server_rows_) {
      json["server_latency_ms"].push_back(
          {{"phase", row.phase},
           {"what", row.what},
           {"count", row.histogram.count},
           {"p50_upper_bound", row.histogram.QuantileUpperBound(0.5) * 1000},
           {"p99_upper_bound", row.histogram.QuantileUpperBound(0.99) * 1000},
           {"mean", row.histogram.MeanSeconds() * 1000}});
    }
    for (const auto& [phase, line] : notes_) json["notes"].push_back(phase + ": " + line);
    return json;
  }

 private:
  static std::string Bound(double seconds) {
    if (std::isinf(seconds)) return "inf";
    return absl::StrFormat("%g", seconds * 1000);
  }

  std::vector<Row> rows_;
  std::vector<ServerRow> server_rows_;
  std::vector<std::pair<std::string, std::string>> notes_;
  nlohmann::json json_;
};

// Peak resident memory and thread count of hyscaled while a phase runs (sampled every 200 ms).
class PeakSampler {
 public:
  explicit PeakSampler(const HyscaledProcess* process) : process_(process) {
    if (process_ != nullptr) thread_ = std::thread([this] { Loop(); });
  }
  ~PeakSampler() { Stop(); }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // "" without a process of ours to watch.
  std::string Describe() {
    Stop();
    if (process_ == nullptr) return "";
    return absl::StrFormat("hyscaled during the phase: peak %.0f MiB resident, peak %d threads",
                           static_cast<double>(peak_rss_) / 1048576.0, peak_threads_);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    do {
      peak_rss_ = std::max(peak_rss_, process_->ResidentBytes());
      peak_threads_ = std::max(peak_threads_, process_->Threads());
    } while (!wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopped_; }));
  }

  const HyscaledProcess* const process_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopped_ = false;
  int64_t peak_rss_ = 0;
  int peak_threads_ = 0;
  std::thread thread_;
};

std::string Machine() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  utsname name{};
  uname(&name);
  return absl::StrCat(std::thread::hardware_concurrency(), " cores (", model, "), Linux ",
                      name.release);
}

// The 1/5/15-minute load averages: on a shared machine they say how much else was running.
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double one = 0, five = 0, fifteen = 0;
  in >> one >> five >> fifteen;
  return absl::StrFormat("%.2f %.2f %.2f", one, five, fifteen);
}

std::string RunId() {
  return absl::StrCat(getpid(), "-",
                      std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count());
}

absl::Status StartServer(const Flags& flags, const std::string& run_id, const std::string& phase,
                         Server* server) {
  if (!flags.server.empty()) {
    server->address = flags.server;
    if (!flags.metrics.empty()) {
      const auto colon = flags.metrics.rfind(':');
      if (colon == std::string::npos || colon == 0 ||
          !absl::SimpleAtoi(flags.metrics.substr(colon + 1), &server->metrics_port) ||
          server->metrics_port <= 0 || server->metrics_port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("--metrics: expected HOST:PORT (got '", flags.metrics, "')"));
      }
      server->metrics_host = flags.metrics.substr(0, colon);
    }
    return absl::OkStatus();
  }
  server->data_dir =
      (std::filesystem::path(flags.data_root) / absl::StrCat("hyscale-load-", run_id, "-", phase))
          .string();
  std::vector<std::string> args = {"--heartbeat-interval-ms",
                                   std::to_string(flags.heartbeat_interval_ms)};
  if (!flags.token_file.empty()) args.insert(args.end(), {"--token-file", flags.token_file});
  // Phase (c) holds all its streams from this one host.
  args.insert(args.end(), {"--max-streams-per-host", std::to_string(flags.watch.watchers + 64)});
  auto process = HyscaledProcess::Start(flags.hyscaled, server->data_dir, args);
  if (!process.ok()) return process.status();
  server->process = std::move(*process);
  server->address = server->process->address();
  server->metrics_host = "127.0.0.1";
  server->metrics_port = server->process->metrics_port();
  return absl::OkStatus();
}

absl::Status StopServer(const Flags& flags, Server* server) {
  if (!server->process) return absl::OkStatus();
  auto code = server->process->Stop();
  server->process.reset();
  if (!flags.keep_data) {
    std::error_code error;
    std::filesystem::remove_all(server->data_dir, error);
  }
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::InternalError(absl::StrCat("hyscaled exited ", *code, " on SIGTERM"));
  }
  return absl::OkStatus();
}

std::string Scrape(const Server& server) {
  if (server.metrics_port == 0) return "";
  auto text = ScrapeMetrics(server.metrics_host, server.metrics_port);
  if (!text.ok()) {
    std::fprintf(stderr, "service_load_bench: %s\n", std::string(text.status().message()).c_str());
    return "";
  }
  return *text;
}

// hyscaled around one load run: its /metrics before and after, and its peaks during the run.
struct Observation {
  std::string metrics_before, metrics_after;
  std::string peaks;  // PeakSampler::Describe()
};

Observation ObserveServer(const Server& server, const std::function<void()>& run) {
  Observation seen;
  seen.metrics_before = Scrape(server);
  PeakSampler peak(server.process.get());
  run();
  seen.peaks = peak.Describe();
  seen.metrics_after = Scrape(server);
  return seen;
}

void AddServerRpc(Report* report, const std::string& phase, const std::string& before,
                  const std::string& after, const std::string& method) {
  const std::string filter = absl::StrCat("method=\"hyscale.v1.", method, "\"");
  const auto delta = FindHistogram(after, "hyscale_rpc_duration_seconds", filter)
                         .Since(FindHistogram(before, "hyscale_rpc_duration_seconds", filter));
  report->AddServer(phase, absl::StrCat(method, " handler"), delta);
}

void PhaseA(const Flags& flags, const Server& server,
            const std::vector<std::shared_ptr<grpc::Channel>>& channels,
            const rpc::ClientOptions& client, const v1::JobSpec& spec, Report* report) {
  SubmitLoadResult result;
  const Observation seen =
      ObserveServer(server, [&] { RunSubmitLoad(channels, client, spec, flags.submit, &result); });
  report->Add("a", "SubmitJob (never placed, durable)", result.latency);
  AddServerRpc(report, "a", seen.metrics_before, seen.metrics_after, "JobService/SubmitJob");
  const std::string offered =
      flags.submit.rate > 0 ? absl::StrFormat(" (offered %.0f/s, open loop)", flags.submit.rate)
                            : std::string(" (closed loop)");
  report->Note("a", absl::StrFormat("%.1f submissions/s%s: %lld ok in %.2f s, %d threads over %d "
                                    "channels; %lld failed, %lld not PENDING",
                                    result.PerSecond(), offered, static_cast<long long>(result.ok),
                                    result.seconds, flags.submit.threads, flags.channels,
                                    static_cast<long long>(result.failed),
                                    static_cast<long long>(result.not_pending)));
  const size_t window = std::min<size_t>(1000, result.completions.size() / 2);
  const double first_rate = result.PerSecondBetween(0, window);
  const double last_rate = result.PerSecondBetween(result.completions.size() - window, window);
  report->Note("a", absl::StrFormat("throughput of the first %zu: %.1f/s, of the last %zu: %.1f/s",
                                    window, first_rate, window, last_rate));
  if (!seen.peaks.empty()) report->Note("a", seen.peaks);
  if (!result.first_error.empty()) report->Note("a", "first error: " + result.first_error);
  report->Json()["phase_a"] = {{"submissions", flags.submit.submissions},
                               {"threads", flags.submit.threads},
                               {"offered_per_second", flags.submit.rate},
                               {"channels", flags.channels},
                               {"ok", result.ok},
                               {"failed", result.failed},
                               {"not_pending", result.not_pending},
                               {"seconds", result.seconds},
                               {"submissions_per_second", result.PerSecond()},
                               {"throughput_window", window},
                               {"first_window_per_second", first_rate},
                               {"last_window_per_second", last_rate}};
}

void PhaseB(const Flags& flags, const Server& server,
            const std::vector<std::shared_ptr<grpc::Channel>>& channels,
            const rpc::ClientOptions& client, const v1::JobSpec& spec, Report* report) {
  WorkerLoadResult r;
  const Observation seen =
      ObserveServer(server, [&] { RunWorkerLoad(channels, client, spec, flags.workers, &r); });
  const std::string &before = seen.metrics_before, &after = seen.metrics_after;
  report->Add("b", "RegisterWorker", r.register_latency);
  report->Add("b", "Heartbeat (first 2 intervals, streams opening)", r.first_heartbeats);
  report->Add("b", "Heartbeat (steady, during submissions)", r.heartbeat);
  report->Add("b", "ReportStatus (rank started / exited)", r.report);
  report->Add("b", "SubmitJob (placeable)", r.submit);
  report->Add("b", "scheduling: submit -> SCHEDULED", r.scheduled);
  report->Add("b", "submit -> RunRank on the worker's stream", r.delivered);
  report->AddServer("b", "scheduling latency (PENDING -> SCHEDULED)",
                    FindHistogram(after, "hyscale_scheduling_latency_seconds", "")
                        .Since(FindHistogram(before, "hyscale_scheduling_latency_seconds", "")));
  for (const char* method : {"WorkerService/RegisterWorker", "WorkerService/Heartbeat",
                             "WorkerService/ReportStatus", "JobService/SubmitJob"}) {
    AddServerRpc(report, "b", before, after, method);
  }
  report->Note(
      "b", absl::StrFormat("%d workers x %d CPU slot(s) registered (%lld failed), heartbeat every "
                           "%lld ms over %d channels, one assignment stream each",
                           flags.workers.workers, flags.workers.slots,
                           static_cast<long long>(r.register_failed),
                           static_cast<long long>(r.heartbeat_interval_ms), flags.channels));
  report->Note("b", absl::StrFormat("%lld jobs submitted at %.1f/s over %.1f s, each running %lld "
                                    "ms: %lld placed at submit, %lld never scheduled, %lld "
                                    "failed",
                                    static_cast<long long>(r.submitted), flags.workers.job_rate,
                                    r.seconds, static_cast<long long>(flags.workers.job_ms),
                                    static_cast<long long>(r.placed_at_submit),
                                    static_cast<long long>(r.never_scheduled),
                                    static_cast<long long>(r.submit_failed)));
  report->Note("b", absl::StrFormat("errors: %lld heartbeats failed, %lld answered unregistered "
                                    "(worker lost), %lld reports failed, %lld streams ended "
                                    "early, %lld stops received",
                                    static_cast<long long>(r.heartbeats_failed),
                                    static_cast<long long>(r.heartbeats_unregistered),
                                    static_cast<long long>(r.reports_failed),
                                    static_cast<long long>(r.streams_failed),
                                    static_cast<long long>(r.stops_received)));
  if (!seen.peaks.empty()) report->Note("b", seen.peaks);
  if (!r.first_error.empty()) report->Note("b", "first error: " + r.first_error);
  report->Json()["phase_b"] = {{"workers", flags.workers.workers},
                               {"slots", flags.workers.slots},
                               {"channels", flags.channels},
                               {"heartbeat_interval_ms", r.heartbeat_interval_ms},
                               {"job_rate", flags.workers.job_rate},
                               {"job_ms", flags.workers.job_ms},
                               {"seconds", r.seconds},
                               {"registered", r.registered},
                               {"submitted", r.submitted},
                               {"submit_failed", r.submit_failed},
                               {"placed_at_submit", r.placed_at_submit},
                               {"never_scheduled", r.never_scheduled},
                               {"heartbeats_failed", r.heartbeats_failed},
                               {"heartbeats_unregistered", r.heartbeats_unregistered},
                               {"reports_failed", r.reports_failed},
                               {"streams_failed", r.streams_failed},
                               {"stops_received", r.stops_received}};
}

void PhaseC(const Flags& flags, const Server& server,
            const std::vector<std::shared_ptr<grpc::Channel>>& channels,
            const rpc::ClientOptions& client, const v1::JobSpec& spec, Report* report) {
  const HyscaledProcess* process = server.process.get();
  const int64_t rss_before = process != nullptr ? process->ResidentBytes() : 0;
  const int threads_before = process != nullptr ? process->Threads() : 0;
  int64_t rss_open = 0;
  int threads_open = 0;
  WatchLoadResult result;
  RunWatchLoad(
      channels, client, spec, flags.watch,
      [&] {
        if (process == nullptr) return;
        rss_open = process->ResidentBytes();
        threads_open = process->Threads();
      },
      &result);
  report->Add("c", "CancelJob -> CANCELLED at each watcher", result.fanout);
  report->Note("c", absl::StrFormat("%lld of %lld watch streams open on %d jobs over %d channels "
                                    "in %.2f s; %lld saw CANCELLED, %lld ended OK, %lld failed",
                                    static_cast<long long>(result.opened),
                                    static_cast<long long>(flags.watch.watchers), flags.watch.jobs,
                                    flags.channels, result.open_seconds,
                                    static_cast<long long>(result.cancelled),
                                    static_cast<long long>(result.ended_ok),
                                    static_cast<long long>(result.failed)));
  if (process != nullptr) {
    report->Note("c", absl::StrFormat("hyscaled before the streams: %.0f MiB resident, %d "
                                      "threads; with them all open: %.0f MiB, %d threads",
                                      static_cast<double>(rss_before) / 1048576.0, threads_before,
                                      static_cast<double>(rss_open) / 1048576.0, threads_open));
  }
  if (!result.first_error.empty()) report->Note("c", "first error: " + result.first_error);
  report->Json()["phase_c"] = {
      {"watchers", flags.watch.watchers},    {"jobs", flags.watch.jobs},
      {"channels", flags.channels},          {"opened", result.opened},
      {"open_seconds", result.open_seconds}, {"cancelled", result.cancelled},
      {"ended_ok", result.ended_ok},         {"failed", result.failed},
      {"rss_bytes_before", rss_before},      {"rss_bytes_open", rss_open},
      {"threads_before", threads_before},    {"threads_open", threads_open}};
}

int Run(const Flags& flags) {
  auto spec = BenchSpec();
  if (!spec.ok()) {
    std::fprintf(stderr, "service_load_bench: %s\n", std::string(spec.status().message()).c_str());
    return kExitFailed;
  }
  rpc::ClientOptions client;
  client.tls_ca_file = flags.tls_ca;
  auto token = rpc::ResolveToken("", flags.token_file, "HYSCALE_TOKEN");
  if (!token.ok()) {
    std::fprintf(stderr, "service_load_bench: %s\n", std::string(token.status().message()).c_str());
    return kExitFailed;
  }
  client.token = *token;

  const std::string run_id = RunId();
  Report report;
  report.Json()["machine"] = Machine();
  std::printf("service_load_bench on %s, load average %s\n", Machine().c_str(),
              LoadAverage().c_str());
  report.Json()["load_average_start"] = LoadAverage();
  std::fflush(stdout);
  Server server;
  bool failed = false;
  for (const std::string& phase : flags.phases) {
    const bool reuse = server.process && flags.shared_server;
    if (!reuse) {
      if (auto stopped = StopServer(flags, &server); !stopped.ok()) {
        std::fprintf(stderr, "service_load_bench: %s\n", std::string(stopped.message()).c_str());
        failed = true;
      }
      if (auto started = StartServer(flags, run_id, phase, &server); !started.ok()) {
        std::fprintf(stderr, "service_load_bench: %s\n", std::string(started.message()).c_str());
        return kExitFailed;
      }
    }
    client.server = server.address;
    auto channels = OpenChannels(client, flags.channels);
    if (!channels.ok()) {
      std::fprintf(stderr, "service_load_bench: %s\n",
                   std::string(channels.status().message()).c_str());
      return kExitFailed;
    }
    std::fprintf(stderr, "service_load_bench: phase %s against %s\n", phase.c_str(),
                 server.address.c_str());
    if (phase == "a") {
      PhaseA(flags, server, *channels, client, *spec, &report);
    } else if (phase == "b") {
      PhaseB(flags, server, *channels, client, *spec, &report);
    } else {
      PhaseC(flags, server, *channels, client, *spec, &report);
    }
  }
  if (auto stopped = StopServer(flags, &server); !stopped.ok()) {
    std::fprintf(stderr, "service_load_bench: %s\n", std::string(stopped.message()).c_str());
    failed = true;
  }
  report.Json()["load_average_end"] = LoadAverage();
  report.Note("end", "load average " + LoadAverage());
  report.Print(stdout);
  if (!flags.json_path.empty()) {
    const std::string json = report.ToJson().dump(2) + "\n";
    if (flags.json_path == "-") {
      std::fputs(json.c_str(), stdout);
    } else {
      std::ofstream out(flags.json_path);
      out << json;
      if (!out) {
        std::fprintf(stderr, "service_load_bench: %s: cannot write\n", flags.json_path.c_str());
        failed = true;
      }
    }
  }
  return failed ? kExitFailed : kExitOk;
}

}  // namespace
}  // namespace hyscale::bench

int main(int argc, char** argv) {
  hyscale::bench::Flags flags;
  CLI::App app{"service_load_bench: load on a real hyscaled (see docs/performance.md, section 6)"};
  app.add_option("--hyscaled", flags.hyscaled, "hyscaled binary to start")->capture_default_str();
  app.add_option("--server", flags.server,
                 "Use this running coordinator (HOST:PORT) instead of starting one per phase");
  app.add_option("--metrics", flags.metrics, "Its /metrics address HOST:PORT (with --server)");
  app.add_option("--token-file", flags.token_file, "Bearer token file (else env HYSCALE_TOKEN)");
  app.add_option("--tls-ca", flags.tls_ca, "PEM roots for TLS (with --server)");
  app.add_option("--data-root", flags.data_root, "Where fresh data dirs are made")
      ->capture_default_str();
  app.add_flag("--keep-data", flags.keep_data, "Keep the data dirs (and hyscaled.log)");
  app.add_flag("--shared-server", flags.shared_server,
               "Run phase b on phase a's coordinator, with a's jobs still queued");
  app.add_option("--phases", flags.phases, "Phases to run, in order: a, b, c")
      ->delimiter(',')
      ->check(CLI::IsMember({"a", "b", "c"}))
      ->capture_default_str();
  app.add_option("--channels", flags.channels, "gRPC connections per phase")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--heartbeat-interval-ms", flags.heartbeat_interval_ms,
                 "Heartbeat interval of a coordinator started here")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{60'000}));
  app.add_option("--submissions", flags.submit.submissions, "(a) SubmitJob calls")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  app.add_option("-c,--threads", flags.submit.threads, "(a) concurrent client threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--rate", flags.submit.rate,
                 "(a) offered submissions/s over all threads (open loop); 0: closed loop")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1'000'000.0));
  app.add_option("--workers", flags.workers.workers, "(b) simulated workers")
      ->capture_default_str()
      ->check(CLI::Range(1, 100'000));
  app.add_option("--slots", flags.workers.slots, "(b) CPU slots per worker")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--job-rate", flags.workers.job_rate, "(b) job submissions per second")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 100'000.0));
  app.add_option("--job-ms", flags.workers.job_ms, "(b) how long each simulated rank runs")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}));
  app.add_option("--duration-s", flags.workers.duration_s, "(b) submission window")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--watchers", flags.watch.watchers, "(c) concurrent WatchJob streams")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  app.add_option("--watch-jobs", flags.watch.jobs, "(c) jobs the streams watch")
      ->capture_default_str()
      ->check(CLI::Range(1, 100'000));
  app.add_option("--json", flags.json_path,
                 "Also write the results as JSON to this file ('-': stdout)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? hyscale::bench::kExitOk : hyscale::bench::kExitBadFlags;
  }
  const std::string run_id = hyscale::bench::RunId();
  flags.submit.run_id = run_id;
  flags.workers.run_id = run_id;
  flags.watch.run_id = run_id;
  flags.workers.register_threads = flags.submit.threads;
  return hyscale::bench::Run(flags);
}
