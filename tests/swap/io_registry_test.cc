// OpenIoBackend: names, "auto" probing, STRATA_IO_BACKEND, option checks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "strata/config.h"
#include "swap/direct_io.h"
#include "swap/io_backend.h"
#include "tests/testing/pattern.h"
#include "tests/testing/scoped_env.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

TEST(IoRegistryTest, AutoPicksTheFirstWorkingBackendInProbeOrder) {
  testing::ScopedEnv env("STRATA_IO_BACKEND", nullptr);
  testing::TempDir dir;
  Result<std::unique_ptr<IoBackend>> b = OpenIoBackend("auto", IoOptions{}, dir.path());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->name(), CompiledIoBackends().front());
}

TEST(IoRegistryTest, EnvironmentForcesABackendUnderAuto) {
  testing::ScopedEnv env("STRATA_IO_BACKEND", "posix");
  Result<std::unique_ptr<IoBackend>> b = OpenIoBackend("auto", IoOptions{});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->name(), "posix");
}

TEST(IoRegistryTest, ExplicitNameWinsOverEnvironment) {
  testing::ScopedEnv env("STRATA_IO_BACKEND", "aio");
  Result<std::unique_ptr<IoBackend>> b = OpenIoBackend("posix", IoOptions{});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->name(), "posix");
}

TEST(IoRegistryTest, UnknownOrUnavailableNamesAreErrorsNotFallbacks) {
  testing::ScopedEnv env("STRATA_IO_BACKEND", "floppy");
  Result<std::unique_ptr<IoBackend>> b = OpenIoBackend("auto", IoOptions{});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().ToString().find("STRATA_IO_BACKEND=floppy"), std::string::npos)
      << b.status().ToString();
  EXPECT_EQ(OpenIoBackend("floppy", IoOptions{}).status().code(), StatusCode::kInvalidArgument);
#if !STRATA_HAVE_URING
  EXPECT_EQ(OpenIoBackend("uring", IoOptions{}).status().code(), StatusCode::kUnavailable);
#endif
#if !STRATA_HAVE_AIO
  EXPECT_EQ(OpenIoBackend("aio", IoOptions{}).status().code(), StatusCode::kUnavailable);
#endif
}

TEST(IoRegistryTest, ProbeInMissingDirectoryMakesNamedBackendUnavailable) {
  Result<std::unique_ptr<IoBackend>> b =
      OpenIoBackend("posix", IoOptions{}, "/nonexistent/strata/dir");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(b.status().ToString().find("/nonexistent/strata/dir"), std::string::npos);
}

TEST(IoRegistryTest, OptionsAreValidated) {
  IoOptions o;
  EXPECT_TRUE(ValidateIoOptions(o).ok());
  o.block_size = 1000;
  EXPECT_EQ(ValidateIoOptions(o).code(), StatusCode::kInvalidArgument);
  o = IoOptions{};
  o.queue_depth = 0;
  EXPECT_EQ(ValidateIoOptions(o).code(), StatusCode::kInvalidArgument);
  o = IoOptions{};
  o.intra_op_parallelism = 0;
  EXPECT_EQ(ValidateIoOptions(o).code(), StatusCode::kInvalidArgument);
  o = IoOptions{};
  o.alignment = 3000;
  EXPECT_EQ(ValidateIoOptions(o).code(), StatusCode::kInvalidArgument);
  o = IoOptions{};
  o.queue_depth = 0;
  EXPECT_EQ(OpenIoBackend("posix", o).status().code(), StatusCode::kInvalidArgument);
}

TEST(IoRegistryTest, CapabilitiesAreReported) {
  for (const std::string& name : CompiledIoBackends()) {
    Result<std::unique_ptr<IoBackend>> b = OpenIoBackend(name, IoOptions{});
    if (!b.ok()) continue;  // blocked by the kernel: covered by the conformance skips
    EXPECT_TRUE((*b)->capabilities().direct_io) << name;
    EXPECT_GE((*b)->capabilities().max_queue_depth, 8u) << name;
    EXPECT_EQ((*b)->name(), name);
  }
}

TEST(IoRegistryTest, UringFixedBuffersAndFilesMoveTheSameBytes) {
  IoOptions o;
  o.register_buffers = true;
  o.block_size = 64 << 10;
  Result<std::unique_ptr<IoBackend>> b = OpenIoBackend("uring", o);
  if (!b.ok()) GTEST_SKIP() << "uring unavailable: " << b.status().ToString();
  EXPECT_TRUE((*b)->capabilities().fixed_buffers);
  testing::TempDir dir;
  const int fd = open(dir.File("fixed").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  Result<AlignedBuffer> out = AlignedBuffer::Allocate(256 << 10);
  Result<AlignedBuffer> in = AlignedBuffer::Allocate(256 << 10, 4096, true);
  ASSERT_TRUE(out.ok() && in.ok());
  testing::FillPattern(out->data(), out->size(), 77);
  const std::span<std::byte> regions[] = {out->span(), in->span()};
  ASSERT_TRUE((*b)->RegisterBuffers(regions).ok());
  const int fds[] = {fd};
  ASSERT_TRUE((*b)->RegisterFiles(fds).ok());
  ASSERT_TRUE((*b)->Write(fd, 0, out->span()).ok());
  ASSERT_TRUE((*b)->Read(fd, 0, in->span()).ok());
  EXPECT_EQ(std::memcmp(in->data(), out->data(), out->size()), 0);
  ASSERT_TRUE((*b)->RegisterBuffers({}).ok());
  ASSERT_TRUE((*b)->RegisterFiles({}).ok());
  b->reset();
  close(fd);
}

}  // namespace
}  // namespace strata
