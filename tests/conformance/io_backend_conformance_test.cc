// The IoBackend contract (swap/io_backend.h), run on every backend compiled into this build
// (CompiledIoBackends(): some of "uring", "aio", and "posix") and on the fault injector with no
// rules (wrapping posix). A compiled backend that the kernel or container refuses skips with the
// reason.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "swap/direct_io.h"
#include "swap/fault_injecting_backend.h"
#include "swap/io_backend.h"
#include "tests/testing/pattern.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using testing::FillPattern;
using testing::TempDir;

struct Config {
  std::string backend;  // "uring", "aio", "posix", "fault"
  IoOptions options;
  std::string label;
};

Result<std::unique_ptr<IoBackend>> OpenForTest(const std::string& name, const IoOptions& options) {
  if (name == "fault") {
    STRATA_ASSIGN_OR_RETURN(auto inner, OpenIoBackend("posix", options));
    return std::unique_ptr<IoBackend>(std::make_unique<FaultInjectingBackend>(std::move(inner)));
  }
  return OpenIoBackend(name, options);
}

class ConformanceTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    Result<std::unique_ptr<IoBackend>> b = OpenForTest(GetParam().backend, GetParam().options);
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kUnavailable ||
          b.status().code() == StatusCode::kIoError) {
        GTEST_SKIP() << "backend " << GetParam().backend
                     << " unavailable here: " << b.status().ToString();
      }
      FAIL() << b.status().ToString();
    }
    backend_ = std::move(b).value();
    Result<DirectIoSupport> probe = ProbeDirectIo(dir_.path());
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    direct_ = probe->direct;
  }

  // Opens a fresh file in the test directory, O_DIRECT when the filesystem allows it.
  int OpenFile(const std::string& name, bool direct, int flags = O_RDWR | O_CREAT) {
    const int fd =
        open(dir_.File(name).c_str(), flags | O_CLOEXEC | (direct && direct_ ? O_DIRECT : 0), 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    fds_.push_back(fd);
    return fd;
  }

  void TearDown() override {
    backend_.reset();
    for (int fd : fds_) close(fd);
  }

  AlignedBuffer Buffer(size_t n, uint64_t seed) {
    Result<AlignedBuffer> b = AlignedBuffer::Allocate(n, 4096);
    EXPECT_TRUE(b.ok());
    FillPattern(b->data(), b->size(), seed);
    return std::move(b).value();
  }

  TempDir dir_;
  std::unique_ptr<IoBackend> backend_;
  bool direct_ = false;
  std::vector<int> fds_;
};

TEST_P(ConformanceTest, WritesAndReadsBackExactBytesAcrossBlockBoundaries) {
  const int fd = OpenFile("data", /*direct=*/true);
  // Sizes around the block size (256 KiB in these configs): one page, exact, not a multiple.
  for (size_t n :
       {size_t{4096}, size_t{256} << 10, (size_t{1} << 20) + 3 * 4096, size_t{3} << 20}) {
    AlignedBuffer out = Buffer(n, n);
    AlignedBuffer in = Buffer(n, 0);
    const uint64_t offset = 8 * 4096;
    ASSERT_TRUE(backend_->Write(fd, offset, out.span()).ok());
    IoTicket t = backend_->Submit({IoOp::kRead, fd, offset, in.span(), nullptr});
    ASSERT_TRUE(t.Wait().ok());
    EXPECT_EQ(t.bytes(), n);
    EXPECT_EQ(std::memcmp(in.data(), out.data(), n), 0) << "size " << n;
  }
}

TEST_P(ConformanceTest, CallbackRunsExactlyOnceBeforeTicketIsReady) {
  const int fd = OpenFile("data", true);
  AlignedBuffer buf = Buffer(size_t{1} << 20, 1);
  std::atomic<int> calls{0};
  std::atomic<size_t> seen_bytes{0};
  IoTicket t = backend_->Submit({IoOp::kWrite, fd, 0, buf.span(), [&](Status st, size_t bytes) {
                                   EXPECT_TRUE(st.ok()) << st.ToString();
                                   seen_bytes = bytes;
                                   calls.fetch_add(1);
                                 }});
  ASSERT_TRUE(t.valid());
  ASSERT_TRUE(t.Wait().ok());
  EXPECT_TRUE(t.Ready());
  EXPECT_EQ(calls.load(), 1);  // the callback has returned when the ticket is ready
  EXPECT_EQ(seen_bytes.load(), buf.size());
  EXPECT_EQ(t.bytes(), buf.size());
  EXPECT_TRUE(t.Wait().ok());  // waiting again is fine
}

