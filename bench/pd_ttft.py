#!/usr/bin/env python3
"""TTFT of long prompts on a disaggregated deployment, split into prefill,
KV transfer and first decode step, from the server's own metrics
(headway:pd_prefill_seconds, headway:kv_transfer_seconds,
headway:pd_first_decode_seconds, headway:time_to_first_token_seconds).

  build/bin/headway-launch deploy/configs/pd.yaml &
  python3 bench/pd_ttft.py --base-url http://127.0.0.1:8000 --prompt-tokens 2040 --runs 3

Sends --runs requests one at a time (distinct random token-id prompts, so
nothing hits a prefix cache, max_tokens 1) and prints one JSON object with
the per-run split and medians; transfer_share_of_ttft = transfer / TTFT.
Standard library only.
"""
import argparse
import json
import random
import statistics
import time
import urllib.request

SERIES = {
    "ttft_s": "headway:time_to_first_token_seconds_sum",
    "prefill_s": "headway:pd_prefill_seconds_sum",
    "transfer_s": "headway:kv_transfer_seconds_sum",
    "first_decode_s": "headway:pd_first_decode_seconds_sum",
    "transfer_bytes": "headway:kv_transfer_bytes_total",
    "transfer_blocks": "headway:kv_transfer_blocks_total",
}


def scrape(base_url):
    text = urllib.request.urlopen(base_url + "/metrics", timeout=30).read().decode()
    out = {}
    for key, name in SERIES.items():
        out[key] = sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith(name + "{") or line.startswith(name + " "))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompt-tokens", type=int, default=2040)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    runs = []
    for _ in range(args.runs):
        prompt = [rng.randrange(100, 40000) for _ in range(args.prompt_tokens)]
        before = scrape(args.base_url)
        body = json.dumps({"model": args.model, "prompt": prompt, "max_tokens": 1,
                           "temperature": 0}).encode()
        request = urllib.request.Request(args.base_url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        start = time.time()
        urllib.request.urlopen(request, timeout=600).read()
        wall = time.time() - start
        after = scrape(args.base_url)
        run = {key: after[key] - before[key] for key in SERIES}
        run["request_wall_s"] = wall
        run["transfer_share_of_ttft"] = run["transfer_s"] / run["ttft_s"] if run["ttft_s"] else None
        runs.append(run)
    medians = {key: statistics.median(r[key] for r in runs)
               for key in runs[0] if runs[0][key] is not None}
    print(json.dumps({"prompt_tokens": args.prompt_tokens, "runs": runs, "median": medians},
                     indent=1))


if __name__ == "__main__":
    main()
