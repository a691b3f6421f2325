// STRATA_IO_FAULTS (swap/fault_spec.h): the grammar, and that OpenIoBackend honours it by counting
// reads and writes apart (FaultRule::op), so "eio:read:2" fails the second read however many
// writes came before it.
#include "swap/fault_spec.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "swap/direct_io.h"
#include "swap/io_backend.h"
#include "tests/testing/scoped_env.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

TEST(FaultSpecTest, ParsesRules) {
  Result<std::vector<FaultRule>> rules = ParseFaultSpec("eio:read:5,enospc:write:1,eagain:any:3");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  ASSERT_EQ(rules->size(), 3u);
  EXPECT_EQ((*rules)[0].kind, FaultKind::kEio);
  EXPECT_EQ((*rules)[0].op, IoOp::kRead);
  EXPECT_EQ((*rules)[0].request, 4u);  // N counts from 1, FaultRule::request from 0
  EXPECT_EQ((*rules)[1].kind, FaultKind::kEnospc);
  EXPECT_EQ((*rules)[1].op, IoOp::kWrite);
  EXPECT_EQ((*rules)[1].request, 0u);
  EXPECT_EQ((*rules)[2].kind, FaultKind::kEagain);
  EXPECT_FALSE((*rules)[2].op.has_value());
}

TEST(FaultSpecTest, ParsesFlipsAndFileFilters) {
  Result<std::vector<FaultRule>> rules =
      ParseFaultSpec("flip:write@optimizer:3,flip:read:1:7,eio:any@params:2");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  ASSERT_EQ(rules->size(), 3u);
  EXPECT_EQ((*rules)[0].kind, FaultKind::kFlip);
  EXPECT_EQ((*rules)[0].op, IoOp::kWrite);
  EXPECT_EQ((*rules)[0].file, "optimizer");
  EXPECT_EQ((*rules)[0].request, 2u);
  EXPECT_EQ((*rules)[0].flip_bit, 30u);  // the default
  EXPECT_EQ((*rules)[1].op, IoOp::kRead);
  EXPECT_EQ((*rules)[1].file, "");
  EXPECT_EQ((*rules)[1].flip_bit, 7u);
  EXPECT_EQ((*rules)[2].kind, FaultKind::kEio);
  EXPECT_FALSE((*rules)[2].op.has_value());
  EXPECT_EQ((*rules)[2].file, "params");
}

TEST(FaultSpecTest, RefusesBadRules) {
  for (const char* bad :
       {"", "eio", "eio:read", "eio:read:0", "eio:read:x", "eio:read:5x", "boom:read:1",
        "eio:sideways:1", "eio:read:1,", "eio:read:-1", "flip:write@:1", "flip:write@a/b:1",
        "flip:sideways@params:1", "eio:read:1:5", "flip:write:1:x", "flip:write:1:"}) {
    Result<std::vector<FaultRule>> r = ParseFaultSpec(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(FaultEnvTest, UnsetLeavesTheBackendAlone) {
  testing::ScopedEnv env(kIoFaultsEnv, nullptr);
  Result<std::unique_ptr<IoBackend>> io = OpenIoBackend("posix", IoOptions{});
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  EXPECT_EQ((*io)->name(), "posix");
}

TEST(FaultEnvTest, BadSpecNamesTheVariable) {
  testing::ScopedEnv env(kIoFaultsEnv, "eio:read:zero");
  Result<std::unique_ptr<IoBackend>> io = OpenIoBackend("posix", IoOptions{});
  ASSERT_FALSE(io.ok());
  EXPECT_EQ(io.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(io.status().message().find("STRATA_IO_FAULTS=eio:read:zero"), std::string_view::npos)
      << io.status().ToString();
}

TEST(FaultEnvTest, FailsTheNthReadAfterAnyNumberOfWrites) {
  testing::TempDir dir("strata-fault-spec-test");
  ASSERT_TRUE(dir.ok());
  testing::ScopedEnv env(kIoFaultsEnv, "eio:read:2");
  Result<std::unique_ptr<IoBackend>> opened = OpenIoBackend("posix", IoOptions{}, dir.path());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  IoBackend& io = **opened;
  EXPECT_EQ(io.name(), "fault(posix)");
  const int fd = open(dir.File("f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  Result<AlignedBuffer> buf = AlignedBuffer::Allocate(4096, 4096, /*zero=*/true);
  ASSERT_TRUE(buf.ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(io.Write(fd, 4096 * i, buf->span()).ok()) << i;
  EXPECT_TRUE(io.Read(fd, 0, buf->span()).ok());
  const Status second = io.Read(fd, 4096, buf->span());
  EXPECT_EQ(second.code(), StatusCode::kIoError) << second.ToString();
  EXPECT_EQ(second.sys_errno(), EIO);
  EXPECT_NE(second.message().find("[injected]"), std::string_view::npos);
  EXPECT_NE(second.message().find("offset 4096"), std::string_view::npos) << second.ToString();
  EXPECT_TRUE(io.Read(fd, 8192, buf->span()).ok());  // one request, not the ones after it
  EXPECT_TRUE(io.Write(fd, 0, buf->span()).ok());
  close(fd);
}

// flip:write@opt:2 through OpenIoBackend: writes to another file do not count; the second write
// to opt... reaches the disk with bit 30 flipped, and the caller's buffer is untouched.
TEST(FaultEnvTest, FlipsTheNthWriteToTheNamedFile) {
  testing::TempDir dir("strata-fault-spec-test");
  ASSERT_TRUE(dir.ok());
  testing::ScopedEnv env(kIoFaultsEnv, "flip:write@opt:2");
  Result<std::unique_ptr<IoBackend>> opened = OpenIoBackend("posix", IoOptions{}, dir.path());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  IoBackend& io = **opened;
  const int other = open(dir.File("params.swp").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  const int opt = open(dir.File("optimizer.swp").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(other, 0);
  ASSERT_GE(opt, 0);
  Result<AlignedBuffer> buf = AlignedBuffer::Allocate(4096, 4096, /*zero=*/true);
  ASSERT_TRUE(buf.ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(io.Write(other, 4096 * i, buf->span()).ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(io.Write(opt, 4096 * i, buf->span()).ok());
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(buf->data()[i], std::byte{0}) << i;
  unsigned char got[3] = {};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(pread(opt, &got[i], 1, 4096 * i + 3), 1);
    unsigned char in_other = 1;
    ASSERT_EQ(pread(other, &in_other, 1, 4096 * i + 3), 1);
    EXPECT_EQ(in_other, 0) << i;
  }
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], 0x40);  // bit 30 = byte 3, bit 6
  EXPECT_EQ(got[2], 0);
  close(other);
  close(opt);
}

}  // namespace
}  // namespace strata