TEST_P(ConformanceTest, ManyThreadsSubmittingIndependentRequests) {
  const int fd = OpenFile("data", true);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 16;
  constexpr size_t kSize = 64 << 10;
  AlignedBuffer out = Buffer(kThreads * kPerThread * kSize, 7);
  AlignedBuffer in = Buffer(out.size(), 0);
  std::atomic<int> callbacks{0};
  auto run = [&](IoOp op, AlignedBuffer& buf) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<IoTicket> tickets;
        for (int i = 0; i < kPerThread; ++i) {
          const size_t off = (static_cast<size_t>(t) * kPerThread + i) * kSize;
          tickets.push_back(
              backend_->Submit({op, fd, off, buf.span(off, kSize), [&](Status st, size_t n) {
                                  EXPECT_TRUE(st.ok()) << st.ToString();
                                  EXPECT_EQ(n, kSize);
                                  callbacks.fetch_add(1);
                                }}));
        }
        for (auto& ticket : tickets) EXPECT_TRUE(ticket.Wait().ok());
      });
    }
    for (auto& th : threads) th.join();
  };
  run(IoOp::kWrite, out);
  run(IoOp::kRead, in);
  EXPECT_EQ(callbacks.load(), 2 * kThreads * kPerThread);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
}

TEST_P(ConformanceTest, ReadPastEndOfFileIsAnErrorNotZeros) {
  const int fd = OpenFile("short", true);
  AlignedBuffer out = Buffer(8192, 3);
  ASSERT_TRUE(backend_->Write(fd, 0, out.span()).ok());
  AlignedBuffer in = Buffer(16384, 0);
  IoTicket t = backend_->Submit({IoOp::kRead, fd, 0, in.span(), nullptr});
  Status st = t.Wait();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_NE(st.ToString().find("end of file"), std::string::npos) << st.ToString();
  EXPECT_NE(st.ToString().find(dir_.File("short")), std::string::npos) << st.ToString();
  EXPECT_EQ(t.bytes(), 8192u);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), 8192), 0);

  // Entirely past the end: nothing moves.
  IoTicket t2 = backend_->Submit({IoOp::kRead, fd, 1 << 20, in.span(0, 4096), nullptr});
  EXPECT_EQ(t2.Wait().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(t2.bytes(), 0u);
}

TEST_P(ConformanceTest, KernelErrorsNameFileOffsetLengthAndErrno) {
  const int ro = OpenFile("readonly", true, O_RDONLY | O_CREAT);
  AlignedBuffer buf = Buffer(8192, 4);
  Status st = backend_->Write(ro, 4096, buf.span());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.sys_errno(), EBADF);
  const std::string text = st.ToString();
  EXPECT_NE(text.find("write " + dir_.File("readonly")), std::string::npos) << text;
  EXPECT_NE(text.find("offset 4096"), std::string::npos) << text;
  EXPECT_NE(text.find("length 8192"), std::string::npos) << text;
  EXPECT_NE(text.find("errno 9"), std::string::npos) << text;
}

TEST_P(ConformanceTest, RejectsBadRequestsOnTheCallingThread) {
  AlignedBuffer buf = Buffer(4096, 5);
  int calls = 0;
  IoTicket t = backend_->Submit({IoOp::kRead, -1, 0, buf.span(), [&](Status st, size_t n) {
                                   EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
                                   EXPECT_EQ(n, 0u);
                                   ++calls;
                                 }});
  EXPECT_EQ(calls, 1);  // ran before Submit returned
  EXPECT_TRUE(t.Ready());

  const int closed = open(dir_.File("closed").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(closed, 0);
  close(closed);
  Status st = backend_->Read(closed, 0, buf.span());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.sys_errno(), EBADF);
}

