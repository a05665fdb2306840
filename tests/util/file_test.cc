#include "util/file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "util/temp_dir.h"

namespace hyscale::util {
namespace {

bool Exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

class FileTest : public ::testing::Test {
 protected:
  TempDir dir_ = TempDir::Create("util-file").value();
};

TEST_F(FileTest, AtomicWriteReplacesTheWholeFileAndLeavesNoTemporary) {
  const std::string path = dir_.Path("doc.json");
  ASSERT_TRUE(WriteFileAtomically(path, "first version, the longer one\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second\n").ok());
  EXPECT_EQ(ReadFile(path).value(), "second\n");
  EXPECT_FALSE(Exists(path + ".tmp"));
}

TEST_F(FileTest, AtomicWriteIntoAMissingFolderFailsNamingThePathAndKeepsNothing) {
  const std::string path = dir_.Path("missing/doc.json");
  const absl::Status status = WriteFileAtomically(path, "x");
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(path), std::string::npos) << status;
  EXPECT_FALSE(Exists(path + ".tmp"));
}

TEST_F(FileTest, AtomicWriteOverAFolderFailsAndRemovesItsTemporary) {
  const std::string path = dir_.Path("folder");
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  ::mkdir((path + "/inside").c_str(), 0755);  // rename(2) cannot replace a non-empty folder
  EXPECT_FALSE(WriteFileAtomically(path, "x").ok());
  EXPECT_FALSE(Exists(path + ".tmp"));
}

TEST_F(FileTest, DurableWriteTruncatesAndReadFileReadsBinary) {
  const std::string path = dir_.Path("bytes");
  ASSERT_TRUE(WriteFileDurably(path, "a long first content").ok());
  const std::string binary("\0\x01\xff tail", 8);
  ASSERT_TRUE(WriteFileDurably(path, binary).ok());
  EXPECT_EQ(ReadFile(path).value(), binary);
}

TEST_F(FileTest, ReadFileOfAMissingFileIsNotFound) {
  const auto read = ReadFile(dir_.Path("absent"));
  EXPECT_TRUE(absl::IsNotFound(read.status())) << read.status();
  EXPECT_NE(read.status().message().find("absent"), std::string::npos);
}

TEST_F(FileTest, FsyncDirectoryNeedsADirectory) {
  EXPECT_TRUE(FsyncDirectory(dir_.path()).ok());
  std::ofstream(dir_.Path("file")) << "x";
  EXPECT_FALSE(FsyncDirectory(dir_.Path("file")).ok());
}

TEST_F(FileTest, RemoveTreeRemovesEverythingBelowButNotWhatLinksPointTo) {
  const TempDir outside = TempDir::Create("util-file-outside").value();
  std::ofstream(outside.Path("kept")) << "kept";
  const std::string tree = dir_.Path("tree");
  ASSERT_EQ(::mkdir(tree.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tree + "/sub").c_str(), 0755), 0);
  std::ofstream(tree + "/sub/file") << "x";
  ASSERT_EQ(::symlink(outside.path().c_str(), (tree + "/link").c_str()), 0);
  RemoveTree(tree);
  EXPECT_FALSE(Exists(tree));
  EXPECT_TRUE(Exists(outside.Path("kept")));
  RemoveTree(tree);  // nothing there: nothing happens
}

TEST(UniqueFdTest, ClosesOnceWhenDestroyedOrMoved) {
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  UniqueFd write_end(ends[1]);
  {
    UniqueFd read_end(ends[0]);
    UniqueFd moved = std::move(read_end);
    EXPECT_FALSE(read_end.valid());  // NOLINT(bugprone-use-after-move): moved from on purpose
    EXPECT_EQ(moved.get(), ends[0]);
  }
  EXPECT_EQ(::fcntl(ends[0], F_GETFD), -1);  // closed by `moved`
  EXPECT_EQ(write_end.Close(), 0);
  EXPECT_FALSE(write_end.valid());
}

}  // namespace
}  // namespace hyscale::util
