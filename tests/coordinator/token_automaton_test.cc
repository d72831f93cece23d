// The regex parser and token masks against independent checks: FullMatch's
// NFA simulation for the language, and for the masks a brute-force check of
// every token's bytes.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "coordinator/structured/grammar_compiler.h"
#include "coordinator/structured/nfa.h"
#include "coordinator/structured/regex_parser.h"
#include "coordinator/structured/token_automaton.h"

namespace headway::structured {
namespace {

bool Matches(const std::string& regex, const std::string& text) {
  Result<Pattern> p = ParseRegex(regex);
  EXPECT_TRUE(p.ok()) << regex << ": " << p.status().ToString();
  if (!p.ok()) return false;
  Result<Nfa> nfa = CompileNfa(*p);
  EXPECT_TRUE(nfa.ok());
  return nfa.ok() && FullMatch(*nfa, text);
}

TEST(RegexParser, MatchesWholeStrings) {
  EXPECT_TRUE(Matches("abc", "abc"));
  EXPECT_FALSE(Matches("abc", "abcd"));
  EXPECT_FALSE(Matches("abc", "ab"));
  EXPECT_TRUE(Matches("^a(b|cd)*e$", "acdbbe"));
  EXPECT_FALSE(Matches("a(b|cd)*e", "acde2"));
  EXPECT_TRUE(Matches("[A-Z][a-z]{2,4}", "Abcd"));
  EXPECT_FALSE(Matches("[A-Z][a-z]{2,4}", "Abcdef"));
  EXPECT_FALSE(Matches("[A-Z][a-z]{2,4}", "Ab"));
  EXPECT_TRUE(Matches("x{3}", "xxx"));
  EXPECT_TRUE(Matches("x{2,}", "xxxxx"));
  EXPECT_FALSE(Matches("x{2,}", "x"));
  EXPECT_TRUE(Matches("\\d+\\.\\d{2}", "12.50"));
  EXPECT_TRUE(Matches("[^0-9]+", "ab-é"));
  EXPECT_FALSE(Matches("[^0-9]+", "a1"));
  EXPECT_TRUE(Matches("(?:ab)+?", "abab"));
  EXPECT_TRUE(Matches("(?P<year>\\d{4})-(?<m>\\d\\d)", "2024-05"));
  EXPECT_TRUE(Matches("a.c", "a€c"));  // one character, three bytes
  EXPECT_FALSE(Matches("a.c", "a\nc"));
  EXPECT_TRUE(Matches("[é-ë]x", "êx"));
  EXPECT_FALSE(Matches("[é-ë]x", "ex"));
  EXPECT_TRUE(Matches("\\w\\s\\W", "a !"));
  EXPECT_TRUE(Matches("a{x}", "a{x}"));  // not a quantifier: literal, as in Python
  EXPECT_TRUE(Matches("\\u00e9\\x41", "éA"));
  EXPECT_TRUE(Matches("(yes|no)?", ""));
}

TEST(RegexParser, RefusesWhatItCannotMatchNamingIt) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "backreference"},        {"a(?=b)", "lookaround"},
      {"\\bword", "assertion"},           {"\\p{L}", "Unicode property"},
      {"(?i)abc", "group construct"},     {"a++", "possessive"},
      {"[[:alpha:]]", "POSIX"},           {"[^é]", "negated class listing non-ASCII"},
      {"(ab", "unclosed group"},          {"ab)", "unbalanced"},
      {"[ab", "unclosed character class"}, {"*a", "nothing to repeat"},
      {"a{3,1}", "m > n"},                {"a{1001}", "above 1000"},
      {"a^b", "'^'"},                     {"a$b", "'$'"},
      {"\\q", "unknown escape"},          {"a**", "repeated quantifier"},
      {"a{,5}", "{,n}"},                  {"\\ud800", "surrogate"},
  };
  for (const auto& [regex, what] : cases) {
    Result<Pattern> p = ParseRegex(regex);
    ASSERT_FALSE(p.ok()) << regex;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(what), std::string::npos)
        << regex << " -> " << p.status().message();
  }
}

TEST(RegexParser, JsonStringContentNeverGeneratesWhatJsonEscapes) {
  RegexOptions json;
  json.json_string_content = true;
  Result<Pattern> p = ParseRegex("[^a]+", json);
  ASSERT_TRUE(p.ok());
  Result<Nfa> nfa = CompileNfa(*p);
  ASSERT_TRUE(nfa.ok());
  EXPECT_TRUE(FullMatch(*nfa, "xyz"));
  EXPECT_FALSE(FullMatch(*nfa, "x\"z"));
  EXPECT_FALSE(FullMatch(*nfa, "x\\z"));
  EXPECT_FALSE(FullMatch(*nfa, "x\nz"));
  EXPECT_FALSE(ParseRegex("a\"b", json).ok());
}

