#include "comm/fd_io.h"

#include <unistd.h>

#include <string>

namespace headway {

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool SendPeerInfo(int fd, const KvPeerInfo& info, const std::string& write_key) {
  if (write_key.size() != kKvWriteKeyBytes) return false;
  const uint32_t n = static_cast<uint32_t>(info.worker_address.size());
  return WriteAll(fd, &n, sizeof n) && WriteAll(fd, info.worker_address.data(), n) &&
         WriteAll(fd, &info.block_bytes, 8) && WriteAll(fd, &info.num_blocks, 4) &&
         WriteAll(fd, write_key.data(), write_key.size());
}

bool ReceivePeerInfo(int fd, KvPeerInfo* info, std::string* write_key) {
  uint32_t n = 0;
  if (!ReadAll(fd, &n, sizeof n) || n > (1u << 20)) return false;
  info->worker_address.resize(n);
  write_key->resize(kKvWriteKeyBytes);
  return ReadAll(fd, info->worker_address.data(), n) && ReadAll(fd, &info->block_bytes, 8) &&
         ReadAll(fd, &info->num_blocks, 4) && ReadAll(fd, write_key->data(), write_key->size());
}

}  // namespace headway
