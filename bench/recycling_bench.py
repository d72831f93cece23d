#!/usr/bin/env python3
"""What sliding-window KV block recycling buys: the same fixed workload on a
deployment with cache.enable_recycling off (the baseline) and on, at equal KV
memory, measured.

  cmake --build build --target headway-launch headway-coordinator headway-worker headway-bench
  python3 bench/recycling_bench.py --workload both

For each variant it writes a copy of the workload's base config with the
given cache.kv_memory_mb, cache.enable_recycling and
cache.recycling_granularity and free ports, starts `headway-launch` on it,
waits for /health, runs `headway-bench` (every request sent at once,
--ignore-eos, --max-concurrency = --num-prompts, fixed lengths and seed),
samples GET /metrics every --sample-interval-s for
headway:num_requests_running (peak and time-weighted mean over the run),
reads headway:num_preemptions_total and headway:kv_blocks_recycled_total
(their growth over the run), and stops the deployment. Latencies and
throughput come from headway-bench's result JSON.

Workloads (defaults chosen so that a run of both takes about 15-20 minutes
on a 2-core CPU):
  gemma3   deploy/configs/gemma3.yaml (15 of 18 layers slide over 512
           positions); variants off, kv_head; 7 prompts of 3,968 + 128
           tokens (4,096 positions each) in 296 MiB, where 2 sequences at
           full context fit without recycling and 7 with it.
  smollm2  deploy/configs/smollm2-streaming.yaml (one KV head in 3 per layer
           streams: sink 64, window 256); variants off, layer, kv_head;
           6 prompts of 1,920 + 128 tokens (2,048 positions) in 200 MiB,
           where 2 fit without recycling and 3 with it. At `layer`
           granularity no SmolLM2 layer recycles (each has full heads), as
           in an engine with one block table per layer.
  gemma3-dtypes  gemma3.yaml in 296 MiB again, with recycling and smaller
           KV cache dtypes: variants off and kv_head (float32),
           f16_q8sliding (cache.kv_cache_dtype float16,
           cache.kv_cache_dtype_sliding q8_0) and q8_0; 24 prompts of
           3,968 + 32 tokens. Not part of `both`.
--variants a,b,... runs only those variants of the workload, the first as
the baseline.

Prints progress to stderr and one JSON object to stdout: per workload the
shared settings, per variant its knobs and figures, and `ratios` of each
variant against the baseline (variant / off). Exit status: 0; 1 when a
deployment or headway-bench failed (no JSON) or any request failed (the JSON
is printed); 130 on Ctrl-C or SIGTERM (deployments are stopped first).
Standard library only.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each variant: (name, enable_recycling, recycling_granularity[,
# kv_cache_dtype, kv_cache_dtype_sliding]); the dtypes default to float32.
# The first is the baseline every ratio is taken against.
#
# KV budgets, in blocks of one (layer, KV head) row (16 positions, f32 K+V).
# Each leaves, beside the full sequences that fit without recycling, less
# than one 512-token prefill chunk free (scheduler.max_num_batched_tokens):
# a third sequence that could start but never finish would be preempted and
# recomputed again and again, and the baseline would measure that thrash.
#   gemma3: 32 KiB blocks, 296 MiB = 9,472. Off: 18 rows x 256 = 4,608 per
#     4,096-position sequence; 2 take 9,216, leaving 256 < 576 (a chunk:
#     32 x 18). On: 3 x 256 + 15 x (32 window + 1) = 1,263; 7 take 8,841,
#     + 480 while the last prefill chunk overlaps the window = 9,321.
#   smollm2: 8 KiB blocks, 200 MiB = 25,600. Off: 90 rows x 128 = 11,520 per
#     2,048-position sequence; 2 take 23,040, leaving 2,560 < 2,880 (a chunk:
#     32 x 90). kv_head: 30 x (2 x 128 + 4 sink + 17 window) = 8,310; 3 take
#     24,930.
# The split is prompt-heavy because decode is the slow part on a CPU: it
# reaches the full context at the least cost.
WORKLOADS = {
    "gemma3": {
        "config": "deploy/configs/gemma3.yaml",
        "kv_memory_mb": 296,
        "input_len": 3968,
        "output_len": 128,
        "num_prompts": 7,
        "variants": [("off", False, "kv_head"), ("kv_head", True, "kv_head")],
    },
    "smollm2": {
        "config": "deploy/configs/smollm2-streaming.yaml",
        "kv_memory_mb": 200,
        "input_len": 1920,
        "output_len": 128,
        "num_prompts": 6,
        "variants": [("off", False, "kv_head"), ("layer", True, "layer"),
                     ("kv_head", True, "kv_head")],
    },
    # Recycling with smaller KV dtypes (common/kv_arena.h: sliding slots in
    # their own dtype share one arena with the full ones). Same 296 MiB as
    # gemma3, where float32 without recycling holds 2 sequences of 4,096
    # positions; a float16 + q8_0-sliding sequence takes 3 x 256 f16 blocks
    # (12 MiB) + 15 x 33 q8_0 blocks (4.1 MiB), about 18 of them.
    "gemma3-dtypes": {
        "config": "deploy/configs/gemma3.yaml",
        "kv_memory_mb": 296,
        "input_len": 3968,
        "output_len": 32,
        "num_prompts": 24,
        "variants": [("off", False, "kv_head"),
                     ("kv_head", True, "kv_head"),
                     ("f16_q8sliding", True, "kv_head", "float16", "q8_0"),
                     ("q8_0", True, "kv_head", "q8_0", "q8_0")],
    },
}

RATIO_FIELDS = ["peak_running", "mean_running", "output_throughput", "median_ttft_ms",
                "median_itl_ms"]


class Interrupted(Exception):
    """SIGTERM, turned into an exception so that every deployment is stopped."""


def log(message):
    print("[recycling_bench] " + message, file=sys.stderr, flush=True)


def free_ports(count):
    """Ports the OS says are free now, all distinct (held open together)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def set_yaml_key(lines, section, key, value):
    """Sets `section.key: value` in a deployment YAML given as lines, keeping
    everything else (comments too). Handles the block style of
    deploy/configs/*.yaml: top-level sections, one indented scalar per line."""
    header = re.compile(r"^%s:\s*(#.*)?$" % re.escape(section))
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        lines.extend(["%s:" % section, "  %s: %s" % (key, value)])
        return
    end = start + 1
    while end < len(lines) and (lines[end].strip() == "" or lines[end][:1] in (" ", "\t", "#")):
        end += 1
    entry = re.compile(r"^(\s+)%s:" % re.escape(key))
    for i in range(start + 1, end):
        m = entry.match(lines[i])
        if m:
            lines[i] = "%s%s: %s" % (m.group(1), key, value)
            return
    lines.insert(start + 1, "  %s: %s" % (key, value))


