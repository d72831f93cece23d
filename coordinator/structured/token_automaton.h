// Token masks for constrained decoding: which tokens of the vocabulary can
// continue an output that must stay in a regular language.
//
// A Pattern's NFA (nfa.h) is determinised lazily, byte by byte, by the
// subset construction (as RE2 and Rust's regex-automata do); a DFA state is
// one prefix class of valid outputs. A token is allowed in a state when
// every one of its bytes has a transition, so a token that crosses a grammar
// boundary (`":"` closing a key and opening a value) or ends inside a
// multi-byte character is judged by its bytes, not its text. A state's mask
// walks the whole vocabulary once in sorted byte order, reusing the states
// of the common prefix of consecutive tokens and skipping every token that
// shares a dead prefix (the vocabulary trie of XGrammar, Dong et al. 2024,
// "XGrammar: Flexible and Efficient Structured Generation Engine for Large
// Language Models", and llguidance, walked without building it), and is
// kept: a grammar visits few distinct states, so most steps look a mask up.
//
// Thread-safe: one automaton serves every request that uses its grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "coordinator/structured/nfa.h"
#include "coordinator/structured/pattern.h"

namespace headway::structured {

// The vocabulary as grammars see it: each token id's bytes, sorted.
class TokenVocabulary {
 public:
  // `token_bytes[id]` is token id's output bytes. Ids in `never` (special
  // tokens such as EOS, which a caller allows itself) and tokens with no
  // bytes are never allowed by a grammar.
  TokenVocabulary(std::vector<std::string> token_bytes, const std::vector<int32_t>& never);

  int32_t size() const { return int32_t(bytes_.size()); }  // ids [0, size)
  std::string_view bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool never(int32_t id) const { return never_[size_t(id)] != 0; }
  // The allowed-ever ids in ascending byte order, and for each the length of
  // the prefix it shares with the one before (0 for the first).
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint16_t>& shared_prefix() const { return shared_prefix_; }
  // The bytes of sorted()[k], from one buffer in sorted order: a mask's walk
  // reads the vocabulary front to back instead of chasing each token's
  // string (which made the walk memory-bound).
  std::string_view sorted_bytes(size_t k) const {
    return std::string_view(sorted_buffer_).substr(sorted_begin_[k],
                                                   sorted_begin_[k + 1] - sorted_begin_[k]);
  }

 private:
  std::vector<std::string> bytes_;
  std::vector<char> never_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> shared_prefix_;
  std::string sorted_buffer_;
  std::vector<size_t> sorted_begin_;  // [sorted_.size() + 1]
};

// Words of a token mask: bit (id % 32) of word id / 32 is set when token
// `id` is allowed.
using TokenMask = std::vector<uint32_t>;

// True when `mask` allows token `id`; false for an id outside it.
inline bool MaskAllows(const TokenMask& mask, int32_t id) {
  return id >= 0 && size_t(id) / 32 < mask.size() && ((mask[size_t(id) / 32] >> (id % 32)) & 1);
}
// Lets `mask` allow token `id`; an id outside it is left out.
inline void MaskAllow(TokenMask* mask, int32_t id) {
  if (id >= 0 && size_t(id) / 32 < mask->size()) (*mask)[size_t(id) / 32] |= 1u << (id % 32);
}
// True when `mask` allows no token at all.
inline bool MaskAllowsNone(const TokenMask& mask) {
  for (uint32_t word : mask) {
    if (word != 0) return false;
  }
  return true;
}

class TokenAutomaton {
 public:
  // The DFA states an automaton may create (each ~1 KiB of transitions):
  // 32 MiB at most.
  static constexpr size_t kMaxStates = 1u << 15;
  // Bytes of masks an automaton keeps before it forgets them all (2,730
  // masks of SmolLM2's vocabulary, 512 of Gemma 3's).
  static constexpr size_t kMaxMaskBytes = size_t(16) << 20;

  // Compiles `pattern` for `vocabulary`.
  // Errors: ResourceExhausted when its NFA is too large (CompileNfa).
  static Result<std::shared_ptr<TokenAutomaton>> Create(
      const Pattern& pattern, std::shared_ptr<const TokenVocabulary> vocabulary);

  // Where every output starts.
  int32_t start() const { return 0; }
  // The state after `token_id` from `state`, or kDead when the token cannot
  // continue a valid output (a never-allowed token included).
  // Errors: InvalidArgument past kMaxStates (the grammar is too large to
  // run). REQUIRES: state is a live state of this automaton.
  static constexpr int32_t kDead = -1;
  Result<int32_t> Advance(int32_t state, int32_t token_id);
  // The output so far is a whole valid output.
  bool IsAccepting(int32_t state);
  // Accepting, and no byte can follow: the output is complete.
  Result<bool> IsTerminal(int32_t state);
  // The tokens that can follow from `state` ([ceil(vocab / 32)] words). The
  // caller adds its end tokens (EOS) where IsAccepting.
  // Errors: InvalidArgument past kMaxStates.
  Result<std::shared_ptr<const TokenMask>> Mask(int32_t state);

  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // True once it has kMaxStates states: new ones can no longer be made.
  bool Full();
  // Bytes of memory its NFA, DFA states and kept masks take.
  size_t MemoryBytes();

 private:
  TokenAutomaton(Nfa nfa, std::shared_ptr<const TokenVocabulary> vocabulary);

  static constexpr int32_t kUnknown = -2;
  // The state reached from `state` on `byte`: kDead, or an error past
  // kMaxStates. Locked by the caller.
  Result<int32_t> Step(int32_t state, uint8_t byte);
  // The id of the DFA state for the sorted NFA state set `set`.
  Result<int32_t> Intern(std::vector<int32_t> set);
  Result<TokenMask> ComputeMask(int32_t state);

  const Nfa nfa_;
  size_t nfa_bytes_ = 0;
  const std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::mutex mu_;
  std::vector<std::vector<int32_t>> sets_;  // per DFA state, sorted NFA states
  std::vector<int32_t> next_;               // [state * 256 + byte]
  std::vector<char> accepting_;
  std::unordered_map<std::string, int32_t> ids_;  // set bytes -> state
  std::unordered_map<int32_t, std::shared_ptr<const TokenMask>> masks_;
  std::unordered_map<int32_t, bool> terminal_;
  size_t mask_bytes_ = 0;
  size_t set_bytes_ = 0;  // of sets_ and the keys of ids_
  std::vector<uint32_t> mark_;  // Closure's visited stamps, [NFA states]
  uint32_t stamp_ = 0;
};

}  // namespace headway::structured
