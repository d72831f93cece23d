#!/usr/bin/env python3
"""Whether a sliding-window model's prompts stay reusable after their
requests finish: two identical waves of greedy requests that share a long
prefix, on deploy/configs/gemma3.yaml (15 of 18 layers slide over 512
positions).

  cmake --build build --target headway-launch headway-coordinator headway-worker
  python3 bench/prefix_waves_bench.py

Wave 1 sends --requests completions at once: half diverge right after a
--prefix-tokens prefix, half inside its last block (each with its own
--suffix-tokens tail), --max-tokens each. Wave 2 sends the same requests
again once wave 1 has finished. The prompts are token ids cut from one
English passage (tests/data/perplexity/passage.txt, repeated), so the
prefix is real text. Prints one JSON object: each wave's wall time, the
cached_tokens of every request, the ratio wave 2 / wave 1, and the KV
metrics (retained, recycled, evicted blocks) at the end. With
--no-prefix-caching the same waves run with the prefix cache off (the
baseline for outputs and times); --compare-off runs both and checks that
outputs are equal. Standard library only; reuses recycling_bench.py's
deployment helpers.
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recycling_bench as rb  # noqa: E402

BLOCK = 16


def post(base_url, path, body, timeout=600):
    request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode())


def prompts_of(base_url, model, prefix_tokens, suffix_tokens, requests):
    with open(os.path.join(rb.REPO, "tests/data/perplexity/passage.txt")) as f:
        passage = f.read()
    need = prefix_tokens + suffix_tokens * requests + 64
    text = passage
    ids = []
    while len(ids) < need:
        text += "\n\n" + passage
        ids = post(base_url, "/tokenize", {"model": model, "prompt": text})["tokens"]
    prompts = []
    for i in range(requests):
        shared = prefix_tokens if i % 2 == 0 else prefix_tokens - 5  # inside its last block
        tail_at = prefix_tokens + suffix_tokens * i
        prompts.append(ids[:shared] + ids[tail_at:tail_at + suffix_tokens])
    return prompts


def wave(base_url, model, prompts, max_tokens):
    replies = [None] * len(prompts)

    def one(i):
        replies[i] = post(base_url, "/v1/completions",
                          {"model": model, "prompt": prompts[i], "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.time() - start
    if any(r is None for r in replies):
        raise RuntimeError("a request failed")
    return {
        "seconds": round(seconds, 2),
        "cached_tokens": [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies],
        "texts": [r["choices"][0]["text"] for r in replies],
    }


def run(args, prefix_caching, work_dir):
    config = os.path.join(work_dir, "waves-%s.yaml" % ("on" if prefix_caching else "off"))
    http_port = rb.write_config(os.path.join(rb.REPO, args.config), config, args.kv_memory_mb,
                                True, "kv_head")
    lines = open(config).read().splitlines()
    rb.set_yaml_key(lines, "cache", "enable_prefix_caching", "true" if prefix_caching else "false")
    with open(config, "w") as f:
        f.write("\n".join(lines) + "\n")
    d = rb.Deployment(os.path.join(args.bin_dir, "headway-launch"), config, http_port, args.bin_dir,
                      args.model_dir, config + ".log", args.ready_timeout_s)
    try:
        d.wait_ready(args.ready_timeout_s)
        model = rb.yaml_value(lines, "model", "served_name")
        prompts = prompts_of(d.base_url, model, args.prefix_tokens, args.suffix_tokens,
                             args.requests)
        first = wave(d.base_url, model, prompts, args.max_tokens)
        second = wave(d.base_url, model, prompts, args.max_tokens)
        _, metrics = rb.http_get(d.base_url + "/metrics", timeout=10)
        return {
            "prefix_caching": prefix_caching,
            "prompt_tokens": [len(p) for p in prompts],
            "wave1": first,
            "wave2": second,
            "wave2_over_wave1": round(second["seconds"] / first["seconds"], 3),
            "kv_retained_blocks": rb.metric_sum(metrics, "headway:kv_cache_retained_blocks"),
            "kv_blocks_recycled": rb.metric_sum(metrics, "headway:kv_blocks_recycled_total"),
            "kv_blocks_evicted": rb.metric_sum(metrics, "headway:kv_blocks_evicted_total"),
        }
    finally:
        d.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="deploy/configs/gemma3.yaml")
    p.add_argument("--bin-dir", default=os.path.join(rb.REPO, "build/bin"))
    p.add_argument("--model-dir", default=os.environ.get("HEADWAY_MODEL_DIR", ""))
    p.add_argument("--kv-memory-mb", type=int, default=512)
    p.add_argument("--prefix-tokens", type=int, default=1200)
    p.add_argument("--suffix-tokens", type=int, default=24)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--ready-timeout-s", type=int, default=300)
    p.add_argument("--compare-off", action="store_true",
                   help="also run with the prefix cache off and compare outputs")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="headway-waves-") as work_dir:
        result = {"on": run(args, True, work_dir)}
        if args.compare_off:
            result["off"] = run(args, False, work_dir)
            result["outputs_equal_off"] = (
                result["on"]["wave1"]["texts"] == result["off"]["wave1"]["texts"] and
                result["on"]["wave2"]["texts"] == result["off"]["wave1"]["texts"])
    for variant in ("on", "off"):
        for w in ("wave1", "wave2"):
            if variant in result:
                result[variant][w].pop("texts")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
