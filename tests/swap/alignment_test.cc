// Alignment, splitting and direct-I/O probing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "swap/direct_io.h"
#include "swap/io_backend.h"
#include "swap/io_engine.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

TEST(SplitIntoBlocksTest, CutsAtBlockBoundariesAndOnlyTheLastPieceIsShort) {
  auto pieces = SplitIntoBlocks(4096, 10 * 4096 + 512, 4 * 4096);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].file_offset, 4096u);
  EXPECT_EQ(pieces[0].buffer_offset, 0u);
  EXPECT_EQ(pieces[0].length, 4u * 4096);
  EXPECT_EQ(pieces[1].file_offset, 4096u + 4 * 4096);
  EXPECT_EQ(pieces[1].buffer_offset, 4u * 4096);
  EXPECT_EQ(pieces[2].length, 2u * 4096 + 512);
  uint64_t total = 0;
  for (const auto& p : pieces) total += p.length;
  EXPECT_EQ(total, 10u * 4096 + 512);
}

TEST(SplitIntoBlocksTest, ExactMultipleAndEmpty) {
  EXPECT_EQ(SplitIntoBlocks(0, 8 << 20, 1 << 20).size(), 8u);
  EXPECT_TRUE(SplitIntoBlocks(0, 0, 1 << 20).empty());
  EXPECT_EQ(SplitIntoBlocks(0, 1, 1 << 20).size(), 1u);
}

TEST(AlignmentTest, CheckDirectAlignmentNamesWhatIsOff) {
  alignas(4096) static std::byte page[8192];
  EXPECT_TRUE(CheckDirectAlignment(page, 4096, 8192, 4096).ok());
  Status st = CheckDirectAlignment(page + 1, 0, 4096, 4096);
  EXPECT_NE(st.ToString().find("address"), std::string::npos);
  st = CheckDirectAlignment(page, 512, 4096, 4096);
  EXPECT_NE(st.ToString().find("offset 512"), std::string::npos);
  st = CheckDirectAlignment(page, 0, 4000, 4096);
  EXPECT_NE(st.ToString().find("length 4000"), std::string::npos);
}

TEST(AlignmentTest, AlignedBufferRoundsUpAndIsAligned) {
  Result<AlignedBuffer> b = AlignedBuffer::Allocate(5000, 4096, /*zero=*/true);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 8192u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
  EXPECT_EQ(b->data()[8191], std::byte{0});
  AlignedBuffer moved = std::move(b).value();
  EXPECT_EQ(moved.size(), 8192u);
  EXPECT_FALSE(AlignedBuffer::Allocate(10, 3000).ok());
}

TEST(DirectIoTest, ProbeFindsAtLeastFourKiBAlignment) {
  testing::TempDir dir;
  Result<DirectIoSupport> p = ProbeDirectIo(dir.path());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_GE(p->alignment, 4096u);
  EXPECT_GE(p->alignment, p->logical_block_size);
  EXPECT_EQ(p->alignment & (p->alignment - 1), 0u);
  if (!p->direct) {
    EXPECT_FALSE(p->reason.empty());
  }
  EXPECT_FALSE(ProbeDirectIo("/nonexistent/strata").ok());
}

TEST(DirectIoTest, RefusedDirectIoFallsBackWithWarningOrFailsWhenRequired) {
  testing::TempDir dir;
  const std::string why = dir.Mount("ramfs", "mode=0700");  // ramfs has no O_DIRECT
  if (!why.empty()) GTEST_SKIP() << why;
  Result<DirectIoSupport> p = ProbeDirectIo(dir.path());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  if (p->direct) GTEST_SKIP() << "this kernel's ramfs accepts O_DIRECT";
  EXPECT_NE(p->reason.find("O_DIRECT"), std::string::npos);

  Result<OpenedFile> f = OpenFileForIo(dir.File("a"), O_RDWR | O_CREAT, 0600, true, false);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE(f->direct);
  close(f->fd);
  Result<OpenedFile> g = OpenFileForIo(dir.File("b"), O_RDWR | O_CREAT, 0600, true, true);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(g.status().ToString().find("require_direct"), std::string::npos);
}

TEST(DirectIoTest, EngineRejectsMisalignedDirectRequestBeforeSubmitting) {
  testing::TempDir dir;
  Result<OpenedFile> f = OpenFileForIo(dir.File("d"), O_RDWR | O_CREAT, 0600, true, false);
  ASSERT_TRUE(f.ok());
  if (!f->direct) GTEST_SKIP() << "no O_DIRECT in " << dir.path();
  alignas(4096) static std::byte page[8192];
  IoRequest ok{IoOp::kWrite, f->fd, 4096, std::span<std::byte>(page, 4096), nullptr};
  EXPECT_TRUE(internal::ValidateRequest(ok, 4096).ok());
  IoRequest bad = ok;
  bad.offset = 2048;
  Status st = internal::ValidateRequest(bad, 4096);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.ToString().find(dir.File("d")), std::string::npos) << st.ToString();
  close(f->fd);
}

TEST(TransferTest, AdvanceContinuesShortTransfersAndRetriesTransientErrors) {
  std::byte buf[100];
  internal::Transfer t{IoOp::kWrite, 0, 1000, buf, 100, 0, 0};
  Status err;
  EXPECT_EQ(internal::AdvanceTransfer(t, 30, &err), internal::Step::kContinue);
  EXPECT_EQ(t.next_offset(), 1030u);
  EXPECT_EQ(t.next_data(), buf + 30);
  EXPECT_EQ(t.remaining(), 70u);
  EXPECT_EQ(internal::AdvanceTransfer(t, -EINTR, &err), internal::Step::kContinue);
  EXPECT_EQ(internal::AdvanceTransfer(t, -EAGAIN, &err), internal::Step::kContinue);
  EXPECT_EQ(internal::AdvanceTransfer(t, 70, &err), internal::Step::kDone);
  EXPECT_EQ(t.done, 100u);

  internal::Transfer r{IoOp::kRead, 0, 0, buf, 100, 0, 0};
  EXPECT_EQ(internal::AdvanceTransfer(r, 0, &err), internal::Step::kFailed);
  EXPECT_EQ(err.code(), StatusCode::kOutOfRange);

  internal::Transfer e{IoOp::kWrite, 0, 8192, buf, 100, 0, 0};
  EXPECT_EQ(internal::AdvanceTransfer(e, -EIO, &err), internal::Step::kFailed);
  EXPECT_EQ(err.sys_errno(), EIO);
  EXPECT_NE(err.ToString().find("offset 8192 length 100"), std::string::npos) << err.ToString();

  internal::Transfer over{IoOp::kWrite, 0, 0, buf, 100, 0, 0};
  EXPECT_EQ(internal::AdvanceTransfer(over, 200, &err), internal::Step::kFailed);
  EXPECT_EQ(err.code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace strata
