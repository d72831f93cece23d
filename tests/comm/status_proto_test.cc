// A Status through StepResult/TransferResult's `code` and `error` fields
// (comm/status_proto.h).
#include "comm/status_proto.h"

#include <gtest/gtest.h>

#include "proto/control.pb.h"

namespace headway {
namespace {

TEST(StatusProtoTest, EveryCodeRoundTrips) {
  for (uint32_t c = 1; c <= static_cast<uint32_t>(kMaxStatusCode); ++c) {
    const Status sent = Status::FromCode(static_cast<StatusCode>(c), "why");
    const Status received = StatusFromProto(StatusCodeToProto(sent.code()), sent.message());
    EXPECT_EQ(received.code(), sent.code()) << c;
    EXPECT_EQ(received.message(), "why") << c;
  }
}

TEST(StatusProtoTest, ThroughAStepResult) {
  const Status failed = Status::Unavailable("all-reduce timed out");
  proto::StepResult result;
  result.set_error(failed.ToString());
  result.set_code(StatusCodeToProto(failed.code()));
  proto::StepResult parsed;
  ASSERT_TRUE(parsed.ParseFromString(result.SerializeAsString()));
  const Status received = StatusFromProto(parsed.code(), parsed.error());
  EXPECT_EQ(received.code(), StatusCode::kUnavailable);
  EXPECT_EQ(received.message(), "Unavailable: all-reduce timed out");
}

TEST(StatusProtoTest, OkIsZeroWithoutAnError) {
  EXPECT_EQ(StatusCodeToProto(StatusCode::kOk), 0u);
  EXPECT_TRUE(StatusFromProto(0, "").ok());
  proto::TransferResult fresh;
  EXPECT_TRUE(StatusFromProto(fresh.code(), fresh.error()).ok());
}

TEST(StatusProtoTest, AnErrorWithoutACodeIsInternal) {
  const Status s = StatusFromProto(0, "transfer 4 target 0: broken");
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "transfer 4 target 0: broken");
}

TEST(StatusProtoTest, AnUnknownCodeIsInternalAndNamed) {
  const Status s = StatusFromProto(99, "from a newer worker");
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "unknown status code 99: from a newer worker");
}

TEST(StatusProtoTest, AKnownCodeWithoutTextKeepsItsCode) {
  const Status s = StatusFromProto(StatusCodeToProto(StatusCode::kDeadlineExceeded), "");
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace headway
