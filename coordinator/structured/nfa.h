// A Pattern (pattern.h) compiled to a byte-level NFA by Thompson's
// construction (Thompson, "Regular expression search algorithm", CACM 1968):
// states with byte-range edges and epsilon edges, one start and one accept
// state.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "coordinator/structured/pattern.h"

namespace headway::structured {

struct NfaState {
  struct Edge {
    uint8_t lo = 0, hi = 0;  // bytes lo..hi, inclusive
    int32_t to = 0;
  };
  std::vector<Edge> edges;      // on a byte
  std::vector<int32_t> epsilon;  // without one
};

struct Nfa {
  std::vector<NfaState> states;
  int32_t start = 0;
  int32_t accept = 0;  // no edges leave it
};

// The most NFA states a pattern may compile to (a bound on the memory and
// the DFA work of one grammar; about 100 bytes a state, so ~25 MiB).
inline constexpr size_t kMaxNfaStates = 1u << 18;

// Thompson's construction of `pattern`.
// Errors: ResourceExhausted when it needs more than `max_states` states (a
// huge repetition count or a deeply nested schema), saying how many.
Result<Nfa> CompileNfa(const Pattern& pattern, size_t max_states = kMaxNfaStates);

// True when `bytes` as a whole is in the NFA's language (a set-of-states
// simulation; for tests and checks, not the token masks).
bool FullMatch(const Nfa& nfa, std::string_view bytes);

}  // namespace headway::structured
