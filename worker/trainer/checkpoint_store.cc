#include "worker/trainer/checkpoint_store.h"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <fcntl.h>
#include <sys/file.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "util/file.h"

namespace hyscale::trainer {
namespace {

namespace fs = std::filesystem;

constexpr char kManifest[] = "manifest.json";
constexpr char kPrefix[] = "step-";
constexpr char kTemporarySuffix[] = ".tmp";
constexpr int kManifestVersion = 1;
// The fence: the attempt that holds the root, and the lock its check holds.
constexpr char kFenceFile[] = "ATTEMPT";
constexpr char kLockFile[] = ".lock";

uint32_t crc32_of(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t done = 0; done < bytes.size();) {  // zlib takes a uInt length per call
    const auto n = static_cast<uInt>(std::min<size_t>(bytes.size() - done, size_t{1} << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

// A name that stays inside the checkpoint directory and is not the manifest.
bool is_plain_name(const std::string& name) {
  return !name.empty() && name[0] != '.' && name.find('/') == std::string::npos &&
         name != kManifest;
}

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

absl::Status os_error(const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot ", what));
}

// name -> {size, crc32} from a manifest, or the reason it is unusable.
struct FileRecord {
  uint64_t size = 0;
  uint32_t crc32 = 0;
};
absl::StatusOr<std::map<std::string, FileRecord>> parse_manifest(const std::string& text,
                                                                 int64_t step) {
  const auto manifest = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return absl::DataLossError("manifest is not a JSON object");
  }
  const auto step_it = manifest.find("step");
  if (step_it == manifest.end() || !step_it->is_number_integer() ||
      step_it->get<int64_t>() != step) {
    return absl::DataLossError(absl::StrCat("manifest step is not ", step));
  }
  const auto files = manifest.find("files");
  if (files == manifest.end() || !files->is_object()) {
    return absl::DataLossError("manifest has no files object");
  }
  std::map<std::string, FileRecord> records;
  for (const auto& [name, entry] : files->items()) {
    if (!is_plain_name(name) || !entry.is_object() || !entry.contains("size") ||
        !entry.contains("crc32") || !entry["size"].is_number_unsigned() ||
        !entry["crc32"].is_number_unsigned() || entry["crc32"].get<uint64_t>() > 0xffffffffu) {
      return absl::DataLossError(absl::StrCat("manifest entry for '", name, "' is malformed"));
    }
    records[name] = {entry["size"].get<uint64_t>(), entry["crc32"].get<uint32_t>()};
  }
  return records;
}

// An exclusive flock on root/.lock for as long as it lives (released by closing the file).
class FenceLock {
 public:
  static absl::StatusOr<FenceLock> Take(const std::string& root) {
    const std::string path = join(root, kLockFile);
    util::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid()) return os_error("open", path);
    while (::flock(fd.get(), LOCK_EX) != 0) {
      if (errno != EINTR) return os_error("lock", path);
    }
    return FenceLock(std::move(fd));
  }

 private:
  explicit FenceLock(util::UniqueFd fd) : fd_(std::move(fd)) {}
  util::UniqueFd fd_;
};

}  // namespace

CheckpointStore::CheckpointStore(std::string root, int keep, int64_t attempt)
    : root_(std::move(root)), keep_(std::max(1, keep)), attempt_(attempt) {}

absl::Status CheckpointStore::Claim() {
  if (attempt_ < 0) return absl::OkStatus();
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) return absl::InternalError(absl::StrCat(root_, ": cannot create: ", ec.message()));
  auto lock = FenceLock::Take(root_);
  if (!lock.ok()) return lock.status();
  return TakeFence();
}

absl::Status CheckpointStore::TakeFence() {
  const std::string path = join(root_, kFenceFile);
  int64_t holder = -1;
  if (auto text = util::ReadFile(path); text.ok()) {
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &holder)) {
      return absl::DataLossError(absl::StrCat(path, ": not an attempt number"));
    }
  } else if (!absl::IsNotFound(text.status())) {
    return text.status();
  }
  if (holder > attempt_) {
    return absl::FailedPreconditionError(
        absl::StrCat(root_, ": attempt ", holder, " of this job has taken the checkpoints over; ",
                     "this trainer (attempt ", attempt_, ") is stale and writes nothing"));
  }
  if (holder == attempt_) return absl::OkStatus();
  return util::WriteFileAtomically(path, absl::StrCat(attempt_, "\n"));
}

std::string CheckpointStore::PathOf(int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", kPrefix, static_cast<long long>(step));
  return join(root_, name);
}

