// What a structured-output grammar costs the coordinator, per step: the
// token mask of a state met for the first time (a walk over the whole
// vocabulary) and of one met before (a lookup), on a real model's
// vocabulary.
//
//   headway-grammar-mask-bench --model ~/.cache/headway/models/SmolLM2-135M-Instruct.Q4_1.gguf
//
// Compiles a nested JSON schema (bench/structured_output_bench.py's), then
// writes `--answers` answers by picking, at each step, a random token the
// mask allows (a fixed seed), timing every Mask and Advance call. The
// first answer meets most states cold; the later ones reuse them, as
// requests with the same schema do. Prints JSON with medians and p90s.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "common/gguf.h"
#include "coordinator/http/structured_output_fields.h"
#include "coordinator/structured/grammar_compiler.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

constexpr const char* kSchema = R"({"type": "object", "properties": {
  "orders": {"type": "array", "minItems": 3, "maxItems": 3, "items": {
    "type": "object", "properties": {
      "id": {"type": "integer", "minimum": 0, "maximum": 99999},
      "customer": {"type": "string", "maxLength": 30},
      "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
      "total": {"type": "number", "minimum": 0, "maximum": 10000},
      "items": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 12}}},
    "required": ["id", "customer", "status", "total", "items"]}}},
  "required": ["orders"]})";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Structured-output token mask cost"};
  std::string model_path;
  int answers = 5;
  int max_tokens = 400;
  size_t max_token_bytes = 0;
  app.add_option("--model", model_path, "GGUF file whose vocabulary to use")->required();
  app.add_option("--answers", answers, "answers to write");
  app.add_option("--max-tokens", max_tokens, "longest answer");
  app.add_option("--max-token-bytes", max_token_bytes,
                 "pick only allowed tokens of at most this many bytes where there are any (0: "
                 "any); a model writes names and words in short tokens, which visits more "
                 "states than random long ones");
  CLI11_PARSE(app, argc, argv);

  using namespace headway;
  auto gguf = GgufFile::Open(model_path);
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s\n", gguf.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = Tokenizer::FromGguf(**gguf);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  Clock::time_point t0 = Clock::now();
  auto vocabulary = GrammarVocabulary(**tokenizer);
  const double vocabulary_ms = Ms(Clock::now() - t0);
  structured::GrammarCompiler compiler(vocabulary);
  const structured::StructuredOutputSpec spec{structured::StructuredOutputSpec::Kind::kJsonSchema,
                                              kSchema, "", "bench"};
  t0 = Clock::now();
  auto automaton = compiler.Compile(spec);
  const double compile_ms = Ms(Clock::now() - t0);
  if (!automaton.ok()) {
    std::fprintf(stderr, "%s\n", automaton.status().ToString().c_str());
    return 1;
  }
  structured::TokenAutomaton& a = **automaton;

  std::mt19937_64 rng(1);
  nlohmann::json per_answer = nlohmann::json::array();
  for (int answer = 0; answer < answers; ++answer) {
    std::vector<double> mask_ms, advance_ms;
    int32_t state = a.start();
    int tokens = 0;
    for (; tokens < max_tokens; ++tokens) {
      t0 = Clock::now();
      auto mask = a.Mask(state);
      mask_ms.push_back(Ms(Clock::now() - t0));
      if (!mask.ok()) {
        std::fprintf(stderr, "%s\n", mask.status().ToString().c_str());
        return 1;
      }
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocabulary->size(); ++id) {
        if (structured::MaskAllows(**mask, id)) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      if (max_token_bytes > 0) {
        std::vector<int32_t> short_ones;
        for (int32_t id : allowed) {
          if (vocabulary->bytes(id).size() <= max_token_bytes) short_ones.push_back(id);
        }
        if (!short_ones.empty()) allowed = std::move(short_ones);
      }
      const int32_t token = allowed[rng() % allowed.size()];
      t0 = Clock::now();
      auto next = a.Advance(state, token);
      advance_ms.push_back(Ms(Clock::now() - t0));
      if (!next.ok()) return 1;
      state = *next;
      auto terminal = a.IsTerminal(state);
      if (terminal.ok() && *terminal) {
        ++tokens;
        break;
      }
    }
    double total = 0.0;
    for (double m : mask_ms) total += m;
    per_answer.push_back({{"tokens", tokens},
                          {"mask_ms_median", Percentile(mask_ms, 0.5)},
                          {"mask_ms_p90", Percentile(mask_ms, 0.9)},
                          {"mask_ms_max", Percentile(mask_ms, 1.0)},
                          {"mask_ms_mean", total / double(mask_ms.size())},
                          {"advance_ms_median", Percentile(advance_ms, 0.5)}});
  }
  nlohmann::json out = {{"model", model_path},
                        {"vocab_size", vocabulary->size()},
                        {"vocabulary_ms", vocabulary_ms},
                        {"compile_ms_with_start_mask", compile_ms},
                        {"answers", per_answer}};
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
