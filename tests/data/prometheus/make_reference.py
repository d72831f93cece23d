"""Reference parses of Prometheus text exposition by prometheus_client.

Made with:
  python3 -m venv /tmp/promenv && /tmp/promenv/bin/pip install prometheus_client==0.26.0
  /tmp/promenv/bin/python tests/data/prometheus/make_reference.py tests/data/prometheus

Writes:
  client_python.txt   an exposition rendered by prometheus_client itself
  client_python.json  prometheus_client's parse of it
  headway_rendered.json  prometheus_client's parse of headway_rendered.txt
                      (the output of ServingMetrics for the calls in
                      tests/coordinator/serving_metrics_test.cc, GoldenRender)

Each JSON holds {"command", "samples": [{"name", "labels", "value", "type"}]}
in file order, values as Python repr strings (so inf and nan survive JSON).
Tests compare Headway's parser with these; they never run Python.
"""
import json
import os
import sys

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

COMMAND = ("/tmp/promenv/bin/python tests/data/prometheus/make_reference.py tests/data/prometheus"
           " (prometheus_client==0.26.0)")


def flatten(text):
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append({"name": s.name, "labels": dict(s.labels), "value": repr(float(s.value)),
                        "type": family.type})
    return out


def client_exposition():
    reg = CollectorRegistry()
    c = Counter("demo:requests", "Requests served.\nSecond line with \\ backslash.",
                ["model_name", "path"], registry=reg)
    c.labels("m", "/v1/completions").inc(3)
    c.labels('we"ird\\va\nlue', "/metrics").inc(0.5)
    g = Gauge("demo_queue_length", "Queue length.", registry=reg)
    g.set(-2.5)
    h = Histogram("demo_latency_seconds", "Latency.", ["model_name"],
                  buckets=[0.001, 0.1, 1.0, 2560.0], registry=reg)
    for v in [0.0005, 0.001, 0.05, 0.5, 3.0, 10000.0]:
        h.labels("m").observe(v)
    text = generate_latest(reg).decode()
    # _created samples carry wall-clock times; fix them so the file is stable.
    lines = []
    for line in text.splitlines():
        if "_created" in line and not line.startswith("#"):
            line = line.rsplit(" ", 1)[0] + " 1.7e+09"
        lines.append(line)
    return "# made by: " + COMMAND + "\n" + "\n".join(lines) + "\n"


def main():
    out_dir = sys.argv[1]
    text = client_exposition()
    with open(os.path.join(out_dir, "client_python.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "client_python.json"), "w") as f:
        json.dump({"command": COMMAND, "samples": flatten(text)}, f, indent=1)
    rendered = os.path.join(out_dir, "headway_rendered.txt")
    if os.path.exists(rendered):
        with open(rendered) as f:
            text = f.read()
        with open(os.path.join(out_dir, "headway_rendered.json"), "w") as f:
            json.dump({"command": COMMAND, "samples": flatten(text)}, f, indent=1)


if __name__ == "__main__":
    main()
