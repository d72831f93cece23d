#!/usr/bin/env python3
"""Makes the reference data the worker's model tests compare against.

Run once (tests never run Python):

  /tmp/refenv/bin/python tests/data/reference/make_reference.py \
      --model ~/.cache/headway/models/SmolLM2-135M-Instruct.Q4_1.gguf

with llama-cpp-python 0.3.16 (PyPI; builds llama.cpp from source) in the venv.
Writes:
  tests/data/reference/smollm2_greedy.json   prompts, greedy continuations,
                                             top logits of the last prompt position
  tests/data/perplexity/passage_ids.json     token ids of passage.txt and
                                             llama.cpp's perplexity on them

Besides llama.cpp, F32Reference below recomputes each prompt's last-position
logits in numpy at f32 from the `gguf` package's dequantised weights
("f32_last_top_*"): the same arithmetic as Headway, for a tight comparison.

Greedy decoding is done token by token with llama.cpp (temperature 0 = argmax
of the logits), n_threads=2, so the continuation is exactly what llama.cpp's
own forward pass prefers. Tokenization is llama.cpp's (the GGUF's BPE
vocabulary, `smollm` pre-tokenizer); the file says add_bos_token = false, so
no BOS is prepended.
"""

import argparse
import json
import math
import os
import sys

import gguf
import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)

PROMPTS = [
    ("chatml_capital",
     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
     "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
     "<|im_end|>\n<|im_start|>assistant\n"),
    ("counting", "One, two, three, four, five,"),
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
]
NUM_GENERATED = 32
NUM_TOP_LOGITS = 100


class F32Reference:
    """The llama forward pass in numpy at f32 on weights dequantised by `gguf`
    (the format's own dequantiser): what Headway computes, without llama.cpp's
    on-the-fly quantisation of activations. Plain causal attention, no cache."""

    def __init__(self, path):
        from gguf.quants import dequantize
        reader = gguf.GGUFReader(path)
        self.w = {}
        for t in reader.tensors:
            shape = [int(x) for x in reversed(t.shape)]  # ne {n_in, n_out} -> [n_out, n_in]
            self.w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        f = reader.fields
        get = lambda k: f[k].contents()
        self.n_layers = int(get("llama.block_count"))
        self.n_heads = int(get("llama.attention.head_count"))
        self.n_kv = int(get("llama.attention.head_count_kv"))
        self.hidden = int(get("llama.embedding_length"))
        self.head_dim = self.hidden // self.n_heads
        self.eps = float(get("llama.attention.layer_norm_rms_epsilon"))
        self.base = float(get("llama.rope.freq_base"))

    def rms(self, x, w):
        x64 = x.astype(np.float64)
        return (x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + self.eps)).astype(np.float32) * w

    def rope(self, x, pos):
        # Interleaved pairs (x[2i], x[2i+1]) turn by pos * base^(-2i/head_dim):
        # llama.cpp's LLAMA_ROPE_TYPE_NORM, since the converter permuted Q/K rows.
        d = self.head_dim
        theta = pos[:, None] * self.base ** (-2.0 * np.arange(d // 2) / d)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def last_logits(self, ids):
        w, n, d = self.w, len(ids), self.head_dim
        x = w["token_embd.weight"][np.array(ids)]
        pos = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
        for l in range(self.n_layers):
            p = "blk.%d." % l
            h = self.rms(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(n, self.n_heads, d), pos)
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(n, self.n_kv, d), pos)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.n_kv, d)
            o = np.empty((n, self.n_heads, d), np.float32)
            for qh in range(self.n_heads):
                kh = qh // (self.n_heads // self.n_kv)
                s = q[:, qh] @ k[:, kh].T / np.float32(np.sqrt(d)) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                o[:, qh] = (s / s.sum(-1, keepdims=True)) @ v[:, kh]
            x = x + o.reshape(n, -1) @ w[p + "attn_output.weight"].T
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
        h = self.rms(x[-1:], w["output_norm.weight"])
        return (h @ w["token_embd.weight"].T)[0]


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    args = ap.parse_args()

    llm = llama_cpp.Llama(model_path=os.path.expanduser(args.model), n_ctx=1024,
                          n_batch=512, n_threads=2, logits_all=True, seed=0,
                          verbose=False)
    command = ("/tmp/refenv/bin/python tests/data/reference/make_reference.py "
               "--model ~/.cache/headway/models/SmolLM2-135M-Instruct.Q4_1.gguf")

    f32 = F32Reference(os.path.expanduser(args.model))
    cases = []
    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-last, kind="stable")[:NUM_TOP_LOGITS]
        f32_last = f32.last_logits(ids)
        f32_top_ids = [int(t) for t in np.argsort(-f32_last, kind="stable")[:NUM_TOP_LOGITS]]
        generated = []
        margins = []  # top-1 minus top-2 logit at each greedy step
        for _ in range(NUM_GENERATED):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            tok = int(np.argmax(logits))
            top2 = np.sort(logits)[-2:]
            margins.append(float(top2[1] - top2[0]))
            generated.append(tok)
            llm.eval([tok])
        cases.append({
            "name": name,
            "text": text,
            "prompt_ids": [int(t) for t in ids],
            "greedy_ids": generated,
            "greedy_margins": margins,
            "greedy_text": llm.detokenize(generated).decode("utf-8", "replace"),
            "last_top_ids": [int(t) for t in order],
            "last_top_logits": [float(last[t]) for t in order],
            "f32_last_top_ids": f32_top_ids,
            "f32_last_top_logits": [float(f32_last[t]) for t in f32_top_ids],
            "last_logsumexp": float(np.log(np.exp(last.astype(np.float64) - last.max()).sum())
                                    + last.max()),
        })
        print(name, len(ids), "prompt tokens ->", repr(cases[-1]["greedy_text"]), file=sys.stderr)

    with open(os.path.join(HERE, "smollm2_greedy.json"), "w") as f:
        json.dump({"made_by": command,
                   "llama_cpp_python": llama_cpp.__version__,
                   "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
                   "cases": cases}, f, indent=1)

    # Perplexity by teacher forcing over the whole passage in one context:
    # NLL of token i+1 given tokens [0, i], averaged over all predicted tokens.
    with open(os.path.join(DATA, "perplexity", "passage.txt"), encoding="utf-8") as f:
        passage = f.read()
    ids = llm.tokenize(passage.encode("utf-8"), add_bos=False, special=False)
    llm.reset()
    llm.eval(ids)
    nll = 0.0
    for i in range(len(ids) - 1):
        lp = log_softmax(np.array(llm.scores[i], dtype=np.float32))
        nll -= lp[ids[i + 1]]
    mean_nll = nll / (len(ids) - 1)
    ppl = math.exp(mean_nll)
    print("passage", len(ids), "tokens, llama.cpp perplexity", ppl, file=sys.stderr)
    with open(os.path.join(DATA, "perplexity", "passage_ids.json"), "w") as f:
        json.dump({"made_by": command,
                   "source": "Lewis Carroll, Alice's Adventures in Wonderland (1865), "
                             "chapter 1, opening paragraphs; public domain",
                   "llama_cpp_python": llama_cpp.__version__,
                   "ids": [int(t) for t in ids],
                   "llama_cpp_mean_nll": mean_nll,
                   "llama_cpp_perplexity": ppl}, f, indent=1)


if __name__ == "__main__":
    main()
