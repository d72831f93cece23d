#!/usr/bin/env python3
"""Routing policies on multi-turn conversations: the same chat workload on
a multi-instance deployment under each routing policy, and on one instance
holding all their KV memory (the placement oracle for the prefix hit rate).

  cmake --build build --target headway-launch headway-coordinator headway-worker headway-node
  python3 bench/conversation_bench.py                  # deploy/configs/two-mixed.yaml
  python3 bench/conversation_bench.py --config deploy/configs/pd-2p2d.yaml

Workload (fixed by --seed): --sessions conversations of --turns turns each,
all opening with one --system-tokens system prompt. Turn t's prompt is turn
t-1's prompt, then turn t-1's answer, then a new --user-tokens user message
(ChatML markers around text cut from tests/data/perplexity/passage.txt, a
"Question S.T:" line first so that no two sessions share more than the
system prompt). Prompts are token ids, so each turn's prompt starts with
exactly the tokens of the previous turn and its answer: the answer's ids come
from the streamed log-probability tokens, mapped back to ids through the
model's own vocabulary (read from its GGUF); an answer whose tokens cannot be
mapped exactly (a token that is not valid UTF-8 on its own) is tokenized
from its text instead and counted in `answers_retokenized`. Requests are
greedy, --max-tokens each with ignore_eos, streamed. --concurrency sessions
are in flight at once, as chat clients: each sends its next turn when its
previous answer has ended and a think time (uniform in [0, 2 x
--think-time-s]) has passed; a finished session's place goes to the next.

Runs: for each policy in --policies a fresh deployment of a copy of
--config with free ports and `routing.policy` set; then `oracle`: the same
config with one mixed instance in place of the pools, with the KV memory and
compute threads of all the instances that serve the turns (the mixed
instances, or a disaggregated config's decode instances).

Prints progress to stderr and one JSON object to stdout: per run the prefix
hit rate (sum of usage.prompt_tokens_details.cached_tokens over sum of
usage.prompt_tokens, per turn too, and headway:prefix_cache_hits_total over
headway:prefix_cache_queries_total, per role), TTFT median and p99 (first
streamed token), output throughput (output tokens over the workload's wall
time), per instance the requests finished (headway:request_success_total),
requests first scheduled (headway:request_queue_time_seconds_count: a
disaggregated request counts on its prefill instance), prompt tokens and
prefix-cache counters, and KV bytes moved between instances per turn
(headway:kv_transfer_bytes_total over the requests); then `ratios`
(prefix_aware / least_loaded for TTFT median and throughput, each policy /
oracle for the hit rates) and `outputs` (every run's answers against the
first run's: greedy, so they must be equal). Exit status: 0; 1 when a
deployment failed, a request failed or outputs differ (the JSON is printed
when the runs finished); 130 on Ctrl-C or SIGTERM (deployments are stopped
first). Standard library only; reuses recycling_bench.py's deployment
helpers.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recycling_bench as rb  # noqa: E402

POLICIES = ("least_loaded", "prefix_aware", "round_robin")


def log(message):
    print("[conversation_bench] " + message, file=sys.stderr, flush=True)


# ---- the model's vocabulary: streamed token strings back to token ids ------

# GGUF metadata value types (gguf spec, ggml/docs/gguf.md): scalar formats.
GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9
# llama.cpp token types whose text is their bytes (Headway's IsVerbatim):
# unknown, control, user-defined. Others are byte-level BPE text.
VERBATIM_TYPES = (2, 3, 4)


def byte_level_decoder():
    """GPT-2's bytes_to_unicode, inverted: the code point that stands for each
    byte in a byte-level BPE vocabulary -> that byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    code_points = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            code_points.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, code_points)}


