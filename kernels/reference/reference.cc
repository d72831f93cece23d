// Naive reference kernels: plain loops, double accumulators, no tricks. Only
// tests link this library.
#include "kernels/reference/reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/quant_blocks.h"

namespace headway::reference {

void Embedding(const float* table, const int32_t* ids, int n, int dim, float* out) {
  for (int i = 0; i < n; ++i) {
    for (int d = 0; d < dim; ++d) out[size_t(i) * dim + d] = table[size_t(ids[i]) * dim + d];
  }
}

void RmsNorm(const float* x, const float* weight, int n_rows, int dim, float eps, float* out) {
  for (int r = 0; r < n_rows; ++r) {
    const float* row = x + size_t(r) * dim;
    double sum_sq = 0.0;
    for (int d = 0; d < dim; ++d) sum_sq += double(row[d]) * row[d];
    const double inv = 1.0 / std::sqrt(sum_sq / dim + eps);
    for (int d = 0; d < dim; ++d) out[size_t(r) * dim + d] = float(row[d] * inv * weight[d]);
  }
}

void Rope(float* x, const int32_t* positions, int n_tokens, int n_heads, int head_dim,
          float freq_base, cpu::RopeStyle style) {
  const int half = head_dim / 2;
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (size_t(t) * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double theta =
            positions[t] * std::pow(double(freq_base), -2.0 * i / head_dim);
        const int a = style == cpu::RopeStyle::kInterleaved ? 2 * i : i;
        const int b = style == cpu::RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
        const double x0 = v[a], x1 = v[b];
        v[a] = float(x0 * std::cos(theta) - x1 * std::sin(theta));
        v[b] = float(x0 * std::sin(theta) + x1 * std::cos(theta));
      }
    }
  }
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = float(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void GeluTanhGated(const float* gate, const float* up, int64_t n, float* out) {
  const double kPi = 3.14159265358979323846;
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double inner = std::sqrt(2.0 / kPi) * (g + 0.044715 * g * g * g);
    out[i] = float(0.5 * g * (1.0 + std::tanh(inner)) * up[i]);
  }
}

void MatmulTransB(const float* x, const float* w, int m, int n, int k, float* y) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int l = 0; l < k; ++l) acc += double(x[size_t(i) * k + l]) * w[size_t(j) * k + l];
      y[size_t(i) * n + j] = float(acc);
    }
  }
}

void Attention(const float* q, const float* k_hist, const float* v_hist,
               const BatchLayout& batch, const SlotSpec* specs, int num_heads,
               int num_kv_heads, int head_dim, float scale, float* out) {
  const int group = num_heads / num_kv_heads;
  size_t hist_offset = 0;  // first history row of sequence s
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int n_new = batch.query_start[s + 1] - batch.query_start[s];
    const int context_len = batch.start_pos[s] + n_new;
    for (int j = 0; j < n_new; ++j) {
      const int row = batch.query_start[s] + j;
      const int pos = batch.start_pos[s] + j;
      for (int qh = 0; qh < num_heads; ++qh) {
        const int kvh = qh / group;
        const float* qv = q + (size_t(row) * num_heads + qh) * head_dim;
        std::vector<double> scores(context_len, -std::numeric_limits<double>::infinity());
        double max_score = -std::numeric_limits<double>::infinity();
        for (int key = 0; key < context_len; ++key) {
          if (!specs[kvh].Sees(pos, key)) continue;
          const float* kv = k_hist + ((hist_offset + key) * num_kv_heads + kvh) * head_dim;
          double dot = 0.0;
          for (int d = 0; d < head_dim; ++d) dot += double(qv[d]) * kv[d];
          scores[key] = dot * scale;
          max_score = std::max(max_score, scores[key]);
        }
        double denom = 0.0;
        std::vector<double> acc(head_dim, 0.0);
        for (int key = 0; key < context_len; ++key) {
          if (!specs[kvh].Sees(pos, key)) continue;
          const double p = std::exp(scores[key] - max_score);
          denom += p;
          const float* vv = v_hist + ((hist_offset + key) * num_kv_heads + kvh) * head_dim;
          for (int d = 0; d < head_dim; ++d) acc[d] += p * vv[d];
        }
        float* o = out + (size_t(row) * num_heads + qh) * head_dim;
        for (int d = 0; d < head_dim; ++d) o[d] = float(acc[d] / denom);
      }
    }
    hist_offset += context_len;
  }
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFF;
  // NaN: quiet, with the top of its payload (as F16C's vcvtps2ph keeps it).
  if (abs > 0x7F800000) return uint16_t(sign | 0x7E00 | ((abs >> 13) & 0x03FF));
  // Round |f| to a multiple of the half's spacing at its exponent with
  // nearbyint (ties to even), in double, where every step is exact.
  const double a = double(std::bit_cast<float>(abs));
  if (a >= 65520.0) return uint16_t(sign | 0x7C00);  // rounds past 65504: infinity
  if (a < std::ldexp(1.0, -14)) {                    // subnormal: multiples of 2^-24
    return uint16_t(sign | uint16_t(std::nearbyint(a * std::ldexp(1.0, 24))));
  }
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const double mantissa = std::nearbyint(std::ldexp(a, 11 - e));  // in [1024, 2048]
  // 2048 carries into the next exponent, which the encoding below absorbs.
  const uint32_t half_exp = uint32_t(e - 1 + 15);
  return uint16_t(sign + (half_exp << 10) + (uint32_t(mantissa) - 1024));
}

