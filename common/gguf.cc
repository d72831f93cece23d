#include "common/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>

namespace headway {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 4;
// Bounds for the header's counts: one byte per entry, loose on purpose, so
// that a file cut short inside an entry is reported at that entry.
constexpr uint64_t kMinMetadataEntryBytes = 1;
constexpr uint64_t kMinTensorInfoBytes = 1;

// Metadata value types (gguf.md `enum gguf_metadata_value_type`).
enum class ValueType : uint32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kUInt16 = 2,
  kInt16 = 3,
  kUInt32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUInt64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

const char* KindName(const GgufValue& v) {
  switch (v.value.index()) {
    case 0: return "unsigned integer";
    case 1: return "signed integer";
    case 2: return "float";
    case 3: return "bool";
    case 4: return "string";
    default: return "array";
  }
}

Status WrongKind(const GgufValue& v, const char* wanted) {
  return Status::InvalidArgument(std::string("expected ") + wanted + ", found " + KindName(v));
}

// Bounds-checked little-endian reader over the mapped file. Every read names
// what it was reading when the file ends, so truncation errors say where.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status Truncated(const std::string& what, uint64_t need) const {
    return Status::DataLoss("truncated file " + path_ + ": " + what + " needs " +
                            std::to_string(need) + " bytes at offset " + std::to_string(pos_) +
                            " but the file has " + std::to_string(remaining()) + " left");
  }

  // A count read from the file (`who` says `count` `unit`) that the rest of
  // the file cannot hold, each taking at least `min_bytes_each`: a flipped
  // or garbage count reads as such, not as a file short by exabytes.
  Status CountTooLarge(const std::string& who, uint64_t count, const std::string& unit,
                       uint64_t min_bytes_each) const {
    return Status::DataLoss("truncated or corrupt file " + path_ + ": " + who + " says " +
                            std::to_string(count) + " " + unit + ", but the file has only " +
                            std::to_string(remaining()) + " bytes left at offset " +
                            std::to_string(pos_) +
                            (min_bytes_each > 1 ? " (each takes at least " +
                                                      std::to_string(min_bytes_each) + ")"
                                                : std::string()));
  }

  // True when `count` items of at least `min_bytes_each` bytes cannot fit.
  bool CannotHold(uint64_t count, uint64_t min_bytes_each) const {
    return count > remaining() / min_bytes_each;
  }

  Status ReadBytes(void* out, uint64_t n, const std::string& what) {
    if (n > remaining()) return Truncated(what, n);
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return Status::Ok();
  }

  template <typename T>
  Status Read(T* out, const std::string& what) {
    return ReadBytes(out, sizeof(T), what);
  }

  Status ReadString(std::string* out, const std::string& what) {
    uint64_t len = 0;
    HW_RETURN_IF_ERROR(Read(&len, what + " (string length)"));
    if (len > remaining()) return CountTooLarge(what + " (string length)", len, "bytes", 1);
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

template <typename T>
Status ReadScalar(Cursor& cur, const std::string& what, GgufValue* out) {
  T v{};
  HW_RETURN_IF_ERROR(cur.Read(&v, what));
  if constexpr (std::is_floating_point_v<T>) {
    out->value = static_cast<double>(v);
  } else if constexpr (std::is_signed_v<T>) {
    out->value = static_cast<int64_t>(v);
  } else {
    out->value = static_cast<uint64_t>(v);
  }
  return Status::Ok();
}

// The fewest bytes a value of `type` takes in the file (1 for an unknown
// type, which ReadValue then names).
uint64_t MinValueBytes(uint32_t type) {
  switch (static_cast<ValueType>(type)) {
    case ValueType::kUInt16:
    case ValueType::kInt16: return 2;
    case ValueType::kUInt32:
    case ValueType::kInt32:
    case ValueType::kFloat32: return 4;
    case ValueType::kUInt64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
    case ValueType::kString: return 8;        // the length
    case ValueType::kArray: return 4 + 8;     // element type, length
    default: return 1;
  }
}

Status ReadValue(Cursor& cur, uint32_t type, const std::string& what, int depth,
                 const std::string& path, GgufValue* out) {
  switch (static_cast<ValueType>(type)) {
    case ValueType::kUInt8: return ReadScalar<uint8_t>(cur, what, out);
    case ValueType::kInt8: return ReadScalar<int8_t>(cur, what, out);
    case ValueType::kUInt16: return ReadScalar<uint16_t>(cur, what, out);
    case ValueType::kInt16: return ReadScalar<int16_t>(cur, what, out);
    case ValueType::kUInt32: return ReadScalar<uint32_t>(cur, what, out);
    case ValueType::kInt32: return ReadScalar<int32_t>(cur, what, out);
    case ValueType::kUInt64: return ReadScalar<uint64_t>(cur, what, out);
    case ValueType::kInt64: return ReadScalar<int64_t>(cur, what, out);
    case ValueType::kFloat32: return ReadScalar<float>(cur, what, out);
    case ValueType::kFloat64: return ReadScalar<double>(cur, what, out);
    case ValueType::kBool: {
      uint8_t b = 0;
      HW_RETURN_IF_ERROR(cur.Read(&b, what));
      if (b > 1) {
        return Status::DataLoss("corrupt file " + path + ": " + what + " is a bool of value " +
                                std::to_string(b));
      }
      out->value = (b != 0);
      return Status::Ok();
    }
    case ValueType::kString: {
      std::string s;
      HW_RETURN_IF_ERROR(cur.ReadString(&s, what));
      out->value = std::move(s);
      return Status::Ok();
    }
    case ValueType::kArray: {
      if (depth >= kMaxArrayDepth) {
        return Status::DataLoss("corrupt file " + path + ": " + what + " nests arrays deeper than " +
                                std::to_string(kMaxArrayDepth));
      }
      uint32_t elem_type = 0;
      uint64_t count = 0;
      HW_RETURN_IF_ERROR(cur.Read(&elem_type, what + " (array element type)"));
      HW_RETURN_IF_ERROR(cur.Read(&count, what + " (array length)"));
      // Checking first keeps a corrupt count from allocating without bound.
      const uint64_t min_bytes = MinValueBytes(elem_type);
      if (cur.CannotHold(count, min_bytes)) {
        return cur.CountTooLarge(what + " (array length)", count, "elements", min_bytes);
      }
      GgufValue::Array items(count);
      for (uint64_t i = 0; i < count; ++i) {
        HW_RETURN_IF_ERROR(ReadValue(cur, elem_type, what + "[" + std::to_string(i) + "]",
                                     depth + 1, path, &items[i]));
      }
      out->value = std::move(items);
      return Status::Ok();
    }
  }
  return Status::DataLoss("corrupt file " + path + ": " + what + " has unknown value type " +
                          std::to_string(type));
}

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

std::string GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ4_1: return "Q4_1";
    case GgmlType::kQ5_0: return "Q5_0";
    case GgmlType::kQ5_1: return "Q5_1";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ2_K: return "Q2_K";
    case GgmlType::kQ3_K: return "Q3_K";
    case GgmlType::kQ4_K: return "Q4_K";
    case GgmlType::kQ5_K: return "Q5_K";
    case GgmlType::kQ6_K: return "Q6_K";
    case GgmlType::kBF16: return "BF16";
  }
  return "type" + std::to_string(static_cast<uint32_t>(type));
}

