#include "coordinator/structured/token_automaton.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace headway::structured {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes,
                                 const std::vector<int32_t>& never)
    : bytes_(std::move(token_bytes)), never_(bytes_.size(), 0) {
  for (int32_t id : never) {
    if (id >= 0 && size_t(id) < never_.size()) never_[size_t(id)] = 1;
  }
  for (int32_t id = 0; id < size(); ++id) {
    if (bytes_[size_t(id)].empty()) never_[size_t(id)] = 1;
    if (!never_[size_t(id)]) sorted_.push_back(id);
  }
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
  sorted_begin_.push_back(0);
  for (int32_t id : sorted_) {
    sorted_buffer_ += bytes_[size_t(id)];
    sorted_begin_.push_back(sorted_buffer_.size());
  }
  shared_prefix_.assign(sorted_.size(), 0);
  for (size_t k = 1; k < sorted_.size(); ++k) {
    const std::string& a = bytes_[size_t(sorted_[k - 1])];
    const std::string& b = bytes_[size_t(sorted_[k])];
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    shared_prefix_[k] = uint16_t(std::min<size_t>(n, UINT16_MAX));
  }
}

namespace {

// The epsilon closure of `seeds`, sorted; `mark`/`stamp` avoid clearing a
// visited array of NFA size per call.
std::vector<int32_t> Closure(const Nfa& nfa, std::vector<int32_t> seeds,
                             std::vector<uint32_t>* mark, uint32_t stamp) {
  std::vector<int32_t> out;
  while (!seeds.empty()) {
    const int32_t s = seeds.back();
    seeds.pop_back();
    if ((*mark)[size_t(s)] == stamp) continue;
    (*mark)[size_t(s)] = stamp;
    out.push_back(s);
    for (int32_t e : nfa.states[size_t(s)].epsilon) seeds.push_back(e);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Result<std::shared_ptr<TokenAutomaton>> TokenAutomaton::Create(
    const Pattern& pattern, std::shared_ptr<const TokenVocabulary> vocabulary) {
  HW_ASSIGN_OR_RETURN(Nfa nfa, CompileNfa(pattern));
  return std::shared_ptr<TokenAutomaton>(new TokenAutomaton(std::move(nfa), std::move(vocabulary)));
}

TokenAutomaton::TokenAutomaton(Nfa nfa, std::shared_ptr<const TokenVocabulary> vocabulary)
    : nfa_(std::move(nfa)), vocabulary_(std::move(vocabulary)), mark_(nfa_.states.size(), 0) {
  for (const NfaState& s : nfa_.states) {
    nfa_bytes_ += sizeof(NfaState) + sizeof(uint32_t) + s.edges.capacity() * sizeof(NfaState::Edge) +
                  s.epsilon.capacity() * sizeof(int32_t);
  }
  const Result<int32_t> start = Intern(Closure(nfa_, {nfa_.start}, &mark_, ++stamp_));
  HW_CHECK(start.ok() && *start == 0);
}

Result<int32_t> TokenAutomaton::Intern(std::vector<int32_t> set) {
  if (set.empty()) return kDead;
  std::string key(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int32_t));
  if (auto it = ids_.find(key); it != ids_.end()) return it->second;
  if (sets_.size() >= kMaxStates) {
    // The client's grammar, not the server, is at fault: a regex such as
    // [ab]*a[ab]{20} needs a state per combination of its last 21 bytes.
    return Status::InvalidArgument("the grammar needs more than " + std::to_string(kMaxStates) +
                                   " automaton states for these answers; make it smaller");
  }
  const int32_t id = int32_t(sets_.size());
  accepting_.push_back(std::binary_search(set.begin(), set.end(), nfa_.accept) ? 1 : 0);
  set_bytes_ += 2 * key.size();  // the set, in sets_ and as the key of ids_
  sets_.push_back(std::move(set));
  next_.resize(next_.size() + 256, kUnknown);
  ids_.emplace(std::move(key), id);
  return id;
}

Result<int32_t> TokenAutomaton::Step(int32_t state, uint8_t byte) {
  int32_t& next = next_[size_t(state) * 256 + byte];
  if (next != kUnknown) return next;
  std::vector<int32_t> seeds;
  for (int32_t s : sets_[size_t(state)]) {
    for (const NfaState::Edge& e : nfa_.states[size_t(s)].edges) {
      if (byte >= e.lo && byte <= e.hi) seeds.push_back(e.to);
    }
  }
  HW_ASSIGN_OR_RETURN(const int32_t id, Intern(Closure(nfa_, std::move(seeds), &mark_, ++stamp_)));
  // Intern may have grown next_: index again.
  next_[size_t(state) * 256 + byte] = id;
  return id;
}

Result<int32_t> TokenAutomaton::Advance(int32_t state, int32_t token_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (token_id < 0 || token_id >= vocabulary_->size() || vocabulary_->never(token_id)) {
    return kDead;
  }
  for (unsigned char b : vocabulary_->bytes(token_id)) {
    HW_ASSIGN_OR_RETURN(state, Step(state, b));
    if (state == kDead) return kDead;
  }
  return state;
}

bool TokenAutomaton::Full() {
  std::lock_guard<std::mutex> lock(mu_);
  return sets_.size() >= kMaxStates;
}

size_t TokenAutomaton::MemoryBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return nfa_bytes_ + next_.size() * sizeof(int32_t) + set_bytes_ + mask_bytes_;
}

bool TokenAutomaton::IsAccepting(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return accepting_[size_t(state)] != 0;
}

Result<bool> TokenAutomaton::IsTerminal(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_[size_t(state)]) return false;
  if (auto it = terminal_.find(state); it != terminal_.end()) return it->second;
  bool terminal = true;
  for (int b = 0; b < 256 && terminal; ++b) {
    HW_ASSIGN_OR_RETURN(const int32_t next, Step(state, uint8_t(b)));
    terminal = next == kDead;
  }
  terminal_[state] = terminal;
  return terminal;
}