void Hadamard32Groups(float* x, int n) {
  const float scale = float(1.0 / std::sqrt(32.0));
  for (int g = 0; g < n; g += 32) {
    float* y = x + g;
    for (int step = 1; step < 32; step *= 2) {
      for (int i = 0; i < 32; ++i) {
        if (i & step) continue;
        const float a = y[i], b = y[i + step];
        y[i] = a + b;
        y[i + step] = a - b;
      }
    }
    for (int i = 0; i < 32; ++i) y[i] *= scale;
  }
}

void QuantizeKvRow(const float* x, int head_dim, KvCacheDtype dtype, uint8_t* row) {
  switch (dtype) {
    case KvCacheDtype::kFloat32:
      std::memcpy(row, x, sizeof(float) * size_t(head_dim));
      return;
    case KvCacheDtype::kFloat16:
      for (int i = 0; i < head_dim; ++i) {
        const uint16_t h = FloatToHalf(x[i]);
        std::memcpy(row + 2 * i, &h, 2);
      }
      return;
    case KvCacheDtype::kQ8_0:
      for (int g = 0; g < head_dim / 32; ++g, row += 34) {
        const float* v = x + 32 * g;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = FloatToHalf(d);
        std::memcpy(row, &dh, 2);
        for (int i = 0; i < 32; ++i) row[2 + i] = uint8_t(int8_t(std::nearbyint(v[i] * id)));
      }
      return;
    case KvCacheDtype::kQ4_0Hadamard: {
      std::vector<float> rotated(x, x + head_dim);
      Hadamard32Groups(rotated.data(), head_dim);
      QuantizeKvRow(rotated.data(), head_dim, KvCacheDtype::kQ4_0, row);
      return;
    }
    case KvCacheDtype::kQ4_0:
      for (int g = 0; g < head_dim / 32; ++g, row += 18) {
        const float* v = x + 32 * g;
        float amax = 0.0f, m = 0.0f;
        for (int i = 0; i < 32; ++i) {
          if (std::fabs(v[i]) > amax) {
            amax = std::fabs(v[i]);
            m = v[i];
          }
        }
        const float d = m / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = FloatToHalf(d);
        std::memcpy(row, &dh, 2);
        for (int i = 0; i < 16; ++i) {
          const int lo = std::min(15, int(std::floor(std::fma(v[i], id, 8.5f))));
          const int hi = std::min(15, int(std::floor(std::fma(v[i + 16], id, 8.5f))));
          row[2 + i] = uint8_t(lo | (hi << 4));
        }
      }
      return;
  }
}

