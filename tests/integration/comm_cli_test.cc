// `strata bench comm --nproc 2` through the binary: it launches two ranks of itself, they meet over
// Gloo on loopback, and the JSON reports every size for both collectives with consistent
// bandwidths (busbw = algbw * (n-1)/n, algbw = bytes / seconds).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/testing/cli_run.h"

namespace {

using strata::testing::Shell;

TEST(CommCliTest, BenchCommReportsEverySizeForBothCollectives) {
  // stderr to /dev/null: the JSON document is the whole of stdout.
  const auto r = Shell(std::string(STRATA_BINARY) +
                       " bench comm --nproc 2 --min-bytes 1M --max-bytes 4M --iters 2 --json "
                       "2>/dev/null");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["backend"], "gloo");
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["iters"], 2);
  ASSERT_EQ(j["results"].size(), 3u) << j.dump();  // 1M, 2M, 4M
  uint64_t expect = 1 << 20;
  for (const nlohmann::json& s : j["results"]) {
    EXPECT_EQ(s["bytes"].get<uint64_t>(), expect);
    for (const char* op : {"all_gather", "reduce_scatter"}) {
      const nlohmann::json& o = s[op];
      const double seconds = o["seconds"].get<double>();
      const double algbw = o["algbw_gbps"].get<double>();
      EXPECT_GT(seconds, 0) << op;
      EXPECT_NEAR(algbw, expect / seconds / 1e9, 1e-9 * algbw + 1e-12) << op;
      EXPECT_NEAR(o["busbw_gbps"].get<double>(), algbw / 2, 1e-9 * algbw + 1e-12) << op;
    }
    expect *= 2;
  }
}

// The human form is a table; the ranks' stderr, if any, is prefixed.
TEST(CommCliTest, BenchCommPrintsATable) {
  const auto r = Shell(std::string(STRATA_BINARY) +
                       " bench comm --nproc 2 --min-bytes 64K --max-bytes 64K --iters 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("strata bench comm: backend gloo, 2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all_gather"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("busbw"), std::string::npos) << r.out;
}

}  // namespace
