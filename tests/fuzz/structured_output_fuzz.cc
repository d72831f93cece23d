// Structured output's front ends on arbitrary text: the first byte picks a
// regex (plain or as JSON string content) or a JSON schema, the rest is its
// text. What compiles is then walked token by token over a small
// vocabulary: every allowed token advances, and where the automaton
// accepts, the bytes walked are a whole match of the pattern's NFA.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/structured/json_schema.h"
#include "coordinator/structured/nfa.h"
#include "coordinator/structured/regex_parser.h"
#include "coordinator/structured/token_automaton.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace headway;
using namespace headway::structured;

std::shared_ptr<const TokenVocabulary> Vocabulary() {
  std::vector<std::string> tokens = {"<eos>", "{", "}", "[", "]", "\"", ":", ",", " ", "\":",
                                     "a", "b", "ab", "0", "1", "12", "-", ".", "e", "true",
                                     "false", "null", "\xC3", "\xA9", "\xC3\xA9", "\\", "x"};
  return std::make_shared<const TokenVocabulary>(tokens, std::vector<int32_t>{0});
}

Result<Pattern> Parse(uint8_t mode, const std::string& text) {
  switch (mode % 3) {
    case 0:
      return ParseRegex(text);
    case 1: {
      RegexOptions json;
      json.json_string_content = true;
      return ParseRegex(text, json);
    }
    default: {
      const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text, nullptr, false);
      if (schema.is_discarded()) return Status::InvalidArgument("not JSON");
      return JsonSchemaPattern(schema, DefaultJsonGrammarOptions());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::shared_ptr<const TokenVocabulary> vocabulary = Vocabulary();
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  Result<Pattern> pattern = Parse(data[0], text);
  if (!pattern.ok()) {
    FUZZ_CHECK(pattern.status().code() == StatusCode::kInvalidArgument,
               pattern.status().ToString());
    return 0;
  }
  // Small bounds keep each input fast; the real ones only scale them.
  Result<Nfa> nfa = CompileNfa(*pattern, 20000);
  if (!nfa.ok()) {
    FUZZ_CHECK(nfa.status().code() == StatusCode::kResourceExhausted, nfa.status().ToString());
    return 0;
  }
  Result<std::shared_ptr<TokenAutomaton>> automaton = TokenAutomaton::Create(*pattern, vocabulary);
  if (!automaton.ok()) return 0;  // over the real NFA bound
  TokenAutomaton& a = **automaton;
  int32_t state = a.start();
  std::string walked;
  // The input's bytes choose among the allowed tokens.
  for (size_t step = 0; step < 16; ++step) {
    FUZZ_CHECK(a.IsAccepting(state) == FullMatch(*nfa, walked), "accepting '" + walked + "'");
    Result<std::shared_ptr<const TokenMask>> mask = a.Mask(state);
    if (!mask.ok()) return 0;  // past kMaxStates
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < vocabulary->size(); ++id) {
      if (MaskAllows(**mask, id)) allowed.push_back(id);
    }
    if (allowed.empty()) break;
    const int32_t token = allowed[data[step % size] % allowed.size()];
    Result<int32_t> next = a.Advance(state, token);
    if (!next.ok()) return 0;
    FUZZ_CHECK(*next != TokenAutomaton::kDead, "allowed token " + std::to_string(token) + " died");
    state = *next;
    walked += std::string(vocabulary->bytes(token));
  }
  return 0;
}
