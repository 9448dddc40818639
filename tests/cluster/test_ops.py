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
                   "kvgate_ratelimit_rejections_total", "kvgate_ratelimit_redis_down",
                   "kvgate_usage_spend_usd_total"):  # fmt: skip
        assert needed in panels


def test_compose_runs_two_workers_behind_the_gateway() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    workers = [n for n, s in services.items() if s.get("command", [None])[0] == "worker"]
    assert len(workers) == 2
    env = services["gateway"]["environment"]
    assert env["KVGATE_WORKERS"] == ",".join(f"http://{w}:8100" for w in workers)
    assert env["KVGATE_WORKER_TOKEN"] == services[workers[0]]["environment"]["KVGATE_WORKER_TOKEN"]


def _policy(name: str) -> dict[str, Any]:
    (policy,) = [p for p in by_kind("NetworkPolicy") if p["metadata"]["name"] == name]
    return policy


def test_network_policies_keep_workers_and_metrics_internal() -> None:
    """Workers: only gateway pods, only the worker port. Gateways: the API port from anywhere,
    the metrics port from the monitoring namespace only. No Service exposes the metrics port."""
    (sts,) = by_kind("StatefulSet")
    (gw,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "kvgate-gateway"]
    worker_labels = sts["spec"]["template"]["metadata"]["labels"]
    gateway_labels = gw["spec"]["template"]["metadata"]["labels"]
    worker = _policy("kvgate-worker")["spec"]
    assert worker["podSelector"]["matchLabels"].items() <= worker_labels.items()
    assert worker["policyTypes"] == ["Ingress"]
    (rule,) = worker["ingress"]
    (source,) = rule["from"]
    assert set(source) == {"podSelector"}  # this namespace's pods, no namespace or IP range
    assert source["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    assert not source["podSelector"]["matchLabels"].items() <= worker_labels.items()
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert [p["port"] for p in rule["ports"]] == [p["containerPort"] for p in c["ports"]]

    gateway = _policy("kvgate-gateway")["spec"]
    assert gateway["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    assert gateway["policyTypes"] == ["Ingress"]
    ports = {
        p["name"]: p["containerPort"]
        for p in gw["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    by_port = {p["port"]: r.get("from") for r in gateway["ingress"] for p in r["ports"]}
    assert set(by_port) == {ports["http"], ports["metrics"]}
    assert by_port[ports["http"]] is None  # the API: from anywhere
    (monitoring,) = by_port[ports["metrics"]]
    assert set(monitoring) == {"namespaceSelector"}
    assert monitoring["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    for svc in by_kind("Service"):
        for port in svc["spec"].get("ports", []):
            assert ports["metrics"] not in (port["port"], port.get("targetPort"))
            assert port.get("targetPort") != "metrics"


def test_secret_placeholders_are_too_short_to_start_with() -> None:
    """A secrets.yaml applied unedited must not run with a well-known token: its placeholders
    fail the gateway's and worker's minimum lengths (start-up error naming the variable)."""
    from gateway.settings import Settings, SettingsError

    (secret,) = by_kind("Secret")
    data = secret["stringData"]
    with pytest.raises(SettingsError, match="KVGATE_WORKER_TOKEN"):
        Settings.from_env({"KVGATE_WORKER_TOKEN": data["KVGATE_WORKER_TOKEN"]})
    with pytest.raises(SettingsError, match="KVGATE_ADMIN_TOKEN"):
        Settings.from_env({"KVGATE_ADMIN_TOKEN": data["KVGATE_ADMIN_TOKEN"]})
    with pytest.raises(SettingsError, match="KVGATE_SECRETS_KEY"):
        Settings.from_env({"KVGATE_SECRETS_KEY": data["KVGATE_SECRETS_KEY"]})


def test_compose_publishes_only_the_api_and_needs_a_generated_worker_token() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name, svc in services.items():
        for port in svc.get("ports", []):
            if name == "gateway":
                assert port == "8000:8000"  # the API only: never the metrics port
            elif name == "gateway-vllm":
                assert port == "8001:8000"  # the vllm profile's gateway: its API only
            else:  # monitoring UIs show every tenant's series: the host's loopback only
                assert port.startswith("127.0.0.1:"), (name, port)
    workers = [n for n, s in services.items() if s.get("command", [None])[0] == "worker"]
    for w in workers:
        assert "ports" not in services[w]
        token = services[w]["environment"]["KVGATE_WORKER_TOKEN"]
        assert re.fullmatch(r"\$\{KVGATE_WORKER_TOKEN:\?[^}]+\}", token), token  # no default


def test_deployments_open_one_worker_port_for_probes_and_calls() -> None:
    """The gateways' calls go over the worker's own port (the transport is a WebSocket on the
    probes' server): the StatefulSet, its Service, the NetworkPolicy and compose carry that port
    and no other, so nothing else of a worker is reachable."""
    (sts,) = by_kind("StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    port = int(c["args"][c["args"].index("--port") + 1])
    assert c["ports"] == [{"name": "internal", "containerPort": port}]
    (svc,) = [s for s in by_kind("Service") if s["metadata"]["name"] == "kvgate-worker"]
    assert svc["spec"]["ports"] == [{"name": "internal", "port": port, "targetPort": "internal"}]
    (rule,) = _policy("kvgate-worker")["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    workers = [s for s in compose["services"].values() if s.get("command", [None])[0] == "worker"]
    assert workers and all(w["expose"] == [str(port)] for w in workers)


# -- the vLLM-backed variant (ops/k8s/vllm/, compose profile "vllm") --------------------------
K8S_VLLM = K8S / "vllm"


def vllm_manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S_VLLM.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _vllm(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in vllm_manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _settings_names() -> set[str]:
    from gateway.settings import VARIABLES

    return {v.name for v in VARIABLES}


def test_vllm_manifests_validate_against_the_kubernetes_schemas() -> None:
    docs = vllm_manifests()
    assert {d["kind"] for d in docs} >= {"StatefulSet", "Deployment", "ConfigMap", "Service"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return value


def test_vllm_statefulset_serves_with_tensor_parallelism_and_kv_events() -> None:
    sts = _vllm("StatefulSet", "kvgate-vllm")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    tp = int(_flag(args, "--tensor-parallel-size"))
    assert c["resources"]["limits"]["nvidia.com/gpu"] == tp >= 2
    assert "--enable-prompt-tokens-details" in args and "--enable-prefix-caching" in args
    events = json.loads(_flag(args, "--kv-events-config"))
    assert events["enable_kv_cache_events"] and events["publisher"] == "zmq"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert events["endpoint"] == f"tcp://*:{ports['kv-events']}"  # "*": the publisher binds
    assert events["replay_endpoint"] == f"tcp://*:{ports['kv-replay']}"
    assert _flag(args, "--scheduling-policy") == "priority"
    env = {e["name"]: e for e in c["env"]}
    key = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert key == {"name": "kvgate-secrets", "key": "KVGATE_WORKER_TOKEN"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    svc = _vllm("Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None"  # one DNS name per pod: kvgate-vllm-0.kvgate-vllm
    assert {p["port"] for p in svc["spec"]["ports"]} == set(ports.values())
    policy = _vllm("NetworkPolicy", "kvgate-vllm")["spec"]
    (rule,) = policy["ingress"]
    assert {p["port"] for p in rule["ports"]} == set(ports.values())
    assert rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kvgate-gateway"}}}
    ]


def test_vllm_gateway_is_the_slim_image_configured_for_the_servers() -> None:
    sts = _vllm("StatefulSet", "kvgate-vllm")
    gw = _vllm("Deployment", "kvgate-gateway")
    pod = gw["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"].startswith("kvgate-gateway:")  # the slim image, no torch
    config = _vllm("ConfigMap", "kvgate-vllm-config")["data"]
    assert [s["configMapRef"]["name"] for s in c["envFrom"] if "configMapRef" in s][-1] == (
        "kvgate-vllm-config"
    )  # the last source wins: KVGATE_WORKERS here, not the kvgate variant's
    assert config["KVGATE_BACKEND"] == "vllm"
    pods = [f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}" for i in range(2)]
    assert sts["spec"]["replicas"] == 2
    assert config["KVGATE_WORKERS"] == ",".join(f"http://{p}:8000" for p in pods)
    events = [e.split("|") for e in config["KVGATE_KV_EVENTS"].split(",")]
    assert events == [[f"tcp://{p}:5557", f"tcp://{p}:5558"] for p in pods]  # the same order
    token = {e["name"]: e for e in c["env"]}["KVGATE_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token == {"name": "kvgate-secrets", "key": "KVGATE_WORKER_TOKEN"}
    # the tokenizer from the volume the servers load the model from
    mount = {m["name"]: m for m in c["volumeMounts"]}["models"]
    assert config["KVGATE_MODEL"].startswith(mount["mountPath"] + "/") and mount["readOnly"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
    server_claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in sts["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == server_claims == {"kvgate-models"}
    served = _flag(sts["spec"]["template"]["spec"]["containers"][0]["args"], "--model")
    assert served == config["KVGATE_MODEL"]
    names = {k for k in config if k.startswith("KVGATE_")} | {e["name"] for e in c["env"]}
    assert names <= _settings_names(), names - _settings_names()


def test_compose_vllm_profile_puts_the_gateway_in_front_of_two_servers() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    servers = [n for n, s in services.items() if "vllm" in s.get("profiles", []) and "image" in s]
    assert len(servers) == 2
    gw = services["gateway-vllm"]
    assert gw["profiles"] == ["vllm"] and gw["build"]["target"] == "gateway"
    env = gw["environment"]
    assert env["KVGATE_BACKEND"] == "vllm"
    assert env["KVGATE_WORKERS"] == ",".join(f"http://{s}:8000" for s in servers)
    events = [e.split("|")[0] for e in env["KVGATE_KV_EVENTS"].split(",")]
    assert events == [f"tcp://{s}:5557" for s in servers]
    for s in servers:
        assert services[s]["environment"]["VLLM_API_KEY"] == env["KVGATE_WORKER_TOKEN"]
        assert "ports" not in services[s]
        assert "--enable-prompt-tokens-details" in services[s]["command"]
    names = {k for k in env if k.startswith("KVGATE_")}
    assert names <= _settings_names(), names - _settings_names()
    # the default profile is unchanged: `docker compose up` starts no vLLM server
    assert all(services[n].get("profiles") for n in [*servers, "gateway-vllm"])
