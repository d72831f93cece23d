#include "coordinator/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/tokenizer/bpe.h"
#include "coordinator/tokenizer/pretokenizer.h"
#include "tests/coordinator/tiny_vocab.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using ::headway::testing::SmolLm2Path;
using ::headway::testing::TestDataPath;
using ::headway::testing::TinyVocab;

// ---- pieces that need no model

TEST(ByteLevelTest, MapsBytesLikeGpt2) {
  EXPECT_EQ(ByteToUnicodeText(' '), "Ġ");
  EXPECT_EQ(ByteToUnicodeText('\n'), "Ċ");
  EXPECT_EQ(ByteToUnicodeText('a'), "a");
  EXPECT_EQ(ByteToUnicodeText(0xAD), "Ń");  // the last of the 68 remapped bytes
  std::string all_bytes;
  std::string all_texts;
  for (int b = 0; b < 256; ++b) {
    all_bytes.push_back(static_cast<char>(b));
    all_texts += ByteToUnicodeText(static_cast<uint8_t>(b));
  }
  EXPECT_EQ(UnicodeTextToBytes(all_texts), all_bytes);
}

TEST(PreTokenizerTest, SmolLmSplitsDigitsAndWords) {
  auto pre = PreTokenizer::Create("smollm");
  ASSERT_TRUE(pre.ok()) << pre.status().ToString();
  std::vector<std::string_view> expected = {"ied", " ", "4", " ", "½", " months"};
  EXPECT_EQ((*pre)->Split("ied 4 ½ months"), expected);
  expected = {"Hello", ",", " y", "'", "all", "!", "   ", " x", "\n"};
  EXPECT_EQ((*pre)->Split("Hello, y'all!    x\n"), expected);
  EXPECT_TRUE((*pre)->Split("").empty());
}