TEST_P(ConformanceTest, DirectIoRequiresAlignmentAndSaysWhich) {
  if (!direct_) GTEST_SKIP() << "O_DIRECT not supported in " << dir_.path();
  const int fd = OpenFile("direct", true);
  AlignedBuffer buf = Buffer(3 * 4096, 6);
  Status st = backend_->Write(fd, 100, buf.span(0, 4096));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.ToString().find("offset 100"), std::string::npos) << st.ToString();
  st = backend_->Write(fd, 0, buf.span(0, 1000));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.ToString().find("length"), std::string::npos) << st.ToString();
  st = backend_->Write(fd, 0, std::span<std::byte>(buf.data() + 512, 4096));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.ToString().find("address"), std::string::npos) << st.ToString();
}

TEST_P(ConformanceTest, BufferedFilesAcceptUnalignedRequests) {
  const int fd = OpenFile("buffered", /*direct=*/false);
  std::vector<std::byte> out(300000), in(300000);
  FillPattern(out.data(), out.size(), 9);
  ASSERT_TRUE(backend_->Write(fd, 17, out).ok());
  ASSERT_TRUE(backend_->Read(fd, 17, in).ok());
  EXPECT_EQ(in, out);
}

TEST_P(ConformanceTest, EmptyRequestCompletesAtOnce) {
  const int fd = OpenFile("empty", true);
  int calls = 0;
  IoTicket t = backend_->Submit({IoOp::kRead, fd, 0, {}, [&](Status st, size_t n) {
                                   EXPECT_TRUE(st.ok());
                                   EXPECT_EQ(n, 0u);
                                   ++calls;
                                 }});
  EXPECT_TRUE(t.Ready());
  EXPECT_EQ(calls, 1);
}

TEST_P(ConformanceTest, CallbackMaySubmitMoreWork) {
  const int fd = OpenFile("chain", true);
  AlignedBuffer out = Buffer(4 * 65536, 10);
  AlignedBuffer in = Buffer(out.size(), 0);
  std::mutex mu;
  IoTicket second;
  IoTicket first =
      backend_->Submit({IoOp::kWrite, fd, 0, out.span(), [&](Status st, size_t) {
                          ASSERT_TRUE(st.ok());
                          std::lock_guard<std::mutex> lock(mu);
                          second = backend_->Submit({IoOp::kRead, fd, 0, in.span(), nullptr});
                        }});
  ASSERT_TRUE(first.Wait().ok());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_TRUE(second.valid());
  ASSERT_TRUE(second.Wait().ok());
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
}

TEST_P(ConformanceTest, DestructorWaitsForRequestsInFlight) {
  const int fd = OpenFile("drain", true);
  AlignedBuffer buf = Buffer(size_t{4} << 20, 11);
  std::atomic<int> done{0};
  for (int i = 0; i < 8; ++i) {
    backend_->Submit({IoOp::kWrite, fd, static_cast<uint64_t>(i) * (512 << 10),
                      buf.span(static_cast<size_t>(i) * (512 << 10), 512 << 10),
                      [&](Status st, size_t) {
                        EXPECT_TRUE(st.ok());
                        done.fetch_add(1);
                      }});
  }
  backend_.reset();  // tickets dropped; destruction must still deliver every callback
  EXPECT_EQ(done.load(), 8);
}

std::vector<Config> Configs() {
  std::vector<Config> out;
  std::vector<std::string> names = CompiledIoBackends();
  names.push_back("fault");
  for (const std::string& name : names) {
    IoOptions base;
    base.block_size = 256 << 10;
    base.queue_depth = 4;
    out.push_back({name, base, name + "_window"});
    IoOptions multi = base;
    multi.intra_op_parallelism = 3;
    multi.single_submit = true;
    out.push_back({name, multi, name + "_3threads_single_submit"});
    IoOptions batches = base;
    batches.overlap_events = false;
    batches.queue_depth = 2;
    out.push_back({name, batches, name + "_sequential_batches"});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllBackends, ConformanceTest, ::testing::ValuesIn(Configs()),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return info.param.label;
                         });

}  // namespace
}  // namespace strata
