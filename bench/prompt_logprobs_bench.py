#!/usr/bin/env python3
"""What prompt logprobs cost: the latency of one long prompt with
max_tokens 1, plain, with vLLM's prompt_logprobs, and with echo + logprobs,
against a running deployment (docs/prompt-logprobs.md).

  build/bin/headway-launch deploy/configs/local.yaml &
  python3 bench/prompt_logprobs_bench.py --url http://127.0.0.1:8000

Each round sends the three kinds in turn, each with a prompt no earlier
request shared (a plain request would otherwise hit the prefix cache), and
prints JSON: per kind the median seconds, and its ratio to plain's median.
A benchmark, not a test: CI does not run it.
"""
import argparse
import json
import statistics
import time
import urllib.request

KINDS = {
    "plain": {},
    "prompt_logprobs_5": {"prompt_logprobs": 5},
    "echo_logprobs_1": {"echo": True, "logprobs": 1},
}


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    seconds = {kind: [] for kind in KINDS}
    for r in range(args.rounds):
        for kind, extra in KINDS.items():
            text = "round %d %s " % (r, kind) + "the quick brown fox jumps over the lazy dog " * (
                args.prompt_tokens // 8)
            ids = post(args.url, "/tokenize", {"prompt": text})["tokens"][:args.prompt_tokens]
            body = dict({"prompt": ids, "max_tokens": 1, "temperature": 0}, **extra)
            start = time.monotonic()
            post(args.url, "/v1/completions", body)
            seconds[kind].append(time.monotonic() - start)
    plain = statistics.median(seconds["plain"])
    out = {"prompt_tokens": args.prompt_tokens, "rounds": args.rounds, "kinds": {}}
    for kind, values in seconds.items():
        median = statistics.median(values)
        out["kinds"][kind] = {"median_s": round(median, 3), "all_s": [round(v, 3) for v in values],
                              "ratio_to_plain": round(median / plain, 2)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
