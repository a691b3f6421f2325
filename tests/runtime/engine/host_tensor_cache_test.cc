// HostTensorCache: freed large CPU tensors are reused (no new mapping), ops that allocate through
// libtorch's raw_allocate path work, contents computed in reused blocks are right, and small
// tensors are unaffected.
#include "runtime/engine/host_tensor_cache.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace strata::runtime {
namespace {

TEST(HostTensorCacheTest, LargeBlocksAreReusedAndOpsStayCorrect) {
  HostTensorCache::Install(uint64_t{256} << 20);
  ASSERT_TRUE(HostTensorCache::installed());
  const int64_t n = 4 << 20;  // 16 MiB of fp32
  {
    torch::Tensor a = torch::empty({n});
    a.fill_(1.5f);
  }
  const HostTensorCacheStats before = HostTensorCache::stats();
  EXPECT_GE(before.cached_bytes, uint64_t{16} << 20);
  for (int i = 0; i < 5; ++i) {
    torch::Tensor x = torch::linspace(-3, 3, n);  // same size: served from the cache
    // gelu allocates its output through libtorch's raw_allocate/raw_deallocate path.
    torch::Tensor y = torch::gelu(x);
    torch::Tensor expect = 0.5 * x * (1 + torch::erf(x / std::sqrt(2.0)));
    EXPECT_TRUE(torch::allclose(y, expect, 1e-5, 1e-6));
  }
  const HostTensorCacheStats after = HostTensorCache::stats();
  EXPECT_GT(after.hits, before.hits + 4);  // the loop's blocks came back from the cache
  EXPECT_LE(after.cached_bytes, uint64_t{256} << 20);
  // Small tensors go to malloc and still compute.
  torch::Tensor s = torch::arange(10, torch::kFloat32);
  EXPECT_EQ(s.sum().item<float>(), 45.0f);
}

TEST(HostTensorCacheTest, CapBoundsWhatIsKept) {
  HostTensorCache::Install(uint64_t{256} << 20);  // idempotent: the first cap stays
  {
    std::vector<torch::Tensor> many;
    for (int i = 0; i < 24; ++i) many.push_back(torch::empty({int64_t{4} << 20}));  // 384 MiB
  }
  EXPECT_LE(HostTensorCache::stats().cached_bytes, uint64_t{256} << 20);
}

}  // namespace
}  // namespace strata::runtime
