#include "coordinator/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

namespace headway {

namespace {

// llama.cpp src/llama-vocab.cpp, case LLAMA_VOCAB_PRE_TYPE_SMOLLM.
constexpr std::string_view kSmolLmDigits = R"(\p{N})";
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::~PreTokenizer() = default;

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view name) {
  std::vector<std::string_view> patterns;
  if (name == "smollm") {
    patterns = {kSmolLmDigits, kGpt2};
  } else {
    return Status::Unimplemented("tokenizer pre-tokenizer '" + std::string(name) +
                                 "' (tokenizer.ggml.pre) is not supported; supported: smollm");
  }
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  pre->name_ = std::string(name);
  for (std::string_view pattern : patterns) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // MATCH_INVALID_UTF: invalid UTF-8 in the subject is never matched
    // instead of failing the whole match.
    pcre2_code* code = pcre2_compile(
        reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      return Status::Internal("pre-tokenizer expression '" + std::string(pattern) +
                              "' does not compile at offset " + std::to_string(error_offset) +
                              ": " + reinterpret_cast<const char*>(message));
    }
    auto regex = std::make_unique<Regex>();
    regex->code = code;
    // JIT is only an accelerator: without it pcre2_match interprets.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    pre->regexes_.push_back(std::move(regex));
  }
  return pre;
}

std::vector<std::string_view> PreTokenizer::Split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  for (const auto& regex : regexes_) SplitWith(*regex, &pieces);
  return pieces;
}

void PreTokenizer::SplitWith(const Regex& regex, std::vector<std::string_view>* pieces) {
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex.code, nullptr);
  std::vector<std::string_view> out;
  out.reserve(pieces->size() * 2);
  for (std::string_view piece : *pieces) {
    // Each piece is matched on its own, so lookaheads see its end as the end
    // of the text (as llama.cpp does).
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
    size_t start = 0;     // where the next search begins
    size_t emitted = 0;   // end of the last piece written to `out`
    while (match != nullptr && start < piece.size()) {
      int rc = pcre2_match(regex.code, subject, piece.size(), start, 0, match, nullptr);
      if (rc < 0) break;  // no match (or a matcher limit): the rest is one gap
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      size_t begin = ovector[0];
      size_t end = ovector[1];
      if (begin > emitted) out.push_back(piece.substr(emitted, begin - emitted));
      if (end > begin) {
        out.push_back(piece.substr(begin, end - begin));
        emitted = end;
        start = end;
      } else {
        // None of the built-in expressions matches empty text; step one byte
        // anyway so that such a match cannot loop forever.
        emitted = begin;
        start = begin + 1;
      }
    }
    if (emitted < piece.size()) out.push_back(piece.substr(emitted));
  }
  pcre2_match_data_free(match);
  *pieces = std::move(out);
}

}  // namespace headway
