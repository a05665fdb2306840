// CheckpointStore: atomic commits, pruning to `keep`, and falling back past a corrupt or partial
// newest checkpoint with a warning.
#include "worker/trainer/checkpoint_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/trainer/test_files.h"

namespace hyscale::trainer {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::map<std::string, std::string> files_for(int64_t step) {
  return {{"model.safetensors", "weights " + std::to_string(step) + std::string(3, '\0')},
          {"optimizer.safetensors", "state " + std::to_string(step)}};
}

// Step directories under the root, in name order.
std::vector<std::string> listing(const std::string& root) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  CheckpointStore Store(int keep = 3) const { return CheckpointStore(root_, keep); }

  void Commit(CheckpointStore& store, int64_t step) {
    const absl::Status status = store.Commit(step, files_for(step));
    ASSERT_TRUE(status.ok()) << status;
  }

  // Loads and expects `step`, returning the warnings.
  std::vector<std::string> ExpectLatest(const CheckpointStore& store, int64_t step) {
    std::vector<std::string> warnings;
    auto loaded = store.LoadLatest(&warnings);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (loaded.ok()) {
      EXPECT_EQ(loaded->step, step);
      EXPECT_EQ(loaded->files, files_for(step));
    }
    return warnings;
  }

  ScratchDir scratch_;
  const std::string root_ = scratch_.Path("checkpoints");
};

TEST_F(CheckpointStoreTest, CommitThenLoad) {
  CheckpointStore store = Store();
  Commit(store, 100);
  EXPECT_EQ(store.PathOf(100), root_ + "/step-00000100");
  EXPECT_THAT(listing(store.PathOf(100)),
              ElementsAre("manifest.json", "model.safetensors", "optimizer.safetensors"));
  const auto manifest =
      nlohmann::json::parse(ScratchDir::Read(store.PathOf(100) + "/manifest.json"));
  EXPECT_EQ(manifest["step"], 100);
  EXPECT_EQ(manifest["files"]["model.safetensors"]["size"],
            files_for(100)["model.safetensors"].size());
  EXPECT_TRUE(manifest["files"]["model.safetensors"]["crc32"].is_number_unsigned());
  EXPECT_THAT(ExpectLatest(store, 100), IsEmpty());
}

// A trainer left over from an earlier attempt of the job writes nothing once a later attempt has
// claimed the folder; the later attempt loads what the earlier one committed before that.
TEST_F(CheckpointStoreTest, LaterAttemptFencesOffAnEarlierOne) {
  CheckpointStore first(root_, 3, /*attempt=*/0);
  ASSERT_TRUE(first.Claim().ok());
  Commit(first, 100);
  CheckpointStore second(root_, 3, /*attempt=*/1);
  ASSERT_TRUE(second.Claim().ok());
  EXPECT_EQ(ScratchDir::Read(root_ + "/ATTEMPT"), "1\n");
  const absl::Status stale = first.Commit(200, files_for(200));
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  EXPECT_THAT(std::string(stale.message()), HasSubstr("attempt 1"));
  EXPECT_TRUE(absl::IsFailedPrecondition(first.Claim()));
  ExpectLatest(second, 100);
  Commit(second, 300);
  EXPECT_EQ(
      nlohmann::json::parse(ScratchDir::Read(second.PathOf(300) + "/manifest.json"))["attempt"], 1);
  // The lock and fence files are not checkpoints.
  EXPECT_THAT(ExpectLatest(CheckpointStore(root_, 3), 300), IsEmpty());
}

TEST_F(CheckpointStoreTest, KeepsTheNewest) {
  CheckpointStore store = Store(/*keep=*/2);
  for (int64_t step : {10, 20, 30}) Commit(store, step);
  EXPECT_THAT(listing(root_), ElementsAre("step-00000020", "step-00000030"));
  EXPECT_THAT(ExpectLatest(store, 30), IsEmpty());
}