TEST(RegexParser, JsonWhitespaceKeepsOnlyJsonWhitespace) {
  RegexOptions ws;
  ws.json_whitespace = true;
  Result<Pattern> p = ParseRegex("[\\s\\S]*", ws);
  ASSERT_TRUE(p.ok());
  Result<Nfa> nfa = CompileNfa(*p);
  ASSERT_TRUE(nfa.ok());
  EXPECT_TRUE(FullMatch(*nfa, " \t\n\r "));
  EXPECT_FALSE(FullMatch(*nfa, " x"));
  EXPECT_FALSE(FullMatch(*nfa, "\f"));
  EXPECT_FALSE(ParseRegex("x", ws).ok());
  EXPECT_FALSE(ParseRegex("[a-z]+", ws).ok());  // nothing left of the class
}

TEST(Nfa, RefusesAGrammarOverTheStateBound) {
  Result<Nfa> nfa = CompileNfa(Repeat(Literal("abcdefgh"), 1000, 1000), 1000);
  ASSERT_FALSE(nfa.ok());
  EXPECT_EQ(nfa.status().code(), StatusCode::kResourceExhausted);
}

// A small vocabulary with tokens that cross grammar boundaries and split a
// multi-byte character.
std::shared_ptr<const TokenVocabulary> Vocabulary() {
  std::vector<std::string> tokens = {
      "<eos>", "{", "}", "\"", "\":", "\":\"", "a", "ab", "b", "\"a", "1", "12", "x",
      "\xC3",  "\xA9", "é", "\",\"", " ", "", "abc\"", "aa", "ba"};
  return std::make_shared<const TokenVocabulary>(tokens, std::vector<int32_t>{0});
}


// Every token whose bytes keep `prefix` + bytes a prefix of some word of
// the NFA's language, by brute force over a bounded set of completions.
TEST(TokenAutomaton, MaskEqualsBruteForceOverEveryToken) {
  const std::vector<std::string> regexes = {"\\{\"[ab]+\":\"[ab]*é?\"\\}", "(ab|ba)+c?",
                                            "1[0-9]*|x", "[^\"]{0,3}\"", "a{2,3}b"};
  auto vocab = Vocabulary();
  for (const std::string& regex : regexes) {
    Result<Pattern> p = ParseRegex(regex);
    ASSERT_TRUE(p.ok());
    Result<std::shared_ptr<TokenAutomaton>> a = TokenAutomaton::Create(*p, vocab);
    ASSERT_TRUE(a.ok());
    Result<Nfa> nfa = CompileNfa(*p);
    ASSERT_TRUE(nfa.ok());
    // Walk every output of up to 3 tokens and compare each state's mask
    // with a check of prefix viability: a prefix is viable when some
    // continuation from the alphabet of the tests completes it.
    const std::vector<std::string> tails = {"", "\"}", "}", "c", "b", "\"", "a\"}", "é\"}",
                                            "0", "ab", "bc", "b\"}"};
    auto viable = [&](const std::string& s) {
      for (const std::string& t : tails) {
        if (FullMatch(*nfa, s + t)) return true;
      }
      return false;
    };
    std::vector<std::pair<std::string, int32_t>> frontier = {{"", (*a)->start()}};
    for (int depth = 0; depth < 3; ++depth) {
      std::vector<std::pair<std::string, int32_t>> next;
      for (const auto& [text, state] : frontier) {
        Result<std::shared_ptr<const TokenMask>> mask = (*a)->Mask(state);
        ASSERT_TRUE(mask.ok());
        EXPECT_EQ((*a)->IsAccepting(state), FullMatch(*nfa, text)) << regex << " " << text;
        for (int32_t id = 0; id < vocab->size(); ++id) {
          const bool allowed = MaskAllows(**mask, id);
          if (vocab->never(id)) {
            EXPECT_FALSE(allowed);
            continue;
          }
          const std::string extended = text + std::string(vocab->bytes(id));
          // Viability by completion is a lower bound; the automaton must
          // allow every viable token, and the tokens it allows must advance.
          if (viable(extended)) {
            EXPECT_TRUE(allowed) << regex << " '" << extended << "'";
          }
          Result<int32_t> after = (*a)->Advance(state, id);
          ASSERT_TRUE(after.ok());
          EXPECT_EQ(allowed, *after != TokenAutomaton::kDead) << regex << " '" << extended << "'";
          if (allowed) next.emplace_back(extended, *after);
        }
      }
      frontier = std::move(next);
    }
  }
}