void DequantizeKvRow(const uint8_t* row, int head_dim, KvCacheDtype dtype, float* x) {
  switch (dtype) {
    case KvCacheDtype::kFloat32:
      std::memcpy(x, row, sizeof(float) * size_t(head_dim));
      return;
    case KvCacheDtype::kFloat16:
      for (int i = 0; i < head_dim; ++i) x[i] = quant::HalfToFloat(quant::LoadU16(row + 2 * i));
      return;
    case KvCacheDtype::kQ8_0:
      for (int g = 0; g < head_dim / 32; ++g, row += 34) {
        const float d = quant::HalfToFloat(quant::LoadU16(row));
        for (int i = 0; i < 32; ++i) x[32 * g + i] = d * float(int8_t(row[2 + i]));
      }
      return;
    case KvCacheDtype::kQ4_0Hadamard:
      DequantizeKvRow(row, head_dim, KvCacheDtype::kQ4_0, x);
      Hadamard32Groups(x, head_dim);
      return;
    case KvCacheDtype::kQ4_0:
      for (int g = 0; g < head_dim / 32; ++g, row += 18) {
        const float d = quant::HalfToFloat(quant::LoadU16(row));
        for (int i = 0; i < 16; ++i) {
          x[32 * g + i] = d * float((row[2 + i] & 15) - 8);
          x[32 * g + i + 16] = d * float((row[2 + i] >> 4) - 8);
        }
      }
      return;
  }
}

SampleResult Sample(const float* logits, int vocab_size, const SamplingConfig& config,
                    double uniform, int num_top_logprobs) {
  // Raw log softmax.
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < vocab_size; ++i) max_logit = std::max(max_logit, double(logits[i]));
  double sum = 0.0;
  for (int i = 0; i < vocab_size; ++i) sum += std::exp(double(logits[i]) - max_logit);
  const double log_z = max_logit + std::log(sum);

  // All ids, best first, lowest id first among equal logits.
  std::vector<int32_t> order(vocab_size);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });

  SampleResult result;
  const int num_top = std::clamp(num_top_logprobs, 0, vocab_size);
  for (int i = 0; i < num_top; ++i) {
    result.top_logprobs.emplace_back(order[i], float(logits[order[i]] - log_z));
  }

  if (config.temperature <= 0.0f) {
    result.token_id = order[0];
  } else {
    size_t keep = order.size();
    if (config.top_k > 0) keep = std::min(keep, size_t(config.top_k));
    const double t = config.temperature;
    const double max_scaled = double(logits[order[0]]) / t;
    if (config.min_p > 0.0f) {
      // Probability relative to the best token's, at temperature t.
      size_t above = 0;
      while (above < order.size() &&
             std::exp(double(logits[order[above]]) / t - max_scaled) >= double(config.min_p)) {
        ++above;
      }
      keep = std::min(keep, std::max<size_t>(above, 1));
    }
    std::vector<double> weight(keep);
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      weight[i] = std::exp(double(logits[order[i]]) / t - max_scaled);
      total += weight[i];
    }
    if (config.top_p < 1.0f) {
      double cumulative = 0.0;
      size_t n = 0;
      while (n < keep && cumulative < double(config.top_p) * total) cumulative += weight[n++];
      keep = std::max<size_t>(n, 1);
    }
    // Inverse CDF over the kept tokens in ascending id order.
    std::vector<int32_t> kept(order.begin(), order.begin() + keep);
    std::sort(kept.begin(), kept.end());
    double kept_total = 0.0;
    for (int32_t id : kept) kept_total += std::exp(double(logits[id]) / t - max_scaled);
    const double target = uniform * kept_total;
    double cumulative = 0.0;
    result.token_id = kept.back();
    for (int32_t id : kept) {
      cumulative += std::exp(double(logits[id]) / t - max_scaled);
      if (target < cumulative) {
        result.token_id = id;
        break;
      }
    }
  }
  if (num_top_logprobs != cpu::kNoLogprobs) result.logprob = float(logits[result.token_id] - log_z);
  return result;
}

}  // namespace headway::reference