class Vocabulary:
    """Token bytes -> id for a byte-level BPE GGUF (SmolLM2's `gpt2` model).
    Reads only the metadata (tokenizer.ggml.tokens, tokenizer.ggml.token_type)."""

    def __init__(self, gguf_path):
        tokens, types = self._read(gguf_path)
        decoder = byte_level_decoder()
        self.id_of = {}
        self.ambiguous = set()
        for i, (text, kind) in enumerate(zip(tokens, types)):
            if kind in VERBATIM_TYPES:
                raw = text.encode("utf-8")
            else:
                raw = b"".join(bytes([decoder[c]]) if c in decoder else c.encode("utf-8")
                               for c in text)
            if raw in self.id_of:
                self.ambiguous.add(raw)
            else:
                self.id_of[raw] = i

    @staticmethod
    def _read(path):
        with open(path, "rb") as f:
            def scalar(fmt):
                return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

            def string():
                return f.read(scalar("<Q"))

            def value(kind, keep):
                if kind == GGUF_STRING:
                    s = string()
                    return s.decode("utf-8") if keep else None
                if kind == GGUF_ARRAY:
                    item, n = scalar("<I"), scalar("<Q")
                    if not keep and item in GGUF_SCALARS:
                        f.seek(n * struct.calcsize(GGUF_SCALARS[item]), 1)
                        return None
                    return [value(item, keep) for _ in range(n)]
                if kind not in GGUF_SCALARS:
                    raise ValueError("%s: unknown GGUF value type %d" % (path, kind))
                return scalar(GGUF_SCALARS[kind])

            if f.read(4) != b"GGUF":
                raise ValueError("%s is not a GGUF file" % path)
            if scalar("<I") < 2:
                raise ValueError("%s: GGUF version 1 is not supported" % path)
            scalar("<Q")  # tensor count
            found = {}
            wanted = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")
            for _ in range(scalar("<Q")):
                key = string().decode("utf-8")
                found[key] = value(scalar("<I"), key in wanted)
                if all(k in found for k in wanted):
                    return found[wanted[0]], found[wanted[1]]
        raise ValueError("%s has no %s" % (path, " and ".join(wanted)))

    def ids(self, token_strings):
        """The ids of streamed token strings, or None when any of them cannot
        be mapped exactly (U+FFFD: bytes the server's JSON replaced)."""
        out = []
        for s in token_strings:
            raw = s.encode("utf-8")
            if "\ufffd" in s or raw in self.ambiguous or raw not in self.id_of:
                return None
            out.append(self.id_of[raw])
        return out


# ---- HTTP ---------------------------------------------------------------------

def post_json(base_url, path, body, timeout):
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read().decode("utf-8", "replace")
        if response.status != 200:
            raise RuntimeError("POST %s: HTTP %d: %s" % (path, response.status, data[:300]))
        return json.loads(data)
    finally:
        conn.close()


