#include "tests/support/tcp_garbage.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>

namespace headway::testing {

void SendTcpGarbage(int port) {
  std::mt19937 rng(1234);
  constexpr int kConnections = 8;
  for (int round = 0; round < kConnections; ++round) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) continue;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      std::string bytes(size_t(1) << (8 + round % 7), '\0');
      for (char& c : bytes) c = char(rng());
      if (round == kConnections - 1) {
        // ZMTP 3.0 (RFC 23) greeting: signature, version 3.0, mechanism
        // "NULL" padded to 20 bytes, as-server 0, 31 bytes of filler.
        bytes = std::string("\xff\0\0\0\0\0\0\0\x01\x7f\x03\x00NULL", 16) + std::string(48, '\0');
      }
      (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ::close(fd);
  }
}

}  // namespace headway::testing
