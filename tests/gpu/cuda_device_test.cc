// CudaDevice and the gpu/ kernels. Every test skips, with the CUDA error as the reason, where no
// usable GPU is present (CUDA errors 34, 35, 100): that is the normal case on CI machines.
#include "gpu/cuda_device.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gpu/kernels.h"
#include "tiers/pinned_arena.h"

namespace strata {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = CudaDevice::Open({.ordinal = 0, .budget_bytes = 256 << 20});
    if (!dev.ok()) {
      if (dev.status().code() == StatusCode::kUnavailable) {
        GTEST_SKIP() << dev.status().message();
      }
      FAIL() << dev.status().ToString();
    }
    dev_ = std::move(*dev);
    auto s = dev_->CreateStream("test");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stream_ = std::move(*s);
  }
  void TearDown() override {
    stream_.reset();
    dev_.reset();
  }

  template <typename T>
  std::vector<T> Download(const DeviceMemory& mem, size_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(
        dev_->CopyAsync(out.data(), mem.data(), n * sizeof(T), CopyKind::kDeviceToHost, *stream_)
            .ok());
    EXPECT_TRUE(dev_->Synchronize(*stream_).ok());
    return out;
  }
  template <typename T>
  DeviceMemory Upload(const std::vector<T>& v) {
    auto mem = dev_->Allocate(std::max<size_t>(v.size() * sizeof(T), 8));
    EXPECT_TRUE(mem.ok());
    EXPECT_TRUE(dev_->CopyAsync(mem->data(), v.data(), v.size() * sizeof(T),
                                CopyKind::kHostToDevice, *stream_)
                    .ok());
    return std::move(*mem);
  }

  std::unique_ptr<CudaDevice> dev_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(CudaDeviceTest, RoundTripFromPinnedArenaAndBudget) {
  auto arena = PinnedArena::Create({.bytes = 8 << 20, .device = dev_.get()});
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  auto buf = (*arena)->Allocate(4 << 20);
  ASSERT_TRUE(buf.ok());
  for (size_t i = 0; i < buf->size(); ++i) buf->data()[i] = std::byte(i * 7);
  auto mem = dev_->Allocate(buf->size());
  ASSERT_TRUE(mem.ok());
  std::vector<std::byte> back(buf->size());
  ASSERT_TRUE(
      dev_->CopyAsync(mem->data(), buf->data(), buf->size(), CopyKind::kHostToDevice, *stream_)
          .ok());
  ASSERT_TRUE(
      dev_->CopyAsync(back.data(), mem->data(), buf->size(), CopyKind::kDeviceToHost, *stream_)
          .ok());
  auto ev = dev_->RecordEvent(*stream_);
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(ev->Wait().ok());
  EXPECT_EQ(std::memcmp(back.data(), buf->data(), buf->size()), 0);
  auto too_big = dev_->Allocate(300 << 20);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
}

// The tier manager allocates, frees and copies from completion callbacks. CUDA forbids CUDA calls
// on its own callback thread (cudaFreeAsync there fails with error 800), so host functions must
// run where they may call CUDA, and still in stream order.
TEST_F(CudaDeviceTest, HostFunctionsMayCallCudaAndRunInStreamOrder) {
  auto held = dev_->Allocate(1 << 20);
  ASSERT_TRUE(held.ok());
  std::vector<int> order;
  Status in_callback = InternalError("callback did not run");
  ASSERT_TRUE(dev_->LaunchHostFunc(*stream_, [&] { order.push_back(1); }).ok());
  ASSERT_TRUE(dev_->LaunchHostFunc(*stream_,
                                   [&] {
                                     held->Reset();                         // cudaFreeAsync
                                     auto fresh = dev_->Allocate(2 << 20);  // cudaMallocAsync
                                     in_callback = fresh.ok() ? Status::Ok() : fresh.status();
                                     order.push_back(2);
                                   })
                  .ok());
  ASSERT_TRUE(dev_->Synchronize(*stream_).ok());  // waits for the host functions too
  EXPECT_TRUE(in_callback.ok()) << in_callback.ToString();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(dev_->used_bytes(), 0u);  // both the freed and the callback's own block are gone
}

