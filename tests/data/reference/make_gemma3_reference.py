#!/usr/bin/env python3
"""Makes the reference data the Gemma 3 270M model tests compare against.

Run once (tests never run Python):

  /tmp/lcpenv/bin/python tests/data/reference/make_gemma3_reference.py \
      --model ~/.cache/headway/models/gemma-3-270m-q4_k_m.gguf

with llama-cpp-python 0.3.36 (PyPI; builds llama.cpp from source), `gguf`
and numpy in the venv. Writes tests/data/reference/gemma3_greedy.json:
prompts, their token ids (llama.cpp's SentencePiece tokenizer, BOS first, as
the file's add_bos_token asks), llama.cpp's greedy continuation, and the top
logits of each prompt's last position from llama.cpp and from the numpy f32
forward pass below ("f32_last_top_*": Headway's arithmetic, for a tight check).

The numpy pass follows llama.cpp's llm_build_gemma3_iswa and Hugging Face's
Gemma3TextModel: embeddings * sqrt(hidden); per layer RMSNorm, Q/K/V, per-head
RMSNorm of Q and K, NeoX RoPE (base 10,000 on sliding layers, 1,000,000 on
every 6th), attention scaled by 1/sqrt(head_dim) with a 512-position window on
sliding layers, post-attention RMSNorm, residual; RMSNorm, GELU-tanh gated MLP,
post-MLP RMSNorm, residual; final RMSNorm and the tied embedding as LM head.
"""

import argparse
import json
import os
import sys

import gguf
import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))

PROMPTS = [
    ("capital", "The capital of France is"),
    ("counting", "One, two, three, four, five,"),
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
]
# Past the 512-position window, so the sliding layers' masks matter: the
# perplexity passage three times over (about 870 tokens).
PASSAGE = os.path.join(os.path.dirname(HERE), "perplexity", "passage.txt")
NUM_GENERATED = 32
NUM_TOP_LOGITS = 100
SWA_PATTERN = 6
SLIDING_ROPE_BASE = 10000.0


class F32Reference:
    def __init__(self, path):
        from gguf.quants import dequantize
        reader = gguf.GGUFReader(path)
        self.w = {}
        for t in reader.tensors:
            shape = [int(x) for x in reversed(t.shape)]  # ne {n_in, n_out} -> [n_out, n_in]
            self.w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        f = reader.fields
        get = lambda k: f[k].contents()
        self.n_layers = int(get("gemma3.block_count"))
        self.n_heads = int(get("gemma3.attention.head_count"))
        self.n_kv = int(get("gemma3.attention.head_count_kv"))
        self.hidden = int(get("gemma3.embedding_length"))
        self.head_dim = int(get("gemma3.attention.key_length"))
        self.eps = float(get("gemma3.attention.layer_norm_rms_epsilon"))
        self.base = float(get("gemma3.rope.freq_base"))
        self.window = int(get("gemma3.attention.sliding_window"))

    def rms(self, x, w):
        x64 = x.astype(np.float64)
        return (x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + self.eps)).astype(np.float32) * w

    def rope(self, x, pos, base):
        # NeoX halves: pair (x[i], x[i + d/2]) turns by pos * base^(-2i/d).
        d = self.head_dim
        theta = pos[:, None] * base ** (-2.0 * np.arange(d // 2) / d)
        c = np.cos(theta)[:, None, :].astype(np.float32)
        s = np.sin(theta)[:, None, :].astype(np.float32)
        x0, x1 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)

    def last_logits(self, ids):
        w, n, d = self.w, len(ids), self.head_dim
        x = w["token_embd.weight"][np.array(ids)] * np.float32(np.sqrt(self.hidden))
        pos = np.arange(n, dtype=np.float64)
        qp, kp = np.arange(n)[:, None], np.arange(n)[None, :]
        for l in range(self.n_layers):
            p = "blk.%d." % l
            sliding = l % SWA_PATTERN != SWA_PATTERN - 1
            base = SLIDING_ROPE_BASE if sliding else self.base
            visible = kp <= qp
            if sliding:
                visible &= kp > qp - self.window
            mask = np.where(visible, 0.0, -np.inf).astype(np.float32)
            h = self.rms(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(n, self.n_heads, d)
            k = (h @ w[p + "attn_k.weight"].T).reshape(n, self.n_kv, d)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.n_kv, d)
            q = self.rope(self.rms(q, w[p + "attn_q_norm.weight"]), pos, base)
            k = self.rope(self.rms(k, w[p + "attn_k_norm.weight"]), pos, base)
            o = np.empty((n, self.n_heads, d), np.float32)
            for qh in range(self.n_heads):
                kh = qh // (self.n_heads // self.n_kv)
                s = q[:, qh] @ k[:, kh].T / np.float32(np.sqrt(d)) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                o[:, qh] = (s / s.sum(-1, keepdims=True)) @ v[:, kh]
            a = o.reshape(n, -1) @ w[p + "attn_output.weight"].T
            x = x + self.rms(a, w[p + "post_attention_norm.weight"])
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            gelu = 0.5 * g * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (g + 0.044715 * g ** 3)))
            m = (gelu * u) @ w[p + "ffn_down.weight"].T
            x = x + self.rms(m, w[p + "post_ffw_norm.weight"])
        h = self.rms(x[-1:], w["output_norm.weight"])
        return (h @ w["token_embd.weight"].T)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    path = os.path.expanduser(args.model)

    llm = llama_cpp.Llama(model_path=path, n_ctx=2048, n_batch=512, n_threads=2,
                          logits_all=True, seed=0, verbose=False)
    command = ("/tmp/lcpenv/bin/python tests/data/reference/make_gemma3_reference.py "
               "--model ~/.cache/headway/models/gemma-3-270m-q4_k_m.gguf")
    f32 = F32Reference(path)
    with open(PASSAGE, encoding="utf-8") as f:
        passage = f.read()
    cases = []
    for name, text in PROMPTS + [("long_passage", (passage + "\n\n") * 3)]:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-last, kind="stable")[:NUM_TOP_LOGITS]
        f32_last = f32.last_logits(ids)
        f32_top_ids = [int(t) for t in np.argsort(-f32_last, kind="stable")[:NUM_TOP_LOGITS]]
        generated, margins = [], []
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
        })
        print(name, len(ids), "prompt tokens ->", repr(cases[-1]["greedy_text"]), file=sys.stderr)

    with open(os.path.join(HERE, "gemma3_greedy.json"), "w") as f:
        json.dump({"made_by": command,
                   "llama_cpp_python": llama_cpp.__version__,
                   "model": "gemma-3-270m-q4_k_m.gguf",
                   "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
