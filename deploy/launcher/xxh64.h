// XXH64, the 64-bit xxHash of Yann Collet (spec:
// https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md, seed 0),
// for checking that a model file on another host is the same file. It is an
// integrity check against truncated or different copies, not a defence
// against someone forging a file: it is not cryptographic. Chosen because it
// reads a 100 MB file at memory speed (several GB/s on one core) where a
// SHA-256 without a crypto library would cost about a second.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace headway::launcher {

// Streaming XXH64: Update() any number of times, then Digest(), which does
// not change the state. Equal to the one-shot XXH64 of the concatenated input.
class Xxh64 {
 public:
  Xxh64();
  void Update(const void* data, size_t n_bytes);
  uint64_t Digest() const;

 private:
  uint64_t acc_[4];
  unsigned char buffer_[32];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// XXH64 of `n_bytes` bytes at `data`.
uint64_t Xxh64Of(const void* data, size_t n_bytes);

// "xxh64:" and the 16 lowercase hex digits of `hash`.
std::string FormatXxh64(uint64_t hash);

// Feeds the whole file at `path` into *hash, read in 1 MiB pieces. Errors:
// NotFound when it cannot be opened; Unavailable on a read error (both name
// the path; *hash has then seen part of the file).
Status HashFile(const std::string& path, Xxh64* hash);

// XXH64 of the whole file at `path`. Errors: as HashFile.
Result<uint64_t> FileXxh64(const std::string& path);

}  // namespace headway::launcher
