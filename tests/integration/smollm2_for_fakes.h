// What the integration tests that drive the real coordinator with fake
// workers (tests/support/fake_worker.h) take from the real SmolLM2 file: the
// model spec the fakes register with, the tokenizer to count prompts with,
// and an ordinary one-token text ("a") for the fakes to answer with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway::testing {

struct SmolLm2ForFakes {
  ModelSpec spec;
  std::unique_ptr<Tokenizer> tokenizer;
  int32_t token_a = 0;  // the token id of "a"
};

// Loads them from the GGUF at `path`. Errors: the GGUF reader's, the spec's
// and the tokenizer's; Internal when "a" is not one token.
inline Result<SmolLm2ForFakes> LoadSmolLm2ForFakes(const std::string& path) {
  HW_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
  SmolLm2ForFakes out;
  HW_ASSIGN_OR_RETURN(out.spec, LoadModelSpec(*gguf));
  HW_ASSIGN_OR_RETURN(out.tokenizer, Tokenizer::FromGguf(*gguf));
  const std::vector<int32_t> a = out.tokenizer->Encode("a", false);
  if (a.size() != 1) return Status::Internal("\"a\" is not one token in " + path);
  out.token_a = a[0];
  return out;
}

}  // namespace headway::testing