TEST_F(CheckpointStoreTest, RecommittingAStepReplacesIt) {
  CheckpointStore store = Store();
  ASSERT_TRUE(store.Commit(5, {{"a", "old"}}).ok());
  Commit(store, 5);
  EXPECT_THAT(listing(root_), ElementsAre("step-00000005"));
  EXPECT_THAT(ExpectLatest(store, 5), IsEmpty());
}

TEST_F(CheckpointStoreTest, CorruptNewestFallsBackWithAWarning) {
  CheckpointStore store = Store();
  Commit(store, 1);
  Commit(store, 2);
  const std::string model = store.PathOf(2) + "/model.safetensors";
  std::string bytes = ScratchDir::Read(model);
  bytes[0] ^= 1;
  std::ofstream(model, std::ios::binary) << bytes;

  const auto warnings = ExpectLatest(store, 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], AllOf(HasSubstr("step-00000002"), HasSubstr("model.safetensors"),
                                 HasSubstr("CRC32")));
}

TEST_F(CheckpointStoreTest, TruncatedOrMissingFilesFallBack) {
  CheckpointStore store = Store(/*keep=*/4);
  for (int64_t step : {1, 2, 3}) Commit(store, step);
  fs::resize_file(store.PathOf(3) + "/optimizer.safetensors", 2);
  fs::remove(store.PathOf(2) + "/manifest.json");

  const auto warnings = ExpectLatest(store, 1);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_THAT(warnings[0],
              AllOf(HasSubstr("step-00000003"), HasSubstr("2 bytes, the manifest says")));
  EXPECT_THAT(warnings[1], AllOf(HasSubstr("step-00000002"), HasSubstr("manifest.json")));
}

TEST_F(CheckpointStoreTest, MalformedManifestFallsBack) {
  CheckpointStore store = Store();
  Commit(store, 1);
  Commit(store, 2);
  std::ofstream(store.PathOf(2) + "/manifest.json") << R"({"step": 2, "files": {"x": 3}})";
  const auto warnings = ExpectLatest(store, 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("manifest entry for 'x' is malformed"));
}

// A commit interrupted before its rename leaves only a .tmp directory: never loaded, and the next
// commit removes it.
TEST_F(CheckpointStoreTest, PartialCommitIsIgnored) {
  CheckpointStore store = Store();
  Commit(store, 1);
  fs::create_directory(store.PathOf(2) + ".tmp");
  std::ofstream(store.PathOf(2) + ".tmp/model.safetensors") << "half";
  EXPECT_THAT(ExpectLatest(store, 1), IsEmpty());

  Commit(store, 3);
  EXPECT_THAT(listing(root_), ElementsAre("step-00000001", "step-00000003"));
}

TEST_F(CheckpointStoreTest, NothingToLoad) {
  std::vector<std::string> warnings;
  EXPECT_TRUE(absl::IsNotFound(Store().LoadLatest(&warnings).status()));

  CheckpointStore store = Store();
  Commit(store, 1);
  fs::remove(store.PathOf(1) + "/model.safetensors");
  const absl::Status status = store.LoadLatest(&warnings).status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(root_));
  EXPECT_EQ(warnings.size(), 1u);
}

TEST_F(CheckpointStoreTest, RejectsFileNamesOutsideTheDirectory) {
  CheckpointStore store = Store();
  for (const char* name : {"../escape", "manifest.json", "", ".hidden"}) {
    const absl::Status status = store.Commit(1, {{name, "x"}});
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << name << ": " << status;
  }
  EXPECT_FALSE(fs::exists(root_));
}

TEST_F(CheckpointStoreTest, UnwritableRootNamesThePath) {
  const std::string file = scratch_.Write("not-a-directory", "x");
  CheckpointStore store(file + "/checkpoints", 2);
  const absl::Status status = store.Commit(1, files_for(1));
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(file));
}

}  // namespace
}  // namespace hyscale::trainer
