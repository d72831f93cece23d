// GGUF file reader: header, metadata, tensor infos, data alignment, mmap.
//
// Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (v2/v3).
//   magic "GGUF" (u32 0x46554747 little-endian) | version u32 |
//   n_tensors u64 | n_kv u64 | n_kv x (key: gguf_string, type: u32, value) |
//   n_tensors x (name: gguf_string, n_dims u32, dims u64[n_dims], type u32,
//                offset u64 relative to the data section) |
//   padding to `general.alignment` (default 32) | tensor data.
// gguf_string = u64 length + bytes (no terminator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"

namespace headway {

// ggml tensor types (ggml.h `enum ggml_type`); only those Headway reads.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// Name such as "Q4_1"; "type<N>" for an unknown value.
std::string GgmlTypeName(GgmlType type);

// Storage geometry of a ggml type: `block_values` values take `block_bytes`
// bytes (ggml's `ggml_type_traits`: blck_size, type_size).
struct GgmlTypeSize {
  uint64_t block_values = 1;
  uint64_t block_bytes = 4;
};

// Geometry of any type in GgmlType, whether or not Headway can dequantise it.
// Unimplemented naming the number for a value outside GgmlType.
Result<GgmlTypeSize> GgmlTypeSizeOf(GgmlType type);

// A metadata value. Arrays hold one element type.
struct GgufValue {
  using Array = std::vector<GgufValue>;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> value;

  // Typed views. Each returns InvalidArgument naming the actual type when the
  // value is not of a compatible kind (integers convert if in range).
  Result<uint64_t> AsUInt() const;
  Result<int64_t> AsInt() const;
  Result<double> AsFloat() const;
  Result<bool> AsBool() const;
  Result<std::string> AsString() const;
  Result<std::vector<std::string>> AsStringArray() const;
  Result<std::vector<int64_t>> AsIntArray() const;
  Result<std::vector<double>> AsFloatArray() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the contiguous (row) length
  GgmlType type;
  uint64_t offset;             // bytes from the start of the data section
  uint64_t num_bytes;          // size of the data in the file
  uint64_t num_elements() const;
};

// An opened, memory-mapped GGUF file. Immutable after Open; thread-safe to
// read from many threads. Tensor data pointers stay valid for its lifetime.
class GgufFile {
 public:
  // Opens and validates `path`: magic, version (2 or 3), every metadata entry
  // and tensor info, alignment, and that each tensor's data lies inside the
  // file. Errors: NotFound (no file), FailedPrecondition (not a readable
  // regular file), DataLoss (wrong magic, truncated file, tensor out of
  // bounds, duplicate key or tensor, misaligned offset, a count (metadata
  // entries, tensors, array or string length) larger than the rest of the
  // file can hold: "the header says N tensors, but the file has only M
  // bytes left at offset P"; the message names the
  // file and the offending part, e.g. "metadata entry 7 'x'" or
  // "tensor info 3 'blk.0.attn_q.weight'"), Unimplemented (unknown tensor
  // type or version), Internal (mmap failed).
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  // Metadata by key, or nullptr.
  const GgufValue* Find(const std::string& key) const;
  // Metadata by key; NotFound naming the key and file when absent.
  Result<const GgufValue*> Get(const std::string& key) const;
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }

  // Tensor info by name, or nullptr.
  const GgufTensorInfo* FindTensor(const std::string& name) const;
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  // Raw bytes of a tensor inside the mapping (valid while this file lives).
  const uint8_t* TensorData(const GgufTensorInfo& info) const;

 private:
  GgufFile() = default;

  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  const uint8_t* data_ = nullptr;   // start of the data section in the mapping
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
};

}  // namespace headway