TEST(PreTokenizerTest, UnknownNameIsUnimplemented) {
  auto pre = PreTokenizer::Create("llama3");
  ASSERT_FALSE(pre.ok());
  EXPECT_EQ(pre.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(pre.status().message().find("llama3"), std::string::npos);
}

TEST(BpeModelTest, MergesByRank) {
  TokenizerVocab vocab = TinyVocab();
  auto bpe = BpeModel::Create(vocab.tokens, vocab.merges);
  ASSERT_TRUE(bpe.ok()) << bpe.status().ToString();
  std::vector<int32_t> ids;
  bpe->Encode("abc", &ids);  // "b c" outranks "a b", then "a bc"
  EXPECT_EQ(ids, std::vector<int32_t>({258}));
  ids.clear();
  bpe->Encode("abab", &ids);
  EXPECT_EQ(ids, std::vector<int32_t>({256, 256}));
  ids.clear();
  bpe->Encode("\xff", &ids);
  EXPECT_EQ(ids, std::vector<int32_t>({0xff}));
}

TEST(BpeModelTest, RejectsMergeOutsideVocabulary) {
  TokenizerVocab vocab = TinyVocab();
  vocab.merges.push_back("c d");
  auto bpe = BpeModel::Create(vocab.tokens, vocab.merges);
  ASSERT_FALSE(bpe.ok());
  EXPECT_EQ(bpe.status().code(), StatusCode::kInvalidArgument);
  vocab.merges.back() = "ab";
  EXPECT_FALSE(BpeModel::Create(vocab.tokens, vocab.merges).ok());
}

TEST(TokenizerTest, CreateValidatesVocabulary) {
  TokenizerVocab vocab = TinyVocab();
  vocab.model = "bert";
  auto tokenizer = Tokenizer::Create(vocab);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(tokenizer.status().message().find("bert"), std::string::npos);

  vocab = TinyVocab();
  vocab.pre = "qwen2";
  tokenizer = Tokenizer::Create(vocab);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(tokenizer.status().message().find("qwen2"), std::string::npos);

  vocab = TinyVocab();
  vocab.eos_id = 1000;
  EXPECT_EQ(Tokenizer::Create(vocab).status().code(), StatusCode::kInvalidArgument);

  vocab = TinyVocab();
  vocab.token_types.pop_back();
  EXPECT_EQ(Tokenizer::Create(vocab).status().code(), StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, DropsBytesWithoutToken) {
  TokenizerVocab vocab = TinyVocab();
  vocab.tokens[' '] = "<unused>";  // no token for byte 0x20 any more
  auto tokenizer = Tokenizer::Create(vocab);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ((*tokenizer)->Encode("ab ab", false), std::vector<int32_t>({256, 256}));
  EXPECT_EQ((*tokenizer)->Encode(" ", false), std::vector<int32_t>());
}

TEST(TokenizerTest, TinyVocabularySpecialTokens) {
  auto tokenizer = Tokenizer::Create(TinyVocab());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  const Tokenizer& tok = **tokenizer;
  EXPECT_EQ(tok.Encode("abc<|s|>abc", true), std::vector<int32_t>({258, 259, 258}));
  std::vector<int32_t> plain = tok.Encode("abc<|s|>abc", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 259), 0);
  EXPECT_EQ(tok.Decode(plain), "abc<|s|>abc");
  EXPECT_TRUE(tok.IsSpecial(259));
  EXPECT_FALSE(tok.IsSpecial(258));
  EXPECT_FALSE(tok.IsSpecial(-3));
}

// ---- the real SmolLM2 vocabulary

class SmolLmTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HW_REQUIRE_MODEL(SmolLm2Path());
    auto gguf = GgufFile::Open(SmolLm2Path());
    ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
    auto vocab = LoadTokenizerVocab(**gguf);
    ASSERT_TRUE(vocab.ok()) << vocab.status().ToString();
    vocab_ = std::move(vocab).value();
    auto tokenizer = Tokenizer::Create(vocab_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    tokenizer_ = std::move(tokenizer).value();
  }

  TokenizerVocab vocab_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(SmolLmTokenizerTest, LoadsVocabularyFromGguf) {
  EXPECT_EQ(vocab_.model, "gpt2");
  EXPECT_EQ(vocab_.pre, "smollm");
  EXPECT_EQ(vocab_.tokens.size(), 49152u);
  EXPECT_EQ(vocab_.merges.size(), 48900u);
  EXPECT_EQ(vocab_.bos_id, 1);
  EXPECT_EQ(vocab_.eos_id, 2);
  EXPECT_EQ(vocab_.unk_id, 0);
  EXPECT_EQ(vocab_.pad_id, 2);
  EXPECT_FALSE(vocab_.add_bos);
  EXPECT_EQ(tokenizer_->vocab_size(), 49152);
  EXPECT_EQ(tokenizer_->bos_id(), 1);
  EXPECT_EQ(tokenizer_->eos_id(), 2);
  for (int32_t id = 0; id <= 16; ++id) EXPECT_TRUE(tokenizer_->IsSpecial(id)) << id;
  EXPECT_FALSE(tokenizer_->IsSpecial(17));
  EXPECT_EQ(*tokenizer_->TokenText(2), "<|im_end|>");
  EXPECT_EQ(*tokenizer_->TokenId("<|im_start|>"), 1);
  EXPECT_EQ(*tokenizer_->TokenId("ĠHello"), 38699);
}

// tests/data/tokenizer/smollm.jsonl: llama.cpp's reference outputs.
TEST_F(SmolLmTokenizerTest, MatchesReferenceCases) {
  std::ifstream in(TestDataPath("tokenizer/smollm.jsonl"));
  ASSERT_TRUE(in) << TestDataPath("tokenizer/smollm.jsonl");
  std::string line;
  int num_cases = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto json = nlohmann::json::parse(line);
    std::string text = json.at("text").get<std::string>();
    std::vector<int32_t> expected = json.at("ids").get<std::vector<int32_t>>();
    std::vector<int32_t> ids = tokenizer_->Encode(text, /*parse_special=*/false);
    EXPECT_EQ(ids, expected) << "text: " << text;
    EXPECT_EQ(tokenizer_->Decode(ids), text);
    EXPECT_EQ(tokenizer_->Encode(text, /*parse_special=*/true), expected) << "text: " << text;
    ++num_cases;
  }
  EXPECT_EQ(num_cases, 43);
}

// Expected ids from llama-cpp-python 0.3.16 on the same GGUF:
//   Llama(path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=...)
TEST_F(SmolLmTokenizerTest, ParsesSpecialTokensOnlyWhenAsked) {
  const std::string text = "<|im_start|>user\nHi<|im_end|>";
  EXPECT_EQ(tokenizer_->Encode(text, /*parse_special=*/true),
            std::vector<int32_t>({1, 4093, 198, 26843, 2}));
  std::vector<int32_t> plain = tokenizer_->Encode(text, /*parse_special=*/false);
  EXPECT_EQ(plain, std::vector<int32_t>({44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44,
                                         108, 306, 79, 486, 108, 46}));
  for (int32_t id : plain) EXPECT_FALSE(tokenizer_->IsSpecial(id));
  EXPECT_EQ(tokenizer_->Decode(plain), text);
  EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(text, true)), text);
}

