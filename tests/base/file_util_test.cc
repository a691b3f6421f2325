// base/file_util: whole writes and reads, atomic replacement (old or new contents, never a mix,
// no temporaries left behind), and errors that name the file and the errno. The trace writer is
// checked here too because it is file_util's simplest user.
#include "base/file_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/trace.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  testing::TempDir dir_{"strata-file-util-test"};
};

TEST_F(FileUtilTest, WriteFileAtomicallyReplacesWholeAndLeavesNoTemporary) {
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "latest", std::string(10000, 'a')).ok());
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "latest", "short").ok());
  EXPECT_EQ(ReadAll(dir_.File("latest")), "short");  // not "short" + the old tail
  EXPECT_EQ(Names(dir_.path()), std::vector<std::string>{"latest"});
}

TEST_F(FileUtilTest, AtomicFileWriterShowsNothingUntilCommitThenTheWholeFile) {
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "ids.bin", "old").ok());
  Result<AtomicFileWriter> w = AtomicFileWriter::Create(dir_.File("ids.bin"));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->tmp_path(), dir_.File("ids.bin.tmp"));
  ASSERT_TRUE(w->Append("new ").ok());
  ASSERT_TRUE(w->Append("contents", 8).ok());
  EXPECT_EQ(ReadAll(dir_.File("ids.bin")), "old");  // appends go to the temporary only
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(ReadAll(dir_.File("ids.bin")), "new contents");
  EXPECT_EQ(Names(dir_.path()), std::vector<std::string>{"ids.bin"});
  EXPECT_EQ(w->Append("x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Commit().code(), StatusCode::kFailedPrecondition);
}

TEST_F(FileUtilTest, AtomicFileWriterDestroyedWithoutCommitLeavesTheOldFile) {
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "config.json", "{}").ok());
  {
    Result<AtomicFileWriter> w = AtomicFileWriter::Create(dir_.File("config.json"));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(w->Append("{\"partial\"").ok());
    AtomicFileWriter moved = std::move(*w);  // the moved-from writer removes nothing
  }
  EXPECT_EQ(ReadAll(dir_.File("config.json")), "{}");
  EXPECT_EQ(Names(dir_.path()), std::vector<std::string>{"config.json"});
}

TEST_F(FileUtilTest, ModeIsHonoured) {
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "private", "x", 0600).ok());
  struct stat st {};
  ASSERT_EQ(::stat(dir_.File("private").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(FileUtilTest, FixedTemporaryOverwritesALeftoverAndIsGoneAfterwards) {
  const std::string tmp = dir_.File("manifest.json.tmp");
  {
    std::ofstream leftover(tmp);  // as a crash between create and rename would leave it
    leftover << std::string(5000, 'z');
  }
  ASSERT_TRUE(WriteFileAtomicallyVia(tmp, dir_.File("manifest.json"), "{}").ok());
  EXPECT_EQ(ReadAll(dir_.File("manifest.json")), "{}");
  EXPECT_FALSE(fs::exists(tmp));
}

TEST_F(FileUtilTest, FailedRenameKeepsTheTargetAndRemovesTheTemporary) {
  // A non-empty directory cannot be replaced by a file: one that appears after the writer was
  // created (an existing one is refused before anything is written, below).
  const std::string tmp = dir_.File("target.tmp");
  Status s;
  {
    Result<AtomicFileWriter> w = AtomicFileWriter::CreateVia(tmp, dir_.File("target"));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(MakeDirs(dir_.File("target/child")).ok());
    ASSERT_TRUE(w->Append("data").ok());
    s = w->Commit();
  }  // destroyed after the failed Commit: the temporary goes
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.sys_errno(), 0);
  EXPECT_NE(s.ToString().find("rename " + tmp + " to " + dir_.File("target")), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.ToString().find("(errno " + std::to_string(s.sys_errno()) + ")"), std::string::npos)
      << s.ToString();
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::is_directory(dir_.File("target/child")));
}

