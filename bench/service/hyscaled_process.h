// A hyscaled child process with its own data directory, for benchmarks: started on free ports,
// ready once it prints its addresses, stopped with SIGTERM (SIGKILL after a grace period).
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/subprocess.h"

namespace hyscale::bench {

class HyscaledProcess {
 public:
  // Runs `binary` with --data-dir `data_dir` (created; stdout and stderr go to
  // <data_dir>/hyscaled.log) plus `extra_args`, and waits until it listens.
  static absl::StatusOr<std::unique_ptr<HyscaledProcess>> Start(
      const std::string& binary, const std::string& data_dir,
      const std::vector<std::string>& extra_args);
  ~HyscaledProcess();  // Stop()s it if still running

  HyscaledProcess(const HyscaledProcess&) = delete;
  HyscaledProcess& operator=(const HyscaledProcess&) = delete;

  const std::string& address() const { return address_; }  // gRPC host:port
  int metrics_port() const { return metrics_port_; }
  const std::string& log_path() const { return log_path_; }

  // From /proc: resident memory and thread count now (0 when unreadable).
  int64_t ResidentBytes() const;
  int Threads() const;

  // SIGTERM, then SIGKILL if it has not exited within `grace_seconds`. Returns its exit status
  // as the shell reports it (128 + signal when killed).
  absl::StatusOr<int> Stop(int grace_seconds = 10);

 private:
  HyscaledProcess(util::Subprocess process, std::string log_path, int metrics_port)
      : process_(std::move(process)), log_path_(std::move(log_path)), metrics_port_(metrics_port) {}
  absl::Status WaitReady(int timeout_seconds);

  util::Subprocess process_;
  bool stopped_ = false;  // by Stop, or on its own while starting
  const std::string log_path_;
  const int metrics_port_;
  std::string address_;
};

}  // namespace hyscale::bench
