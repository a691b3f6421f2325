// Each injected fault surfaces as the right error (or is absorbed: EAGAIN, short transfers), with
// a message naming the file, offset, length and errno, and the requests around it are unharmed.
// Run over every inner backend. Also: a real ENOSPC on a full (small tmpfs) filesystem.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "swap/direct_io.h"
#include "swap/fault_injecting_backend.h"
#include "swap/io_backend.h"
#include "swap/io_engine.h"
#include "tests/testing/pattern.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using testing::FillPattern;
using testing::TempDir;

constexpr size_t kRequest = 64 << 10;
constexpr int kRequests = 5;
constexpr int kFaulty = 2;  // the request index that gets the fault

class FaultInjectionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    IoOptions options;
    options.block_size = 16 << 10;  // several pieces per request
    options.queue_depth = 4;
    Result<std::unique_ptr<IoBackend>> inner = OpenIoBackend(GetParam(), options);
    if (!inner.ok()) GTEST_SKIP() << GetParam() << " unavailable: " << inner.status().ToString();
    io_ = std::make_unique<FaultInjectingBackend>(std::move(inner).value());
    Result<DirectIoSupport> probe = ProbeDirectIo(dir_.path());
    ASSERT_TRUE(probe.ok());
    path_ = dir_.File("data");
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (probe->direct ? O_DIRECT : 0), 0600);
    ASSERT_GE(fd_, 0);
    out_ = std::move(AlignedBuffer::Allocate(kRequests * kRequest).value());
    in_ = std::move(AlignedBuffer::Allocate(kRequests * kRequest, 4096, true).value());
    FillPattern(out_.data(), out_.size(), 42);
  }
  void TearDown() override {
    io_.reset();
    if (fd_ >= 0) close(fd_);
  }

  struct Outcome {
    Status status;
    size_t bytes;
  };

  // Submits kRequests requests of `op` at once (request i at offset i * kRequest) and waits.
  std::vector<Outcome> RunBatch(IoOp op) {
    AlignedBuffer& buf = op == IoOp::kWrite ? out_ : in_;
    std::vector<IoTicket> tickets;
    std::vector<int> calls(kRequests, 0);
    for (int i = 0; i < kRequests; ++i) {
      const size_t off = static_cast<size_t>(i) * kRequest;
      tickets.push_back(io_->Submit(
          {op, fd_, off, buf.span(off, kRequest), [&calls, i](Status, size_t) { ++calls[i]; }}));
    }
    std::vector<Outcome> out;
    for (auto& t : tickets) {
      Status st = t.Wait();
      out.push_back({st, t.bytes()});
    }
    for (int i = 0; i < kRequests; ++i) EXPECT_EQ(calls[i], 1) << "request " << i;
    return out;
  }

  // Writes everything without faults (request indices advance by kRequests).
  void WriteAllCleanly() {
    for (const Outcome& o : RunBatch(IoOp::kWrite)) ASSERT_TRUE(o.status.ok());
  }

  void ExpectOthersIntact(const std::vector<Outcome>& outcomes, IoOp op) {
    for (int i = 0; i < kRequests; ++i) {
      if (i == kFaulty) continue;
      EXPECT_TRUE(outcomes[i].status.ok())
          << "request " << i << ": " << outcomes[i].status.ToString();
      EXPECT_EQ(outcomes[i].bytes, kRequest);
    }
    // Check the unharmed requests' bytes on disk (or in memory for reads).
    if (op == IoOp::kWrite) {
      for (int i = 0; i < kRequests; ++i) {
        if (i == kFaulty) continue;
        const size_t off = static_cast<size_t>(i) * kRequest;
        ASSERT_EQ(pread(fd_, in_.data() + off, kRequest, static_cast<off_t>(off)),
                  static_cast<ssize_t>(kRequest));
      }
    }
    for (int i = 0; i < kRequests; ++i) {
      if (i == kFaulty) continue;
      const size_t off = static_cast<size_t>(i) * kRequest;
      EXPECT_EQ(std::memcmp(in_.data() + off, out_.data() + off, kRequest), 0) << "request " << i;
    }
  }

  TempDir dir_;
  std::unique_ptr<FaultInjectingBackend> io_;
  std::string path_;
  int fd_ = -1;
  AlignedBuffer out_, in_;
};

