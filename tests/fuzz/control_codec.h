// The control_message fuzz target's world and input format, shared with the
// seed generator (make_seeds.cc).
//
// World: a coordinator Engine over a prefill instance (tp 1, instance 0)
// and a decode instance (tp 2, instance 1) of a small llama-shaped model,
// and requests submitted where the input says.
//
// Input: records, one after another, each
//   u8 flags | u8 identity_len | identity | u16 payload_len (LE) | payload
// flags bit 0: the identity's connection closed (payload ignored);
// bit 1: before decoding, set the payload Envelope's step_result.step_id or
// transfer_result.transfer_id to that of the last plan sent to this
// identity, so the fuzzer reaches states past a step without guessing ids;
// bit 2: first submit a request (10 prompt tokens, 3 to generate), as the
// HTTP API would, before handling the record.
// A truncated record ends the input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/model_spec.h"

namespace headway::fuzz {

inline constexpr uint8_t kRecordDisconnect = 1;
inline constexpr uint8_t kRecordAnswerLastPlan = 2;
inline constexpr uint8_t kRecordSubmitRequest = 4;

struct ControlRecord {
  uint8_t flags = 0;
  std::string identity;
  std::string payload;
};

inline std::string EncodeRecords(const std::vector<ControlRecord>& records) {
  std::string out;
  for (const ControlRecord& r : records) {
    out.push_back(char(r.flags));
    out.push_back(char(uint8_t(r.identity.size())));
    out += r.identity.substr(0, 255);
    const size_t n = r.payload.size() > 0xFFFF ? 0xFFFF : r.payload.size();
    out.push_back(char(n & 0xFF));
    out.push_back(char(n >> 8));
    out += r.payload.substr(0, n);
  }
  return out;
}

inline std::vector<ControlRecord> DecodeRecords(std::string_view in) {
  std::vector<ControlRecord> records;
  while (in.size() >= 2) {
    ControlRecord r;
    r.flags = uint8_t(in[0]);
    const size_t id_len = uint8_t(in[1]);
    in.remove_prefix(2);
    if (in.size() < id_len + 2) break;
    r.identity = std::string(in.substr(0, id_len));
    const size_t n = size_t(uint8_t(in[id_len])) | size_t(uint8_t(in[id_len + 1])) << 8;
    in.remove_prefix(id_len + 2);
    if (in.size() < n) break;
    r.payload = std::string(in.substr(0, n));
    in.remove_prefix(n);
    records.push_back(std::move(r));
  }
  return records;
}

// The model the world serves (FakeRegistration's shapes): 2 layers, 2 KV
// heads of 16, a 260-token vocabulary (tests/coordinator/tiny_vocab.h).
inline ModelSpec ControlWorldSpec() {
  ModelSpec spec;
  spec.name = "fuzz-llama";
  spec.architecture = "llama";
  spec.num_layers = 2;
  spec.hidden_size = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.intermediate_size = 128;
  spec.vocab_size = 260;
  spec.context_length = 512;
  spec.slot_specs.assign(size_t(spec.num_layers * spec.num_kv_heads), SlotSpec{});
  return spec;
}

inline constexpr int kControlWorldBlockSize = 4;

inline const char* ControlWorldConfig() {
  return R"(model:
  path: fuzz.gguf
coordinator:
  control_address: tcp://127.0.0.1:5557
cache:
  block_size: 4
  kv_memory_mb: 1
  enable_prefix_caching: true
scheduler:
  max_num_seqs: 4
  max_num_batched_tokens: 64
  max_model_len: 256
pools:
  - name: prefill
    role: prefill
    instances:
      - tp_size: 1
  - name: decode
    role: decode
    instances:
      - tp_size: 2
)";
}

}  // namespace headway::fuzz
