#include "worker/agent/job_paths.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <filesystem>

namespace hyscale::agent {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Resolve(const std::vector<std::string>& paths) {
  std::vector<std::string> resolved;
  for (const auto& path : paths) {
    std::error_code error;
    const fs::path canonical = fs::weakly_canonical(fs::absolute(path, error), error);
    if (!error) resolved.push_back(canonical.string());
  }
  return resolved;
}

bool Within(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

absl::StatusOr<std::string> Check(const std::string& field, const std::string& path,
                                  const std::vector<std::string>& roots, const char* flag) {
  const fs::path given(path);
  if (!given.is_absolute()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be an absolute path (got '", path, "')"));
  }
  std::error_code error;
  const std::string resolved = fs::weakly_canonical(given, error).string();
  if (!error) {
    for (const auto& root : roots) {
      if (Within(resolved, root)) return resolved;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", path,
                                                 "' is outside the folders this worker allows (",
                                                 flag, " ", absl::StrJoin(roots, ", "), ")"));
}

}  // namespace

JobPaths::JobPaths(const std::vector<std::string>& data_roots,
                   const std::vector<std::string>& checkpoint_roots)
    : data_roots_(Resolve(data_roots)), checkpoint_roots_(Resolve(checkpoint_roots)) {}

absl::StatusOr<std::string> JobPaths::Readable(const std::string& field,
                                               const std::string& path) const {
  return Check(field, path, data_roots_, "--data-root");
}

absl::StatusOr<std::string> JobPaths::Writable(const std::string& field,
                                               const std::string& path) const {
  return Check(field, path, checkpoint_roots_, "--checkpoint-root");
}

}  // namespace hyscale::agent
