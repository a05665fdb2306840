#include "util/temp_dir.h"

#include <absl/strings/str_cat.h>
#include <stdlib.h>

#include <cerrno>
#include <utility>

#include "util/file.h"

namespace hyscale::util {

absl::StatusOr<TempDir> TempDir::Create(absl::string_view prefix) {
  const char* tmpdir = ::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", "/", prefix, "-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat(pattern, ": cannot create"));
  }
  return TempDir(std::move(pattern));
}

TempDir::TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, "")) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    if (!path_.empty()) RemoveTree(path_);
    path_ = std::exchange(other.path_, "");
  }
  return *this;
}

TempDir::~TempDir() {
  if (!path_.empty()) RemoveTree(path_);
}

std::string TempDir::Path(absl::string_view name) const {
  return absl::StrCat(path_, "/", name);
}

}  // namespace hyscale::util
