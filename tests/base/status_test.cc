#include "base/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <string>

namespace strata {
namespace {

TEST(StatusTest, DefaultIsOkAndCarriesNothing) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "ok");
}

TEST(StatusTest, IoErrorNamesErrnoAndIsRetryableOnlyForTransientErrors) {
  Status s = IoErrorFromErrno(ENOSPC, "write /x offset 4096 length 8192");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.sys_errno(), ENOSPC);
  EXPECT_NE(s.ToString().find("io_error: write /x offset 4096 length 8192"), std::string::npos);
  EXPECT_NE(s.ToString().find("errno 28"), std::string::npos);
  EXPECT_FALSE(s.retryable());
  EXPECT_TRUE(IoErrorFromErrno(EAGAIN, "read").retryable());
}

TEST(StatusTest, CopyIsDeepAndContextPrepends) {
  Status a = NotFoundError("no such id");
  Status b = a;
  Status c = b.WithContext("swap space /tmp/run");
  EXPECT_EQ(a, b);
  EXPECT_EQ(c.message(), "swap space /tmp/run: no such id");
  EXPECT_EQ(a.message(), "no such id");
  EXPECT_TRUE(Status().WithContext("x").ok());
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError(std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  STRATA_ASSIGN_OR_RETURN(int h, Half(x));
  STRATA_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckPositive(int x) {
  if (x <= 0) return OutOfRangeError("not positive");
  return Status::Ok();
}

Status Both(int a, int b) {
  STRATA_RETURN_IF_ERROR(CheckPositive(a));
  STRATA_RETURN_IF_ERROR(CheckPositive(b));
  return Status::Ok();
}

TEST(ResultTest, PropagatesValuesAndErrors) {
  Result<int> ok = Quarter(12);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 3);
  Result<int> bad = Quarter(6);  // 6 -> 3 is odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "3 is odd");
  EXPECT_TRUE(Both(1, 2).ok());
  EXPECT_EQ(Both(1, -2).code(), StatusCode::kOutOfRange);
}

TEST(ResultTest, HoldsMoveOnlyValues) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(7));
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

}  // namespace
}  // namespace strata
