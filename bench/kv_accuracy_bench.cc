// What each KV cache dtype costs in accuracy on a real model, measured as
// llama.cpp's `llama-perplexity --kl-divergence` measures its cache types:
// the text is cut into chunks of --ctx tokens (the first token of each
// replaced by BOS where the model adds one); each chunk is run from an empty
// cache, and the tokens of its second half are scored (each row predicts
// the next token). The first dtype is the baseline (float32 by default):
// its log-probabilities of every scored row are kept, and each dtype
// reports
//   perplexity        exp(mean negative log-likelihood of the next token)
//   ppl_ratio         its perplexity over the baseline's
//   mean_kld          mean over scored rows of KL(P_baseline || P_dtype), nats
//   top1_same         share of rows whose argmax equals the baseline's
//   kv_bytes_per_token  KV bytes one token takes on this rank (all layers)
// Everything runs in process, one TP rank (no coordinator or ZeroMQ).
// A dtype written FULL+SLIDING (e.g. float16+q8_0) stores full-attention
// slots in FULL and sliding-window slots in SLIDING (cache.kv_cache_dtype
// and cache.kv_cache_dtype_sliding), in one arena (common/kv_arena.h).
//
//   headway-kv-accuracy-bench --model PATH
//       [--text /usr/share/common-licenses/GPL-3] [--ctx 512] [--threads 2]
//       [--kv-cache-dtypes float32 float16 q8_0 q4_0 q4_0_hadamard]
//       [--max-chunks 0]
//
// The default text is the GNU GPL version 3 as Debian's base-files package
// ships it (35,149 bytes; 7,639 SmolLM2 tokens, 7,562 Gemma 3 tokens).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/kv_arena.h"

#include "bench/kv_dtype_flags.h"
#include "common/gguf.h"
#include "common/model_spec.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "kernels/threads.h"
#include "worker/decoder_model.h"

namespace headway {
namespace {

constexpr int kBlockSize = 16;

struct DtypeScore {
  double nll = 0.0;      // summed over scored rows
  double kld = 0.0;      // summed
  int64_t top1_same = 0;
  int64_t rows = 0;
};

// log softmax of `logits` [vocab] into `out`, in double.
void LogSoftmax(const float* logits, int vocab, std::vector<double>* out) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(double(logits[v]) - mx);
  const double log_z = mx + std::log(sum);
  out->resize(size_t(vocab));
  for (int v = 0; v < vocab; ++v) (*out)[size_t(v)] = double(logits[v]) - log_z;
}

// "float16", or "float16+q8_0" for a pair of dtypes.
std::string DtypesName(const KvCacheDtypes& d) {
  return d.full == d.sliding
             ? KvCacheDtypeName(d.full)
             : std::string(KvCacheDtypeName(d.full)) + "+" + KvCacheDtypeName(d.sliding);
}

// Logits of rows [first, ctx - 1) of one chunk run from an empty cache in
// `dtypes`: [ctx - 1 - first, vocab]. Each block class takes its own run of
// chunks of the arena.
Result<std::vector<float>> ChunkLogits(DecoderModel& model, const std::vector<int32_t>& tokens,
                                       int first, const KvCacheDtypes& dtypes) {
  const ModelSpec& spec = model.spec();
  const int n = int(tokens.size());
  const int n_kv = model.num_local_kv_heads();
  const int blocks_per_row = (n + kBlockSize - 1) / kBlockSize;
  const KvArenaLayout arena = MakeKvArenaLayout(kBlockSize, spec.head_dim, dtypes, spec.slot_specs);
  std::vector<int64_t> rows_of_class(arena.classes.size(), 0);
  for (int l = 0; l < spec.num_layers; ++l) {
    for (int h = 0; h < n_kv; ++h) {
      ++rows_of_class[size_t(arena.ClassOf(arena.dtypes.For(model.slot_spec(l * n_kv + h))))];
    }
  }
  std::vector<int32_t> next_id(arena.classes.size());
  int64_t chunks = 0;
  for (size_t c = 0; c < arena.classes.size(); ++c) {
    const int64_t per_chunk = arena.BlocksPerChunk(arena.classes[c]);
    next_id[c] = int32_t(chunks * per_chunk);
    chunks += (rows_of_class[c] * blocks_per_row + per_chunk - 1) / per_chunk;
  }
  HW_ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool,
                      KvPool::CreateArena(arena, chunks * int64_t(arena.chunk_bytes)));
  std::vector<std::vector<int32_t>> table_ids(size_t(spec.num_layers));
  std::vector<LayerBlockTable> tables(size_t(spec.num_layers));
  for (int l = 0; l < spec.num_layers; ++l) {
    for (int h = 0; h < n_kv; ++h) {
      const size_t c = size_t(arena.ClassOf(arena.dtypes.For(model.slot_spec(l * n_kv + h))));
      for (int i = 0; i < blocks_per_row; ++i) table_ids[size_t(l)].push_back(next_id[c]++);
    }
    tables[size_t(l)] = LayerBlockTable{table_ids[size_t(l)].data(), n_kv, blocks_per_row};
  }
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::vector<int32_t> rows(static_cast<size_t>(n - 1 - first));
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(rows.begin(), rows.end(), first);
  const int32_t query_start[2] = {0, n};
  const int32_t start_pos[1] = {0};
  ForwardBatch batch;
  batch.token_ids = tokens.data();
  batch.positions = positions.data();
  batch.layout = BatchLayout{1, query_start, start_pos};
  batch.tables = tables.data();
  batch.logit_rows = rows.data();
  batch.num_logit_rows = int(rows.size());
  std::vector<float> logits;
  HW_RETURN_IF_ERROR(model.Forward(batch, pool.get(), &logits));
  return logits;
}

