// Structured-output requests compiled to token automata, with a cache: a
// client that sends the same schema with every request compiles it once.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <semaphore>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/status.h"
#include "coordinator/structured/token_automaton.h"

namespace headway::structured {

// What one request constrains its output to.
struct StructuredOutputSpec {
  enum class Kind {
    kJsonSchema,  // JSON valid against `source`, a JSON schema (json_schema.h's subset)
    kJsonObject,  // any JSON object (response_format json_object)
    kRegex,       // a whole match of the regex `source` (regex_parser.h's syntax)
    kChoice,      // exactly one of the strings of `source`, a JSON array of strings
  };
  Kind kind = Kind::kJsonObject;
  std::string source;
  // For JSON: a regex for the whitespace allowed after ',' and ':' (vLLM's
  // guided_whitespace_pattern; only ' ', '\t', '\n', '\r' are kept:
  // RegexOptions::json_whitespace); "" = at most one space.
  std::string whitespace_pattern;
  // The request field it came from ("response_format", "guided_regex",
  // ...), for errors; not part of the grammar.
  std::string field;
};

class GrammarCompiler {
 public:
  // Keeps the `capacity` most recently used automata, fewer when they hold
  // more than `max_bytes` (TokenAutomaton::MemoryBytes; an automaton in use
  // by a request lives on with it).
  GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity = 64,
                  size_t max_bytes = size_t(256) << 20);

  // The automaton of `spec`, compiled or from the cache, with the mask of its
  // start state computed (off the engine thread's step path).
  // Errors: InvalidArgument for a schema, regex or choice list outside what
  // is supported (the message names the keyword or construct), and for a
  // grammar that allows only the empty answer or that no token can begin;
  // ResourceExhausted for a grammar too large to compile.
  Result<std::shared_ptr<TokenAutomaton>> Compile(const StructuredOutputSpec& spec);

  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

 private:
  Result<std::shared_ptr<TokenAutomaton>> CompileUncached(const StructuredOutputSpec& spec);

  const std::shared_ptr<const TokenVocabulary> vocabulary_;
  const size_t capacity_;
  const size_t max_bytes_;
  static constexpr std::ptrdiff_t kMaxConcurrentCompiles = 2;
  std::counting_semaphore<kMaxConcurrentCompiles> compile_slots_{kMaxConcurrentCompiles};
  std::mutex mu_;
  using Entry = std::pair<std::string, std::shared_ptr<TokenAutomaton>>;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace headway::structured
