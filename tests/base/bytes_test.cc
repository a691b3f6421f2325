#include "base/bytes.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

uint64_t Parse(const char* s) {
  Result<uint64_t> r = ParseBytes(s);
  EXPECT_TRUE(r.ok()) << s << ": " << r.status().ToString();
  return r.ok() ? *r : 0;
}

TEST(ParseBytesTest, AcceptsUnitsAndScientificNotation) {
  EXPECT_EQ(Parse("4096"), 4096u);
  EXPECT_EQ(Parse("4K"), 4096u);
  EXPECT_EQ(Parse("4k"), 4096u);
  EXPECT_EQ(Parse("4KiB"), 4096u);
  EXPECT_EQ(Parse("4KB"), 4096u);
  EXPECT_EQ(Parse("1M"), 1048576u);
  EXPECT_EQ(Parse("1.5G"), 1610612736u);
  EXPECT_EQ(Parse("2T"), 2199023255552u);
  EXPECT_EQ(Parse("1e9"), 1000000000u);
  EXPECT_EQ(Parse("5e8"), 500000000u);
  EXPECT_EQ(Parse("1.5e9"), 1500000000u);
  EXPECT_EQ(Parse(" 8 M "), 8388608u);
  EXPECT_EQ(Parse("0"), 0u);
}

TEST(ParseBytesTest, RejectsGarbageWithTheTextInTheMessage) {
  for (const char* bad : {"", "abc", "-1", "4X", "1.5", "1e400", "M", "99999999999T"}) {
    Result<uint64_t> r = ParseBytes(bad);
    EXPECT_FALSE(r.ok()) << "accepted '" << bad << "'";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
          << r.status().message();
    }
  }
}

TEST(FormatBytesTest, UsesBinaryUnits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(4096), "4.00 KiB");
  EXPECT_EQ(FormatBytes(1610612736), "1.50 GiB");
  EXPECT_EQ(FormatGbps(2.5e9), "2.50 GB/s");
}

TEST(AlignTest, RoundsUp) {
  EXPECT_EQ(AlignUp(0, 4096), 0u);
  EXPECT_EQ(AlignUp(1, 4096), 4096u);
  EXPECT_EQ(AlignUp(4096, 4096), 4096u);
  EXPECT_EQ(AlignUp(4097, 512), 4608u);
  EXPECT_TRUE(IsAligned(8192, 4096));
  EXPECT_FALSE(IsAligned(8193, 4096));
}

}  // namespace
}  // namespace strata
