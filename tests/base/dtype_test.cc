// base/dtype.h: names, sizes and parsing of the one DType.
#include "base/dtype.h"

#include <gtest/gtest.h>

#include <string>

namespace strata {
namespace {

// Sizes and names are constexpr so kernels and layouts can size buffers at compile time.
static_assert(DTypeBytes(DType::kFloat32) == 4);
static_assert(DTypeBytes(DType::kBFloat16) == 2);
static_assert(DTypeName(DType::kFloat16) == "fp16");

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(DTypeName(DType::kFloat32), "fp32");
  EXPECT_EQ(DTypeName(DType::kFloat16), "fp16");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bf16");
  EXPECT_EQ(DTypeBytes(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeBytes(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeBytes(DType::kBFloat16), 2u);
}

TEST(DTypeTest, ParseAcceptsEveryNameAndRoundTrips) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Result<DType> back = ParseDType(DTypeName(t));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, t);
  }
  EXPECT_EQ(*ParseDType("float32"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("float"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("float16"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("half"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBFloat16);
}

TEST(DTypeTest, UnknownNameSaysWhatIsAccepted) {
  Result<DType> r = ParseDType("int8");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().ToString().find("'int8'"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("fp32, fp16 or bf16"), std::string::npos);
  EXPECT_FALSE(ParseDType("").ok());
  EXPECT_FALSE(ParseDType("BF16").ok());  // names are lower case only
}

}  // namespace
}  // namespace strata