int Run(const std::string& model_path, const std::string& text_path, int ctx,
        const std::vector<KvCacheDtypes>& dtypes, int max_chunks) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "headway-kv-accuracy-bench: %s\n", s.ToString().c_str());
    return 1;
  };
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(model_path);
  if (!file.ok()) return fail(file.status());
  Result<ModelSpec> spec = LoadModelSpec(**file);
  if (!spec.ok()) return fail(spec.status());
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  Result<std::unique_ptr<ModelWeights>> weights =
      ModelWeights::Load(**file, *spec, ShardForRank(*spec, 1, 0));
  if (!weights.ok()) return fail(weights.status());
  Result<std::unique_ptr<DecoderModel>> model = DecoderModel::Create(*spec, std::move(*weights));
  if (!model.ok()) return fail(model.status());
  for (const KvCacheDtypes& pair : dtypes) {
    for (KvCacheDtype d : {pair.full, pair.sliding}) {
      if (std::string why = KvCacheLayout{kBlockSize, spec->head_dim, d}.Check(); !why.empty()) {
        return fail(Status::InvalidArgument(why));
      }
    }
  }

  std::ifstream in(text_path, std::ios::binary);
  if (!in) return fail(Status::NotFound("cannot read --text " + text_path));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text, /*parse_special=*/false);
  const int32_t bos = (*tokenizer)->add_bos() ? (*tokenizer)->bos_id() : -1;
  int num_chunks = int(ids.size()) / ctx;
  if (max_chunks > 0) num_chunks = std::min(num_chunks, max_chunks);
  if (num_chunks < 1) {
    return fail(Status::InvalidArgument("the text has " + std::to_string(ids.size()) +
                                        " tokens, fewer than one chunk of --ctx " +
                                        std::to_string(ctx)));
  }

  const int first = ctx / 2;
  const int vocab = (*model)->vocab_size();
  std::vector<DtypeScore> scores(dtypes.size());
  std::vector<std::vector<double>> base_logp(static_cast<size_t>(ctx));
  std::vector<int32_t> base_top1(static_cast<size_t>(ctx));
  std::vector<double> logp;
  for (int c = 0; c < num_chunks; ++c) {
    std::vector<int32_t> tokens(ids.begin() + size_t(c) * ctx, ids.begin() + size_t(c + 1) * ctx);
    if (bos >= 0) tokens[0] = bos;
    for (size_t d = 0; d < dtypes.size(); ++d) {
      Result<std::vector<float>> logits = ChunkLogits(**model, tokens, first, dtypes[d]);
      if (!logits.ok()) return fail(logits.status());
      for (int r = 0; r + first + 1 < ctx; ++r) {
        const float* row = logits->data() + size_t(r) * vocab;
        LogSoftmax(row, vocab, &logp);
        DtypeScore& s = scores[d];
        s.nll -= logp[size_t(tokens[size_t(first + r + 1)])];
        const int32_t top1 = int32_t(std::max_element(row, row + vocab) - row);
        ++s.rows;
        if (d == 0) {
          base_logp[size_t(r)] = logp;
          base_top1[size_t(r)] = top1;
          ++s.top1_same;
          continue;
        }
        const std::vector<double>& p = base_logp[size_t(r)];
        double kld = 0.0;
        for (int v = 0; v < vocab; ++v) kld += std::exp(p[size_t(v)]) * (p[size_t(v)] - logp[size_t(v)]);
        s.kld += kld;
        s.top1_same += top1 == base_top1[size_t(r)];
      }
    }
    std::fprintf(stderr, "chunk %d of %d done\n", c + 1, num_chunks);
  }

  const double base_ppl = std::exp(scores[0].nll / double(scores[0].rows));
  std::printf("{\n  \"model\": \"%s\",\n  \"text\": \"%s\",\n  \"text_tokens\": %zu,\n",
              spec->name.c_str(), text_path.c_str(), ids.size());
  std::printf("  \"ctx\": %d,\n  \"chunks\": %d,\n  \"scored_rows\": %lld,\n", ctx, num_chunks,
              static_cast<long long>(scores[0].rows));
  std::printf("  \"threads\": %d,\n  \"kv_cache_dtypes\": [\n", cpu::NumThreads());
  for (size_t d = 0; d < dtypes.size(); ++d) {
    const DtypeScore& s = scores[d];
    const double ppl = std::exp(s.nll / double(s.rows));
    size_t bytes_per_token = 0;
    for (const SlotSpec& slot : spec->slot_specs) {
      bytes_per_token +=
          2 * KvCacheLayout{kBlockSize, spec->head_dim, dtypes[d].For(slot)}.RowBytes();
    }
    std::printf(
        "    {\"kv_cache_dtype\": \"%s\", \"kv_bytes_per_token\": %zu, \"perplexity\": %.5f, "
        "\"ppl_ratio\": %.5f, \"mean_kld\": %.6f, \"top1_same\": %.5f}%s\n",
        DtypesName(dtypes[d]).c_str(), bytes_per_token, ppl, ppl / base_ppl,
        s.kld / double(s.rows), double(s.top1_same) / double(s.rows),
        d + 1 < dtypes.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
  return 0;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) {
  CLI::App app{"KV cache dtype accuracy: perplexity and KL divergence against the first dtype"};
  std::string model_path;
  std::string text_path = "/usr/share/common-licenses/GPL-3";
  int ctx = 512;
  int threads = 2;
  int max_chunks = 0;
  std::vector<std::string> dtype_names = {"float32", "float16", "q8_0", "q4_0", "q4_0_hadamard"};
  app.add_option("--model", model_path, "GGUF model")->required();
  app.add_option("--text", text_path, "UTF-8 text to score");
  app.add_option("--ctx", ctx, "tokens per chunk (the second half is scored)")
      ->check(CLI::Range(16, 1 << 16));
  app.add_option("--threads", threads, "compute threads")->check(CLI::PositiveNumber);
  app.add_option("--max-chunks", max_chunks, "score at most this many chunks (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-cache-dtypes", dtype_names,
                 "dtypes, or FULL+SLIDING pairs; the first is the baseline");
  CLI11_PARSE(app, argc, argv);
  std::vector<headway::KvCacheDtypes> dtypes;
  for (const std::string& name : dtype_names) {
    const size_t plus = name.find('+');
    const std::vector<std::string> parts =
        plus == std::string::npos
            ? std::vector<std::string>{name, name}
            : std::vector<std::string>{name.substr(0, plus), name.substr(plus + 1)};
    const std::optional<std::vector<headway::KvCacheDtype>> parsed =
        headway::bench::ParseKvCacheDtypeFlag(parts);
    if (!parsed) return 2;
    dtypes.push_back({(*parsed)[0], (*parsed)[1]});
  }
  headway::cpu::SetNumThreads(threads);
  return headway::Run(model_path, text_path, ctx, dtypes, max_chunks);
}
