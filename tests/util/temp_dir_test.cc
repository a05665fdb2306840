#include "util/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <optional>
#include <string>

namespace hyscale::util {
namespace {

bool IsFolder(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// Sets $TMPDIR for its lifetime.
class ScopedTmpdir {
 public:
  explicit ScopedTmpdir(const std::string& value) {
    if (const char* old = ::getenv("TMPDIR")) saved_ = old;
    ::setenv("TMPDIR", value.c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (saved_) {
      ::setenv("TMPDIR", saved_->c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST(TempDirTest, IsAFreshFolderUnderTmpdirRemovedWithItsFiles) {
  const TempDir outer = TempDir::Create("util-temp").value();
  std::string path;
  {
    const TempDir dir = [&] {
      const ScopedTmpdir tmpdir(outer.path());
      return TempDir::Create("scratch").value();
    }();
    path = dir.path();
    EXPECT_EQ(path.rfind(outer.path() + "/scratch-", 0), 0u) << path;
    EXPECT_TRUE(IsFolder(path));
    EXPECT_EQ(dir.Path("a.txt"), path + "/a.txt");
    ::mkdir(dir.Path("sub").c_str(), 0755);
    std::ofstream(dir.Path("sub/a.txt")) << "x";
  }
  EXPECT_FALSE(IsFolder(path));
}

TEST(TempDirTest, TwoAreDistinct) {
  const TempDir a = TempDir::Create().value();
  const TempDir b = TempDir::Create().value();
  EXPECT_NE(a.path(), b.path());
}

TEST(TempDirTest, MovedOwnershipRemovesOnce) {
  TempDir first = TempDir::Create("util-temp").value();
  const std::string path = first.path();
  {
    const TempDir second = std::move(first);
    EXPECT_EQ(second.path(), path);
    EXPECT_TRUE(first.path().empty());  // NOLINT(bugprone-use-after-move): moved from on purpose
  }
  EXPECT_FALSE(IsFolder(path));
}

TEST(TempDirTest, AMissingTmpdirIsAnError) {
  const ScopedTmpdir tmpdir("/nonexistent/hyscale");
  const auto dir = TempDir::Create("x");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("/nonexistent/hyscale/x-"), std::string::npos);
}

}  // namespace
}  // namespace hyscale::util