def yaml_value(lines, section, key):
    """The raw scalar of `section.key` (comment stripped), or None."""
    in_section = False
    for line in lines:
        if re.match(r"^\S", line) and not line.startswith("#"):
            in_section = re.match(r"^%s:\s*(#.*)?$" % re.escape(section), line) is not None
            continue
        m = re.match(r"^\s+%s:\s*([^#]*)" % re.escape(key), line)
        if in_section and m:
            return m.group(1).strip().strip("'\"")
    return None


def write_config(base_path, out_path, kv_memory_mb, enable_recycling, granularity,
                 kv_cache_dtype="float32", kv_cache_dtype_sliding="float32"):
    """Copies the base config with the variant's cache knobs and free ports.
    A relative model.head_pattern is made absolute (it resolves against the
    config file's directory, and the copy lives elsewhere)."""
    with open(base_path) as f:
        lines = f.read().splitlines()
    http_port, control_port = free_ports(2)
    set_yaml_key(lines, "coordinator", "http_port", str(http_port))
    set_yaml_key(lines, "coordinator", "control_address", "tcp://127.0.0.1:%d" % control_port)
    set_yaml_key(lines, "cache", "kv_memory_mb", str(kv_memory_mb))
    set_yaml_key(lines, "cache", "enable_recycling", "true" if enable_recycling else "false")
    set_yaml_key(lines, "cache", "recycling_granularity", granularity)
    set_yaml_key(lines, "cache", "kv_cache_dtype", kv_cache_dtype)
    set_yaml_key(lines, "cache", "kv_cache_dtype_sliding", kv_cache_dtype_sliding)
    pattern = yaml_value(lines, "model", "head_pattern")
    if pattern and not os.path.isabs(pattern):
        absolute = os.path.join(os.path.dirname(os.path.abspath(base_path)), pattern)
        set_yaml_key(lines, "model", "head_pattern", json.dumps(absolute))
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return http_port


