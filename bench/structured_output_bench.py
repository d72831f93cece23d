#!/usr/bin/env python3
"""What structured output costs in decode: time per output token (TPOT)
with a JSON schema against the same requests unconstrained, at concurrency
1 and 8, against a running deployment (docs/structured-output.md).

  build/bin/headway-launch deploy/configs/local.yaml &
  python3 bench/structured_output_bench.py --url http://127.0.0.1:8000

Each request is streamed with usage; its TPOT is (last chunk - first chunk)
/ (completion tokens - 1). A round sends `concurrency` constrained requests
at once (a nested schema with arrays and enums, temperature 1), then as many
unconstrained ones with `ignore_eos`, each as long as one constrained
answer, so both decode as many tokens in batches of the same sizes. Rounds
alternate the two kinds, and the constrained requests use a fresh schema
each round, so grammar compilation and the masks of new states are in the
figure (`--same-schema`: one schema throughout). Prints JSON: per concurrency the
median TPOT of each kind and their ratio. A benchmark, not a test: CI does
not run it.
"""
import argparse
import concurrent.futures
import json
import statistics
import time
import urllib.request

PROMPT = [{"role": "user", "content": "List three orders of a shop as JSON."}]


def schema(round_index):
    # maxLength varies per round: a new grammar to compile each time.
    return {"type": "object", "properties": {
        "orders": {"type": "array", "minItems": 3, "maxItems": 3, "items": {
            "type": "object", "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 99999},
                "customer": {"type": "string", "maxLength": 30 + round_index},
                "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
                "total": {"type": "number", "minimum": 0, "maximum": 10000},
                "items": {"type": "array", "maxItems": 4,
                          "items": {"type": "string", "maxLength": 12}}},
            "required": ["id", "customer", "status", "total", "items"]}}},
        "required": ["orders"]}


def stream(url, body):
    """(TPOT seconds, completion tokens) of one streamed chat request."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    first = last = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                last = time.monotonic()
                first = first or last
    if tokens < 2 or first is None or last == first:
        return None, tokens
    return (last - first) / (tokens - 1), tokens


def run_round(url, bodies):
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(lambda b: stream(url, b), bodies))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--same-schema", action="store_true",
                   help="send one schema in every round (compiled and its masks kept after "
                        "the first), as clients that repeat a schema do")
    args = p.parse_args()
    out = {"rounds": args.rounds, "same_schema": args.same_schema, "concurrency": {}}
    for c in [int(x) for x in args.concurrency.split(",")]:
        tpot = {"json_schema": [], "plain": []}
        lengths = []
        for r in range(args.rounds):
            constrained = {"messages": PROMPT, "temperature": 1.0, "max_tokens": 400,
                           "response_format": {"type": "json_schema", "json_schema": {
                               "name": "orders", "schema": schema(0 if args.same_schema else r)}}}
            results = run_round(args.url, [constrained] * c)
            tpot["json_schema"] += [t for t, _ in results if t is not None]
            lengths += [n for _, n in results]
            # Each plain request decodes as many tokens as one constrained
            # answer did, so the batch shrinks the same way as answers end.
            plain = [{"messages": PROMPT, "temperature": 1.0, "ignore_eos": True,
                      "max_tokens": max(2, n)} for _, n in results]
            tpot["plain"] += [t for t, _ in run_round(args.url, plain) if t is not None]
        medians = {k: statistics.median(v) for k, v in tpot.items()}
        out["concurrency"][str(c)] = {
            "median_tpot_ms": {k: round(v * 1000, 2) for k, v in medians.items()},
            "requests": {k: len(v) for k, v in tpot.items()},
            "median_output_tokens": statistics.median(lengths),
            "ratio_json_schema_to_plain": round(medians["json_schema"] / medians["plain"], 3)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
