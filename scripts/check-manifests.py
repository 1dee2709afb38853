#!/usr/bin/env python3
"""Checks the deployment files: renders each overlay under deploy/overlays with `kubectl kustomize`,
validates every resource against the Kubernetes schemas (kubernetes-validate, strict) or, for the
custom resources, against deploy/schemas/, checks what corral's pods rely on (probes, drain time,
non-root, the picker's label, the pool's selector and port, a config the picker can read, a route
that waits out a load), and lints the Dockerfile with hadolint.

Usage: check-manifests.py [--kubernetes-version X.Y.Z]. Prints one line per problem; exit 1 if any.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DRAIN_SECONDS = 30  # corral's drain bound after SIGTERM
PORT = 8080


def render(overlay: Path) -> list:
    out = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def custom_schema(doc: dict):
    group_version = doc["apiVersion"].replace("/", "_")
    path = DEPLOY / "schemas" / f"{group_version}_{doc['kind']}.json"
    return json.loads(path.read_text()) if path.exists() else None


def validate(doc: dict, version: str) -> list:
    schema = custom_schema(doc)
    if schema is not None:
        validator = jsonschema.Draft202012Validator(schema)
        return [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no schema for {doc['apiVersion']} {doc['kind']} (add one under deploy/schemas)"]
    return []


def pod_problems(sts: dict) -> list:
    """What a corral pod needs: ready when corral serves, time to drain, no root, the picker's label."""
    spec = sts["spec"]["template"]["spec"]
    labels = sts["spec"]["template"]["metadata"].get("labels", {})
    problems = []
    if labels.get("llm-d.ai/engine-type") != "corral":
        problems.append("pod label llm-d.ai/engine-type must be corral (the endpoint picker reads it)")
    security = spec.get("securityContext", {})
    if not security.get("runAsNonRoot"):
        problems.append("pods must run as non-root")
    if "fsGroup" in security and security.get("fsGroupChangePolicy") != "OnRootMismatch":
        problems.append("fsGroupChangePolicy must be OnRootMismatch (else every start chowns the whole model cache)")
    corral = next((c for c in spec["containers"] if c["name"] == "corral"), None)
    if corral is None:
        return problems + ["no container named corral"]
    for probe in ("readinessProbe", "livenessProbe"):
        if corral.get(probe, {}).get("httpGet", {}).get("path") != "/health":
            problems.append(f"{probe} must be GET /health (ready when corral serves, not when a model is loaded)")
    if corral.get("readinessProbe", {}).get("failureThreshold", 3) < 2:
        problems.append("readinessProbe failureThreshold must be at least 2 (one slow answer must not take the pod out)")
    pre_stop = corral.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_stop_seconds = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] and len(pre_stop) == 2 else 0
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < pre_stop_seconds + DRAIN_SECONDS:
        problems.append(f"terminationGracePeriodSeconds {grace} does not cover preStop {pre_stop_seconds} s + the {DRAIN_SECONDS} s drain")
    ports = [p.get("containerPort") for p in corral.get("ports", [])]
    if PORT not in ports:
        problems.append(f"container port {PORT} missing")
    return problems


def pool_problems(docs: list) -> list:
    """An InferencePool must select corral's pods on corral's port."""
    pods = [d for d in docs if d["kind"] == "StatefulSet"]
    problems = []
    for pool in (d for d in docs if d["kind"] == "InferencePool"):
        wanted = pool["spec"]["selector"]["matchLabels"]
        if not any(wanted.items() <= p["spec"]["template"]["metadata"]["labels"].items() for p in pods):
            problems.append(f"InferencePool {pool['metadata']['name']} selects no corral pod: {wanted}")
        if [t["number"] for t in pool["spec"]["targetPorts"]] != [PORT]:
            problems.append(f"InferencePool {pool['metadata']['name']} must target port {PORT}")
    return problems


def seconds(duration: str) -> float:
    """A Gateway API duration (GEP-2257: `1h`, `90s`, `1m30s`, `500ms`) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|h|m|s)", duration))


def corral_config(docs: list) -> dict:
    """The config the pods load: config.yaml of the ConfigMap corral-config."""
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "corral-config":
            return yaml.safe_load(d.get("data", {}).get("config.yaml", "")) or {}
    return {}


def gateway_problems(docs: list) -> list:
    """Behind an InferencePool, the picker must be able to read each pod's gauges, and the route
    must wait out a model's load."""
    if not any(d["kind"] == "InferencePool" for d in docs):
        return []
    config = corral_config(docs)
    problems = []
    if config.get("vllmMetricNames") is not True:
        problems.append("the config of pods in an InferencePool must set vllmMetricNames: true (a stock endpoint picker reads vLLM's names)")
    if config.get("apiKeys"):
        problems.append("the config of pods in an InferencePool must set no apiKeys (the endpoint picker sends no key, so /metrics would answer 401)")
    load = config.get("healthCheckTimeout", 120)
    for route in (d for d in docs if d["kind"] == "HTTPRoute"):
        for i, rule in enumerate(route["spec"].get("rules", [])):
            if not any(b.get("kind") == "InferencePool" for b in rule.get("backendRefs", [])):
                continue
            request = rule.get("timeouts", {}).get("request")
            if request is None or seconds(request) <= load:
                problems.append(
                    f"HTTPRoute {route['metadata']['name']} rule {i}: timeouts.request must be set and longer "
                    f"than healthCheckTimeout ({load} s), not {request!r} (gateways cut requests at 15 to 30 s by default)"
                )
    return problems


def check_overlay(overlay: Path, version: str) -> list:
    docs = render(overlay)
    problems = []
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        problems += [f"{where}: {p}" for p in validate(doc, version)]
        if doc["kind"] == "StatefulSet":
            problems += [f"{where}: {p}" for p in pod_problems(doc)]
    problems += pool_problems(docs)
    problems += gateway_problems(docs)
    if not any(d["kind"] == "StatefulSet" for d in docs):
        problems.append("renders no corral StatefulSet")
    return [f"{overlay.relative_to(ROOT)}: {p}" for p in problems]


def lint_dockerfile() -> list:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    out = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False)
    return [] if out.returncode == 0 else [f"hadolint: {line}" for line in (out.stdout + out.stderr).splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", default=kubernetes_validate.utils.latest_version())
    args = parser.parse_args()
    overlays = sorted(p for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").exists())
    problems = lint_dockerfile()
    for overlay in overlays:
        problems += check_overlay(overlay, args.kubernetes_version)
    for p in problems:
        print(p)
    names = ", ".join(o.name for o in overlays)
    print(f"checked {len(overlays)} overlays ({names}) against Kubernetes {args.kubernetes_version}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
