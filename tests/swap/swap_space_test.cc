// SwapSpace: private directory, preallocation, extents, stable ids, reopen, out-of-space refusal,
// cleanup (destructor and SIGTERM).
#include "swap/swap_space.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <set>

#include "swap/direct_io.h"
#include "swap/io_backend.h"
#include "tests/testing/pattern.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using testing::TempDir;

bool Exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

mode_t Mode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

TEST(SwapSpaceTest, PrivateRunDirectoryWithPreallocatedFilesRemovedAtDestruction) {
  TempDir parent;
  std::string dir;
  {
    Result<std::unique_ptr<SwapSpace>> s = SwapSpace::Create({.nvme_path = parent.path()});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    dir = (*s)->dir();
    EXPECT_EQ(Mode(dir), 0700u);
    EXPECT_GE((*s)->alignment(), 4096u);
    ASSERT_TRUE((*s)->Reserve("optimizer", 3 << 20).ok());
    const std::string file = dir + "/optimizer.swp";
    EXPECT_EQ(Mode(file), 0600u);
    struct stat st {};
    ASSERT_EQ(stat(file.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 3 << 20);
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 3u << 20);  // really allocated
    EXPECT_EQ((*s)->reserved_bytes("optimizer"), 3u << 20);
    EXPECT_EQ((*s)->Reserve("bad/kind", 4096).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(Exists(dir));
}

TEST(SwapSpaceTest, IdsAreStableHashesOfNames) {
  EXPECT_EQ(SwapSpace::IdForName("blocks.3.attn.qkv.weight/exp_avg"), 11524169929809285116ull);
  EXPECT_NE(SwapSpace::IdForName("blocks.3.attn.qkv.weight/exp_avg"),
            SwapSpace::IdForName("blocks.3.attn.qkv.weight/exp_avg_sq"));
  TempDir parent;
  auto s = SwapSpace::Create({.nvme_path = parent.path()}).value();
  SwapExtent e = s->Allocate("blocks.3.attn.qkv.weight/exp_avg", "optimizer", 1000).value();
  EXPECT_EQ(e.id, 11524169929809285116ull);
  EXPECT_EQ(s->FindById(e.id).value().offset, e.offset);
  EXPECT_EQ(s->Allocate("blocks.3.attn.qkv.weight/exp_avg", "optimizer", 10).status().code(),
            StatusCode::kAlreadyExists);
}

TEST(SwapSpaceTest, ExtentsArePaddedAlignedDisjointAndReused) {
  TempDir parent;
  auto s = SwapSpace::Create({.nvme_path = parent.path()}).value();
  const uint64_t a = s->alignment();
  std::vector<SwapExtent> extents;
  for (int i = 0; i < 6; ++i) {
    auto e = s->Allocate("t" + std::to_string(i), "params", 1000 + i * a);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->offset % a, 0u);
    EXPECT_EQ(e->padded_length % a, 0u);
    EXPECT_GE(e->padded_length, e->length);
    EXPECT_LT(e->padded_length - e->length, a);
    extents.push_back(*e);
  }
  for (size_t i = 0; i < extents.size(); ++i) {
    for (size_t j = i + 1; j < extents.size(); ++j) {
      const bool disjoint = extents[i].offset + extents[i].padded_length <= extents[j].offset ||
                            extents[j].offset + extents[j].padded_length <= extents[i].offset;
      EXPECT_TRUE(disjoint) << i << " " << j;
    }
  }
  // Free two neighbours: they coalesce and a bigger extent fits in the hole (first fit).
  ASSERT_TRUE(s->Free("t1").ok());
  ASSERT_TRUE(s->Free("t2").ok());
  auto big = s->Allocate("big", "params", extents[1].padded_length + extents[2].padded_length);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->offset, extents[1].offset);
  EXPECT_EQ(s->Free("nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(s->Find("t1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s->Allocate("zero", "params", 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(SwapSpaceTest, ReopenFindsTheSameExtentsAndData) {
  TempDir parent;
  std::string dir;
  SwapExtent before;
  Result<AlignedBuffer> out = AlignedBuffer::Allocate(64 << 10);
  ASSERT_TRUE(out.ok());
  testing::FillPattern(out->data(), out->size(), 5);
  auto io = OpenIoBackend("posix", IoOptions{}).value();
  {
    auto s = SwapSpace::Create({.nvme_path = parent.path(), .keep_files = true}).value();
    dir = s->dir();
    ASSERT_TRUE(s->Allocate("layer0/param", "params", 5000).ok());
    before = s->Allocate("layer1/exp_avg", "optimizer", 60000).value();
    ASSERT_TRUE(io->Write(before.fd, before.offset, out->span(0, before.padded_length)).ok());
    ASSERT_TRUE(s->Sync().ok());
    ASSERT_TRUE(s->SaveManifest().ok());
  }
  ASSERT_TRUE(Exists(dir + "/optimizer.swp"));
  {
    auto s = SwapSpace::Open(dir, {}).value();
    EXPECT_EQ(s->extent_count(), 2u);
    SwapExtent after = s->Find("layer1/exp_avg").value();
    EXPECT_EQ(after.id, before.id);
    EXPECT_EQ(after.offset, before.offset);
    EXPECT_EQ(after.length, before.length);
    Result<AlignedBuffer> in = AlignedBuffer::Allocate(after.padded_length, 4096, true);
    ASSERT_TRUE(io->Read(after.fd, after.offset, in->span()).ok());
    EXPECT_EQ(std::memcmp(in->data(), out->data(), after.length), 0);
    // New allocations do not overlap the restored ones.
    SwapExtent fresh = s->Allocate("layer2/exp_avg", "optimizer", 4096).value();
    EXPECT_GE(fresh.offset, after.offset + after.padded_length);
    EXPECT_FALSE(s->keep_files());  // reopened without keep_files: removed at destruction
  }
  EXPECT_FALSE(Exists(dir));
}

TEST(SwapSpaceTest, OutOfSpaceIsRefusedBeforeAllocatingWithNeededAndAvailableBytes) {
  TempDir parent;
  auto s = SwapSpace::Create({.nvme_path = parent.path()}).value();
  // More than any disk here: the statvfs pre-check refuses it without touching the disk.
  Status st = s->Reserve("optimizer", uint64_t{1} << 60);
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.ToString().find("needs 1152921504606846976 bytes"), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.ToString().find("are available"), std::string::npos) << st.ToString();
  EXPECT_EQ(s->Allocate("huge", "optimizer", uint64_t{1} << 60).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(SwapSpaceTest, SmallFilesystemFillsUpWithAClearRefusal) {
  TempDir parent;
  const std::string why = parent.Mount("tmpfs", "size=8m,mode=0700");
  if (!why.empty()) GTEST_SKIP() << why;
  auto s = SwapSpace::Create({.nvme_path = parent.path()}).value();
  ASSERT_TRUE(s->Reserve("params", 4 << 20).ok());
  Status st = s->Reserve("params", 16 << 20);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.ToString().find("needs 12582912 bytes"), std::string::npos) << st.ToString();
  EXPECT_EQ(s->reserved_bytes("params"), 4u << 20);  // unchanged
  int ok = 0;
  Status last;
  for (int i = 0; i < 16; ++i) {
    auto e = s->Allocate("x" + std::to_string(i), "params", 1 << 20);
    if (!e.ok()) {
      last = e.status();
      break;
    }
    ++ok;
  }
  EXPECT_GE(ok, 4);
  EXPECT_LE(ok, 8);
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted) << last.ToString();
}

TEST(SwapSpaceTest, SigtermRemovesTheRunDirectory) {
  TempDir parent;
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    auto s = SwapSpace::Create({.nvme_path = parent.path()});
    if (!s.ok() || !(*s)->Reserve("params", 1 << 20).ok()) _exit(3);
    const std::string dir = (*s)->dir();
    if (write(pipefd[1], dir.c_str(), dir.size()) != static_cast<ssize_t>(dir.size())) _exit(4);
    close(pipefd[1]);
    raise(SIGTERM);
    _exit(5);  // not reached: the handler re-raises with the default action
  }
  close(pipefd[1]);
  char buf[1024] = {};
  const ssize_t n = read(pipefd[0], buf, sizeof(buf) - 1);
  close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_GT(n, 0) << "child failed, status " << status;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  EXPECT_FALSE(Exists(buf)) << buf;
}

TEST(SwapSpaceTest, KeptFilesSurviveAndRunNameMustBeNew) {
  TempDir parent;
  {
    auto s = SwapSpace::Create({.nvme_path = parent.path(), .run_name = "ckpt"}).value();
    ASSERT_TRUE(s->Reserve("params", 4096).ok());
    s->set_keep_files(true);
  }
  EXPECT_TRUE(Exists(parent.File("ckpt/params.swp")));
  auto again = SwapSpace::Create({.nvme_path = parent.path(), .run_name = "ckpt"});
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(SwapSpace::Create({.nvme_path = parent.File("missing")}).status().code(),
            StatusCode::kIoError);
  EXPECT_EQ(SwapSpace::Open(parent.File("ckpt"), {}).status().code(), StatusCode::kNotFound)
      << "no manifest was saved";
}

}  // namespace
}  // namespace strata
