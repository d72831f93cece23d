"""Joins the GPU check's outputs (tests/gpu/run.sh) into one JSON object.

Usage: python3 tests/gpu/summarize.py RESULTS_DIR
Reads tests.json (GoogleTest's --gtest_output=json), tests.log (for skip
reasons and the "[ measured ]" lines tests print), attention.json and
matmul.json (when the benchmarks ran) and nvidia-smi.txt from RESULTS_DIR;
prints the summary on stdout. Exit status 1 when a test failed, test_gpu
exited non-zero, or its results are missing; else 0.
"""
import json
import os
import re
import sys


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{os.path.basename(path)}: {e}"}


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def skip_reasons(log):
    """Test name -> the message of its GTEST_SKIP, from the test log."""
    reasons, current, lines = {}, None, []
    for line in log.splitlines():
        m = re.match(r"\[ RUN      \] (\S+)", line)
        if m:
            current, lines = m.group(1), []
            continue
        m = re.match(r"\[  SKIPPED \] (\S+)", line)
        if m and m.group(1) == current:
            text = [l for l in lines if l and not l.endswith(": Skipped")]
            reasons[current] = " ".join(text)[:300]
            current = None
            continue
        if current is not None:
            lines.append(line.strip())
    return reasons


def main():
    d = sys.argv[1]
    log = read(os.path.join(d, "tests.log"))
    reasons = skip_reasons(log)
    summary = {"gpu": read(os.path.join(d, "nvidia-smi.txt")).strip()}
    tests = {}
    gtest = load_json(os.path.join(d, "tests.json"))
    known = {"name", "file", "line", "status", "result", "timestamp", "time", "classname",
             "failures", "value_param", "type_param"}
    for suite in gtest.get("testsuites", []):
        for case in suite.get("testsuite", []):
            name = f"{suite['name']}.{case['name']}"
            if case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                status = "skipped"
            elif case.get("failures"):
                status = "failed"
            else:
                status = "passed"
            entry = {"status": status}
            if status == "skipped" and name in reasons:
                entry["reason"] = reasons[name]
            # Figures recorded with RecordProperty (max errors and the like).
            for key, value in case.items():
                if key not in known:
                    entry[key] = value
            if status == "failed":
                entry["failures"] = [f.get("failure", "")[:400] for f in case["failures"]]
            tests[name] = entry
    if "error" in gtest:
        summary["tests_error"] = gtest["error"]
    summary["counts"] = {s: sum(1 for t in tests.values() if t["status"] == s)
                         for s in ("passed", "failed", "skipped")}
    summary["test_gpu_exit"] = (re.findall(r"test_gpu exit (\d+)", log) or ["?"])[-1]
    summary["measured"] = re.findall(r"\[ measured \] (.*)", log)
    summary["tests"] = tests
    for bench in ("attention", "matmul"):
        path = os.path.join(d, bench + ".json")
        if os.path.exists(path):
            summary[bench] = load_json(path)
    print(json.dumps(summary, indent=1))
    ok = "error" not in gtest and summary["counts"]["failed"] == 0 and \
        summary["test_gpu_exit"] == "0"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
