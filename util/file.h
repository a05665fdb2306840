// Files written whole or not at all, read whole, and removed as trees. POSIX calls only, no
// std::filesystem: PyTorch's pip libtorch.so exports its own copy of some of its symbols
// (remove_all among them), which the dynamic linker binds ahead of libstdc++'s in hyscale-train,
// and which crashed it (PyTorch 2.11, Ubuntu 24.04).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <string>
#include <utility>

namespace hyscale::util {

// An owned file descriptor: closed when destroyed; Close() reports a failed close (NFS reports
// write errors late, at close).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes now; the close's result (0, or -1 with errno set).
  int Close();
  void Reset() { (void)Close(); }

 private:
  int fd_ = -1;
};

// Writes `bytes` to `path` (created 0644 or truncated) and fsyncs it. Errors name the path and
// the OS error.
absl::Status WriteFileDurably(const std::string& path, absl::string_view bytes);

// Writes `bytes` to `path` + ".tmp", fsyncs it and renames it over `path`: a reader (or a crash)
// sees the old file or the whole new one, never part of it.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

// Fsyncs a directory, making the renames and creations in it durable.
absl::Status FsyncDirectory(const std::string& path);

// The whole file.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Removes `path` and everything below it (links themselves, not what they point to); nothing
// when it does not exist.
void RemoveTree(const std::string& path);

}  // namespace hyscale::util
