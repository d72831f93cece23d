#include "deploy/launcher/xxh64.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace headway::launcher {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// The spec reads lanes little-endian; memcpy keeps it alignment-safe.
// (Every machine Headway builds for is little-endian.)
uint64_t Read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint32_t Read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint64_t Round(uint64_t acc, uint64_t lane) {
  acc += lane * kP2;
  acc = Rotl(acc, 31);
  return acc * kP1;
}

uint64_t MergeRound(uint64_t acc, uint64_t val) {
  acc ^= Round(0, val);
  return acc * kP1 + kP4;
}

}  // namespace

Xxh64::Xxh64() : acc_{kP1 + kP2, kP2, 0, 0 - kP1} {}

void Xxh64::Update(const void* data, size_t n_bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_bytes_ += n_bytes;
  if (buffered_ > 0) {
    const size_t take = std::min(n_bytes, sizeof buffer_ - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n_bytes -= take;
    if (buffered_ < sizeof buffer_) return;
    for (int i = 0; i < 4; ++i) acc_[i] = Round(acc_[i], Read64(buffer_ + 8 * i));
    buffered_ = 0;
  }
  while (n_bytes >= 32) {
    for (int i = 0; i < 4; ++i) acc_[i] = Round(acc_[i], Read64(p + 8 * i));
    p += 32;
    n_bytes -= 32;
  }
  std::memcpy(buffer_, p, n_bytes);
  buffered_ = n_bytes;
}

uint64_t Xxh64::Digest() const {
  uint64_t h;
  if (total_bytes_ >= 32) {
    h = Rotl(acc_[0], 1) + Rotl(acc_[1], 7) + Rotl(acc_[2], 12) + Rotl(acc_[3], 18);
    for (int i = 0; i < 4; ++i) h = MergeRound(h, acc_[i]);
  } else {
    h = kP5;  // seed 0
  }
  h += total_bytes_;
  const unsigned char* p = buffer_;
  size_t left = buffered_;
  while (left >= 8) {
    h ^= Round(0, Read64(p));
    h = Rotl(h, 27) * kP1 + kP4;
    p += 8;
    left -= 8;
  }
  if (left >= 4) {
    h ^= uint64_t(Read32(p)) * kP1;
    h = Rotl(h, 23) * kP2 + kP3;
    p += 4;
    left -= 4;
  }
  while (left > 0) {
    h ^= uint64_t(*p) * kP5;
    h = Rotl(h, 11) * kP1;
    ++p;
    --left;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t Xxh64Of(const void* data, size_t n_bytes) {
  Xxh64 hash;
  hash.Update(data, n_bytes);
  return hash.Digest();
}

std::string FormatXxh64(uint64_t hash) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::string("xxh64:") + hex;
}

Status HashFile(const std::string& path, Xxh64* hash) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return Status::NotFound("cannot open " + path + ": " + std::strerror(errno));
  }
  std::vector<unsigned char> piece(size_t(1) << 20);
  size_t n;
  while ((n = std::fread(piece.data(), 1, piece.size(), file)) > 0) hash->Update(piece.data(), n);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) return Status::Unavailable("read error in " + path);
  return Status::Ok();
}

Result<uint64_t> FileXxh64(const std::string& path) {
  Xxh64 hash;
  HW_RETURN_IF_ERROR(HashFile(path, &hash));
  return hash.Digest();
}

}  // namespace headway::launcher
