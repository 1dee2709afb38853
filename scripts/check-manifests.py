#!/usr/bin/env python3
"""Checks the deployment files: renders each overlay under deploy/overlays with `kubectl kustomize`,
validates every resource against the Kubernetes schemas (kubernetes-validate, strict) or, for the
custom resources, against deploy/schemas/, checks what corral's pods rely on (probes, drain time,
non-root, the picker's label, the pool's selector and port, a config the picker can read, a route
that waits out a load), that they are safe as shipped (API keys from a Secret, no captures, a
NetworkPolicy, a route to the model routes alone, /metrics readable by whoever scrapes it), and
lints the Dockerfile with hadolint.

Usage: check-manifests.py [--kubernetes-version X.Y.Z] [--overlay DIR ...]. With --overlay, checks
those kustomizations alone (and not the Dockerfile). Prints one line per problem; exit 1 if any.
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
PORT_NAME = "http"
# The model routes (src/api/inference.rs): whole path segments under these prefixes, and these
# paths. The rest (management, /logs, /upstream, /metrics, /ui) must not be routed by a gateway.
MODEL_PREFIXES = ("/v1", "/v", "/sdapi", "/audioapi")
MODEL_PATHS = ("/completion", "/infill", "/rerank", "/reranking", "/props")
ENV_REFERENCE = re.compile(r"^\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}$")


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
    """Behind an InferencePool, the picker must be able to read each pod's gauges (without a key),
    and the route must wait out a model's load."""
    if not any(d["kind"] == "InferencePool" for d in docs):
        return []
    config = corral_config(docs)
    problems = []
    if config.get("vllmMetricNames") is not True:
        problems.append("the config of pods in an InferencePool must set vllmMetricNames: true (a stock endpoint picker reads vLLM's names)")
    if config.get("openMetrics") is not True:
        problems.append("the config of pods in an InferencePool must set openMetrics: true (the endpoint picker sends no key, so /metrics would answer 401)")
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


