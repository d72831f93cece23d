#include "comm/control_channel.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <set>
#include <thread>
#include <vector>
#include <zmq.hpp>

namespace headway {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

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

// Receives until a kDisconnected arrives or `timeout` passes; messages seen
// on the way are appended to *messages (may be null).
std::optional<Inbound> NextDisconnect(ControlServer& server, milliseconds timeout,
                                      std::vector<Inbound>* messages = nullptr) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    std::optional<Inbound> in = server.Receive(milliseconds(20));
    if (!in) continue;
    if (in->kind == Inbound::Kind::kDisconnected) return in;
    if (messages != nullptr) messages->push_back(std::move(*in));
  }
  return std::nullopt;
}

TEST(ControlChannelDisconnectTest, ReportsAPeerThatClosesItsConnection) {
  const std::string address = FreeAddress();
  auto server = ControlServer::Bind(address);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = ControlClient::Connect(address, PeerName(2, 1));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Send(Register(2, 1)).ok());
  std::optional<Inbound> in = (*server)->Receive(milliseconds(5000));
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->kind, Inbound::Kind::kMessage);

  const Clock::time_point closed = Clock::now();
  client->reset();
  std::optional<Inbound> gone = NextDisconnect(**server, milliseconds(5000));
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->peer, "i2r1");
  EXPECT_LT(Clock::now() - closed, milliseconds(1000));
  // Once per connection.
  EXPECT_FALSE(NextDisconnect(**server, milliseconds(200)).has_value());
}

// SIGKILL of a worker process: the kernel closes its socket and the server
// reports the peer at once, long before any heartbeat timeout.
TEST(ControlChannelDisconnectTest, ReportsAKilledPeerProcess) {
  const std::string address = FreeAddress();
  // Forked before this test creates any ZeroMQ context; the child connects
  // (ZeroMQ retries until the server binds) and sends every 50 ms.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = ControlClient::Connect(address, PeerName(0, 0));
    if (!c.ok()) _exit(3);
    proto::Envelope hb;
    hb.mutable_heartbeat()->set_sent_unix_ms(1);
    for (;;) {
      (void)(*c)->Send(hb);
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{child};
  auto server = ControlServer::Bind(address);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::optional<Inbound> in = (*server)->Receive(milliseconds(10000));
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->peer, "i0r0");

  const Clock::time_point killed = Clock::now();
  kill(child, SIGKILL);
  std::optional<Inbound> gone = NextDisconnect(**server, milliseconds(5000));
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->peer, "i0r0");
  const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - killed).count();
  EXPECT_LT(ms, 1000);
  std::printf("disconnect of a killed peer reported after %lld ms\n", static_cast<long long>(ms));
}

TEST(ControlChannelDisconnectTest, NamesOnlyThePeerThatLeft) {
  const std::string address = FreeAddress();
  auto server = ControlServer::Bind(address);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto a = ControlClient::Connect(address, PeerName(0, 0));
  auto b = ControlClient::Connect(address, PeerName(1, 0));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Send(Register(0, 0)).ok());
  ASSERT_TRUE((*b)->Send(Register(1, 0)).ok());
  std::set<std::string> heard;
  for (int i = 0; i < 2; ++i) {
    std::optional<Inbound> in = (*server)->Receive(milliseconds(5000));
    ASSERT_TRUE(in.has_value());
    heard.insert(in->peer);
  }
  EXPECT_EQ(heard, (std::set<std::string>{"i0r0", "i1r0"}));
  // A connection that never delivered a message is not reported.
  zmq::context_t context(1);
  zmq::socket_t silent(context, zmq::socket_type::dealer);
  silent.set(zmq::sockopt::linger, 0);
  silent.connect(address);

  a->reset();
  std::vector<Inbound> messages;
  std::optional<Inbound> gone = NextDisconnect(**server, milliseconds(5000), &messages);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->peer, "i0r0");
  silent.close();
  ASSERT_TRUE((*b)->Send(Register(1, 0)).ok());
  EXPECT_FALSE(NextDisconnect(**server, milliseconds(500), &messages).has_value());
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].peer, "i1r0");
}

// The kernel hands a closed connection's descriptor to the next one: the
// old peer's disconnect must not be charged to the new peer, and the new
// peer's own disconnect is reported under its name.
TEST(ControlChannelDisconnectTest, ReusedDescriptorKeepsPeersApart) {
  const std::string address = FreeAddress();
  auto server = ControlServer::Bind(address);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<std::string> messages, gone;
  auto take = [&](milliseconds wait) {
    while (std::optional<Inbound> in = (*server)->Receive(wait)) {
      (in->kind == Inbound::Kind::kMessage ? messages : gone).push_back(in->peer);
    }
  };
  std::unique_ptr<ControlClient> previous;
  for (int round = 0; round < 5; ++round) {
    // This peer connects and sends right as the previous one leaves.
    previous.reset();
    auto next = ControlClient::Connect(address, PeerName(0, round));
    ASSERT_TRUE(next.ok());
    ASSERT_TRUE((*next)->Send(Register(0, round)).ok());
    previous = std::move(*next);
    take(milliseconds(300));
  }
  previous.reset();
  take(milliseconds(1500));
  EXPECT_EQ(messages, (std::vector<std::string>{"i0r0", "i0r1", "i0r2", "i0r3", "i0r4"}));
  EXPECT_EQ(gone, (std::vector<std::string>{"i0r0", "i0r1", "i0r2", "i0r3", "i0r4"}));
}

}  // namespace
}  // namespace headway
