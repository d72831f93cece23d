// The "llama" (SentencePiece-style) tokenizer: SpmModel on hand-made
// vocabularies, Tokenizer dispatch and special tokens, and Gemma 3 270M's
// vocabulary against llama.cpp's own token ids.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/tokenizer/spm.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using ::headway::testing::Gemma3Path;
using ::headway::testing::TestDataPath;

using Ids = std::vector<int32_t>;

// ---- SpmModel alone

struct TinySpm {
  std::vector<std::string> texts;
  std::vector<float> scores;
  int32_t Add(std::string text, float score) {
    texts.push_back(std::move(text));
    scores.push_back(score);
    return static_cast<int32_t>(texts.size()) - 1;
  }
  Ids Encode(std::string_view escaped, int32_t unk_id = -1) const {
    auto model = SpmModel::Create(texts, scores, unk_id);
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    Ids ids;
    if (model.ok()) model->Encode(escaped, &ids);
    return ids;
  }
};

TEST(SpmModelTest, MergesHighestScoreFirst) {
  TinySpm spm;
  const int32_t a = spm.Add("a", -1), b = spm.Add("b", -1), c = spm.Add("c", -1);
  const int32_t ab = spm.Add("ab", -5), bc = spm.Add("bc", -2);
  EXPECT_EQ(spm.Encode("abc"), Ids({a, bc}));  // "bc" outscores "ab"
  spm.scores[ab] = -1;
  EXPECT_EQ(spm.Encode("abc"), Ids({ab, c}));
  const int32_t abc = spm.Add("abc", -100);  // reachable from either pair
  EXPECT_EQ(spm.Encode("abc"), Ids({abc}));
  EXPECT_EQ(spm.Encode("cba"), Ids({c, b, a}));
  EXPECT_EQ(spm.Encode(""), Ids());
}

TEST(SpmModelTest, TiesGoToTheLeftmostPair) {
  TinySpm spm;
  const int32_t a = spm.Add("a", 0), b = spm.Add("b", 0), c = spm.Add("c", 0);
  const int32_t ab = spm.Add("ab", -3), bc = spm.Add("bc", -3), aa = spm.Add("aa", -1);
  EXPECT_EQ(spm.Encode("abc"), Ids({ab, c}));
  EXPECT_EQ(spm.Encode("aaa"), Ids({aa, a}));
  EXPECT_EQ(spm.Encode("aaaaa"), Ids({aa, aa, a}));
  EXPECT_EQ(spm.Encode("bcab"), Ids({bc, ab}));
  (void)b;
}

// A merge may build on a merged symbol: ("▁", "a") then ("▁a", "b").
TEST(SpmModelTest, MergesChain) {
  TinySpm spm;
  const int32_t space = spm.Add("\xE2\x96\x81", -1);
  spm.Add("a", -1);
  const int32_t b = spm.Add("b", -1);
  spm.Add("\xE2\x96\x81" "a", -2);
  const int32_t space_ab = spm.Add("\xE2\x96\x81" "ab", -3);
  EXPECT_EQ(spm.Encode("\xE2\x96\x81" "ab\xE2\x96\x81" "b"), Ids({space_ab, space, b}));
}

TEST(SpmModelTest, ByteFallback) {
  TinySpm spm;
  const int32_t a = spm.Add("a", -1);
  for (int byte = 0; byte < 256; ++byte) {
    char text[7];
    std::snprintf(text, sizeof(text), "<0x%02X>", byte);
    spm.Add(text, 0);
  }
  auto byte_id = [&](int byte) { return a + 1 + byte; };
  // 'x' and 'é' (C3 A9) are not in the vocabulary; nor is a stray 0xFF.
  EXPECT_EQ(spm.Encode("axé\xff"), Ids({a, byte_id('x'), byte_id(0xC3), byte_id(0xA9),
                                        byte_id(0xFF)}));
  // A character cut short at the end still falls back byte by byte.
  EXPECT_EQ(spm.Encode("a\xE2\x96"), Ids({a, byte_id(0xE2), byte_id(0x96)}));
}

TEST(SpmModelTest, WithoutByteTokensUsesSingleByteTokenThenUnknownThenNothing) {
  TinySpm spm;
  const int32_t unk = spm.Add("<unk>", 0);
  const int32_t a = spm.Add("a", -1);
  const int32_t x = spm.Add("x", -1);
  EXPECT_EQ(spm.Encode("a\xffx"), Ids({a, x}));                 // no unknown: dropped
  EXPECT_EQ(spm.Encode("a\xffx", unk), Ids({a, unk, x}));       // one per byte
  EXPECT_EQ(spm.Encode("\xC3\xA9", unk), Ids({unk, unk}));
}