def stream_completion(base_url, model, prompt_ids, max_tokens, timeout):
    """One greedy streamed completion of a token-id prompt. Returns its TTFT
    (to the first chunk carrying a token), end-to-end time, token strings,
    text and usage."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "logprobs": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    start = time.time()
    ttft = None
    tokens, text, usage, done = [], [], None, False
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError("HTTP %d: %s" % (response.status,
                                                response.read().decode("utf-8", "replace")[:300]))
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError("error event: %s" % json.dumps(chunk["error"])[:300])
            for choice in chunk.get("choices") or []:
                got = (choice.get("logprobs") or {}).get("tokens") or []
                if got and ttft is None:
                    ttft = time.time() - start
                tokens.extend(got)
                text.append(choice.get("text") or "")
            if chunk.get("usage"):
                usage = chunk["usage"]
    finally:
        conn.close()
    if not done or usage is None or ttft is None:
        raise RuntimeError("the stream ended without %s" % (
            "[DONE]" if not done else "a usage chunk" if usage is None else "a token"))
    return {"ttft_s": ttft, "e2e_s": time.time() - start, "tokens": tokens, "text": "".join(text),
            "usage": usage}


# ---- the workload ---------------------------------------------------------------

def tokenize(base_url, model, text):
    return post_json(base_url, "/tokenize", {"model": model, "prompt": text,
                                             "add_special_tokens": False}, 60)["tokens"]


def build_workload(base_url, model, args):
    """The system prompt's ids and every (session, turn)'s user message ids,
    each exactly --system-tokens / --user-tokens long. Deterministic: the
    same server tokenizer gives the same ids in every run."""
    with open(os.path.join(rb.REPO, "tests/data/perplexity/passage.txt")) as f:
        passage = f.read().strip()
    need = args.system_tokens + args.sessions * args.turns * args.user_tokens
    text, body = passage, tokenize(base_url, model, passage)
    while len(body) < need:
        text += "\n\n" + passage
        body = tokenize(base_url, model, text)
    rng = random.Random(args.seed)
    system_head = tokenize(base_url, model, "<|im_start|>system\n")
    system_tail = tokenize(base_url, model, "<|im_end|>\n")
    n = args.system_tokens - len(system_head) - len(system_tail)
    if n < 1:
        raise ValueError("--system-tokens %d leaves no room for text" % args.system_tokens)
    system = system_head + body[:n] + system_tail
    users = []
    for s in range(args.sessions):
        turns = []
        for t in range(args.turns):
            # Turn 1 follows the system prompt; a later turn follows an answer,
            # which it closes.
            head = tokenize(base_url, model, ("" if t == 0 else "<|im_end|>\n") +
                            "<|im_start|>user\nQuestion %d.%d:" % (s + 1, t + 1))
            tail = tokenize(base_url, model, "<|im_end|>\n<|im_start|>assistant\n")
            n = args.user_tokens - len(head) - len(tail)
            if n < 1:
                raise ValueError("--user-tokens %d leaves no room for text" % args.user_tokens)
            at = rng.randrange(0, len(body) - n)
            turns.append(head + body[at:at + n] + tail)
        users.append(turns)
    return {"system": system, "users": users,
            "think_s": [[rng.uniform(0, 2 * args.think_time_s) for _ in range(args.turns)]
                        for _ in range(args.sessions)]}


def run_sessions(base_url, model, workload, vocab, args):
    """Every session's turns, --concurrency sessions at a time. Returns the
    per-request records (session, turn order) and the workload's wall time."""
    records = {}
    pending = list(range(args.sessions))
    lock = threading.Lock()
    failures = []
    done = [0]

    def session(s):
        history = list(workload["system"])
        for t in range(args.turns):
            time.sleep(workload["think_s"][s][t])
            prompt = history + workload["users"][s][t]
            try:
                r = stream_completion(base_url, model, prompt, args.max_tokens,
                                      args.request_timeout_s)
                ids = vocab.ids(r["tokens"])
                exact = ids is not None
                if not exact:
                    ids = tokenize(base_url, model, r["text"])
            except (RuntimeError, OSError, ValueError) as e:
                with lock:
                    failures.append("session %d turn %d: %s" % (s + 1, t + 1, e))
                return  # the conversation cannot go on without its answer
            usage = r["usage"]
            with lock:
                records[(s, t)] = {
                    "prompt_tokens": usage["prompt_tokens"],
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens", 0),
                    "completion_tokens": usage["completion_tokens"],
                    "ttft_s": r["ttft_s"], "e2e_s": r["e2e_s"], "text": r["text"],
                    "ids": ids, "ids_exact": exact,
                }
            history = prompt + ids

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                s = pending.pop(0)
            session(s)
            with lock:
                done[0] += 1
                log("  session %d ended (%d of %d), %.0f s" % (s + 1, done[0], args.sessions,
                                                              time.time() - start))

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(min(args.concurrency, args.sessions))]
    start = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records, time.time() - start, failures