def http_get(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode()


def metric_sum(text, name):
    """Sum of every sample of `name` (all label sets), None if absent."""
    total = None
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total = (total or 0.0) + float(line.split()[-1])
    return total


class Deployment:
    """A running `headway-launch CONFIG`; stop() is safe to call on any path."""

    def __init__(self, launcher, config_path, http_port, bin_dir, model_dir, log_path,
                 ready_timeout_s):
        self.base_url = "http://127.0.0.1:%d" % http_port
        self.log_path = log_path
        command = [launcher, config_path, "--bin-dir", bin_dir,
                   "--ready-timeout-s", str(ready_timeout_s)]
        if model_dir:
            command += ["--model-dir", model_dir]
        self.log_file = open(log_path, "w")
        # Its own session: a Ctrl-C reaches only this script, which stops the
        # launcher itself (the launcher stops its coordinator and workers).
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout_s):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("headway-launch exited with status %d before it was ready; "
                                   "log %s:\n%s" % (self.process.returncode, self.log_path,
                                                    self.log_tail()))
            try:
                status, _ = http_get(self.base_url + "/health", timeout=5)
                if status == 200:
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError("deployment not ready after %d s; log %s:\n%s"
                           % (timeout_s, self.log_path, self.log_tail()))

    def log_tail(self, lines=15):
        self.log_file.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def stop(self, timeout_s=30):
        # A second Ctrl-C while stopping must not leave the launcher running.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
                try:
                    self.process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    log("headway-launch did not stop within %d s; killing it" % timeout_s)
                    self.process.kill()
                    self.process.wait()
            self.log_file.close()
        finally:
            signal.signal(signal.SIGINT, previous)


