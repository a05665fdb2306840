// The folders jobs on this worker may read data from and write checkpoints to. A job names its
// files itself (spec.data.*.path), so without this a job could read any file the trainer can.
// Paths are resolved (symlinks, "..") before they are compared, so a link cannot lead out.
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <vector>

namespace hyscale::agent {

class JobPaths {
 public:
  // Roots are resolved now; a root that does not exist yet resolves as far as it exists.
  JobPaths(const std::vector<std::string>& data_roots,
           const std::vector<std::string>& checkpoint_roots);

  // `path` resolved, when it lies in a data root; INVALID_ARGUMENT naming `field` otherwise.
  absl::StatusOr<std::string> Readable(const std::string& field, const std::string& path) const;
  // The same for a checkpoint folder and the checkpoint roots.
  absl::StatusOr<std::string> Writable(const std::string& field, const std::string& path) const;

  const std::vector<std::string>& data_roots() const { return data_roots_; }
  const std::vector<std::string>& checkpoint_roots() const { return checkpoint_roots_; }

 private:
  std::vector<std::string> data_roots_;
  std::vector<std::string> checkpoint_roots_;
};

}  // namespace hyscale::agent
