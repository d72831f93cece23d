// CurveZMQ on the control channel alone (comm/control_channel.h,
// comm/zap_handler.h): an authorized client is heard and answered; a client
// with an unknown key, with none, or trusting another server key, and
// garbage bytes on the port, reach nothing. tests/integration/
// coordinator_auth_test.cc does the same against headway-coordinator.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/control_channel.h"
#include "comm/curve_keys.h"
#include "tests/support/process.h"
#include "tests/support/tcp_garbage.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// How long a peer that should be ignored is watched: CURVE handshakes on
// loopback take about a millisecond.
constexpr milliseconds kQuietWindow(1500);

CurveKeyPair NewPair() {
  Result<CurveKeyPair> pair = GenerateCurveKeyPair();
  EXPECT_TRUE(pair.ok()) << pair.status().ToString();
  return pair.ok() ? *pair : CurveKeyPair{};
}

std::string FreeAddress() { return "tcp://127.0.0.1:" + std::to_string(testing::FreePort()); }

int PortOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

proto::Envelope Register(int instance_id) {
  proto::Envelope envelope;
  proto::RegisterRequest* request = envelope.mutable_register_request();
  request->set_instance_id(uint32_t(instance_id));
  request->set_tp_rank(0);
  request->set_tp_size(1);
  return envelope;
}

class ControlAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_pair_ = NewPair();
    client_pair_ = NewPair();
    address_ = FreeAddress();
    auto server = ControlServer::Bind(address_, ControlServerKeys{server_pair_.secret_key,
                                                                  {client_pair_.public_key}});
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }

  ControlClientKeys ClientKeys(const CurveKeyPair& own) const {
    return ControlClientKeys{server_pair_.public_key, own.public_key, own.secret_key};
  }

  // Every message the server receives within `window`.
  std::vector<Inbound> Drain(milliseconds window) {
    std::vector<Inbound> got;
    const auto deadline = Clock::now() + window;
    while (Clock::now() < deadline) {
      auto in = server_->Receive(milliseconds(50));
      if (in) got.push_back(std::move(*in));
    }
    return got;
  }

  CurveKeyPair server_pair_;
  CurveKeyPair client_pair_;
  std::string address_;
  std::unique_ptr<ControlServer> server_;
};

TEST_F(ControlAuthTest, AuthorizedClientIsHeardAndAnswered) {
  auto client = ControlClient::Connect(address_, PeerName(3, 0), ClientKeys(client_pair_));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->Send(Register(3)).ok());
  auto in = server_->Receive(milliseconds(5000));
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->peer, "i3r0");
  EXPECT_TRUE(in->envelope.has_register_request());
  proto::Envelope reply;
  reply.mutable_register_response()->set_accepted(true);
  ASSERT_TRUE(server_->Send("i3r0", reply).ok());
  auto back = (*client)->Receive(milliseconds(5000));
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->register_response().accepted());
}

TEST_F(ControlAuthTest, UnknownKeyNoKeyAndWrongServerKeyAreNeverHeard) {
  const CurveKeyPair stranger = NewPair();
  auto unknown_key = ControlClient::Connect(address_, PeerName(0, 0), ClientKeys(stranger));
  auto no_key = ControlClient::Connect(address_, PeerName(1, 0));
  // An authorized pair that trusts another server key (a man in the
  // middle's): the server cannot complete the handshake.
  ControlClientKeys wrong_server = ClientKeys(client_pair_);
  wrong_server.server_public_key = stranger.public_key;
  auto misdirected = ControlClient::Connect(address_, PeerName(2, 0), wrong_server);
  ASSERT_TRUE(unknown_key.ok() && no_key.ok() && misdirected.ok());
  // A handshake the server has refused already (a slow machine, a sanitizer
  // build) leaves the client no connection to queue on, and the send says
  // it would block; otherwise the message is queued and dropped with the
  // connection. Either way nothing may be heard.
  int instance = 0;
  for (ControlClient* client : {unknown_key->get(), no_key->get(), misdirected->get()}) {
    const Status sent = client->Send(Register(instance++));
    EXPECT_TRUE(sent.ok() || sent.code() == StatusCode::kUnavailable) << sent.ToString();
  }

  std::vector<Inbound> got = Drain(kQuietWindow);
  for (const Inbound& in : got) ADD_FAILURE() << "heard from " << in.peer;
  // Nothing can be sent to them either: ROUTER_MANDATORY knows no such peer.
  proto::Envelope prompt;
  prompt.mutable_step_plan()->set_step_id(1);
  for (const char* peer : {"i0r0", "i1r0", "i2r0"}) {
    EXPECT_EQ(server_->Send(peer, prompt).code(), StatusCode::kUnavailable) << peer;
  }
  EXPECT_FALSE((*unknown_key)->Receive(milliseconds(100)).has_value());

  // The server still admits the authorized key.
  auto good = ControlClient::Connect(address_, PeerName(4, 0), ClientKeys(client_pair_));
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE((*good)->Send(Register(4)).ok());
  auto in = server_->Receive(milliseconds(5000));
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->peer, "i4r0");
}

TEST_F(ControlAuthTest, GarbageOnTheControlPortIsDropped) {
  testing::SendTcpGarbage(PortOf(address_));
  std::vector<Inbound> got = Drain(milliseconds(300));
  for (const Inbound& in : got) ADD_FAILURE() << "garbage became a message from " << in.peer;
  auto good = ControlClient::Connect(address_, PeerName(0, 0), ClientKeys(client_pair_));
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE((*good)->Send(Register(0)).ok());
  auto in = server_->Receive(milliseconds(5000));
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->peer, "i0r0");
}

TEST_F(ControlAuthTest, MalformedKeysAreRefused) {
  EXPECT_EQ(ControlServer::Bind(FreeAddress(), ControlServerKeys{"not a key", {}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ControlServer::Bind(FreeAddress(), ControlServerKeys{server_pair_.secret_key, {"x"}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  ControlClientKeys bad = ClientKeys(client_pair_);
  bad.secret_key = "short";
  EXPECT_EQ(ControlClient::Connect(address_, "i0r0", bad).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace headway
