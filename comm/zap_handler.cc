#include "comm/zap_handler.h"

#include <spdlog/spdlog.h>

#include <zmq.hpp>

#include <atomic>
#include <set>
#include <thread>

#include "comm/curve_keys.h"

namespace headway {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";  // fixed by RFC 27
constexpr int kCurveKeyBytes = 32;

class ZmqZapHandler final : public ZapHandler {
 public:
  ZmqZapHandler(void* context, std::set<std::string> keys)
      : authorized_(std::move(keys)) {
    raw_ = zmq_socket(context, ZMQ_REP);
  }

  ~ZmqZapHandler() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (raw_ != nullptr) zmq_close(raw_);
  }

  Status Bind() {
    if (raw_ == nullptr) {
      return Status::Unavailable(std::string("cannot create the ZAP socket: ") +
                                 zmq_strerror(zmq_errno()));
    }
    int linger = 0;
    zmq_setsockopt(raw_, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(raw_, kZapEndpoint) != 0) {
      return Status::Unavailable(std::string("cannot bind the ZAP handler at ") + kZapEndpoint +
                                 ": " + zmq_strerror(zmq_errno()));
    }
    // The socket moves to the thread here and is used by it alone.
    thread_ = std::thread([this] { Run(); });
    return Status::Ok();
  }

  int num_refused() const override { return num_refused_; }

 private:
  void Run() {
    zmq::socket_ref socket(zmq::from_handle, raw_);
    while (!stop_) {
      zmq::pollitem_t item{raw_, 0, ZMQ_POLLIN, 0};
      try {
        if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) <= 0) continue;
        std::vector<zmq::message_t> request;
        do {
          zmq::message_t frame;
          if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
          request.push_back(std::move(frame));
        } while (request.back().more());
        if (request.empty()) continue;
        Answer(socket, request);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        if (e.num() == ETERM) return;
        spdlog::warn("control channel: ZAP handler: {}", e.what());
      }
    }
  }

  // Request frames (RFC 27): version, request id, domain, address, routing
  // id, mechanism, credentials (CURVE: the client's 32-byte public key).
  // Reply frames: version, request id, status code, status text, user id,
  // metadata.
  void Answer(zmq::socket_ref socket, const std::vector<zmq::message_t>& request) {
    std::string request_id = request.size() > 1 ? request[1].to_string() : "";
    std::string address = request.size() > 3 ? request[3].to_string() : "?";
    std::string code = "400";
    std::string text = "malformed ZAP request";
    std::string user_id;
    if (request.size() >= 7 && request[0].to_string() == "1.0" &&
        request[5].to_string() == "CURVE" && request[6].size() == kCurveKeyBytes) {
      char z85[41] = {};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), kCurveKeyBytes);
      if (authorized_.count(z85) > 0) {
        code = "200";
        text = "OK";
        user_id = z85;  // the message metadata's User-Id: the peer's key
      } else {
        text = "client key not authorized";
        ++num_refused_;
        // The key is Z85 text and the address an IP: safe to log as is.
        spdlog::warn("control channel: refused a CURVE client from {} with key {} (not in "
                     "security.authorized_keys)",
                     address, z85);
      }
    } else {
      ++num_refused_;
      spdlog::warn("control channel: refused a handshake from {}: {}", address, text);
    }
    const std::string frames[] = {"1.0", request_id, code, text, user_id, ""};
    for (size_t i = 0; i < std::size(frames); ++i) {
      socket.send(zmq::buffer(frames[i]),
                  i + 1 < std::size(frames) ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

  void* raw_ = nullptr;
  const std::set<std::string> authorized_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> num_refused_{0};
};

}  // namespace

Result<std::unique_ptr<ZapHandler>> ZapHandler::Start(void* zmq_context,
                                                      const std::vector<std::string>& authorized_keys) {
  for (const std::string& key : authorized_keys) {
    HW_RETURN_IF_ERROR(CheckZ85Key(key, "authorized key"));
  }
  auto handler = std::make_unique<ZmqZapHandler>(
      zmq_context, std::set<std::string>(authorized_keys.begin(), authorized_keys.end()));
  HW_RETURN_IF_ERROR(handler->Bind());
  return std::unique_ptr<ZapHandler>(std::move(handler));
}

}  // namespace headway
