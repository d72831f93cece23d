"""Joins the GPU check's outputs (tests/gpu/run.sh) into one JSON object.

Usage: python3 tests/gpu/summarize.py RESULTS_DIR
Reads tests.json (GoogleTest's --gtest_output=json), tests.log (for the
"[ measured ]" lines tests print), attention.json, matmul.json and
nvidia-smi.txt from RESULTS_DIR; prints the summary on stdout.
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


def main():
    d = sys.argv[1]
    summary = {"gpu": read(os.path.join(d, "nvidia-smi.txt")).strip()}
    tests = {}
    gtest = load_json(os.path.join(d, "tests.json"))
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
            # Figures recorded with RecordProperty (max errors and the like).
            known = {"name", "file", "line", "status", "result", "timestamp", "time",
                     "classname", "failures"}
            for key, value in case.items():
                if key not in known:
                    entry[key] = value
            if status == "failed":
                entry["failures"] = [f.get("failure", "")[:400] for f in case["failures"]]
            tests[name] = entry
    if "error" in gtest:
        summary["tests_error"] = gtest["error"]
    log = read(os.path.join(d, "tests.log"))
    summary["measured"] = re.findall(r"\[ measured \] (.*)", log)
    summary["tests"] = tests
    summary["counts"] = {s: sum(1 for t in tests.values() if t["status"] == s)
                         for s in ("passed", "failed", "skipped")}
    summary["test_gpu_exit"] = (re.findall(r"test_gpu exit (\d+)", log) or ["?"])[-1]
    summary["attention"] = load_json(os.path.join(d, "attention.json"))
    summary["matmul"] = load_json(os.path.join(d, "matmul.json"))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
