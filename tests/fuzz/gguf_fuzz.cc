// The GGUF reader on mutated files: GgufFile::Open on the input's bytes
// (held in a memfd, so that the real open, stat and mmap path runs), then
// every accessor on every metadata value, every tensor's bytes, and what
// the coordinator and launcher do next with a model file: LoadModelSpec,
// the tokenizer's keys and CheckModelTensors. Seeds: small synthetic
// files from tests/fuzz/make_seeds.cc, not the real models.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/gguf.h"
#include "common/model_spec.h"
#include "common/model_tensors.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace headway;

int memfd = -1;
std::string memfd_path;

void TouchValues(const GgufFile& gguf) {
  for (const auto& [key, value] : gguf.metadata()) {
    (void)value.AsUInt();
    (void)value.AsInt();
    (void)value.AsFloat();
    (void)value.AsBool();
    (void)value.AsString();
    (void)value.AsStringArray();
    (void)value.AsIntArray();
    (void)value.AsFloatArray();
  }
}

void TouchTensors(const GgufFile& gguf) {
  unsigned sum = 0;
  for (const GgufTensorInfo& info : gguf.tensors()) {
    FUZZ_CHECK(gguf.FindTensor(info.name) == &info, info.name);
    (void)info.num_elements();
    if (info.num_bytes == 0) continue;
    // ASan checks that the first and last byte lie inside the mapping.
    const uint8_t* bytes = gguf.TensorData(info);
    sum += bytes[0] + bytes[info.num_bytes - 1];
  }
  volatile unsigned sink = sum;
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  memfd = memfd_create("gguf-fuzz", 0);
  FUZZ_CHECK(memfd >= 0, "memfd_create failed");
  memfd_path = "/proc/self/fd/" + std::to_string(memfd);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FUZZ_CHECK(ftruncate(memfd, 0) == 0, "ftruncate failed");
  size_t written = 0;
  while (written < size) {
    const ssize_t n = pwrite(memfd, data + written, size - written, off_t(written));
    FUZZ_CHECK(n > 0, "pwrite failed");
    written += size_t(n);
  }
  Result<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(memfd_path);
  if (!gguf.ok()) {
    const StatusCode code = gguf.status().code();
    FUZZ_CHECK(code == StatusCode::kDataLoss || code == StatusCode::kUnimplemented,
               gguf.status().ToString());
    return 0;
  }
  TouchValues(**gguf);
  TouchTensors(**gguf);
  (void)LoadTokenizerVocab(**gguf);
  Result<ModelSpec> spec = LoadModelSpec(**gguf);
  if (spec.ok()) (void)CheckModelTensors(**gguf, *spec);
  return 0;
}