# ---- /metrics ---------------------------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(base_url):
    """/metrics as {name: [(labels, value)]}."""
    _, text = rb.http_get(base_url + "/metrics", timeout=30)
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            out.setdefault(m.group(1), []).append(
                (dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def by_instance(metrics, name):
    out = {}
    for labels, v in metrics.get(name, []):
        key = labels.get("instance", "")
        out[key] = out.get(key, 0.0) + v
    return out


def total(metrics, name):
    return sum(v for _, v in metrics.get(name, []))


# ---- configs -----------------------------------------------------------------------

def section_bounds(lines, name):
    """[start, end) of top-level section `name` in block-style YAML lines, or None."""
    header = re.compile(r"^%s:\s*(#.*)?$" % re.escape(name))
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return None
    end = start + 1
    while end < len(lines) and (lines[end].strip() == "" or lines[end][:1] in (" ", "\t", "#")):
        end += 1
    return start, end


def drop_section(lines, name):
    bounds = section_bounds(lines, name)
    if bounds:
        del lines[bounds[0]:bounds[1]]


def write_config(args, out_path, policy=None, oracle=None):
    """A copy of --config with free ports; with `policy`, routing.policy (and
    --prefix-weight) set; with `oracle` ({kv_memory_mb, num_threads}), one
    mixed instance instead of the pools. Returns the HTTP port."""
    with open(args.config) as f:
        lines = f.read().splitlines()
    http_port, control_port = rb.free_ports(2)
    rb.set_yaml_key(lines, "coordinator", "http_port", str(http_port))
    rb.set_yaml_key(lines, "coordinator", "control_address", "tcp://127.0.0.1:%d" % control_port)
    if args.kv_memory_mb is not None:
        rb.set_yaml_key(lines, "cache", "kv_memory_mb", str(args.kv_memory_mb))
    pattern = rb.yaml_value(lines, "model", "head_pattern")
    if pattern and not os.path.isabs(pattern):
        absolute = os.path.join(os.path.dirname(args.config), pattern)
        rb.set_yaml_key(lines, "model", "head_pattern", json.dumps(absolute))
    if policy is not None:
        rb.set_yaml_key(lines, "routing", "policy", policy)
        if args.prefix_weight is not None:
            rb.set_yaml_key(lines, "routing", "prefix_weight", str(args.prefix_weight))
        if args.balance_abs_threshold is not None:
            rb.set_yaml_key(lines, "routing", "balance_abs_threshold",
                            str(args.balance_abs_threshold))
        if args.balance_rel_threshold is not None:
            rb.set_yaml_key(lines, "routing", "balance_rel_threshold",
                            str(args.balance_rel_threshold))
    if oracle is not None:
        for name in ("routing", "kv_transfer", "pools"):
            drop_section(lines, name)
        rb.set_yaml_key(lines, "cache", "kv_memory_mb", str(oracle["kv_memory_mb"]))
        lines += ["pools:", "  - name: main", "    role: mixed", "    instances:",
                  "      - tp_size: 1", "        device: cpu", "        hosts: [127.0.0.1]",
                  "        num_threads: %d" % oracle["num_threads"]]
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return http_port


def serving_role(instances):
    roles = {i["role"] for i in instances}
    return "decode" if "decode" in roles else "mixed"


def oracle_shape(args, instances):
    """One instance with the KV memory and threads of every serving instance."""
    with open(args.config) as f:
        lines = f.read().splitlines()
    per_worker = args.kv_memory_mb or int(rb.yaml_value(lines, "cache", "kv_memory_mb") or 256)
    role = serving_role(instances)
    serving = [i for i in instances if i["role"] == role]
    workers = sum(i["tp_size"] for i in serving)
    threads = [int(t) for t in re.findall(r"num_threads:\s*(\d+)", "\n".join(lines))]
    per_instance = max(threads) if threads else 0  # 0 = all cores
    return {"kv_memory_mb": per_worker * workers,
            "num_threads": per_instance * len(serving) if per_instance else 0,
            "instances_merged": len(serving), "role_merged": role}


# ---- one run -------------------------------------------------------------------------

def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def ratio(a, b):
    return round(a / b, 4) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b \
        else None


def warm_up(base_url, model, num_instances, seed):
    """Two short requests per instance at once, so that no run's first turns
    pay for page faults in a worker's weights. Distinct random prompts of 40
    tokens: they share no block with the workload."""
    rng = random.Random(seed + 1)
    errors = []

    def one():
        try:
            post_json(base_url, "/v1/completions",
                      {"model": model, "prompt": [rng.randrange(1000, 40000) for _ in range(40)],
                       "max_tokens": 2, "temperature": 0}, 300)
        except (RuntimeError, OSError) as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one) for _ in range(2 * num_instances)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("warm-up request failed: %s" % errors[0])


def launch(args, config_path, http_port, log_path):
    d = rb.Deployment(os.path.join(args.bin_dir, "headway-launch"), config_path, http_port,
                      args.bin_dir, args.model_dir, log_path, args.ready_timeout_s)
    try:
        d.wait_ready(args.ready_timeout_s + 10)
    except RuntimeError:
        d.stop()
        raise
    return d


def run_one(args, name, policy, oracle, workload_cache, vocab, work_dir):
    config_path = os.path.join(work_dir, "%s.yaml" % name)
    log_path = os.path.join(work_dir, "%s-launch.log" % name)
    http_port = write_config(args, config_path, policy, oracle)
    log("%s: starting %s" % (name, config_path))
    d = launch(args, config_path, http_port, log_path)
    try:
        _, health = rb.http_get(d.base_url + "/health", timeout=10)
        instances = json.loads(health)["instances"]
        _, models = rb.http_get(d.base_url + "/v1/models", timeout=10)
        model = json.loads(models)["data"][0]["id"]
        if not workload_cache:
            workload_cache.update(build_workload(d.base_url, model, args))
        workload = workload_cache
        warm_up(d.base_url, model, len(instances), args.seed)
        before = scrape(d.base_url)
        log("%s: ready (%d instances); %d sessions x %d turns, %d at a time"
            % (name, len(instances), args.sessions, args.turns, args.concurrency))
        records, wall, failures = run_sessions(d.base_url, model, workload, vocab, args)
        after = scrape(d.base_url)
        if d.process.poll() is not None:
            raise RuntimeError("the deployment exited during the run; log %s:\n%s"
                               % (d.log_path, d.log_tail()))
    finally:
        d.stop()

    def grown(metric):
        a, b = by_instance(after, metric), by_instance(before, metric)
        return {k: int(round(v - b.get(k, 0.0))) for k, v in a.items()}

    per_instance = []
    series = {"requests": "headway:request_success_total",
              "scheduled": "headway:request_queue_time_seconds_count",
              "prompt_tokens": "headway:prompt_tokens_total",
              "prefix_cache_queries": "headway:prefix_cache_queries_total",
              "prefix_cache_hits": "headway:prefix_cache_hits_total"}
    grown_series = {key: grown(metric) for key, metric in series.items()}
    for i in instances:
        entry = {"instance": i["instance_id"], "role": i["role"]}
        for key in series:
            entry[key] = grown_series[key].get(str(i["instance_id"]), 0)
        per_instance.append(entry)
    hit_rate_by_role = {}
    for role in sorted({i["role"] for i in per_instance}):
        q = sum(i["prefix_cache_queries"] for i in per_instance if i["role"] == role)
        h = sum(i["prefix_cache_hits"] for i in per_instance if i["role"] == role)
        hit_rate_by_role[role] = ratio(h, q)
    queries = sum(i["prefix_cache_queries"] for i in per_instance)
    hits = sum(i["prefix_cache_hits"] for i in per_instance)

    rs = list(records.values())
    prompt_tokens = sum(r["prompt_tokens"] for r in rs)
    cached_tokens = sum(r["cached_tokens"] for r in rs)
    output_tokens = sum(r["completion_tokens"] for r in rs)
    ttfts = [r["ttft_s"] * 1000 for r in rs]
    by_turn = []
    for t in range(args.turns):
        turn = [r for (s, tt), r in records.items() if tt == t]
        by_turn.append(ratio(sum(r["cached_tokens"] for r in turn),
                             sum(r["prompt_tokens"] for r in turn)))
    transfer_bytes = total(after, "headway:kv_transfer_bytes_total") - \
        total(before, "headway:kv_transfer_bytes_total")
    result = {
        "policy": policy,
        "requests": len(rs),
        "failed_requests": len(failures),
        # Turns after a failed one, which its session could not send.
        "requests_not_sent": args.sessions * args.turns - len(rs) - len(failures),
        "failures": failures[:5],
        "wall_s": round(wall, 2),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "hit_rate_usage": ratio(cached_tokens, prompt_tokens),
        "hit_rate_usage_by_turn": by_turn,
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "hit_rate_metrics": ratio(hits, queries),
        "hit_rate_metrics_by_role": hit_rate_by_role,
        "ttft_median_ms": round(statistics.median(ttfts), 1) if ttfts else None,
        "ttft_p99_ms": round(percentile(ttfts, 99), 1) if ttfts else None,
        "e2e_median_ms": round(statistics.median([r["e2e_s"] * 1000 for r in rs]), 1)
        if rs else None,
        "output_tokens": output_tokens,
        "output_throughput": round(output_tokens / wall, 3) if wall > 0 else None,
        "instances": per_instance,
        "kv_transfer_bytes": int(transfer_bytes),
        "kv_transfer_bytes_per_turn": int(transfer_bytes / len(rs)) if rs else None,
        "kv_transfer_blocks": int(total(after, "headway:kv_transfer_blocks_total") -
                                  total(before, "headway:kv_transfer_blocks_total")),
        "kv_transfer_fallbacks": int(total(after, "headway:kv_transfer_fallbacks_total") -
                                     total(before, "headway:kv_transfer_fallbacks_total")),
        "answers_retokenized": sum(1 for r in rs if not r["ids_exact"]),
    }
    if oracle:
        result["oracle"] = oracle
    log("%s: %d requests in %.1f s; hit rate %s (usage), %s (metrics); TTFT median %s ms; "
        "%s tok/s; requests per instance %s"
        % (name, len(rs), wall, result["hit_rate_usage"], result["hit_rate_metrics"],
           result["ttft_median_ms"], result["output_throughput"],
           [i["requests"] for i in per_instance]))
    return result, records, instances


def compare_outputs(reference_name, reference, runs):
    """Each run's answers against the reference run's, per (session, turn).
    A session's first difference changes its later prompts, so only the
    first one per session is listed."""
    mismatches = []
    for name, records in runs.items():
        if name == reference_name:
            continue
        seen = set()
        for key in sorted(reference):
            s, t = key
            if s in seen or key not in records:
                continue
            ref, got = reference[key], records[key]
            a, b = ref["ids"], got["ids"]
            # A retokenized answer's ids may differ where its text does not.
            if ref["text"] != got["text"] or (ref["ids_exact"] and got["ids_exact"] and a != b):
                seen.add(s)
                first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                             min(len(a), len(b)))
                mismatches.append({"run": name, "session": s + 1, "turn": t + 1,
                                   "first_differing_token": first,
                                   "reference_text": reference[key]["text"],
                                   "text": records[key]["text"]})
    return mismatches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="deploy/configs/two-mixed.yaml",
                        help="the multi-instance deployment (copied with free ports)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated routing.policy values, one run each")
    parser.add_argument("--no-oracle", action="store_true", help="leave out the oracle run")
    parser.add_argument("--prefix-weight", type=float, default=None,
                        help="routing.prefix_weight for every policy run (default: the config's)")
    parser.add_argument("--balance-abs-threshold", type=int, default=None,
                        help="routing.balance_abs_threshold for every policy run (default: the "
                        "config's)")
    parser.add_argument("--balance-rel-threshold", type=float, default=None,
                        help="routing.balance_rel_threshold for every policy run (default: the "
                        "config's)")
    parser.add_argument("--kv-memory-mb", type=int, default=None,
                        help="cache.kv_memory_mb per worker (default: the config's)")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8, help="sessions in flight at once")
    parser.add_argument("--system-tokens", type=int, default=192)
    parser.add_argument("--user-tokens", type=int, default=64,
                        help="tokens per user message, ChatML markers included")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--think-time-s", type=float, default=0.25,
                        help="mean pause before each turn (uniform in [0, 2x])")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bin-dir", default="build/bin")
    parser.add_argument("--model-dir", default=None,
                        help="passed to headway-launch; the vocabulary is read from the model "
                             "there (default: $HEADWAY_MODEL_DIR or ~/.cache/headway/models)")
    parser.add_argument("--ready-timeout-s", type=int, default=180)
    parser.add_argument("--request-timeout-s", type=float, default=600)
    parser.add_argument("--work-dir", default=None,
                        help="configs and logs (default: a new temporary directory, kept)")
    args = parser.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in POLICIES:
            parser.error("unknown policy %r (allowed: %s)" % (p, ", ".join(POLICIES)))
    if not policies:
        parser.error("--policies needs at least one policy (the oracle copies its shape)")
    for key in ("sessions", "turns", "concurrency", "system_tokens", "user_tokens",
                "max_tokens"):
        if getattr(args, key) < 1:
            parser.error("--%s must be at least 1" % key.replace("_", "-"))
    if args.think_time_s < 0:
        parser.error("--think-time-s must not be negative")
    args.config = os.path.abspath(args.config)
    args.bin_dir = os.path.abspath(args.bin_dir)
    if not os.access(os.path.join(args.bin_dir, "headway-launch"), os.X_OK):
        parser.error("no headway-launch in %s (build it, or pass --bin-dir)" % args.bin_dir)
    if args.model_dir:
        args.model_dir = os.path.abspath(args.model_dir)
    with open(args.config) as f:
        model_path = rb.yaml_value(f.read().splitlines(), "model", "path")
    model_dir = args.model_dir or os.environ.get("HEADWAY_MODEL_DIR") or os.path.expanduser(
        "~/.cache/headway/models")
    gguf = model_path if os.path.isabs(model_path) else os.path.join(model_dir, model_path)
    try:
        vocab = Vocabulary(gguf)
    except (OSError, ValueError) as e:
        parser.error("cannot read the model's vocabulary: %s" % e)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="headway-conversation-")
    os.makedirs(work_dir, exist_ok=True)
    log("configs and logs go to " + work_dir)

    def on_sigterm(signum, frame):
        raise rb.Interrupted()

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.time()
    output = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "config": os.path.relpath(args.config, rb.REPO),
              "workload": {k: getattr(args, k) for k in (
                  "sessions", "turns", "concurrency", "system_tokens", "user_tokens",
                  "max_tokens", "think_time_s", "seed")},
              "work_dir": work_dir, "runs": {}}
    workload, records, instances = {}, {}, None
    try:
        for policy in policies:
            got = run_one(args, policy, policy, None, workload, vocab, work_dir)
            if isinstance(got, dict):
                output["runs"][policy] = got
                continue
            output["runs"][policy], records[policy], instances = got
        if not args.no_oracle:
            if instances is None:
                raise RuntimeError("no policy run started, so the oracle has no shape to copy")
            shape = oracle_shape(args, instances)
            output["runs"]["oracle"], records["oracle"], _ = run_one(
                args, "oracle", None, shape, workload, vocab, work_dir)
    except (KeyboardInterrupt, rb.Interrupted):
        log("interrupted; deployments stopped")
        return 130
    except (RuntimeError, OSError, ValueError) as e:
        log("failed: %s" % e)
        return 1

    runs = output["runs"]
    pa, ll, oracle = runs.get("prefix_aware", {}), runs.get("least_loaded", {}), \
        runs.get("oracle", {})
    output["ratios"] = {
        "prefix_aware_over_least_loaded": {
            "ttft_median": ratio(pa.get("ttft_median_ms"), ll.get("ttft_median_ms")),
            "output_throughput": ratio(pa.get("output_throughput"),
                                       ll.get("output_throughput"))},
        "prefix_aware_over_oracle": {
            "hit_rate_usage": ratio(pa.get("hit_rate_usage"), oracle.get("hit_rate_usage")),
            "hit_rate_metrics": ratio(pa.get("hit_rate_metrics"),
                                      oracle.get("hit_rate_metrics"))},
        "hit_rate_usage_over_oracle": {
            name: ratio(r.get("hit_rate_usage"), oracle.get("hit_rate_usage"))
            for name, r in runs.items() if name != "oracle"},
    }
    reference = next(iter(records)) if records else None
    mismatches = compare_outputs(reference, records[reference], records) if reference else []
    output["outputs"] = {"reference": reference, "compared": [n for n in records if n != reference],
                         "identical": not mismatches, "mismatches": mismatches[:10],
                         "num_mismatched_sessions": len(mismatches)}
    output["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(output, indent=1))
    failed = sum(r.get("failed_requests", 0) for r in runs.values())
    if failed:
        log("%d requests failed" % failed)
    if mismatches:
        log("outputs differ between runs in %d sessions" % len(mismatches))
    return 1 if failed or mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
