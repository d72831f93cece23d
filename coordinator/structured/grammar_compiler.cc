#include "coordinator/structured/grammar_compiler.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <vector>

#include "coordinator/structured/json_schema.h"
#include "coordinator/structured/regex_parser.h"

namespace headway::structured {

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocabulary,
                                 size_t capacity, size_t max_bytes)
    : vocabulary_(std::move(vocabulary)), capacity_(capacity), max_bytes_(max_bytes) {}

namespace {

Result<Pattern> ChoicePattern(const std::string& source) {
  const nlohmann::json choices = nlohmann::json::parse(source, nullptr, false);
  if (!choices.is_array() || choices.empty()) {
    return Status::InvalidArgument("the choices must be a non-empty array of strings");
  }
  std::vector<Pattern> alternatives;
  for (const nlohmann::json& c : choices) {
    if (!c.is_string()) return Status::InvalidArgument("the choices must be strings");
    alternatives.push_back(Literal(c.get<std::string>()));
  }
  return Alt(std::move(alternatives));
}

Result<Pattern> SpecPattern(const StructuredOutputSpec& spec) {
  JsonGrammarOptions options = DefaultJsonGrammarOptions();
  if (!spec.whitespace_pattern.empty()) {
    RegexOptions whitespace;
    whitespace.json_whitespace = true;
    Result<Pattern> ws = ParseRegex(spec.whitespace_pattern, whitespace);
    if (!ws.ok()) return ws.status().WithContext("the whitespace pattern");
    options.whitespace = *ws;
  }
  switch (spec.kind) {
    case StructuredOutputSpec::Kind::kJsonSchema: {
      const nlohmann::ordered_json schema =
          nlohmann::ordered_json::parse(spec.source, nullptr, false);
      if (schema.is_discarded()) return Status::InvalidArgument("the JSON schema is not JSON");
      return JsonSchemaPattern(schema, options);
    }
    case StructuredOutputSpec::Kind::kJsonObject:
      return JsonObjectPattern(options);
    case StructuredOutputSpec::Kind::kRegex:
      return ParseRegex(spec.source);
    case StructuredOutputSpec::Kind::kChoice:
      return ChoicePattern(spec.source);
  }
  return Status::Internal("unknown structured output kind");
}

}  // namespace

Result<std::shared_ptr<TokenAutomaton>> GrammarCompiler::CompileUncached(
    const StructuredOutputSpec& spec) {
  HW_ASSIGN_OR_RETURN(const Pattern pattern, SpecPattern(spec));
  HW_ASSIGN_OR_RETURN(std::shared_ptr<TokenAutomaton> automaton,
                      TokenAutomaton::Create(pattern, vocabulary_));
  const int32_t start = automaton->start();
  HW_ASSIGN_OR_RETURN(std::shared_ptr<const TokenMask> mask, automaton->Mask(start));
  HW_ASSIGN_OR_RETURN(const bool empty_only, automaton->IsTerminal(start));
  if (empty_only) return Status::InvalidArgument("the grammar allows only an empty answer");
  if (MaskAllowsNone(*mask) && !automaton->IsAccepting(start)) {
    return Status::InvalidArgument("no token of the vocabulary can begin an answer");
  }
  return automaton;
}

Result<std::shared_ptr<TokenAutomaton>> GrammarCompiler::Compile(
    const StructuredOutputSpec& spec) {
  const std::string key = std::to_string(int(spec.kind)) + '\0' + spec.whitespace_pattern +
                          '\0' + spec.source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      if (!it->second->second->Full()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
      // A full automaton fails every answer that needs a new state; the
      // requests that hold it keep it, new ones start from a fresh one.
      lru_.erase(it->second);
      index_.erase(it);
    }
  }
  // Compiled unlocked: two requests with one new grammar may both compile
  // it, and the second keeps the first's. At most kMaxConcurrentCompiles at
  // once: each may build an NFA of kMaxNfaStates.
  compile_slots_.acquire();
  Result<std::shared_ptr<TokenAutomaton>> compiled = CompileUncached(spec);
  compile_slots_.release();
  HW_ASSIGN_OR_RETURN(std::shared_ptr<TokenAutomaton> automaton, std::move(compiled));
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    if (!it->second->second->Full()) return it->second->second;
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.emplace_front(key, automaton);
  index_[key] = lru_.begin();
  // Automata grow as requests meet new states; the bound is checked as
  // new grammars arrive, oldest out first.
  size_t bytes = 0;
  for (const Entry& e : lru_) bytes += e.second->MemoryBytes();
  while (lru_.size() > 1 && (lru_.size() > capacity_ || bytes > max_bytes_)) {
    bytes -= std::min(bytes, lru_.back().second->MemoryBytes());
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return automaton;
}

}  // namespace headway::structured
