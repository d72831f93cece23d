"""What the Python end-to-end tests share: a one-worker SmolLM2 deployment
started by `headway-launch` on ports the OS says are free (stopped on every
path), the skip rules, a list of named checks, and the scripts' main."""
import argparse
import importlib
import importlib.metadata
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SKIP = 77
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "smollm2-135m-instruct"


def reexec_in_venv(venv):
    python = os.path.join(venv, "bin", "python3")
    if venv and os.path.exists(python) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        os.execv(python, [python] + sys.argv)


def missing(what):
    """Skips (77), or fails where the environment requires the model."""
    if os.environ.get("HEADWAY_REQUIRE_MODEL") == "1":
        print("FAIL: HEADWAY_REQUIRE_MODEL=1 but %s" % what)
        return 1
    print("SKIP: %s" % what)
    return SKIP


def free_ports(count):
    """`count` distinct TCP ports of 127.0.0.1 that were free a moment ago,
    drawn from the 12,000 below the kernel's ephemeral range, which the kernel
    never hands out by itself (tests/support/process.h, FreePort)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_first = 32768
    first, last = max(1024, ephemeral_first - 12000), ephemeral_first - 1
    ports = []
    for _ in range(200 * count):
        if len(ports) == count:
            break
        port = random.randint(first, last)
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    if len(ports) != count:
        raise RuntimeError(f"no {count} free ports in [{first}, {last}]")
    return ports


CONFIG = """\
model:
  path: {model}
  served_name: {served}
coordinator:
  http_host: 127.0.0.1
  http_port: {http_port}
  control_address: tcp://127.0.0.1:{control_port}
cache:
  block_size: 16
  kv_memory_mb: 64
scheduler:
  max_num_seqs: 8
  max_num_batched_tokens: 512
  max_model_len: 2048
pools:
  - name: main
    role: mixed
    instances:
      - tp_size: 1
        device: cpu
        hosts: [127.0.0.1]
"""


class Deployment:
    """`headway-launch CONFIG` in its own session; stop() on every path."""

    def __init__(self, launch, bin_dir, model_dir, work_dir):
        http_port, control_port = free_ports(2)
        self.base_url = "http://127.0.0.1:%d" % http_port
        config = os.path.join(work_dir, "deployment.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.format(model=MODEL_FILE, served=SERVED_NAME, http_port=http_port,
                                  control_port=control_port))
        self.log_path = os.path.join(work_dir, "launch.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [launch, config, "--bin-dir", bin_dir, "--model-dir", model_dir,
             "--ready-timeout-s", "120"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def wait_ready(self, timeout_s=180):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("headway-launch exited with %d:\n%s"
                                   % (self.process.returncode, self.tail()))
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError("not ready after %d s:\n%s" % (timeout_s, self.tail()))

    def tail(self, lines=20):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # the launcher stops its processes
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


class Checks:
    def __init__(self):
        self.failures = []

    def expect(self, condition, what):
        print(("ok    " if condition else "FAIL  ") + what)
        if not condition:
            self.failures.append(what)


def main(packages, run, work_prefix):
    """A test script's main: reads --launch, --bin-dir, --venv and
    --model-dir, re-executes itself in the virtual environment, skips (or
    fails, under HEADWAY_REQUIRE_MODEL=1) when one of `packages` or the model
    is missing, starts a Deployment in a temporary folder named after
    `work_prefix` and calls run(modules, base_url), `modules` by package
    name, which returns the failed checks. Returns the exit status: 0 when
    all passed, 1 on a failure or an error (printed with the launcher's
    log), 77 when skipped."""
    p = argparse.ArgumentParser()
    p.add_argument("--launch", required=True)
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--venv", default="")
    p.add_argument("--model-dir", default=os.environ.get(
        "HEADWAY_MODEL_DIR", os.path.expanduser("~/.cache/headway/models")))
    args = p.parse_args()
    reexec_in_venv(args.venv)
    try:
        modules = {name: importlib.import_module(name) for name in packages}
    except ImportError as e:
        return missing("the `%s` package is not installed (deploy/setup.sh puts it in %s)"
                       % (e.name, args.venv or "HEADWAY_VENV"))
    if not os.path.exists(os.path.join(args.model_dir, MODEL_FILE)):
        return missing("the model is missing at %s" % os.path.join(args.model_dir, MODEL_FILE))

    with tempfile.TemporaryDirectory(prefix=work_prefix) as work_dir:
        deployment = Deployment(args.launch, args.bin_dir, args.model_dir, work_dir)
        try:
            deployment.wait_ready()
            failures = run(modules, deployment.base_url)
        except Exception as e:  # noqa: BLE001: any error fails the test, with the log
            print("FAIL: %s: %s\n%s" % (type(e).__name__, e, deployment.tail()))
            return 1
        finally:
            deployment.stop()
    versions = ", ".join("%s %s" % (n, importlib.metadata.version(n)) for n in packages)
    print("%d failed" % len(failures) if failures else "all passed (%s)" % versions)
    return 1 if failures else 0
