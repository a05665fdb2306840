#include "bench/service/hyscaled_process.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace hyscale::bench {
namespace {

// A port free now on 127.0.0.1 (hyscaled's --metrics-listen takes no port 0: that disables it).
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::ErrnoToStatus(errno, "socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  close(fd);
  if (!ok) return absl::ErrnoToStatus(error, "bind 127.0.0.1:0");
  return ntohs(address.sin_port);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value after `prefix` on the line that has it, up to the end of that line.
std::string AfterPrefix(const std::string& text, const std::string& prefix) {
  const auto at = text.find(prefix);
  if (at == std::string::npos) return "";
  const auto start = at + prefix.size();
  const auto end = text.find('\n', start);
  if (end == std::string::npos) return "";  // the line is not complete yet
  return text.substr(start, end - start);
}

int64_t ProcStatusField(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::vector<std::string> parts =
        absl::StrSplit(line.substr(field.size() + 1), ' ', absl::SkipWhitespace());
    int64_t value = 0;
    if (parts.empty() || !absl::SimpleAtoi(parts[0], &value)) return 0;
    return value;
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HyscaledProcess>> HyscaledProcess::Start(
    const std::string& binary, const std::string& data_dir,
    const std::vector<std::string>& extra_args) {
  std::error_code error;
  std::filesystem::create_directories(data_dir, error);
  if (error) return absl::InternalError(absl::StrCat(data_dir, ": ", error.message()));
  auto metrics_port = FreePort();
  if (!metrics_port.ok()) return metrics_port.status();
  const std::string log_path = data_dir + "/hyscaled.log";

  util::Command command({binary, "--data-dir", data_dir, "--listen", "127.0.0.1:0",
                         "--metrics-listen", absl::StrCat("127.0.0.1:", *metrics_port)});
  command.argv.insert(command.argv.end(), extra_args.begin(), extra_args.end());
  command.stdout_to = util::Redirect::WriteTo(log_path);
  command.stderr_to = util::Redirect::ToStdout();
  auto started = util::Subprocess::Start(command);
  if (!started.ok()) return started.status();
  std::unique_ptr<HyscaledProcess> process(
      new HyscaledProcess(*std::move(started), log_path, *metrics_port));
  if (auto ready = process->WaitReady(30); !ready.ok()) return ready;
  return process;
}

absl::Status HyscaledProcess::WaitReady(int timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (process_.TryWait()) {
      stopped_ = true;
      return absl::UnavailableError(absl::StrCat("hyscaled exited while starting; its log (",
                                                 log_path_, "):\n", ReadAll(log_path_)));
    }
    // "hyscaled: listening on 127.0.0.1:PORT", printed once the services are up.
    const std::string listening = AfterPrefix(ReadAll(log_path_), "hyscaled: listening on ");
    if (!listening.empty()) {
      address_ = listening;
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  (void)Stop(1);
  return absl::DeadlineExceededError(
      absl::StrCat("hyscaled did not listen within ", timeout_seconds, " s; see ", log_path_));
}

int64_t HyscaledProcess::ResidentBytes() const {
  return stopped_ ? 0 : ProcStatusField(process_.pid(), "VmRSS") * 1024;
}

int HyscaledProcess::Threads() const {
  return stopped_ ? 0 : static_cast<int>(ProcStatusField(process_.pid(), "Threads"));
}

absl::StatusOr<int> HyscaledProcess::Stop(int grace_seconds) {
  if (stopped_) return absl::FailedPreconditionError("hyscaled already stopped");
  stopped_ = true;
  return process_.Stop(std::chrono::seconds(grace_seconds)).ShellCode();
}

HyscaledProcess::~HyscaledProcess() {
  if (!stopped_) (void)Stop();
}

}  // namespace hyscale::bench