Result<GgmlTypeSize> GgmlTypeSizeOf(GgmlType type) {
  // Sizes from ggml-common.h block structs (QK_K = 256).
  switch (type) {
    case GgmlType::kF32: return GgmlTypeSize{1, 4};
    case GgmlType::kF16: return GgmlTypeSize{1, 2};
    case GgmlType::kBF16: return GgmlTypeSize{1, 2};
    case GgmlType::kQ4_0: return GgmlTypeSize{32, 18};
    case GgmlType::kQ4_1: return GgmlTypeSize{32, 20};
    case GgmlType::kQ5_0: return GgmlTypeSize{32, 22};
    case GgmlType::kQ5_1: return GgmlTypeSize{32, 24};
    case GgmlType::kQ8_0: return GgmlTypeSize{32, 34};
    case GgmlType::kQ2_K: return GgmlTypeSize{256, 84};
    case GgmlType::kQ3_K: return GgmlTypeSize{256, 110};
    case GgmlType::kQ4_K: return GgmlTypeSize{256, 144};
    case GgmlType::kQ5_K: return GgmlTypeSize{256, 176};
    case GgmlType::kQ6_K: return GgmlTypeSize{256, 210};
  }
  return Status::Unimplemented("unknown ggml tensor type " +
                               std::to_string(static_cast<uint32_t>(type)));
}

// ---- GgufValue views

Result<uint64_t> GgufValue::AsUInt() const {
  if (auto* u = std::get_if<uint64_t>(&value)) return *u;
  if (auto* i = std::get_if<int64_t>(&value)) {
    if (*i >= 0) return static_cast<uint64_t>(*i);
    return Status::InvalidArgument("expected unsigned integer, found negative value " +
                                   std::to_string(*i));
  }
  return WrongKind(*this, "unsigned integer");
}

Result<int64_t> GgufValue::AsInt() const {
  if (auto* i = std::get_if<int64_t>(&value)) return *i;
  if (auto* u = std::get_if<uint64_t>(&value)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(*u);
    }
    return Status::InvalidArgument("integer " + std::to_string(*u) + " does not fit in int64");
  }
  return WrongKind(*this, "integer");
}