TEST(TokenAutomaton, TokensCrossingBoundariesAndSplitCharacters) {
  auto vocab = Vocabulary();
  Result<Pattern> p = ParseRegex("\\{\"a\":\"é\"\\}");
  ASSERT_TRUE(p.ok());
  auto a = TokenAutomaton::Create(*p, vocab);
  ASSERT_TRUE(a.ok());
  int32_t s = (*a)->start();
  auto step = [&](int32_t id) {
    Result<int32_t> next = (*a)->Advance(s, id);
    EXPECT_TRUE(next.ok());
    s = *next;
    return s != TokenAutomaton::kDead;
  };
  EXPECT_TRUE(step(1));  // {
  EXPECT_TRUE(step(9));  // "a
  Result<std::shared_ptr<const TokenMask>> mask = (*a)->Mask(s);
  ASSERT_TRUE(mask.ok());
  EXPECT_TRUE(MaskAllows(**mask, 4));   // ":
  EXPECT_TRUE(MaskAllows(**mask, 5));   // ":" crosses into the value
  EXPECT_TRUE(MaskAllows(**mask, 3));   // " alone leaves a valid prefix too
  EXPECT_FALSE(MaskAllows(**mask, 2));  // }
  EXPECT_FALSE(MaskAllows(**mask, 0));  // <eos>: never part of the bytes
  EXPECT_TRUE(step(5));
  mask = (*a)->Mask(s);
  EXPECT_TRUE(MaskAllows(**mask, 13));  // the first byte of é
  EXPECT_TRUE(MaskAllows(**mask, 15));  // é whole
  EXPECT_FALSE(MaskAllows(**mask, 14));  // a continuation byte cannot start it
  EXPECT_TRUE(step(13));
  EXPECT_TRUE(step(14));
  EXPECT_TRUE(step(3));
  EXPECT_FALSE((*a)->IsAccepting(s));
  EXPECT_TRUE(step(2));
  EXPECT_TRUE((*a)->IsAccepting(s));
  Result<bool> terminal = (*a)->IsTerminal(s);
  ASSERT_TRUE(terminal.ok());
  EXPECT_TRUE(*terminal);
}

// HTTP threads compile grammars and compute start masks while the engine
// thread advances and masks: one automaton serves them all (run under
// ThreadSanitizer by deploy/test.sh's tsan mode).
TEST(GrammarCompiler, ThreadsShareGrammarsAndAutomata) {
  GrammarCompiler compiler(Vocabulary(), 2);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string regex = "(ab|ba)+c?" + std::string(size_t((i + t) % 3), 'a');
        auto a = compiler.Compile({StructuredOutputSpec::Kind::kRegex, regex, "", ""});
        if (!a.ok()) {
          ++failures;
          continue;
        }
        int32_t state = (*a)->start();
        for (int step = 0; step < 6 && state != TokenAutomaton::kDead; ++step) {
          auto mask = (*a)->Mask(state);
          auto next = (*a)->Advance(state, step % 2 == 0 ? 7 : 21);  // "ab", "ba"
          if (!mask.ok() || !next.ok()) ++failures;
          state = next.ok() ? *next : TokenAutomaton::kDead;
        }
        (void)(*a)->MemoryBytes();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(GrammarCompiler, CachesAndRefusesBadSpecs) {
  GrammarCompiler compiler(Vocabulary(), 2);
  StructuredOutputSpec choice{StructuredOutputSpec::Kind::kChoice, R"(["ab","ba"])", "", ""};
  auto first = compiler.Compile(choice);
  auto again = compiler.Compile(choice);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(first->get(), again->get());
  StructuredOutputSpec regex{StructuredOutputSpec::Kind::kRegex, "(a", "", ""};
  EXPECT_EQ(compiler.Compile(regex).status().code(), StatusCode::kInvalidArgument);
  StructuredOutputSpec empty{StructuredOutputSpec::Kind::kChoice, "[]", "", ""};
  EXPECT_EQ(compiler.Compile(empty).status().code(), StatusCode::kInvalidArgument);
  StructuredOutputSpec ws{StructuredOutputSpec::Kind::kJsonObject, "", "(", ""};
  EXPECT_EQ(compiler.Compile(ws).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace headway::structured