TEST(SpmModelTest, RejectsBadInput) {
  EXPECT_EQ(SpmModel::Create({"a", "b"}, {0.0f}, -1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SpmModel::Create({"a", "b"}, {0.0f, std::nanf("")}, -1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SpmModel::Create({"a", "b"}, {}, 2).status().code(), StatusCode::kInvalidArgument);
  auto model = SpmModel::Create({"a", "b", "ab"}, {}, -1);  // no scores: all 0
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Ids ids;
  model->Encode("abab", &ids);
  EXPECT_EQ(ids, Ids({2, 2}));
  EXPECT_EQ(model->Find("ab"), 2);
  EXPECT_EQ(model->Find("ba"), -1);
}

// ---- Tokenizer with a hand-made "llama" vocabulary

constexpr int32_t kPad = 0, kEos = 1, kBos = 2, kUnk = 3, kTurn = 4, kNewline = 5,
                  kTwoSpaces = 6, kTagA = 7, kTagB = 8, kFirstByte = 9;

int32_t ByteId(int byte) { return kFirstByte + byte; }

// Control <pad> <eos> <bos> <unk> <start_of_turn>; user-defined "\n", "  ",
// "[[x", "x]]]"; byte tokens; then normal tokens.
TokenizerVocab TinySpmVocab() {
  TokenizerVocab vocab;
  vocab.model = "llama";
  vocab.pre = "default";
  auto add = [&](std::string text, TokenType type, float score) {
    vocab.tokens.push_back(std::move(text));
    vocab.token_types.push_back(type);
    vocab.scores.push_back(score);
  };
  add("<pad>", TokenType::kControl, -1000);
  add("<eos>", TokenType::kControl, -1000);
  add("<bos>", TokenType::kControl, -1000);
  add("<unk>", TokenType::kUnknown, -1000);
  add("<start_of_turn>", TokenType::kControl, -1000);
  add("\n", TokenType::kUserDefined, -1000);
  add("  ", TokenType::kUserDefined, -1000);
  add("[[x", TokenType::kUserDefined, -1000);
  add("x]]]", TokenType::kUserDefined, -1000);
  for (int byte = 0; byte < 256; ++byte) {
    char text[7];
    std::snprintf(text, sizeof(text), "<0x%02X>", byte);
    add(text, TokenType::kByte, 0);
  }
  for (const char* text : {"\xE2\x96\x81", "a", "b", "c", "h", "i", "<", ">", "[", "]", "x"}) {
    add(text, TokenType::kNormal, -10);
  }
  add("ab", TokenType::kNormal, -1);
  add("hi", TokenType::kNormal, -2);
  add("\xE2\x96\x81" "a", TokenType::kNormal, -3);
  add("\xE2\x96\x81" "ab", TokenType::kNormal, -4);
  add("\xE2\x96\x81" "hi", TokenType::kNormal, -5);
  add("<unused0>", TokenType::kUnused, -1000);
  vocab.bos_id = kBos;
  vocab.eos_id = kEos;
  vocab.unk_id = kUnk;
  vocab.pad_id = kPad;
  vocab.add_bos = true;
  vocab.add_space_prefix = false;
  return vocab;
}

class TinySpmTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(TinySpmVocab()); }

  void Build(TokenizerVocab vocab) {
    auto tokenizer = Tokenizer::Create(std::move(vocab));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    tokenizer_ = std::move(tokenizer).value();
  }

  int32_t Id(std::string_view text) const {
    auto id = tokenizer_->TokenId(text);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : -1;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TinySpmTokenizerTest, SpacesBecomeSentencePieceSpaces) {
  const Tokenizer& tok = *tokenizer_;
  EXPECT_EQ(tok.model(), "llama");
  EXPECT_EQ(tok.Encode("ab hi", false), Ids({Id("ab"), Id("\xE2\x96\x81" "hi")}));
  EXPECT_EQ(tok.Encode(" ab", false), Ids({Id("\xE2\x96\x81" "ab")}));
  EXPECT_EQ(tok.Encode("hi ", false), Ids({Id("hi"), Id("\xE2\x96\x81")}));
  // "  " is a user-defined token, split out before the escaping.
  EXPECT_EQ(tok.Encode("ab  hi", false), Ids({Id("ab"), kTwoSpaces, Id("hi")}));
  EXPECT_EQ(tok.Encode("   a", false), Ids({kTwoSpaces, Id("\xE2\x96\x81" "a")}));
  EXPECT_EQ(tok.Encode("", false), Ids());
}

TEST_F(TinySpmTokenizerTest, AddSpacePrefixAtStartAndAfterSpecialTokens) {
  TokenizerVocab vocab = TinySpmVocab();
  vocab.add_space_prefix = true;
  Build(std::move(vocab));
  const Tokenizer& tok = *tokenizer_;
  EXPECT_EQ(tok.Encode("ab", false), Ids({Id("\xE2\x96\x81" "ab")}));
  EXPECT_EQ(tok.Encode("<start_of_turn>hi", true),
            Ids({kTurn, Id("\xE2\x96\x81" "hi")}));
  // After a user-defined token too, as llama.cpp (is_prev_special).
  EXPECT_EQ(tok.Encode("ab\nab", false),
            Ids({Id("\xE2\x96\x81" "ab"), kNewline, Id("\xE2\x96\x81" "ab")}));
  EXPECT_EQ(tok.Decode(tok.Encode("ab", false)), " ab");
}

TEST_F(TinySpmTokenizerTest, ByteFallbackAndDecode) {
  const Tokenizer& tok = *tokenizer_;
  const std::string text = "ab é\xff";
  Ids ids = tok.Encode(text, false);
  EXPECT_EQ(ids, Ids({Id("ab"), Id("\xE2\x96\x81"), ByteId(0xC3), ByteId(0xA9), ByteId(0xFF)}));
  EXPECT_EQ(tok.Decode(ids), text);
  EXPECT_EQ(tok.TokenBytes(ByteId('\n')), "\n");
  EXPECT_EQ(tok.TokenBytes(Id("\xE2\x96\x81" "hi")), " hi");
  EXPECT_EQ(*tok.TokenText(Id("\xE2\x96\x81" "hi")), "\xE2\x96\x81" "hi");
  EXPECT_EQ(tok.TokenBytes(kEos), "<eos>");
  EXPECT_EQ(tok.TokenBytes(kNewline), "\n");
  EXPECT_EQ(tok.TokenBytes(Id("<unused0>")), "");  // llama.cpp prints unused tokens as nothing
}

TEST_F(TinySpmTokenizerTest, ControlTokensOnlyWithParseSpecial) {
  const Tokenizer& tok = *tokenizer_;
  const std::string text = "<start_of_turn>hi<eos>";
  EXPECT_EQ(tok.Encode(text, true), Ids({kTurn, Id("hi"), kEos}));
  Ids plain = tok.Encode(text, false);
  for (int32_t id : plain) EXPECT_FALSE(tok.IsSpecial(id)) << id;
  EXPECT_EQ(tok.Decode(plain), text);
  EXPECT_EQ(tok.Decode(tok.Encode(text, true)), text);
  EXPECT_EQ(tok.Encode("<unk>", true), Ids({kUnk}));
  EXPECT_NE(tok.Encode("<unk>", false), Ids({kUnk}));
}

TEST_F(TinySpmTokenizerTest, UserDefinedTokensAlwaysSplitLongestFirst) {
  const Tokenizer& tok = *tokenizer_;
  EXPECT_EQ(tok.Encode("hi\n\nab", false), Ids({Id("hi"), kNewline, kNewline, Id("ab")}));
  // llama.cpp takes the longer "x]]]" first, although "[[x" starts earlier.
  EXPECT_EQ(tok.Encode("[[x]]]", false), Ids({Id("["), Id("["), kTagB}));
  EXPECT_EQ(tok.Encode("[[x]", false), Ids({kTagA, Id("]")}));
  EXPECT_EQ(tok.Encode("x]]][[x", true), Ids({kTagB, kTagA}));
}

TEST_F(TinySpmTokenizerTest, SpecialMeansControlOrUnknown) {
  const Tokenizer& tok = *tokenizer_;
  EXPECT_TRUE(tok.IsSpecial(kEos));
  EXPECT_TRUE(tok.IsSpecial(kTurn));
  EXPECT_TRUE(tok.IsSpecial(kUnk));
  EXPECT_FALSE(tok.IsSpecial(kNewline));  // user-defined: part of the text
  EXPECT_FALSE(tok.IsSpecial(ByteId('a')));
  EXPECT_FALSE(tok.IsSpecial(Id("ab")));
  EXPECT_FALSE(tok.IsSpecial(-1));
  EXPECT_EQ(tok.bos_id(), kBos);
  EXPECT_TRUE(tok.add_bos());
}

TEST_F(TinySpmTokenizerTest, StreamDecoderJoinsByteTokens) {
  StreamDecoder decoder(*tokenizer_);
  EXPECT_EQ(decoder.Push(Id("ab")), "ab");
  EXPECT_EQ(decoder.Push(ByteId(0xC3)), "");
  EXPECT_EQ(decoder.Push(ByteId(0xA9)), "é");
  EXPECT_EQ(decoder.Push(Id("\xE2\x96\x81" "hi")), " hi");
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(SpmTokenizerCreateTest, ValidatesVocabulary) {
  TokenizerVocab vocab = TinySpmVocab();
  vocab.scores.pop_back();
  EXPECT_EQ(Tokenizer::Create(vocab).status().code(), StatusCode::kInvalidArgument);
  vocab = TinySpmVocab();
  vocab.scores.clear();  // allowed: all scores 0
  EXPECT_TRUE(Tokenizer::Create(vocab).ok());
  vocab = TinySpmVocab();
  vocab.unk_id = 100000;
  EXPECT_EQ(Tokenizer::Create(vocab).status().code(), StatusCode::kInvalidArgument);
  vocab = TinySpmVocab();
  vocab.model = "bert";
  auto tokenizer = Tokenizer::Create(vocab);
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(tokenizer.status().message().find("bert"), std::string::npos);
}

// LoadTokenizerVocab on a written GGUF: llama.cpp's defaults for absent keys.
TEST(SpmTokenizerLoadTest, ReadsKeysAndDefaults) {
  const std::string path = ::testing::TempDir() + "/spm_tokenizer_test.gguf";
  {
    ::headway::testing::GgufWriter writer;
    writer.AddString("tokenizer.ggml.model", "llama");
    writer.AddStringArray("tokenizer.ggml.tokens", {"<unk>", "a", "\xE2\x96\x81" "a"});
    writer.AddFloat32Array("tokenizer.ggml.scores", {0.0f, -1.0f, -2.5f});
    writer.AddInt32Array("tokenizer.ggml.token_type", {2, 1, 1});
    writer.AddUInt32("tokenizer.ggml.unknown_token_id", 0);
    ASSERT_TRUE(writer.WriteFile(path).ok());
  }
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  auto vocab = LoadTokenizerVocab(**gguf);
  ASSERT_TRUE(vocab.ok()) << vocab.status().ToString();
  EXPECT_EQ(vocab->model, "llama");
  EXPECT_EQ(vocab->scores, std::vector<float>({0.0f, -1.0f, -2.5f}));
  EXPECT_TRUE(vocab->merges.empty());
  EXPECT_TRUE(vocab->add_bos);           // llama.cpp's default for SPM
  EXPECT_TRUE(vocab->add_space_prefix);  // likewise
  auto tokenizer = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ((*tokenizer)->Encode("a", false), Ids({2}));
  // No byte tokens: one unknown per byte of "▁b".
  EXPECT_EQ((*tokenizer)->Encode("b", false), Ids({0, 0, 0, 0}));

  ::headway::testing::GgufWriter bad;
  bad.AddString("tokenizer.ggml.model", "llama");
  bad.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
  bad.AddFloat32Array("tokenizer.ggml.scores", {0.0f});
  ASSERT_TRUE(bad.WriteFile(path).ok());
  gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  EXPECT_EQ(LoadTokenizerVocab(**gguf).status().code(), StatusCode::kInvalidArgument);
  std::remove(path.c_str());
}

// ---- the real Gemma 3 270M vocabulary

class Gemma3TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HW_REQUIRE_MODEL(Gemma3Path());
    auto start = std::chrono::steady_clock::now();
    auto gguf = GgufFile::Open(Gemma3Path());
    ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
    auto opened = std::chrono::steady_clock::now();
    auto tokenizer = Tokenizer::FromGguf(**gguf);
    auto end = std::chrono::steady_clock::now();
    open_seconds_ = std::chrono::duration<double>(opened - start).count();
    load_seconds_ = std::chrono::duration<double>(end - opened).count();
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    tokenizer_ = std::move(tokenizer).value();
  }

  double open_seconds_ = 0;  // GgufFile::Open
  double load_seconds_ = 0;  // Tokenizer::FromGguf
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(Gemma3TokenizerTest, LoadsVocabularyQuickly) {
  const Tokenizer& tok = *tokenizer_;
  RecordProperty("open_ms", static_cast<int>(open_seconds_ * 1000));
  RecordProperty("load_ms", static_cast<int>(load_seconds_ * 1000));
  EXPECT_LT(load_seconds_, 1.0);  // about 0.25 s, and as much again for Open
  EXPECT_EQ(tok.model(), "llama");
  EXPECT_EQ(tok.vocab_size(), 262144);
  EXPECT_EQ(tok.bos_id(), 2);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(*tok.TokenText(105), "<start_of_turn>");
  EXPECT_EQ(*tok.TokenId("<end_of_turn>"), 106);
  EXPECT_TRUE(tok.IsSpecial(106));
  EXPECT_FALSE(tok.IsSpecial(107));  // "\n", user-defined
  EXPECT_EQ(tok.TokenBytes(107), "\n");
  EXPECT_EQ(tok.TokenBytes(*tok.TokenId("<0x0A>")), "\n");
  EXPECT_EQ(tok.TokenBytes(506), " the");  // "▁the"
}

// tests/data/tokenizer/gemma3-270m.json: llama.cpp's token ids (the command
// that made them is in the file).
TEST_F(Gemma3TokenizerTest, MatchesLlamaCpp) {
  std::ifstream in(TestDataPath("tokenizer/gemma3-270m.json"));
  ASSERT_TRUE(in) << TestDataPath("tokenizer/gemma3-270m.json");
  nlohmann::json data = nlohmann::json::parse(in);
  int num_cases = 0;
  for (const nlohmann::json& item : data.at("cases")) {
    const std::string text = item.at("text").get<std::string>();
    const bool special = item.at("special").get<bool>();
    const Ids expected = item.at("ids").get<Ids>();
    const Ids ids = tokenizer_->Encode(text, special);
    EXPECT_EQ(ids, expected) << "text: '" << text << "' special: " << special;
    EXPECT_EQ(tokenizer_->Decode(ids), text) << "text: '" << text << "'";
    ++num_cases;
  }
  EXPECT_GE(num_cases, 15);
}

// Invalid UTF-8 falls back to byte tokens. A stray lead byte takes the next
// bytes into its character, here part of a "▁", which then decodes as those
// bytes rather than ' ': llama.cpp does the same. Ids and the detokenized
// bytes from llama-cpp-python 0.3.36 (tokenize(text, add_bos=False,
// special=False), detokenize).
TEST_F(Gemma3TokenizerTest, InvalidUtf8MatchesLlamaCpp) {
  const std::string text = "ok caf\xc3 \xe2\x82 1\xf0\x9f\xa6 end\x80\xbf";
  const Ids ids = tokenizer_->Encode(text, false);
  EXPECT_EQ(ids, Ids({680, 36451, 433, 464, 388, 367, 464, 368, 464, 388, 367, 236770, 478, 397,
                      404, 464, 388, 367, 643, 366, 429}));
  EXPECT_EQ(tokenizer_->Decode(ids),
            "ok caf\xc3\xe2\x96\x81\xe2\x82\xe2\x96\x81" "1\xf0\x9f\xa6\xe2\x96\x81" "end\x80\xbf");
  EXPECT_EQ(tokenizer_->Encode("a\xff" "b", false), Ids({236746, 493, 336}));
  EXPECT_EQ(tokenizer_->Decode({236746, 493, 336}), "a\xff" "b");
}

TEST_F(Gemma3TokenizerTest, LongPromptRoundTrips) {
  const std::string paragraph =
      "The quick brown fox jumps over the lazy dog, while 42 engineers measure how long\n"
      "it takes to serve a large language model across many machines.  Each request is "
      "split into tokens\t\tand streamed back: «déjà vu», 東京, 🦙.\n\n";
  std::string text;
  for (int i = 0; i < 30; ++i) text += paragraph;
  auto start = std::chrono::steady_clock::now();
  Ids ids = tokenizer_->Encode(text, true);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(ids.size(), 1000u);
  EXPECT_LT(seconds, 0.5);
  EXPECT_EQ(tokenizer_->Decode(ids), text);
}

}  // namespace
}  // namespace headway
