#include "bench/serving/prompt_generator.h"

#include <array>
#include <random>

namespace headway::bench {
namespace {

// Short, frequent words: each is a single token in common BPE vocabularies
// when preceded by a space, so a word count approximates a token count.
constexpr std::array<const char*, 64> kWords = {
    "the",   "of",    "and",   "to",    "in",    "is",    "was",   "for",   "on",    "that",
    "with",  "as",    "it",    "by",    "at",    "from",  "his",   "an",    "were",  "are",
    "which", "this",  "be",    "or",    "has",   "had",   "first", "one",   "their", "its",
    "new",   "after", "who",   "they",  "two",   "her",   "she",   "been",  "other", "when",
    "time",  "during", "there", "into", "school", "more", "years", "all",   "only",  "over",
    "city",  "some",  "world", "would", "where", "later", "up",    "such",  "used",  "many",
    "can",   "state", "about", "national"};

void AppendRandom(std::mt19937_64& rng, int count, bool as_text, BenchPrompt* prompt) {
  std::uniform_int_distribution<int32_t> id_dist(kPromptTokenIdBegin, kPromptTokenIdEnd - 1);
  std::uniform_int_distribution<size_t> word_dist(0, kWords.size() - 1);
  for (int i = 0; i < count; ++i) {
    if (as_text) {
      if (!prompt->text.empty()) prompt->text += ' ';
      prompt->text += kWords[word_dist(rng)];
    } else {
      prompt->token_ids.push_back(id_dist(rng));
    }
  }
}

}  // namespace

std::vector<BenchPrompt> GeneratePrompts(int num_prompts, int prefix_len, int input_len,
                                         int output_len, bool as_text, uint64_t seed) {
  std::mt19937_64 rng(seed);
  BenchPrompt prefix;
  AppendRandom(rng, prefix_len, as_text, &prefix);

  std::vector<BenchPrompt> prompts;
  prompts.reserve(num_prompts);
  for (int i = 0; i < num_prompts; ++i) {
    BenchPrompt prompt = prefix;
    AppendRandom(rng, input_len, as_text, &prompt);
    prompt.prompt_len = prefix_len + input_len;
    prompt.output_len = output_len;
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

}  // namespace headway::bench