def run_variant(args, workload, settings, variant, work_dir):
    name, enable_recycling, granularity = variant[:3]
    dtype, dtype_sliding = variant[3:5] if len(variant) > 3 else ("float32", "float32")
    base_config = os.path.join(REPO, settings["config"])
    config_path = os.path.join(work_dir, "%s-%s.yaml" % (workload, name))
    http_port = write_config(base_config, config_path, settings["kv_memory_mb"],
                             enable_recycling, granularity, dtype, dtype_sliding)
    result_path = os.path.join(work_dir, "%s-%s-result.json" % (workload, name))
    bench_log = os.path.join(work_dir, "%s-%s-bench.log" % (workload, name))
    log("%s/%s: starting %s (kv_memory_mb %d, enable_recycling %s, granularity %s, "
        "kv_cache_dtype %s, kv_cache_dtype_sliding %s)"
        % (workload, name, config_path, settings["kv_memory_mb"], enable_recycling, granularity,
           dtype, dtype_sliding))
    deployment = Deployment(os.path.join(args.bin_dir, "headway-launch"), config_path, http_port,
                            args.bin_dir, args.model_dir,
                            os.path.join(work_dir, "%s-%s-launch.log" % (workload, name)),
                            args.ready_timeout_s)
    try:
        deployment.wait_ready(args.ready_timeout_s + 10)
        _, before = http_get(deployment.base_url + "/metrics", timeout=30)
        n = settings["num_prompts"]
        command = [os.path.join(args.bin_dir, "headway-bench"),
                   "--base-url", deployment.base_url,
                   "--num-prompts", str(n), "--max-concurrency", str(n),
                   "--random-input-len", str(settings["input_len"]),
                   "--random-output-len", str(settings["output_len"]),
                   "--ignore-eos", "--seed", str(args.seed),
                   "--save-result", "--result-filename", result_path]
        log("%s/%s: ready; %d prompts of %d + %d tokens" % (workload, name, n,
                                                         settings["input_len"],
                                                         settings["output_len"]))
        samples = []  # (time, running sequences, KV usage)
        start = time.time()
        with open(bench_log, "w") as bench_out:
            bench = subprocess.Popen(command, stdout=bench_out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
            try:
                last_report = start
                while bench.poll() is None:
                    try:
                        _, text = http_get(deployment.base_url + "/metrics", timeout=5)
                        samples.append((time.time(),
                                        metric_sum(text, "headway:num_requests_running") or 0.0,
                                        metric_sum(text, "headway:kv_cache_usage_perc") or 0.0))
                    except (urllib.error.URLError, OSError) as e:
                        log("%s/%s: /metrics failed: %s" % (workload, name, e))
                    if deployment.process.poll() is not None:
                        raise RuntimeError("the deployment exited during the run; log %s:\n%s"
                                           % (deployment.log_path, deployment.log_tail()))
                    if time.time() - last_report >= 30:
                        last_report = time.time()
                        log("%s/%s: %.0f s, %d running" % (workload, name, last_report - start,
                                                           samples[-1][1] if samples else -1))
                    time.sleep(args.sample_interval_s)
            finally:
                if bench.poll() is None:
                    bench.kill()
                    bench.wait()
        end = time.time()
        if bench.returncode != 0:
            with open(bench_log, errors="replace") as f:
                raise RuntimeError("headway-bench exited with status %d:\n%s"
                                   % (bench.returncode, "".join(f.readlines()[-15:])))
        _, after = http_get(deployment.base_url + "/metrics", timeout=30)
    finally:
        deployment.stop()
    log("%s/%s: done in %.1f s" % (workload, name, end - start))

    with open(result_path) as f:
        result = json.load(f)
    # Time-weighted: each sample holds until the next one.
    weighted = sum(s[1] * (t[0] - s[0]) for s, t in zip(samples, samples[1:]))
    span = samples[-1][0] - samples[0][0] if len(samples) > 1 else 0.0
    share = {}
    for s, t in zip(samples, samples[1:]):
        share[int(s[1])] = share.get(int(s[1]), 0.0) + (t[0] - s[0]) / span

    def grown(metric):
        a, b = metric_sum(after, metric), metric_sum(before, metric)
        return None if a is None else int(a - (b or 0.0))

    figures = {
        "kv_memory_mb": settings["kv_memory_mb"],
        "enable_recycling": enable_recycling,
        "recycling_granularity": granularity,
        "kv_cache_dtype": dtype,
        "kv_cache_dtype_sliding": dtype_sliding,
        "peak_running": int(max(s[1] for s in samples)) if samples else None,
        "mean_running": weighted / span if span > 0 else None,
        # Fraction of the run spent at each number of running sequences: a
        # peak held for one sample (a sequence admitted into leftover memory
        # and preempted at its next chunk) shows here as a sliver.
        "running_time_share": {str(k): round(v, 4) for k, v in sorted(share.items())},
        "peak_kv_cache_usage": max((s[2] for s in samples), default=None),
        "num_samples": len(samples),
        "preemptions": grown("headway:num_preemptions_total"),
        "blocks_recycled": grown("headway:kv_blocks_recycled_total"),
        "completed": result.get("completed"),
        "failed": result.get("failed"),
        "output_throughput": result.get("output_throughput"),
        "median_ttft_ms": result.get("median_ttft_ms"),
        "p99_ttft_ms": result.get("p99_ttft_ms"),
        "median_itl_ms": result.get("median_itl_ms"),
        "median_tpot_ms": result.get("median_tpot_ms"),
        "duration": result.get("duration"),
    }
    if result.get("failed"):
        log("%s/%s: %s requests failed: %s" % (workload, name, result["failed"],
                                               result.get("error_samples")))
    for metric in ("preemptions", "blocks_recycled"):
        if figures[metric] is None:
            log("%s/%s: the server's /metrics has no %s counter" % (workload, name, metric))
    log("%s/%s: peak running %s, mean %.2f, preemptions %s, recycled %s, %.2f tok/s"
        % (workload, name, figures["peak_running"], figures["mean_running"] or 0.0,
           figures["preemptions"], figures["blocks_recycled"],
           figures["output_throughput"] or 0.0))
    return figures


def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Per-workload defaults: " + "; ".join(
                                         "%s: --kv-memory-mb %d --input-len %d --output-len %d "
                                         "--num-prompts %d" % (w, s["kv_memory_mb"],
                                                               s["input_len"], s["output_len"],
                                                               s["num_prompts"])
                                         for w, s in WORKLOADS.items()))
    parser.add_argument("--workload", choices=["gemma3", "smollm2", "both", "gemma3-dtypes"],
                        default="both", help="both = gemma3 and smollm2")
    parser.add_argument("--kv-memory-mb", type=int,
                        help="KV pool per worker, MiB (default: per workload)")
    parser.add_argument("--input-len", type=int, help="prompt tokens (default: per workload)")
    parser.add_argument("--output-len", type=int, help="output tokens (default: per workload)")
    parser.add_argument("--num-prompts", type=int,
                        help="requests, all sent at once (default: per workload)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated variants to run, the first as the baseline "
                             "(default: all of the workload's)")
    parser.add_argument("--seed", type=int, default=0, help="headway-bench prompt seed")
    parser.add_argument("--bin-dir", default="build/bin",
                        help="where headway-launch, -coordinator, -worker and -bench are")
    parser.add_argument("--model-dir", default=None,
                        help="passed to headway-launch (default: its own, "
                             "$HEADWAY_MODEL_DIR or ~/.cache/headway/models)")
    parser.add_argument("--sample-interval-s", type=float, default=0.2,
                        help="seconds between /metrics samples")
    parser.add_argument("--ready-timeout-s", type=int, default=180,
                        help="longest wait for a deployment's /health")
    parser.add_argument("--work-dir", default=None,
                        help="where configs, logs and result files go (default: a new temporary "
                             "directory, kept)")
    args = parser.parse_args()
    args.bin_dir = os.path.abspath(args.bin_dir)
    for binary in ("headway-launch", "headway-bench"):
        if not os.access(os.path.join(args.bin_dir, binary), os.X_OK):
            parser.error("no %s in %s (build it, or pass --bin-dir)" % (binary, args.bin_dir))
    if args.model_dir:
        args.model_dir = os.path.abspath(args.model_dir)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="headway-recycling-")
    os.makedirs(work_dir, exist_ok=True)
    log("configs, logs and headway-bench results go to " + work_dir)

    def on_sigterm(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGTERM, on_sigterm)

    names = ["gemma3", "smollm2"] if args.workload == "both" else [args.workload]
    output = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "seed": args.seed, "work_dir": work_dir, "workloads": {}}
    started = time.time()
    try:
        for workload in names:
            settings = dict(WORKLOADS[workload])
            for key in ("kv_memory_mb", "input_len", "output_len", "num_prompts"):
                if getattr(args, key) is not None:
                    settings[key] = getattr(args, key)
            if args.variants:
                by_name = {v[0]: v for v in settings["variants"]}
                unknown = [n for n in args.variants.split(",") if n not in by_name]
                if unknown:
                    parser.error("unknown variants for %s: %s (known: %s)"
                                 % (workload, ", ".join(unknown), ", ".join(by_name)))
                settings["variants"] = [by_name[n] for n in args.variants.split(",")]
            variants = {}
            for variant in settings["variants"]:
                variants[variant[0]] = run_variant(args, workload, settings, variant, work_dir)
            baseline_name = settings["variants"][0][0]
            baseline = variants[baseline_name]
            output["workloads"][workload] = {
                "config": settings["config"],
                "kv_memory_mb": settings["kv_memory_mb"],
                "input_len": settings["input_len"],
                "output_len": settings["output_len"],
                "num_prompts": settings["num_prompts"],
                "baseline": baseline_name,
                "variants": variants,
                "ratios": {name: {field: ratio(v[field], baseline[field]) for field in RATIO_FIELDS}
                           for name, v in variants.items() if name != baseline_name},
            }
    except (KeyboardInterrupt, Interrupted):
        log("interrupted; deployments stopped")
        return 130
    except RuntimeError as e:
        log("failed: %s" % e)
        return 1
    output["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(output, indent=1))
    failed = sum(v["failed"] or 0 for w in output["workloads"].values()
                 for v in w["variants"].values())
    if failed:
        log("%d requests failed: the figures do not compare like with like" % failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