TEST_F(SmolLmTokenizerTest, StreamDecoderHoldsBackSplitCharacters) {
  const std::string text = "Hello 🦙🦙 wörld";
  std::vector<int32_t> ids = tokenizer_->Encode(text, false);
  ASSERT_EQ(ids, std::vector<int32_t>({19556, 15107, 116, 243, 10813, 116, 243, 267, 29989, 400}));
  StreamDecoder decoder(*tokenizer_);
  std::vector<std::string> outputs;
  for (int32_t id : ids) outputs.push_back(decoder.Push(id));
  EXPECT_EQ(decoder.Flush(), "");
  // " " + first bytes of the emoji, then its middle, then its end.
  EXPECT_EQ(outputs[0], "Hello");
  EXPECT_EQ(outputs[1], " ");
  EXPECT_EQ(outputs[2], "");
  EXPECT_EQ(outputs[3], "🦙");
  EXPECT_EQ(outputs[4], "");
  EXPECT_EQ(outputs[5], "");
  EXPECT_EQ(outputs[6], "🦙");
  std::string joined;
  for (const std::string& piece : outputs) joined += piece;
  EXPECT_EQ(joined, text);
}

TEST_F(SmolLmTokenizerTest, StreamDecoderReplacesBrokenBytes) {
  StreamDecoder decoder(*tokenizer_);
  std::vector<int32_t> emoji = tokenizer_->Encode("🦙", false);
  ASSERT_EQ(emoji.size(), 3u);
  EXPECT_EQ(decoder.Push(emoji[0]), "");
  EXPECT_EQ(decoder.Flush(), "\xEF\xBF\xBD");  // truncated character at the end
  EXPECT_EQ(decoder.Push(emoji[0]), "");
  EXPECT_EQ(decoder.Push(*tokenizer_->TokenId("a")), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(decoder.Push(-1), "\xEF\xBF\xBD");
  EXPECT_EQ(decoder.Push(tokenizer_->eos_id()), "<|im_end|>");
}

TEST_F(SmolLmTokenizerTest, InvalidUtf8RoundTrips) {
  const std::string text = "ok caf\xc3 \xe2\x82 1\xf0\x9f\xa6 end\x80\xbf";
  std::vector<int32_t> ids = tokenizer_->Encode(text, false);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tokenizer_->Decode(ids), text);
}

// SmolLM2 has no token for 21 bytes (e.g. 0x04, 0xC0, 0xFF); llama.cpp and
// Hugging Face drop them, and so does Headway.
TEST_F(SmolLmTokenizerTest, DropsBytesWithoutToken) {
  std::string all_bytes;
  std::string kept_bytes;
  for (int b = 0; b < 256; ++b) {
    all_bytes.push_back(static_cast<char>(b));
    if (tokenizer_->TokenId(ByteToUnicodeText(static_cast<uint8_t>(b))).ok()) {
      kept_bytes.push_back(static_cast<char>(b));
    }
  }
  EXPECT_EQ(kept_bytes.size(), 256u - 21u);
  EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(all_bytes, true)), kept_bytes);
  EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode("a\xff\x04" "b", false)), "ab");
}

TEST_F(SmolLmTokenizerTest, BadIdsAreErrors) {
  auto decoded = tokenizer_->DecodeChecked({19556, 49152});
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("49152"), std::string::npos);
  EXPECT_EQ(tokenizer_->DecodeChecked({-1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*tokenizer_->DecodeChecked({19556, 905}), "Hello world");
  EXPECT_EQ(tokenizer_->Decode({19556, -7, 905, 1 << 30}), "Hello world");
  EXPECT_EQ(tokenizer_->TokenText(49152).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tokenizer_->TokenText(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tokenizer_->TokenId("no such token text").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(tokenizer_->TokenBytes(-1).empty());
}

// About 2,000 tokens of English; gtest's per-case time is the encode cost.
TEST_F(SmolLmTokenizerTest, LongPromptRoundTrips) {
  const std::string paragraph =
      "The quick brown fox jumps over the lazy dog, while 42 engineers measure how long "
      "it takes to serve a large language model across many machines. Each request is "
      "split into tokens, scheduled onto workers, and streamed back to the client as "
      "soon as every character is complete. Nothing here is hard; it only needs care. ";
  std::string text;
  for (int i = 0; i < 30; ++i) text += paragraph;
  std::vector<int32_t> ids = tokenizer_->Encode(text, false);
  EXPECT_GT(ids.size(), 1800u);
  EXPECT_EQ(tokenizer_->Decode(ids), text);
}

}  // namespace
}  // namespace headway