Result<double> GgufValue::AsFloat() const {
  if (auto* d = std::get_if<double>(&value)) return *d;
  if (auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  if (auto* u = std::get_if<uint64_t>(&value)) return static_cast<double>(*u);
  return WrongKind(*this, "float");
}

Result<bool> GgufValue::AsBool() const {
  if (auto* b = std::get_if<bool>(&value)) return *b;
  return WrongKind(*this, "bool");
}

Result<std::string> GgufValue::AsString() const {
  if (auto* s = std::get_if<std::string>(&value)) return *s;
  return WrongKind(*this, "string");
}

Result<std::vector<std::string>> GgufValue::AsStringArray() const {
  auto* a = std::get_if<Array>(&value);
  if (a == nullptr) return WrongKind(*this, "array of strings");
  std::vector<std::string> out;
  out.reserve(a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    auto s = (*a)[i].AsString();
    if (!s.ok()) return s.status().WithContext("element " + std::to_string(i));
    out.push_back(std::move(s).value());
  }
  return out;
}

Result<std::vector<int64_t>> GgufValue::AsIntArray() const {
  auto* a = std::get_if<Array>(&value);
  if (a == nullptr) return WrongKind(*this, "array of integers");
  std::vector<int64_t> out;
  out.reserve(a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    auto v = (*a)[i].AsInt();
    if (!v.ok()) return v.status().WithContext("element " + std::to_string(i));
    out.push_back(*v);
  }
  return out;
}

Result<std::vector<double>> GgufValue::AsFloatArray() const {
  auto* a = std::get_if<Array>(&value);
  if (a == nullptr) return WrongKind(*this, "array of floats");
  std::vector<double> out;
  out.reserve(a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    auto v = (*a)[i].AsFloat();
    if (!v.ok()) return v.status().WithContext("element " + std::to_string(i));
    out.push_back(*v);
  }
  return out;
}

uint64_t GgufTensorInfo::num_elements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

// ---- GgufFile

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = "cannot open GGUF file " + path + ": " + std::strerror(err);
    if (err == ENOENT) return Status::NotFound(msg);
    return Status::FailedPrecondition(msg);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::FailedPrecondition("GGUF path " + path + " is not a regular file");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);

  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  if (file_bytes > 0) {
    void* m = mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Status::Internal("cannot mmap GGUF file " + path + ": " + std::strerror(err));
    }
    file->mapping_ = m;
    file->mapping_bytes_ = file_bytes;
  }
  ::close(fd);  // the mapping keeps the file alive

  const auto* base = static_cast<const uint8_t*>(file->mapping_);
  Cursor cur(base, file_bytes, path);

  // Header.
  uint32_t magic = 0;
  HW_RETURN_IF_ERROR(cur.Read(&magic, "header (magic)"));
  if (magic != kGgufMagic) {
    char shown[5] = {};
    std::memcpy(shown, &magic, 4);
    for (char& c : shown) {
      if (c != 0 && (c < 32 || c > 126)) c = '?';
    }
    return Status::DataLoss("not a GGUF file " + path + ": wrong magic \"" + std::string(shown) +
                            "\" (expected \"GGUF\")");
  }
  HW_RETURN_IF_ERROR(cur.Read(&file->version_, "header (version)"));
  if (file->version_ != 2 && file->version_ != 3) {
    std::string hint = (file->version_ & 0xFFFF) == 0 ? " (a big-endian file?)" : "";
    return Status::Unimplemented("GGUF file " + path + " has version " +
                                 std::to_string(file->version_) + hint +
                                 "; Headway reads versions 2 and 3");
  }
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  HW_RETURN_IF_ERROR(cur.Read(&n_tensors, "header (tensor count)"));
  HW_RETURN_IF_ERROR(cur.Read(&n_kv, "header (metadata count)"));
  // Checking the counts first keeps a corrupt one from driving a huge loop.
  if (cur.CannotHold(n_kv, kMinMetadataEntryBytes)) {
    return cur.CountTooLarge("the header", n_kv, "metadata entries", kMinMetadataEntryBytes);
  }
  if (cur.CannotHold(n_tensors, kMinTensorInfoBytes)) {
    return cur.CountTooLarge("the header", n_tensors, "tensors", kMinTensorInfoBytes);
  }

  // Metadata.
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string entry = "metadata entry " + std::to_string(i);
    std::string key;
    HW_RETURN_IF_ERROR(cur.ReadString(&key, entry + " (key)"));
    const std::string what = entry + " '" + key + "'";
    uint32_t type = 0;
    HW_RETURN_IF_ERROR(cur.Read(&type, what + " (value type)"));
    GgufValue value;
    HW_RETURN_IF_ERROR(ReadValue(cur, type, what, 0, path, &value));
    if (!file->metadata_.emplace(key, std::move(value)).second) {
      return Status::DataLoss("corrupt file " + path + ": duplicate metadata key '" + key + "'");
    }
  }
  if (const GgufValue* a = file->Find("general.alignment")) {
    auto align = a->AsUInt();
    if (!align.ok() || !IsPowerOfTwo(*align)) {
      return Status::DataLoss("corrupt file " + path +
                              ": general.alignment must be a power of two");
    }
    file->alignment_ = *align;
  } else {
    file->alignment_ = kDefaultAlignment;
  }

  // Tensor infos.
  if (cur.CannotHold(n_tensors, kMinTensorInfoBytes)) {
    return cur.CountTooLarge("the header", n_tensors, "tensors", kMinTensorInfoBytes);
  }
  file->tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string entry = "tensor info " + std::to_string(i);
    GgufTensorInfo info;
    HW_RETURN_IF_ERROR(cur.ReadString(&info.name, entry + " (name)"));
    const std::string what = entry + " '" + info.name + "'";
    uint32_t n_dims = 0;
    HW_RETURN_IF_ERROR(cur.Read(&n_dims, what + " (dimension count)"));
    if (n_dims == 0 || n_dims > 4) {
      return Status::DataLoss("corrupt file " + path + ": " + what + " has " +
                              std::to_string(n_dims) + " dimensions (expected 1 to 4)");
    }
    info.dims.resize(n_dims);
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      HW_RETURN_IF_ERROR(cur.Read(&info.dims[d], what + " (dimensions)"));
      if (info.dims[d] == 0 ||
          n_elements > std::numeric_limits<uint64_t>::max() / 16 / info.dims[d]) {
        return Status::DataLoss("corrupt file " + path + ": " + what + " has dimension " +
                                std::to_string(info.dims[d]));
      }
      n_elements *= info.dims[d];
    }
    uint32_t type = 0;
    HW_RETURN_IF_ERROR(cur.Read(&type, what + " (type)"));
    HW_RETURN_IF_ERROR(cur.Read(&info.offset, what + " (offset)"));
    info.type = static_cast<GgmlType>(type);
    auto size = GgmlTypeSizeOf(info.type);
    if (!size.ok()) {
      return Status::Unimplemented("GGUF file " + path + ": tensor '" + info.name +
                                   "' has unknown tensor type " + std::to_string(type));
    }
    if (info.dims[0] % size->block_values != 0) {
      return Status::DataLoss("corrupt file " + path + ": tensor '" + info.name + "' of type " +
                              GgmlTypeName(info.type) + " has row length " +
                              std::to_string(info.dims[0]) + ", not a multiple of its block of " +
                              std::to_string(size->block_values));
    }
    info.num_bytes = n_elements / size->block_values * size->block_bytes;
    if (info.offset % file->alignment_ != 0) {
      return Status::DataLoss("corrupt file " + path + ": tensor '" + info.name + "' offset " +
                              std::to_string(info.offset) + " is not aligned to " +
                              std::to_string(file->alignment_));
    }
    if (!file->tensor_index_.emplace(info.name, file->tensors_.size()).second) {
      return Status::DataLoss("corrupt file " + path + ": duplicate tensor '" + info.name + "'");
    }
    file->tensors_.push_back(std::move(info));
  }

  // Data section: starts at the next multiple of the alignment.
  const uint64_t data_start = (cur.pos() + file->alignment_ - 1) / file->alignment_ * file->alignment_;
  if (n_tensors > 0 && data_start > file_bytes) {
    return Status::DataLoss("truncated file " + path + ": tensor data section starts at offset " +
                            std::to_string(data_start) + " but the file has " +
                            std::to_string(file_bytes) + " bytes");
  }
  const uint64_t data_bytes = data_start <= file_bytes ? file_bytes - data_start : 0;
  for (const GgufTensorInfo& info : file->tensors_) {
    if (info.offset > data_bytes || info.num_bytes > data_bytes - info.offset) {
      return Status::DataLoss("truncated file " + path + ": tensor data of '" + info.name +
                              "' (" + std::to_string(info.num_bytes) + " bytes at data offset " +
                              std::to_string(info.offset) + ") runs past the end of the file (" +
                              std::to_string(data_bytes) + " data bytes)");
    }
  }
  file->data_ = base == nullptr ? nullptr : base + std::min(data_start, file_bytes);
  return file;
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

Result<const GgufValue*> GgufFile::Get(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) {
    return Status::NotFound("GGUF file " + path_ + " has no metadata key '" + key + "'");
  }
  return v;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::TensorData(const GgufTensorInfo& info) const {
  return data_ + info.offset;
}

}  // namespace headway
