// Status codes, their names and Result<T>'s checked access (common/status.h).
#include "common/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace headway {
namespace {

TEST(StatusTest, CancelledAndDeadlineExceededHaveTheirCodesAndNames) {
  const Status cancelled = Status::Cancelled("client went away");
  EXPECT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.code(), StatusCode::kCancelled);
  EXPECT_EQ(cancelled.message(), "client went away");
  EXPECT_EQ(cancelled.ToString(), "Cancelled: client went away");

  const Status late = Status::DeadlineExceeded("step 7 took 5000 ms");
  EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.ToString(), "DeadlineExceeded: step 7 took 5000 ms");
  EXPECT_EQ(late.WithContext("transfer 3").ToString(),
            "DeadlineExceeded: transfer 3: step 7 took 5000 ms");
}

TEST(StatusTest, CodeValuesAreFixedForTheWire) {
  // StepResult.code and TransferResult.code carry these numbers.
  EXPECT_EQ(static_cast<uint32_t>(StatusCode::kOk), 0u);
  EXPECT_EQ(static_cast<uint32_t>(StatusCode::kInvalidArgument), 1u);
  EXPECT_EQ(static_cast<uint32_t>(StatusCode::kUnavailable), 6u);
  EXPECT_EQ(static_cast<uint32_t>(StatusCode::kInternal), 10u);
  EXPECT_EQ(static_cast<uint32_t>(StatusCode::kCancelled), 11u);
  EXPECT_EQ(static_cast<uint32_t>(StatusCode::kDeadlineExceeded), 12u);
  EXPECT_EQ(kMaxStatusCode, StatusCode::kDeadlineExceeded);
}

TEST(StatusTest, EveryCodeHasAName) {
  for (uint32_t c = 0; c <= static_cast<uint32_t>(kMaxStatusCode); ++c) {
    EXPECT_STRNE(StatusCodeName(static_cast<StatusCode>(c)), "Unknown") << c;
  }
}

TEST(StatusTest, FromCodeRebuildsAStatus) {
  EXPECT_EQ(Status::FromCode(StatusCode::kAborted, "m").ToString(), "Aborted: m");
  const Status ok = Status::FromCode(StatusCode::kOk, "ignored");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.message(), "");
}

TEST(ResultTest, ValueAndOperatorsReachTheValue) {
  Result<std::string> r = std::string("abc");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "abc");
  EXPECT_EQ(*r, "abc");
  EXPECT_EQ(r->size(), 3u);
  Result<std::unique_ptr<int>> moved = std::make_unique<int>(5);
  std::unique_ptr<int> taken = std::move(moved).value();
  EXPECT_EQ(*taken, 5);
}

// Death tests run in every build type: the check is not an assert.
TEST(ResultDeathTest, ValueOfAnErrorAbortsNamingTheStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Result<int> r = Status::NotFound("no block 7");
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) on an error: NotFound: no block 7");
  EXPECT_DEATH((void)*r, "NotFound: no block 7");
  Result<std::string> s = Status::Unavailable("peer gone");
  EXPECT_DEATH((void)s->size(), "Unavailable: peer gone");
  EXPECT_DEATH((void)std::move(s).value(), "Unavailable: peer gone");
}

TEST(ResultDeathTest, BuildingFromAnOkStatusAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH((void)Result<int>(Status::Ok()), "Result built from an OK status");
}

}  // namespace
}  // namespace headway
