#!/usr/bin/env python3
"""Renders Kubernetes manifests for deployment configs and validates them.

    validate_k8s_manifests.py --launch BIN --crd-dir DIR [--venv DIR] CONFIG...

For each CONFIG, `BIN render k8s CONFIG -o TMP`, then every rendered object:
  * built-in kinds (ConfigMap, Deployment, Service): `kubernetes-validate
    --strict` (the Kubernetes schemas bundled in that PyPI package);
  * LeaderWorkerSet and DisaggregatedSet: the openAPIV3Schema of their
    CustomResourceDefinition in DIR, made strict the way the API server
    prunes (an object that lists its properties accepts no others), plus
    the DisaggregatedSet's one CEL rule (replicas > 0 on every role), which
    JSON Schema cannot express; and each of their pod templates, wrapped in
    a v1 PodTemplate, with `kubernetes-validate --strict` as well.

Exit status 0 when all pass, 1 on the first failure, 77 (skipped, for ctest)
when kubernetes-validate or jsonschema is not installed: deploy/setup.sh
installs both into the virtual environment given by --venv, which this
script runs under when it exists. Nothing is downloaded here.
"""
import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def reexec_in_venv(venv):
    python = os.path.join(venv, "bin", "python3")
    if venv and os.path.exists(python) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        os.execv(python, [python] + sys.argv)


def strict(schema):
    """The schema with additionalProperties: false wherever an object lists
    its properties and does not keep unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_validators(crd_dir, yaml, jsonschema):
    validators = {}
    for name in sorted(os.listdir(crd_dir)):
        if not name.endswith(".yaml") or "_" not in name:
            continue
        with open(os.path.join(crd_dir, name)) as f:
            crd = yaml.safe_load(f)
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        group = crd["spec"]["group"]
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            validators[(group + "/" + version["name"], kind)] = jsonschema.Draft4Validator(schema)
    return validators


def pod_templates(obj):
    """(where, template) of every pod template in a LeaderWorkerSet or DisaggregatedSet."""
    specs = []
    if obj["kind"] == "LeaderWorkerSet":
        specs.append(("spec", obj["spec"]))
    else:
        for i, role in enumerate(obj["spec"]["roles"]):
            specs.append(("spec.roles[%d].spec" % i, role["spec"]))
    for where, spec in specs:
        for key in ("leaderTemplate", "workerTemplate"):
            if key in spec["leaderWorkerTemplate"]:
                yield where + ".leaderWorkerTemplate." + key, spec["leaderWorkerTemplate"][key]


def run_kubernetes_validate(paths):
    """Runs kubernetes-validate --strict; returns its complaints ("" if none)."""
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict"] + paths,
                         capture_output=True, text=True)
    text = out.stdout + out.stderr
    bad = [line for line in text.splitlines() if not line.startswith("INFO")]
    if out.returncode != 0 or bad:
        return text
    return ""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launch", required=True, help="headway-launch binary")
    parser.add_argument("--crd-dir", required=True)
    parser.add_argument("--venv", default="")
    parser.add_argument("configs", nargs="+")
    args = parser.parse_args()
    reexec_in_venv(args.venv)
    try:
        import jsonschema
        import kubernetes_validate  # noqa: F401
        import yaml
    except ImportError as e:
        print("SKIP: %s; run deploy/setup.sh (it installs kubernetes-validate and jsonschema "
              "into %s)" % (e, args.venv or "a virtual environment"))
        return SKIP

    validators = crd_validators(args.crd_dir, yaml, jsonschema)
    work = tempfile.mkdtemp(prefix="headway-k8s-")
    try:
        checked = 0
        for config in args.configs:
            out_dir = os.path.join(work, os.path.basename(config))
            rendered = subprocess.run([args.launch, "render", "k8s", config, "-o", out_dir],
                                      capture_output=True, text=True)
            if rendered.returncode != 0:
                print("FAIL: render k8s %s: %s" % (config, rendered.stderr))
                return 1
            builtin = []
            for name in sorted(os.listdir(out_dir)):
                path = os.path.join(out_dir, name)
                with open(path) as f:
                    docs = [d for d in yaml.safe_load_all(f) if d is not None]
                for obj in docs:
                    key = (obj.get("apiVersion"), obj.get("kind"))
                    if key not in validators:
                        builtin.append(path)
                        continue
                    errors = sorted(validators[key].iter_errors(obj), key=lambda e: list(e.path))
                    if errors:
                        for e in errors[:5]:
                            print("FAIL: %s: %s at %s" % (path, e.message,
                                                          ".".join(str(p) for p in e.path)))
                        return 1
                    if obj["kind"] == "DisaggregatedSet":
                        for role in obj["spec"]["roles"]:
                            if role["spec"].get("replicas", 0) <= 0:
                                print("FAIL: %s: role %s needs replicas > 0" % (path, role["name"]))
                                return 1
                    for i, (where, template) in enumerate(pod_templates(obj)):
                        wrapped = {"apiVersion": "v1", "kind": "PodTemplate",
                                   "metadata": {"name": "%s-%d" % (obj["metadata"]["name"], i)},
                                   "template": template}
                        wrapped_path = "%s-%s.podtemplate-%d.yaml" % (out_dir, name, i)
                        with open(wrapped_path, "w") as f:
                            f.write("# %s of %s\n" % (where, path))
                            yaml.safe_dump(wrapped, f)
                        builtin.append(wrapped_path)
                    checked += 1
            complaints = run_kubernetes_validate(builtin)
            if complaints:
                print("FAIL: kubernetes-validate --strict on %s:\n%s" % (config, complaints))
                return 1
            checked += len(builtin)
            print("ok: %s: %s" % (config, ", ".join(sorted(os.listdir(out_dir)))))
        print("%d objects and pod templates valid" % checked)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
