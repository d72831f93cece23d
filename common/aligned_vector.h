// std::vector whose storage starts on a cache-line boundary.
//
// The CPU kernels load 64-byte zmm vectors (32-byte ymm on AVX2) at offsets
// that are multiples of 64 bytes from the start of their operands; a buffer
// from plain `new` is only 16-byte aligned, so every such load would straddle
// two cache lines, which on Sapphire Rapids costs the paired matmul sweep a
// third of its speed (docs/cpu-performance.md).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace headway {

// A standard allocator (C++17 aligned operator new) with `kAlignment`-byte
// aligned storage. kAlignment must be a power of two.
template <typename T, std::size_t kAlignment = 64>
struct AlignedAllocator {
  static_assert((kAlignment & (kAlignment - 1)) == 0 && kAlignment >= alignof(T));
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, kAlignment>;
  };

  AlignedAllocator() noexcept = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, kAlignment>&) noexcept {}

  // Throws std::bad_alloc as operator new does.
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kAlignment}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete(p, std::align_val_t{kAlignment});
  }

  template <typename U>
  bool operator==(const AlignedAllocator<U, kAlignment>&) const noexcept {
    return true;
  }
};

// Activations and kernel scratch: data() is 64-byte aligned.
template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace headway
