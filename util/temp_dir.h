// A fresh directory for scratch files (tests, benchmarks), removed with everything in it when its
// owner goes.
#pragma once

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <string>

namespace hyscale::util {

class TempDir {
 public:
  // <$TMPDIR, else /tmp>/<prefix>-XXXXXX, made with mkdtemp (mode 0700).
  static absl::StatusOr<TempDir> Create(absl::string_view prefix = "hyscale");

  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::string& path() const { return path_; }
  // path()/name.
  std::string Path(absl::string_view name) const;

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}

  std::string path_;  // empty once moved from
};

}  // namespace hyscale::util