def corral_container(docs: list) -> dict:
    """The corral container of the overlay's StatefulSet ({} when there is none)."""
    for sts in (d for d in docs if d["kind"] == "StatefulSet"):
        for container in sts["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "corral":
                return container
    return {}


def key_text(entry) -> str:
    """An apiKeys entry's key: the entry itself, or its `key` field."""
    return str(entry.get("key", "")) if isinstance(entry, dict) else str(entry)


def secret_refs(docs: list) -> dict:
    """The corral container's variables set from a Secret: name -> (secret, key)."""
    refs = {}
    for var in corral_container(docs).get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            refs[var["name"]] = (ref.get("name"), ref.get("key"))
    return refs


def key_problems(docs: list) -> list:
    """Every route but /health needs a key, and the keys live in a Secret created in the cluster:
    the config names them as `${env.NAME}`, and the pod sets NAME from that Secret."""
    keys = corral_config(docs).get("apiKeys")
    if not isinstance(keys, list) or not keys:
        return ["the config must set apiKeys (without keys every route is open to whoever reaches the pod)"]
    refs = secret_refs(docs)
    rendered = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    problems = []
    for i, entry in enumerate(keys):
        reference = ENV_REFERENCE.match(key_text(entry))
        if reference is None:
            problems.append(f"apiKeys[{i}] must be ${{env.NAME}}, set from a Secret (no key in the config)")
        elif reference.group(1) not in refs:
            problems.append(f"apiKeys[{i}]: the corral container must set {reference.group(1)} from a Secret (env valueFrom.secretKeyRef)")
        elif refs[reference.group(1)][0] in rendered:
            problems.append(f"apiKeys[{i}]: the Secret {refs[reference.group(1)][0]} must be created in the cluster, not shipped in these files")
    return problems


def scope(entry) -> str:
    """An apiKeys entry's scope: a plain string is an admin key."""
    return entry.get("scope", "admin") if isinstance(entry, dict) else "admin"


def scrape_problems(docs: list) -> list:
    """Prometheus must be able to read /metrics: the config leaves it open (openMetrics), or the
    PodMonitor sends the Secret's value of a key of scope metrics."""
    config = corral_config(docs)
    if config.get("openMetrics") is True:
        return []
    refs = secret_refs(docs)
    metrics_keys = set()
    for entry in config.get("apiKeys") or []:
        reference = ENV_REFERENCE.match(key_text(entry))
        if scope(entry) == "metrics" and reference and reference.group(1) in refs:
            metrics_keys.add(refs[reference.group(1)])
    problems = []
    for monitor in (d for d in docs if d["kind"] == "PodMonitor"):
        for i, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
            credentials = endpoint.get("authorization", {}).get("credentials", {})
            if (credentials.get("name"), credentials.get("key")) not in metrics_keys:
                problems.append(
                    f"PodMonitor {monitor['metadata']['name']} endpoint {i}: /metrics needs a key here: set openMetrics: true "
                    "in the config, or authorization.credentials to the Secret value of a key of scope metrics"
                )
    return problems


def capture_problems(docs: list) -> list:
    """Captures keep the latest prompts and answers in memory for /api/captures: off as shipped."""
    value = corral_config(docs).get("captureBuffer")
    if value != 0 or isinstance(value, bool):
        shown = "unset" if value is None else repr(value)
        return [f"the config must set captureBuffer: 0, not {shown} (captures keep prompts and answers; the default keeps 5 MB)"]
    return []


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects these labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    tests = {
        "In": lambda e: labels.get(e["key"]) in e.get("values", []),
        "NotIn": lambda e: labels.get(e["key"]) not in e.get("values", []),
        "Exists": lambda e: e["key"] in labels,
        "DoesNotExist": lambda e: e["key"] not in labels,
    }
    return all(tests[e["operator"]](e) for e in selector.get("matchExpressions", []))


def selects_all(selector) -> bool:
    """Whether a selector is present and selects everything (`{}`, or empty lists of labels)."""
    return selector is not None and not selector.get("matchLabels") and not selector.get("matchExpressions")


def open_peer(peer: dict) -> str:
    """Why a NetworkPolicy peer admits too much, or "" when it names who it admits."""
    cidr = peer.get("ipBlock", {}).get("cidr", "")
    if cidr.endswith("/0"):
        return f"ipBlock {cidr} admits every address"
    if "ipBlock" in peer:
        return ""
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if selects_all(namespaces) and (pods is None or selects_all(pods)):
        return "namespaceSelector {} admits every pod of every namespace"
    if selects_all(pods) and namespaces is None:
        return "podSelector {} admits every pod of the namespace"
    return ""


def ingress_rule_problems(rule: dict) -> list:
    """An ingress rule must name its sources and admit corral's serving port alone."""
    problems = []
    ports = rule.get("ports", [])
    if not ports or any(p.get("port") not in (PORT, PORT_NAME) or "endPort" in p for p in ports):
        problems.append(f"must admit port {PORT} ({PORT_NAME}) alone, not {ports or 'every port'}")
    if not rule.get("from"):
        problems.append("admits every source (no `from`)")
    problems += [why for why in map(open_peer, rule.get("from", [])) if why]
    return problems


def network_problems(docs: list) -> list:
    """Ingress to the corral pods is limited to named sources on the serving port: without a
    NetworkPolicy every pod in the cluster reaches /health, /metrics and each route's 401."""
    pods = [d["spec"]["template"]["metadata"].get("labels", {}) for d in docs if d["kind"] == "StatefulSet"]
    policies = [
        d for d in docs
        if d["kind"] == "NetworkPolicy"
        and "Ingress" in d["spec"].get("policyTypes", ["Ingress"])
        and any(selects(d["spec"].get("podSelector", {}), labels) for labels in pods)
    ]
    if not policies:
        return ["no NetworkPolicy limits ingress to the corral pods (every pod in the cluster reaches them)"]
    problems = []
    for policy in policies:
        for i, rule in enumerate(policy["spec"].get("ingress", [])):
            where = f"NetworkPolicy {policy['metadata']['name']} ingress {i}"
            problems += [f"{where}: {p}" for p in ingress_rule_problems(rule)]
    return problems


def path_problem(match: dict) -> str:
    """Why an HTTPRoute match reaches more than the model routes, or "" when it does not."""
    path = match.get("path")
    if path is None:
        return "a match without a path routes every path (PathPrefix /)"
    kind, value = path.get("type", "PathPrefix"), path.get("value", "/")
    if kind == "PathPrefix" and value.rstrip("/") in MODEL_PREFIXES + MODEL_PATHS:
        return ""
    if kind == "Exact" and (value in MODEL_PATHS or any(value.startswith(p + "/") for p in MODEL_PREFIXES)):
        return ""
    allowed = ", ".join(MODEL_PREFIXES + MODEL_PATHS)
    return f"{kind} {value} is not a model route (route only {allowed}: Exact or PathPrefix)"


def route_problems(docs: list) -> list:
    """An HTTPRoute sends the model routes alone to corral: the management routes, /logs and
    /upstream stay off the gateway."""
    problems = []
    for route in (d for d in docs if d["kind"] == "HTTPRoute"):
        for i, rule in enumerate(route["spec"].get("rules", [])):
            where = f"HTTPRoute {route['metadata']['name']} rule {i}"
            matches = rule.get("matches", [])
            if not matches:
                problems.append(f"{where}: a rule without matches routes every path (route only the model routes)")
            problems += [f"{where}: {why}" for why in map(path_problem, matches) if why]
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
    problems += key_problems(docs)
    problems += scrape_problems(docs)
    problems += capture_problems(docs)
    problems += network_problems(docs)
    problems += route_problems(docs)
    if not any(d["kind"] == "StatefulSet" for d in docs):
        problems.append("renders no corral StatefulSet")
    where = overlay.relative_to(ROOT) if overlay.is_relative_to(ROOT) else overlay
    return [f"{where}: {p}" for p in problems]


def lint_dockerfile() -> list:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    out = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False)
    return [] if out.returncode == 0 else [f"hadolint: {line}" for line in (out.stdout + out.stderr).splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", default=kubernetes_validate.utils.latest_version())
    parser.add_argument("--overlay", action="append", type=Path, help="check this kustomization alone (repeatable)")
    args = parser.parse_args()
    if args.overlay:
        overlays, problems = [p.resolve() for p in args.overlay], []
    else:
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