TEST_P(FaultInjectionTest, EioFailsOnlyItsRequestAndNamesFileOffsetLengthErrno) {
  io_->AddRule({.request = kFaulty, .kind = FaultKind::kEio});
  auto r = RunBatch(IoOp::kWrite);
  const Status& st = r[kFaulty].status;
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.sys_errno(), EIO);
  const std::string text = st.ToString();
  EXPECT_NE(text.find("write " + path_ + " offset " + std::to_string(kFaulty * kRequest) +
                      " length " + std::to_string(kRequest)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Input/output error (errno 5)"), std::string::npos) << text;
  EXPECT_NE(text.find("[injected]"), std::string::npos) << text;
  EXPECT_EQ(r[kFaulty].bytes, 0u);
  ExpectOthersIntact(r, IoOp::kWrite);
  EXPECT_EQ(io_->injected(), 1u);
}

TEST_P(FaultInjectionTest, EnospcAfterPartialWriteReportsBytesWrittenAndWhereItStopped) {
  io_->AddRule({.request = kFaulty, .kind = FaultKind::kEnospc, .after_bytes = 16384});
  auto r = RunBatch(IoOp::kWrite);
  const Status& st = r[kFaulty].status;
  EXPECT_EQ(st.sys_errno(), ENOSPC) << st.ToString();
  EXPECT_EQ(r[kFaulty].bytes, 16384u);
  const std::string text = st.ToString();
  EXPECT_NE(text.find("offset " + std::to_string(kFaulty * kRequest + 16384) + " length " +
                      std::to_string(kRequest - 16384)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("No space left on device (errno 28)"), std::string::npos) << text;
  ExpectOthersIntact(r, IoOp::kWrite);
}

TEST_P(FaultInjectionTest, EagainIsRetriedAndTheRequestSucceeds) {
  io_->AddRule({.request = kFaulty, .kind = FaultKind::kEagain, .times = 3});
  auto r = RunBatch(IoOp::kWrite);
  EXPECT_TRUE(r[kFaulty].status.ok()) << r[kFaulty].status.ToString();
  EXPECT_EQ(r[kFaulty].bytes, kRequest);
  EXPECT_EQ(io_->injected(), 3u);
  ASSERT_EQ(pread(fd_, in_.data(), in_.size(), 0), static_cast<ssize_t>(in_.size()));
  EXPECT_EQ(std::memcmp(in_.data(), out_.data(), out_.size()), 0);
}

TEST_P(FaultInjectionTest, PersistentEagainEventuallyFails) {
  io_->AddRule(
      {.request = kFaulty, .kind = FaultKind::kEagain, .times = internal::kMaxRetries + 1});
  auto r = RunBatch(IoOp::kWrite);
  EXPECT_EQ(r[kFaulty].status.sys_errno(), EAGAIN);
  EXPECT_NE(r[kFaulty].status.ToString().find("still failing"), std::string::npos);
  ExpectOthersIntact(r, IoOp::kWrite);
}

TEST_P(FaultInjectionTest, ShortTransfersAreContinuedNotTruncated) {
  WriteAllCleanly();
  io_->AddRule({.request = kRequests + kFaulty,
                .kind = FaultKind::kShortTransfer,
                .times = 5,
                .short_bytes = 4096});
  auto r = RunBatch(IoOp::kRead);
  EXPECT_TRUE(r[kFaulty].status.ok()) << r[kFaulty].status.ToString();
  EXPECT_EQ(r[kFaulty].bytes, kRequest);
  EXPECT_EQ(std::memcmp(in_.data(), out_.data(), in_.size()), 0);
  EXPECT_EQ(io_->injected(), 5u);
}

TEST_P(FaultInjectionTest, UnexpectedEndOfFileIsAnErrorForItsReadOnly) {
  WriteAllCleanly();
  io_->AddRule({.request = kRequests + kFaulty, .kind = FaultKind::kEof});
  auto r = RunBatch(IoOp::kRead);
  EXPECT_EQ(r[kFaulty].status.code(), StatusCode::kOutOfRange) << r[kFaulty].status.ToString();
  EXPECT_NE(r[kFaulty].status.ToString().find("unexpected end of file"), std::string::npos);
  ExpectOthersIntact(r, IoOp::kRead);
}

TEST_P(FaultInjectionTest, LatencyDelaysButDoesNotFail) {
  io_->AddRule({.request = kFaulty,
                .kind = FaultKind::kLatency,
                .latency = std::chrono::microseconds(20000)});
  auto r = RunBatch(IoOp::kWrite);
  EXPECT_TRUE(r[kFaulty].status.ok());
  EXPECT_EQ(io_->injected(), 1u);
  ExpectOthersIntact(r, IoOp::kWrite);
}

// Counts the bits in which `a` and `b` differ; `first` gets the index of the first such bit.
uint64_t DifferingBits(const std::byte* a, const std::byte* b, size_t bytes, uint64_t* first) {
  uint64_t n = 0;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned d = static_cast<unsigned>(a[i] ^ b[i]);
    for (int bit = 0; bit < 8; ++bit) {
      if ((d >> bit & 1u) == 0) continue;
      if (n++ == 0) *first = i * 8 + bit;
    }
  }
  return n;
}

TEST_P(FaultInjectionTest, FlippedWriteReachesTheDiskWithOneBitChangedAndSucceeds) {
  const uint64_t bit = 20000 * 8 + 5;  // in the second piece of the request
  io_->AddRule({.request = kFaulty, .kind = FaultKind::kFlip, .flip_bit = bit});
  auto r = RunBatch(IoOp::kWrite);
  for (const Outcome& o : r) EXPECT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(io_->injected(), 1u);
  // The caller's buffer is untouched.
  AlignedBuffer expected = std::move(AlignedBuffer::Allocate(out_.size()).value());
  FillPattern(expected.data(), expected.size(), 42);
  EXPECT_EQ(std::memcmp(expected.data(), out_.data(), out_.size()), 0);
  // On disk: one bit of the faulty request differs, nothing else.
  ASSERT_EQ(pread(fd_, in_.data(), in_.size(), 0), static_cast<ssize_t>(in_.size()));
  uint64_t first = 0;
  EXPECT_EQ(DifferingBits(in_.data(), out_.data(), in_.size(), &first), 1u);
  EXPECT_EQ(first, kFaulty * kRequest * 8 + bit);
}

TEST_P(FaultInjectionTest, FlippedReadDeliversOneBitChangedAndLeavesTheFile) {
  WriteAllCleanly();
  io_->AddRule({.request = kRequests + kFaulty, .kind = FaultKind::kFlip, .flip_bit = 3});
  auto r = RunBatch(IoOp::kRead);
  for (const Outcome& o : r) EXPECT_TRUE(o.status.ok()) << o.status.ToString();
  uint64_t first = 0;
  EXPECT_EQ(DifferingBits(in_.data(), out_.data(), in_.size(), &first), 1u);
  EXPECT_EQ(first, kFaulty * kRequest * 8 + 3);
  ASSERT_EQ(pread(fd_, in_.data(), in_.size(), 0), static_cast<ssize_t>(in_.size()));
  EXPECT_EQ(std::memcmp(in_.data(), out_.data(), in_.size()), 0);
}

// A rule naming a file counts only the requests to files whose name starts with it.
TEST_P(FaultInjectionTest, FileFilterCountsOnlyThatFilesRequests) {
  io_->AddRule({.request = 0, .kind = FaultKind::kEio, .op = IoOp::kWrite, .file = "other"});
  io_->AddRule({.request = 1, .kind = FaultKind::kEio, .op = IoOp::kWrite, .file = "dat"});
  auto r = RunBatch(IoOp::kWrite);  // all to dir/data: the 2nd of them fails, "other" never
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(r[i].status.ok(), i != 1) << i << ": " << r[i].status.ToString();
  }
  EXPECT_EQ(io_->injected(), 1u);
}

TEST_P(FaultInjectionTest, RealEnospcOnAFullFilesystemIsAnErrorNamingTheFile) {
  TempDir small;
  ASSERT_TRUE(small.ok());
  const std::string why = small.Mount("tmpfs", "size=1m,mode=0700");
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string path = small.File("full");
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  Result<AlignedBuffer> buf = AlignedBuffer::Allocate(2 << 20);
  ASSERT_TRUE(buf.ok());
  FillPattern(buf->data(), buf->size(), 1);
  IoTicket t = io_->Submit({IoOp::kWrite, fd, 0, buf->span(), nullptr});
  Status st = t.Wait();
  close(fd);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.sys_errno(), ENOSPC) << st.ToString();
  EXPECT_NE(st.ToString().find(path), std::string::npos) << st.ToString();
  EXPECT_LT(t.bytes(), buf->size());  // what fitted, reported; nothing claimed beyond it
}

INSTANTIATE_TEST_SUITE_P(AllBackends, FaultInjectionTest,
                         ::testing::Values("uring", "aio", "posix"));

}  // namespace
}  // namespace strata
