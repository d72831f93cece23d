// The control channel against hostile peers: frames over the size limit,
// identities that are not a worker's, garbage bytes. The server drops them,
// logs them escaped, and keeps serving its real peers.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <zmq.hpp>

#include "comm/control_channel.h"
#include "tests/support/process.h"

namespace headway {
namespace {

using std::chrono::milliseconds;

proto::Envelope Register(int instance_id) {
  proto::Envelope envelope;
  envelope.mutable_register_request()->set_instance_id(instance_id);
  envelope.mutable_register_request()->set_model_name("SmolLM2");
  return envelope;
}

// Sends every log line to a string for the test's lifetime.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string Text() {
    spdlog::default_logger()->flush();
    return stream_.str();
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::logger> previous_;
};

// Receives messages for `wait`; returns them.
std::vector<Inbound> Drain(ControlServer& server, milliseconds wait) {
  std::vector<Inbound> messages;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    std::optional<Inbound> in = server.Receive(milliseconds(20));
    if (in && in->kind == Inbound::Kind::kMessage) messages.push_back(std::move(*in));
  }
  return messages;
}

std::vector<std::string> Peers(const std::vector<Inbound>& messages) {
  std::vector<std::string> peers;
  for (const Inbound& in : messages) peers.push_back(in.peer);
  return peers;
}

TEST(ControlChannelLimitsTest, EscapeForLogKeepsPrintableTextAndHexesTheRest) {
  EXPECT_EQ(EscapeForLog("i0r0"), "i0r0");
  EXPECT_EQ(EscapeForLog(std::string("\0\x80" "a\n\\", 5)), "\\x00\\x80a\\x0a\\x5c");
  EXPECT_EQ(EscapeForLog(std::string(100, 'x'), 8), "xxxxxxxx...");
}

// One unauthenticated 1 GiB frame once took the coordinator's RSS to about
// 890 MB; now the sender's connection is closed at the limit.
TEST(ControlChannelLimitsTest, OversizedFrameDropsItsSenderAndTheServerKeepsServing) {
  const std::string address = "tcp://127.0.0.1:" + std::to_string(testing::FreePort());
  ControlChannelOptions options;
  options.max_message_bytes = 1 << 20;
  auto server = ControlServer::Bind(address, std::nullopt, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto worker = ControlClient::Connect(address, PeerName(0, 0), std::nullopt, options);
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE((*worker)->Send(Register(0)).ok());
  ASSERT_EQ(Peers(Drain(**server, milliseconds(300))), std::vector<std::string>{"i0r0"});

  zmq::context_t context(1);
  zmq::socket_t big(context, zmq::socket_type::dealer);
  big.set(zmq::sockopt::routing_id, "big");
  big.set(zmq::sockopt::linger, 0);
  big.connect(address);
  std::string valid;
  ASSERT_TRUE(Register(1).SerializeToString(&valid));
  big.send(zmq::buffer(valid), zmq::send_flags::none);  // under the limit: delivered
  // A well-formed message, but over the limit.
  proto::Envelope too_big = Register(2);
  too_big.mutable_register_request()->set_model_name(std::string(2 << 20, 'x'));
  std::string oversized;
  ASSERT_TRUE(too_big.SerializeToString(&oversized));
  big.send(zmq::buffer(oversized), zmq::send_flags::none);

  ASSERT_TRUE((*worker)->Send(Register(0)).ok());
  std::vector<Inbound> messages = Drain(**server, milliseconds(1000));
  std::vector<std::string> peers = Peers(messages);
  EXPECT_EQ(std::count(peers.begin(), peers.end(), "i0r0"), 1);
  EXPECT_LE(std::count(peers.begin(), peers.end(), "big"), 1);  // its first, at most
  for (const Inbound& in : messages) {
    EXPECT_NE(in.envelope.register_request().instance_id(), 2u) << "the oversized one arrived";
  }

  // The server's own sends are held to the limit with a clear error.
  proto::Envelope huge;
  huge.mutable_register_request()->set_model_name(std::string(2 << 20, 'y'));
  Status refused = (*server)->Send("i0r0", huge);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("coordinator.control_max_message_mb"), std::string::npos)
      << refused.ToString();
  EXPECT_EQ((*worker)->Send(huge).code(), StatusCode::kInvalidArgument);
  // And the real peer is still served both ways.
  ASSERT_TRUE((*server)->Send("i0r0", Register(7)).ok());
  std::optional<proto::Envelope> reply = (*worker)->Receive(milliseconds(2000));
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->register_request().instance_id(), 7u);
}

TEST(ControlChannelLimitsTest, BinaryIdentitiesAreDroppedAndLoggedEscaped) {
  CapturedLog log;
  const std::string address = "tcp://127.0.0.1:" + std::to_string(testing::FreePort());
  auto server = ControlServer::Bind(address);
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  zmq::context_t context(1);
  zmq::socket_t named(context, zmq::socket_type::dealer);
  named.set(zmq::sockopt::routing_id, std::string("\x1b[31mi0r0\n\x00", 11));
  named.set(zmq::sockopt::linger, 0);
  named.connect(address);
  zmq::socket_t anonymous(context, zmq::socket_type::dealer);  // ZeroMQ's binary identity
  anonymous.set(zmq::sockopt::linger, 0);
  anonymous.connect(address);
  std::string valid;
  ASSERT_TRUE(Register(0).SerializeToString(&valid));
  named.send(zmq::buffer(valid), zmq::send_flags::none);
  anonymous.send(zmq::buffer(valid), zmq::send_flags::none);
  // Garbage on the port: not ZMTP at all.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(std::stoi(address.substr(address.rfind(':') + 1))));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const char garbage[] = "\xff\x00\x1b[2J\nGET / HTTP/1.1\r\n\r\n";
  ASSERT_GT(::write(fd, garbage, sizeof(garbage)), 0);

  EXPECT_TRUE(Drain(**server, milliseconds(500)).empty());
  ::close(fd);
  const std::string text = log.Text();
  EXPECT_NE(text.find("\\x1b[31mi0r0\\x0a\\x00"), std::string::npos) << text;
  EXPECT_NE(text.find("\"\\x00"), std::string::npos) << text;  // the anonymous identity
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find(std::string(1, '\0')), std::string::npos) << text;

  // A real worker is still served.
  auto worker = ControlClient::Connect(address, PeerName(0, 0));
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE((*worker)->Send(Register(0)).ok());
  EXPECT_EQ(Peers(Drain(**server, milliseconds(300))), std::vector<std::string>{"i0r0"});
}

}  // namespace
}  // namespace headway
