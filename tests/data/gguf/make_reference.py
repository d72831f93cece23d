"""Reference values for Headway's GGUF dequantisation tests.

Run from the repository root (needs `gguf` and `numpy` from PyPI):
    python tests/data/gguf/make_reference.py ~/.cache/headway/models/SmolLM2-135M-Instruct.Q4_1.gguf

Writes tests/data/gguf/dequant/*.f32 / *.raw and tests/data/gguf/dequant/reference.txt.
Expected values come from gguf.quants.dequantize (the format's own Python
dequantiser); raw blocks come from gguf.quants.quantize where the package can
quantise the type, and otherwise from random bytes with finite f16 scales.
"""
import importlib.metadata
import os
import sys

import gguf
import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dequant")
COMMAND = "python tests/data/gguf/make_reference.py SmolLM2-135M-Instruct.Q4_1.gguf"


def f16_bytes(rng, n, lo, hi):
    return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng, qtype, n_blocks):
    """Random raw blocks whose f16 scale fields are finite."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if qtype in (T.Q8_0, T.Q4_0, T.Q5_0):
        raw[:, 0:2] = f16_bytes(rng, n_blocks, -0.05, 0.05)
    elif qtype == T.Q4_1:
        raw[:, 0:2] = f16_bytes(rng, n_blocks, 0.0, 0.05)
        raw[:, 2:4] = f16_bytes(rng, n_blocks, -0.5, 0.5)
    elif qtype == T.Q4_K:
        raw[:, 0:2] = f16_bytes(rng, n_blocks, 0.0, 0.01)
        raw[:, 2:4] = f16_bytes(rng, n_blocks, 0.0, 0.01)
    elif qtype == T.Q6_K:
        raw[:, 208:210] = f16_bytes(rng, n_blocks, -0.01, 0.01)
    return raw.reshape(-1), n_blocks * block_values


def main():
    model_path = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240607)
    lines = [
        "# Made by: " + COMMAND,
        "# gguf " + importlib.metadata.version("gguf") + ", numpy " + np.__version__,
        "# model <tensor> <type> <first value> <count> <expected f32 file>",
        "# modelsum <tensor> <sum of all values> <sum of |values|>   (float64 sums)",
        "# synthetic <type> <n values> <raw ggml bytes file> <expected f32 file>",
        "# quantized <type> <f32 input file> <gguf.quants.quantize output file>",
    ]

    reader = gguf.GGUFReader(model_path)
    tensors = {t.name: t for t in reader.tensors}
    picks = ["token_embd.weight", "blk.0.attn_q.weight", "blk.15.ffn_down.weight",
             "blk.29.attn_v.weight", "blk.0.attn_norm.weight", "output_norm.weight"]
    for name in picks:
        t = tensors[name]
        values = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        n = values.size
        starts = sorted({0, (n // 2) // 256 * 256, n - 256})
        for start in starts:
            fname = "model_%s_%d.f32" % (name.replace(".", "_"), start)
            values[start:start + 256].tofile(os.path.join(OUT, fname))
            lines.append("model %s %s %d %d %s" % (name, t.tensor_type.name, start, 256, fname))
        v64 = values.astype(np.float64)
        lines.append("modelsum %s %.17g %.17g" % (name, v64.sum(), np.abs(v64).sum()))

    # Quantised by the reference quantiser from random normal data.
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0):
        x = rng.standard_normal((8, 256)).astype(np.float32)
        raw = quants.quantize(x, qtype)
        expected = quants.dequantize(raw, qtype).astype(np.float32).reshape(-1)
        stem = "quantized_" + qtype.name.lower()
        raw.reshape(-1).tofile(os.path.join(OUT, stem + ".raw"))
        expected.tofile(os.path.join(OUT, stem + ".f32"))
        x.reshape(-1).tofile(os.path.join(OUT, stem + ".input.f32"))
        lines.append("synthetic %s %d %s.raw %s.f32" % (qtype.name, expected.size, stem, stem))
        lines.append("quantized %s %s.input.f32 %s.raw" % (qtype.name, stem, stem))

    # Random raw blocks: every bit pattern of the quantised fields.
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q4_K, T.Q6_K):
        raw, n_values = random_blocks(rng, qtype, 16)
        expected = quants.dequantize(raw.reshape(16, -1), qtype).astype(np.float32).reshape(-1)
        assert expected.size == n_values
        stem = "random_" + qtype.name.lower()
        raw.tofile(os.path.join(OUT, stem + ".raw"))
        expected.tofile(os.path.join(OUT, stem + ".f32"))
        lines.append("synthetic %s %d %s.raw %s.f32" % (qtype.name, n_values, stem, stem))

    # F16: random values plus zeros, infinities, subnormals, the largest half and NaN.
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -14,
                         6.1e-5, 65504.0, -65504.0, np.nan, 1.0], dtype=np.float16)
    f16 = np.concatenate([specials, (rng.standard_normal(500) * 100).astype(np.float16)])
    f16_raw = f16.view(np.uint8)
    expected = quants.dequantize(f16_raw, T.F16).astype(np.float32).reshape(-1)
    f16_raw.tofile(os.path.join(OUT, "random_f16.raw"))
    expected.tofile(os.path.join(OUT, "random_f16.f32"))
    lines.append("synthetic F16 %d random_f16.raw random_f16.f32" % expected.size)

    # BF16: every kind of bit pattern (random u16 covers NaN, inf, subnormals).
    bf16_bits = rng.integers(0, 65536, size=512, dtype=np.uint16)
    bf16_raw = bf16_bits.view(np.uint8)
    expected = quants.dequantize(bf16_raw, T.BF16).astype(np.float32).reshape(-1)
    bf16_raw.tofile(os.path.join(OUT, "random_bf16.raw"))
    expected.tofile(os.path.join(OUT, "random_bf16.f32"))
    lines.append("synthetic BF16 %d random_bf16.raw random_bf16.f32" % expected.size)

    with open(os.path.join(OUT, "reference.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