TEST_F(CudaDeviceTest, CastsRoundToNearestEven) {
  std::vector<float> x = {1.0f,    -2.5f, 1.00390625f /* 1 + 2^-8: bf16 tie */,
                          65504.f, 1e-8f, std::numeric_limits<float>::quiet_NaN(),
                          INFINITY};
  DeviceMemory in = Upload(x);
  auto bf = dev_->Allocate(x.size() * 2);
  auto back = dev_->Allocate(x.size() * 4);
  ASSERT_TRUE(bf.ok() && back.ok());
  void* s = CudaStreamHandle(*stream_);
  ASSERT_TRUE(
      gpu::Cast(in.data(), DType::kFloat32, bf->data(), DType::kBFloat16, x.size(), s).ok());
  ASSERT_TRUE(
      gpu::Cast(bf->data(), DType::kBFloat16, back->data(), DType::kFloat32, x.size(), s).ok());
  auto r = Download<float>(*back, x.size());
  EXPECT_EQ(r[0], 1.0f);
  EXPECT_EQ(r[1], -2.5f);
  EXPECT_EQ(r[2], 1.0f);  // tie rounds to even mantissa
  EXPECT_TRUE(std::isnan(r[5]));
  EXPECT_TRUE(std::isinf(r[6]));
}

TEST_F(CudaDeviceTest, UnscaleDetectsNonFiniteAndSumOfSquares) {
  std::vector<float> g(100000, 2.0f);
  DeviceMemory dg = Upload(g);
  auto flag = dev_->Allocate(sizeof(int));
  auto sum = dev_->Allocate(sizeof(double));
  ASSERT_TRUE(flag.ok() && sum.ok());
  void* s = CudaStreamHandle(*stream_);
  int zero = 0;
  double dzero = 0;
  ASSERT_TRUE(
      dev_->CopyAsync(flag->data(), &zero, sizeof(int), CopyKind::kHostToDevice, *stream_).ok());
  ASSERT_TRUE(
      dev_->CopyAsync(sum->data(), &dzero, sizeof(double), CopyKind::kHostToDevice, *stream_).ok());
  ASSERT_TRUE(gpu::UnscaleAndCheck(static_cast<float*>(dg.data()), g.size(), 0.5f,
                                   static_cast<int*>(flag->data()), s)
                  .ok());
  ASSERT_TRUE(gpu::AddSumOfSquares(dg.data(), DType::kFloat32, g.size(),
                                   static_cast<double*>(sum->data()), s)
                  .ok());
  EXPECT_EQ(Download<int>(*flag, 1)[0], 0);
  EXPECT_DOUBLE_EQ(Download<double>(*sum, 1)[0], 100000.0);
  g[77777] = std::numeric_limits<float>::infinity();
  DeviceMemory bad = Upload(g);
  ASSERT_TRUE(gpu::UnscaleAndCheck(static_cast<float*>(bad.data()), g.size(), 0.5f,
                                   static_cast<int*>(flag->data()), s)
                  .ok());
  EXPECT_EQ(Download<int>(*flag, 1)[0], 1);
}

TEST_F(CudaDeviceTest, AccumulatesBf16IntoFp32) {
  std::vector<float> acc(1000, 1.0f);
  std::vector<uint16_t> g(1000, 0x3f80);  // bf16 1.0
  DeviceMemory dacc = Upload(acc);
  DeviceMemory dg = Upload(g);
  void* s = CudaStreamHandle(*stream_);
  ASSERT_TRUE(
      gpu::Accumulate(static_cast<float*>(dacc.data()), dg.data(), DType::kBFloat16, 1000, 0.25f, s)
          .ok());
  auto r = Download<float>(dacc, 1000);
  for (float v : r) ASSERT_EQ(v, 1.25f);
}

}  // namespace
}  // namespace strata
