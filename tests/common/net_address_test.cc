#include "common/net_address.h"

#include <gtest/gtest.h>

namespace headway {
namespace {

TEST(NetAddressTest, ResolvesLiteralsNamesAndWildcards) {
  Result<std::string> literal = ResolveHost("k", "127.0.0.1");
  ASSERT_TRUE(literal.ok()) << literal.status().ToString();
  EXPECT_EQ(*literal, "127.0.0.1");
  // IPv4 first, though the resolver may list ::1 before 127.0.0.1.
  Result<std::string> name = ResolveHost("k", "localhost");
  ASSERT_TRUE(name.ok()) << name.status().ToString();
  EXPECT_EQ(*name, "127.0.0.1");
  EXPECT_EQ(*ResolveHost("k", "0.0.0.0"), "0.0.0.0");
  EXPECT_EQ(*ResolveHost("k", "::"), "::");
}

TEST(NetAddressTest, AnUnresolvableNameNamesTheKey) {
  Result<std::string> bad =
      ResolveHost("host_addresses[\"w\"].advertise", "no-such-host.invalid");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = bad.status().message();
  EXPECT_NE(message.find("host_addresses[\"w\"].advertise"), std::string::npos) << message;
  EXPECT_NE(message.find("no-such-host.invalid"), std::string::npos) << message;
  EXPECT_NE(message.find("does not resolve"), std::string::npos) << message;
  EXPECT_NE(message.find("an IP address or a host name"), std::string::npos) << message;
}

TEST(NetAddressTest, SyntaxRefusesSchemesPortsAndDialledWildcards) {
  EXPECT_TRUE(CheckHostSyntax("k", "worker-0.headway.svc", false).ok());
  EXPECT_TRUE(CheckHostSyntax("k", "fd00::2", false).ok());
  EXPECT_TRUE(CheckHostSyntax("k", "0.0.0.0", true).ok());
  EXPECT_FALSE(CheckHostSyntax("k", "0.0.0.0", false).ok());
  EXPECT_FALSE(CheckHostSyntax("k", "::", false).ok());
  EXPECT_FALSE(CheckHostSyntax("k", "*", true).ok());
  EXPECT_FALSE(CheckHostSyntax("k", "", true).ok());
  EXPECT_FALSE(CheckHostSyntax("k", "tcp://h", true).ok());
  EXPECT_FALSE(CheckHostSyntax("k", "[::1]", true).ok());
  EXPECT_FALSE(CheckHostSyntax("k", "a b", true).ok());
}

TEST(NetAddressTest, InterfaceOfLoopbackAndOfAForeignAddress) {
  EXPECT_EQ(InterfaceOf("127.0.0.1"), "lo");
  EXPECT_EQ(InterfaceOf("127.0.0.2"), "lo");
  EXPECT_EQ(InterfaceOf("0.0.0.0"), "");
  EXPECT_EQ(InterfaceOf("192.0.2.254"), "");  // TEST-NET-1, on no interface here
}

TEST(NetAddressTest, ZmqTcpHost) {
  EXPECT_EQ(ZmqTcpHost("tcp://127.0.0.1:5557"), "127.0.0.1");
  EXPECT_EQ(ZmqTcpHost("tcp://coordinator.svc:5557"), "coordinator.svc");
  EXPECT_EQ(ZmqTcpHost("tcp://[::1]:5557"), "::1");
  EXPECT_EQ(ZmqTcpHost("tcp://*:5557"), "*");
  EXPECT_EQ(ZmqTcpHost("ipc:///tmp/a.sock"), "");
}

}  // namespace
}  // namespace headway