// A target that exists and is not a regular file (a directory, a FIFO, a symbolic link; a device
// node such as /dev/null, which root would otherwise replace machine-wide) is refused naming it and
// what it is, before any temporary is created; CheckOutputPath also refuses an input of the run.
TEST_F(FileUtilTest, TargetsThatAreNotRegularFilesAreNotReplaced) {
  ASSERT_TRUE(MakeDirs(dir_.File("dir")).ok());
  ASSERT_EQ(::mkfifo(dir_.File("fifo").c_str(), 0644), 0);
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "file", "kept").ok());
  fs::create_symlink(dir_.File("file"), dir_.File("link"));
  for (const auto& [name, kind] : std::vector<std::pair<std::string, std::string>>{
           {"dir", "a directory"}, {"fifo", "a FIFO"}, {"link", "a symbolic link"}}) {
    Status s = WriteFileAtomicallyVia(dir_.File(name + ".tmp"), dir_.File(name), "x");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.ToString().find(dir_.File(name) + " is " + kind), std::string::npos)
        << s.ToString();
    EXPECT_FALSE(fs::exists(dir_.File(name + ".tmp"))) << name;
  }
  EXPECT_TRUE(fs::is_fifo(dir_.File("fifo")));
  EXPECT_TRUE(fs::is_symlink(dir_.File("link")));
  EXPECT_EQ(CheckReplaceable("/dev/null").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckReplaceable(dir_.File("file")).ok());
  EXPECT_TRUE(CheckReplaceable(dir_.File("absent")).ok());

  Status input = CheckOutputPath(dir_.File("file"), "--trace", {{"--data", dir_.File("link")}});
  EXPECT_EQ(input.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(input.ToString().find("--trace " + dir_.File("file") + " is --data"), std::string::npos)
      << input.ToString();
  EXPECT_TRUE(CheckOutputPath(dir_.File("new"), "--trace", {{"--data", dir_.File("file")}}).ok());
  EXPECT_TRUE(CheckOutputPath("", "--trace", {{"--data", dir_.File("file")}}).ok());
}

TEST_F(FileUtilTest, MissingDirectoryIsNotFoundAndNamesThePath) {
  Status s = WriteFileAtomically(dir_.File("absent"), "f", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.ToString().find(dir_.File("absent") + "/.f.tmp-"), std::string::npos) << s.ToString();
}

TEST(FileUtilErrnoTest, FullDeviceIsAnIoErrorWithErrno) {
  Result<UniqueFd> fd = OpenFile("/dev/full", O_WRONLY);
  if (!fd.ok()) GTEST_SKIP() << "no /dev/full here: " << fd.status().ToString();
  const std::string data(1 << 16, 'x');
  Status s = WriteFully(fd->get(), data.data(), data.size(), "/dev/full");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.sys_errno(), ENOSPC);
  EXPECT_NE(s.ToString().find("write /dev/full"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("errno 28"), std::string::npos) << s.ToString();
}

TEST_F(FileUtilTest, ShortFileIsTruncatedDataLossWithCounts) {
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "short", std::string(100, 'q')).ok());
  Result<UniqueFd> fd = OpenFile(dir_.File("short"), O_RDONLY);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  std::string buf(64, '\0');
  ASSERT_TRUE(PreadFully(fd->get(), 36, buf.data(), 64, dir_.File("short")).ok());
  EXPECT_EQ(buf, std::string(64, 'q'));
  Status s = PreadFully(fd->get(), 50, buf.data(), 64, dir_.File("short"));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.ToString().find("truncated: expected 114 bytes, found 100"), std::string::npos)
      << s.ToString();
  EXPECT_TRUE(fd->Close(dir_.File("short")).ok());
  EXPECT_FALSE(fd->valid());
}

TEST_F(FileUtilTest, MakeDirsCreatesParentsAndRefusesAFile) {
  EXPECT_TRUE(MakeDirs(dir_.File("a/b/c")).ok());
  EXPECT_TRUE(MakeDirs(dir_.File("a/b/c")).ok());  // existing is fine
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "file", "x").ok());
  Status s = MakeDirs(dir_.File("file"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find(dir_.File("file")), std::string::npos) << s.ToString();
}

TEST_F(FileUtilTest, TraceIsWrittenWholeAndErrorsNameTheTraceFile) {
  TraceRecorder trace;
  trace.Enable();
  trace.Record("h2d", "copy", 10, 5);
  const std::string path = dir_.File("trace.json");
  ASSERT_TRUE(trace.WriteJson(path).ok());
  EXPECT_EQ(ReadAll(path), trace.ToJson());
  EXPECT_EQ(Names(dir_.path()), std::vector<std::string>{"trace.json"});

  Status s = trace.WriteJson(dir_.File("absent/trace.json"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("writing trace file " + dir_.File("absent/trace.json")),
            std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace strata
