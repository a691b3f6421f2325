// Host memory does not grow with the model under full NVMe offload: the peak RSS while training
// 16 blocks is at most 1.2x that for 4 blocks of the same width (ARCHITECTURE.md §1). Each size
// runs in its own process (rss_probe) so the peaks do not mix. Width 384: a block is 1.8M
// parameters, so 16 blocks hold ~450 MB of parameters, gradients and Adam state, all on NVMe.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace {

struct Probe {
  long hwm_kb = -1, start_kb = -1;
  unsigned long long arena = 0;
};

Probe RunProbe(int layers, const std::string& dir) {
  const std::string cmd =
      std::string(STRATA_RSS_PROBE) + " " + std::to_string(layers) + " 384 " + dir + " 2>&1";
  Probe p;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return p;
  char buf[4096];
  std::string out;
  while (fgets(buf, sizeof(buf), f)) out += buf;
  const int rc = pclose(f);
  EXPECT_EQ(rc, 0) << out;
  // The last line holds the figures (log lines may precede it).
  const size_t nl = out.find_last_of('\n', out.size() >= 2 ? out.size() - 2 : 0);
  const std::string last = out.substr(nl == std::string::npos ? 0 : nl + 1);
  EXPECT_EQ(std::sscanf(last.c_str(), "%ld %ld %llu", &p.hwm_kb, &p.start_kb, &p.arena), 3) << out;
  return p;
}

TEST(RssTest, PeakHostMemoryDoesNotGrowWithBlocksUnderNvmeOffload) {
  char tmpl[] = "/tmp/strata-rss-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const Probe small = RunProbe(4, tmpl);
  const Probe large = RunProbe(16, tmpl);
  std::filesystem::remove_all(tmpl);
  ASSERT_GT(small.hwm_kb, 0);
  ASSERT_GT(large.hwm_kb, 0);
  std::printf("peak RSS: 4 blocks %ld KiB, 16 blocks %ld KiB (ratio %.3f); arena %llu / %llu B\n",
              small.hwm_kb, large.hwm_kb, double(large.hwm_kb) / small.hwm_kb, small.arena,
              large.arena);
  EXPECT_EQ(small.arena, large.arena);  // sized by the largest unit, not the unit count
  EXPECT_LE(large.hwm_kb, 1.2 * small.hwm_kb);
}

}  // namespace
