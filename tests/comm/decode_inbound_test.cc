// DecodeInbound: the checks every control message passes before the
// coordinator or a worker sees it (the control_message fuzz target drives
// it with arbitrary frames; these are the cases it must tell apart).
#include <gtest/gtest.h>

#include <string>

#include "comm/control_channel.h"

namespace headway {
namespace {

std::string Heartbeat() {
  proto::Envelope env;
  env.mutable_heartbeat()->set_sent_unix_ms(5);
  return env.SerializeAsString();
}

TEST(DecodeInboundTest, RoutedMessageNamesItsPeer) {
  Result<Inbound> in = DecodeInbound("i0r1", Heartbeat(), /*routed=*/true);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->kind, Inbound::Kind::kMessage);
  EXPECT_EQ(in->peer, "i0r1");
  EXPECT_EQ(in->envelope.heartbeat().sent_unix_ms(), 5u);
}

TEST(DecodeInboundTest, DealerMessageHasNoPeer) {
  Result<Inbound> in = DecodeInbound("ignored", Heartbeat(), /*routed=*/false);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->peer, "");
}

TEST(DecodeInboundTest, BinaryIdentityIsRefusedAndEscaped) {
  Result<Inbound> in = DecodeInbound(std::string("\x00\x1b[31m", 6), Heartbeat(), true);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(in.status().message().find("\"\\x00\\x1b[31m\""), std::string::npos)
      << in.status().message();
  EXPECT_FALSE(DecodeInbound("", Heartbeat(), true).ok());
  EXPECT_FALSE(DecodeInbound("i0 r0", Heartbeat(), true).ok());
}

TEST(DecodeInboundTest, UnparsablePayloadIsRefused) {
  Result<Inbound> in = DecodeInbound("i0r0", std::string("\x0a\xff\xff", 3), true);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(in.status().message().find("unparsable message of 3 bytes from `i0r0`"),
            std::string::npos)
      << in.status().message();
  EXPECT_FALSE(DecodeInbound("", std::string("\x0a\xff\xff", 3), false).ok());
}

}  // namespace
}  // namespace headway
