"""Deployment files: Kubernetes manifests against the schemas, alert rules with promtool, the
Grafana dashboard's queries, and the compose file's workers."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "ops" / "k8s"
ALERTS = ROOT / "ops" / "alerts"
DASHBOARD = ROOT / "ops" / "grafana" / "dashboards" / "kvgate.json"
K8S_VERSION = "1.30"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian: prometheus)")


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in manifests() if d["kind"] == kind]


def test_every_manifest_validates_against_the_kubernetes_schemas() -> None:
    docs = manifests()
    assert len(docs) >= 10
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_gateway_probes_scrape_and_scaling() -> None:
    (gw,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "kvgate-gateway"]
    pod = gw["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    port = pod["metadata"]["annotations"]["prometheus.io/port"]
    assert {"name": "metrics", "containerPort": int(port)} in c["ports"]
    (hpa,) = by_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "kvgate-gateway"
    pdbs = {
        p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        for p in by_kind("PodDisruptionBudget")
    }
    assert pdbs == {"kvgate-gateway", "kvgate-worker"}
    config = {k: v for d in by_kind("ConfigMap") for k, v in d["data"].items()}
    assert config["KVGATE_WORKERS"] == "http://kvgate-worker:8100"


def test_workers_are_a_gpu_statefulset_behind_a_headless_service() -> None:
    (sts,) = by_kind("StatefulSet")
    svc = next(s for s in by_kind("Service") if s["metadata"]["name"] == sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None"
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["args"][:1] == ["worker"]
    env = {e["name"]: e for e in c["env"]}
    assert env["KVGATE_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["KVGATE_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "kvgate-secrets"
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    externals = {
        s["metadata"]["name"] for s in by_kind("Service") if s["spec"].get("type") == "ExternalName"
    }
    assert externals == {"kvgate-postgres", "kvgate-redis"}


@needs_promtool
def test_alert_rules_pass_promtool_check_and_unit_tests() -> None:
    for args in (
        ["check", "rules", "kvgate.rules.yml"],
        ["test", "rules", "kvgate.rules.test.yml"],
    ):
        run = subprocess.run([PROMTOOL, *args], cwd=ALERTS, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


@needs_promtool
def test_dashboard_queries_parse(tmp_path: Path) -> None:
    exprs = _dashboard_exprs()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)
    ]}]}  # fmt: skip
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    run = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_dashboard_and_alerts_use_metrics_the_gateway_exports() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "gateway").rglob("*.py"))
    exported = set(re.findall(r'"(kvgate_[a-z_]+)"', source))
    rules = (ALERTS / "kvgate.rules.yml").read_text()
    used = set(re.findall(r"\b(kvgate_[a-z_]+)", " ".join(_dashboard_exprs()) + rules))
    for name in used:
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert base in exported, name
    panels = " ".join(_dashboard_exprs())
    for needed in ("kvgate_ttft_seconds_bucket", "kvgate_worker_pinned_tenants",
                   "kvgate_ratelimit_rejections_total", "kvgate_ratelimit_redis_down"):  # fmt: skip
        assert needed in panels


def test_compose_runs_two_workers_behind_the_gateway() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    workers = [n for n, s in services.items() if s.get("command", [None])[0] == "worker"]
    assert len(workers) == 2
    env = services["gateway"]["environment"]
    assert env["KVGATE_WORKERS"] == ",".join(f"http://{w}:8100" for w in workers)
    assert env["KVGATE_WORKER_TOKEN"] == services[workers[0]]["environment"]["KVGATE_WORKER_TOKEN"]