std::vector<int64_t> CheckpointStore::Steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string digits = name.substr(std::min(name.size(), sizeof(kPrefix) - 1));
    int64_t step;
    if (absl::StartsWith(name, kPrefix) && !digits.empty() &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        absl::SimpleAtoi(digits, &step) && entry.is_directory(ec)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

void CheckpointStore::RemoveLeftoverTemporaries() const {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kPrefix) && absl::EndsWith(name, kTemporarySuffix)) {
      util::RemoveTree(entry.path().string());
    }
  }
}

absl::Status CheckpointStore::Commit(int64_t step,
                                     const std::map<std::string, std::string>& files) {
  for (const auto& [name, bytes] : files) {
    if (!is_plain_name(name)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file '", name,
                                                     "': must be a plain file name (no '/', no "
                                                     "leading '.', not ",
                                                     kManifest, ")"));
    }
  }
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) return absl::InternalError(absl::StrCat(root_, ": cannot create: ", ec.message()));
  // Held to the end: a later attempt's Claim waits for this commit, then fences it off.
  std::optional<FenceLock> fence;
  if (attempt_ >= 0) {
    auto lock = FenceLock::Take(root_);
    if (!lock.ok()) return lock.status();
    fence.emplace(*std::move(lock));
    if (auto status = TakeFence(); !status.ok()) return status;
  }
  RemoveLeftoverTemporaries();

  const std::string final_dir = PathOf(step);
  const std::string temp_dir = final_dir + kTemporarySuffix;
  if (!fs::create_directory(temp_dir, ec)) {
    return absl::InternalError(
        absl::StrCat(temp_dir, ": cannot create: ", ec ? ec.message() : "already exists"));
  }
  nlohmann::json manifest = {
      {"version", kManifestVersion}, {"step", step}, {"files", nlohmann::json::object()}};
  if (attempt_ >= 0) manifest["attempt"] = attempt_;
  for (const auto& [name, bytes] : files) {
    if (auto s = util::WriteFileDurably(join(temp_dir, name), bytes); !s.ok()) return s;
    manifest["files"][name] = {{"size", bytes.size()}, {"crc32", crc32_of(bytes)}};
  }
  // Written last: a directory with a manifest had all its files written first.
  if (auto s = util::WriteFileDurably(join(temp_dir, kManifest), manifest.dump(2) + "\n");
      !s.ok()) {
    return s;
  }
  if (auto s = util::FsyncDirectory(temp_dir); !s.ok()) return s;
  // Re-committing a step replaces it; the old copy is gone before the new one lands.
  util::RemoveTree(final_dir);
  if (::rename(temp_dir.c_str(), final_dir.c_str()) != 0) return os_error("rename", temp_dir);
  if (auto s = util::FsyncDirectory(root_); !s.ok()) return s;

  const std::vector<int64_t> steps = Steps();
  for (size_t i = keep_; i < steps.size(); ++i) util::RemoveTree(PathOf(steps[i]));
  return absl::OkStatus();
}

absl::StatusOr<CheckpointStore::Loaded> CheckpointStore::Load(int64_t step) const {
  const std::string dir = PathOf(step);
  const std::string manifest_path = join(dir, kManifest);
  auto manifest_text = util::ReadFile(manifest_path);
  if (!manifest_text.ok()) return absl::DataLossError(manifest_text.status().message());
  auto records = parse_manifest(*manifest_text, step);
  if (!records.ok()) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": ", records.status().message()));
  }
  Loaded loaded;
  loaded.step = step;
  for (const auto& [name, record] : *records) {
    const std::string path = join(dir, name);
    auto bytes = util::ReadFile(path);
    if (!bytes.ok()) return absl::DataLossError(bytes.status().message());
    if (bytes->size() != record.size) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", bytes->size(), " bytes, the manifest says ", record.size));
    }
    if (const uint32_t crc = crc32_of(*bytes); crc != record.crc32) {
      return absl::DataLossError(
          absl::StrCat(path, ": CRC32 ", crc, " does not match the ", "manifest's ", record.crc32));
    }
    loaded.files[name] = std::move(*bytes);
  }
  return loaded;
}

absl::StatusOr<CheckpointStore::Loaded> CheckpointStore::LoadLatest(
    std::vector<std::string>* warnings) const {
  const std::vector<int64_t> steps = Steps();
  if (steps.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", root_));
  for (int64_t step : steps) {
    auto loaded = Load(step);
    if (loaded.ok()) return loaded;
    warnings->push_back(absl::StrCat("skipping corrupt checkpoint ", PathOf(step), ": ",
                                     loaded.status().message()));
  }
  return absl::DataLossError(
      absl::StrCat("none of the ", steps.size(), " checkpoints in ", root_, " verifies"));
}

}  // namespace hyscale::trainer
