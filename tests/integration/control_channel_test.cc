#include "comm/control_channel.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <zmq.hpp>

namespace headway {
namespace {

using std::chrono::milliseconds;

// A TCP port that was free a moment ago (bind port 0, read it back).
int FreeTcpPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string FreeAddress() { return "tcp://127.0.0.1:" + std::to_string(FreeTcpPort()); }

proto::Envelope Register(int instance_id, int tp_rank) {
  proto::Envelope envelope;
  proto::RegisterRequest* request = envelope.mutable_register_request();
  request->set_instance_id(instance_id);
  request->set_tp_rank(tp_rank);
  request->set_tp_size(1);
  request->set_model_name("SmolLM2");
  request->set_num_blocks(1234);
  return envelope;
}

TEST(ControlChannelTest, PeerName) {
  EXPECT_EQ(PeerName(0, 0), "i0r0");
  EXPECT_EQ(PeerName(12, 3), "i12r3");
}

TEST(ControlChannelTest, RoundTripOverTcp) {
  const std::string address = FreeAddress();
  auto server = ControlServer::Bind(address);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = ControlClient::Connect(address, PeerName(2, 1));
  ASSERT_TRUE(client.ok()) << client.status().ToString();

  ASSERT_TRUE((*client)->Send(Register(2, 1)).ok());
  std::optional<Inbound> inbound = (*server)->Receive(milliseconds(5000));
  ASSERT_TRUE(inbound.has_value());
  EXPECT_EQ(inbound->peer, "i2r1");
  ASSERT_TRUE(inbound->envelope.has_register_request());
  EXPECT_EQ(inbound->envelope.register_request().instance_id(), 2u);
  EXPECT_EQ(inbound->envelope.register_request().tp_rank(), 1u);
  EXPECT_EQ(inbound->envelope.register_request().model_name(), "SmolLM2");
  EXPECT_EQ(inbound->envelope.register_request().num_blocks(), 1234u);

  proto::Envelope reply;
  reply.mutable_register_response()->set_accepted(true);
  ASSERT_TRUE((*server)->Send(inbound->peer, reply).ok());
  std::optional<proto::Envelope> got = (*client)->Receive(milliseconds(5000));
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->has_register_response());
  EXPECT_TRUE(got->register_response().accepted());
}

TEST(ControlChannelTest, RoutesToEachPeer) {
  const std::string address = FreeAddress();
  auto server = ControlServer::Bind(address);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto a = ControlClient::Connect(address, PeerName(0, 0));
  auto b = ControlClient::Connect(address, PeerName(0, 1));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Send(Register(0, 0)).ok());
  ASSERT_TRUE((*b)->Send(Register(0, 1)).ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*server)->Receive(milliseconds(5000)).has_value());
  }

  proto::Envelope plan;
  plan.mutable_step_plan()->set_step_id(7);
  ASSERT_TRUE((*server)->Send("i0r1", plan).ok());
  plan.mutable_step_plan()->set_step_id(8);
  ASSERT_TRUE((*server)->Send("i0r0", plan).ok());

  std::optional<proto::Envelope> got_b = (*b)->Receive(milliseconds(5000));
  std::optional<proto::Envelope> got_a = (*a)->Receive(milliseconds(5000));
  ASSERT_TRUE(got_a.has_value() && got_b.has_value());
  EXPECT_EQ(got_b->step_plan().step_id(), 7u);
  EXPECT_EQ(got_a->step_plan().step_id(), 8u);
}

TEST(ControlChannelTest, SendToUnknownPeerIsUnavailable) {
  auto server = ControlServer::Bind(FreeAddress());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  proto::Envelope heartbeat;
  heartbeat.mutable_heartbeat()->set_sent_unix_ms(1);
  Status status = (*server)->Send("i9r9", heartbeat);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  EXPECT_NE(status.message().find("i9r9"), std::string::npos);
}

TEST(ControlChannelTest, ReceiveTimesOut) {
  const std::string address = FreeAddress();
  auto server = ControlServer::Bind(address);
  auto client = ControlClient::Connect(address, PeerName(0, 0));
  ASSERT_TRUE(server.ok() && client.ok());
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE((*server)->Receive(milliseconds(100)).has_value());
  EXPECT_FALSE((*client)->Receive(milliseconds(100)).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(190));
}

TEST(ControlChannelTest, BindErrors) {
  const std::string address = FreeAddress();
  auto first = ControlServer::Bind(address);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = ControlServer::Bind(address);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(address), std::string::npos);

  auto malformed = ControlServer::Bind("nonsense://x");
  EXPECT_EQ(malformed.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(ControlClient::Connect("nonsense://x", "i0r0").ok());
}

TEST(ControlChannelTest, DropsMalformedMessages) {
  const std::string address = FreeAddress();
  auto server = ControlServer::Bind(address);
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  // A raw peer that breaks the one-frame rule, then sends bytes that are not
  // an Envelope, then a valid one: only the last arrives.
  zmq::context_t context(1);
  zmq::socket_t raw(context, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::routing_id, "raw");
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(address);
  raw.send(zmq::str_buffer("a"), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("b"), zmq::send_flags::none);
  raw.send(zmq::str_buffer("\xff\xff\xff"), zmq::send_flags::none);
  std::string valid;
  ASSERT_TRUE(Register(1, 0).SerializeToString(&valid));
  raw.send(zmq::buffer(valid), zmq::send_flags::none);

  std::optional<Inbound> inbound = (*server)->Receive(milliseconds(5000));
  ASSERT_TRUE(inbound.has_value());
  EXPECT_EQ(inbound->peer, "raw");
  EXPECT_EQ(inbound->envelope.register_request().instance_id(), 1u);
}

}  // namespace
}  // namespace headway