Result<std::shared_ptr<const TokenMask>> TokenAutomaton::Mask(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = masks_.find(state); it != masks_.end()) return it->second;
  HW_ASSIGN_OR_RETURN(TokenMask computed, ComputeMask(state));
  auto mask = std::make_shared<const TokenMask>(std::move(computed));
  if (mask_bytes_ + mask->size() * 4 > kMaxMaskBytes) {
    masks_.clear();
    mask_bytes_ = 0;
  }
  mask_bytes_ += mask->size() * 4;
  masks_.emplace(state, mask);
  return mask;
}

Result<TokenMask> TokenAutomaton::ComputeMask(int32_t state) {
  const TokenVocabulary& v = *vocabulary_;
  TokenMask mask((size_t(v.size()) + 31) / 32, 0);
  const std::vector<int32_t>& order = v.sorted();
  const std::vector<uint16_t>& shared = v.shared_prefix();
  // path[d]: the state after the first d bytes of the current token;
  // valid for d <= live (the bytes walked without dying).
  std::vector<int32_t> path = {state};
  size_t live = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string_view bytes = v.sorted_bytes(k);
    size_t d = std::min<size_t>(shared[k], live);
    path.resize(std::max(path.size(), bytes.size() + 1));
    for (; d < bytes.size(); ++d) {
      // Known transitions are read in place: this loop runs once per byte
      // of the vocabulary that the walk does not skip.
      int32_t next = next_[size_t(path[d]) * 256 + uint8_t(bytes[d])];
      if (next == kUnknown) {
        HW_ASSIGN_OR_RETURN(next, Step(path[d], uint8_t(bytes[d])));
      }
      if (next == kDead) break;
      path[d + 1] = next;
    }
    live = d;
    if (d == bytes.size()) {
      MaskAllow(&mask, order[k]);
      continue;
    }
    // Every following token that starts with these d + 1 bytes dies too.
    while (k + 1 < order.size() && shared[k + 1] > d) ++k;
  }
  return mask;
}

}  // namespace headway::structured
