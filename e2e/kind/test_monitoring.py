"""The operations the chart ships, on kind: a Prometheus server in a pod (Debian's prometheus, in an
image built here) finds the operator's and the brokers' pods by the ``prometheus.io`` annotations the
chart and the operator put on them (through a discovery sidecar: see ``DISCOVERY``), scrapes them at
the pods' addresses, and evaluates the chart's own alert rules
(``charts/zeps/files/zeps-rules.yaml``). Checked: both targets are up; a stream's publish counter
rises while a publisher Job runs; ``ZepsBrokerNotReady`` fires while the stream's broker cannot run,
and resolves once it runs again.

One change to the rules, made here and nowhere else: ``ZepsBrokerNotReady`` waits 10 s, not 5 min,
before firing (its real ``for:`` is tested by ``promtool test rules`` in ``make test``). How the
broker is taken down: scaling its Deployment to 0 does not keep it down — the operator applies the
stream's objects on every resync (about 3 s here) and scales it back — so the stream is pointed at an
image no node has (``imagePullPolicy: Never``): the Deployment, which recreates its one pod, then has
no broker running until the image is set back, as a bad image or a broken node would leave it."""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import Any

import yaml
from kindapp import OPERATOR_NAMESPACE, ROOT, App

PROMETHEUS_IMAGE = os.environ.get("ZEPS_E2E_PROMETHEUS_IMAGE", "")
RULES = ROOT / "charts" / "zeps" / "files" / "zeps-rules.yaml"
PUBLISHES = 25  # one `zeps stream publish` a second or so: the counter is seen rising while the Job runs

# Which pods ask to be scraped (prometheus.io/scrape), at the port and path they name: the convention the
# chart and the operator follow for a Prometheus without the Prometheus operator's PodMonitors. Debian's
# Prometheus is built without Kubernetes service discovery (its package drops client-go), so a sidecar
# in the zeps image lists the pods through the API and serves them to Prometheus's HTTP discovery, with
# the labels the prometheus-community chart's kubernetes-pods job gives (namespace, pod) and, as there,
# honor_labels: the operator's own ``namespace`` label (the resource's) is kept, not renamed.
DISCOVERY = """
import http.server, json
from kubernetes import client, config
config.load_incluster_config()
api = client.CoreV1Api()
class Targets(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        groups = []
        for pod in api.list_pod_for_all_namespaces(timeout_seconds=10).items:
            notes = pod.metadata.annotations or {}
            if notes.get("prometheus.io/scrape") == "true" and pod.status.pod_ip and pod.status.phase == "Running":
                groups.append({"targets": [pod.status.pod_ip + ":" + notes.get("prometheus.io/port", "80")],
                               "labels": {"__metrics_path__": notes.get("prometheus.io/path", "/metrics"),
                                          "namespace": pod.metadata.namespace, "pod": pod.metadata.name}})
        body = json.dumps(groups).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), Targets).serve_forever()
"""
CONFIG = {
    "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
    "rule_files": ["/etc/prometheus/zeps-rules.yaml"],
    "scrape_configs": [{
        "job_name": "zeps-pods",
        "honor_labels": True,
        "http_sd_configs": [{"url": "http://127.0.0.1:8000/targets", "refresh_interval": "3s"}],
    }],
}  # fmt: skip


def _rules() -> str:
    """The chart's rules, with ZepsBrokerNotReady's ``for`` cut to 10 s (see the module's docstring)."""
    rules = yaml.safe_load(RULES.read_text())
    found = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "ZepsBrokerNotReady"]
    assert len(found) == 1, "the chart's rules have no ZepsBrokerNotReady"
    found[0]["for"] = "10s"
    return yaml.safe_dump(rules)


def _prometheus(app: App) -> None:
    """Prometheus in the app's namespace, allowed to list pods in every namespace (a ClusterRole named
    after the namespace, removed by the test)."""
    name = f"{app.ns}-prometheus"
    app.cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": app.ns}]},
    ]}))  # fmt: skip
    app.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus"}})
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prometheus"},
               "data": {"prometheus.yml": yaml.safe_dump(CONFIG), "zeps-rules.yaml": _rules()}})  # fmt: skip
    container = {
        "name": "prometheus", "image": PROMETHEUS_IMAGE, "imagePullPolicy": "IfNotPresent",
        "args": ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
                 "--web.listen-address=:9090", "--storage.tsdb.retention.time=1h"],
        "ports": [{"containerPort": 9090, "name": "web"}],
        "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "web"}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus"},
                         {"name": "data", "mountPath": "/prometheus"}],
    }  # fmt: skip
    discovery = {**App.pod_spec("")["containers"][0], "name": "discovery", "command": ["python3", "-c", DISCOVERY]}
    app.apply({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "prometheus"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "prometheus"}},
                 "template": {"metadata": {"labels": {"app": "prometheus"}},
                              "spec": {"serviceAccountName": "prometheus", "containers": [container, discovery],
                                       "volumes": [{"name": "config", "configMap": {"name": "prometheus"}},
                                                   {"name": "data", "emptyDir": {}}]}}},
    })  # fmt: skip
    app.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "prometheus"},
               "spec": {"selector": {"app": "prometheus"}, "ports": [{"port": 9090, "name": "web"}]}})  # fmt: skip
    app.cluster.kubectl("rollout", "status", "deployment/prometheus", "-n", app.ns, "--timeout=180s", timeout=210)


def _api(app: App, path: str, **params: str) -> Any:
    """Prometheus's HTTP API, through the API server's service proxy (no port-forward)."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    raw = app.cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{app.ns}/services/prometheus:web/proxy{path}{query}")
    answer = json.loads(raw)
    assert answer["status"] == "success", answer
    return answer["data"]


def _value(app: App, query: str) -> float | None:
    result = _api(app, "/api/v1/query", query=query)["result"]
    return float(result[0]["value"][1]) if result else None


def _alerts(app: App, name: str) -> list[dict[str, Any]]:
    """This test's alerts called ``name``: of its own namespace only. The operator's metrics cover
    every stream in the cluster, and tests beside this one (``make e2e`` runs two at a time) take
    their own brokers down on purpose."""
    return [a for a in _api(app, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == name and a["labels"].get("namespace") == app.ns]  # fmt: skip


def test_prometheus_scrapes_zeps_by_its_annotations_and_the_broker_down_alert_fires(app: App) -> None:
    try:
        _scrape_and_alert(app)
    finally:
        app.cluster.kubectl("delete", "clusterrolebinding,clusterrole", f"{app.ns}-prometheus", "--ignore-not-found")


def _scrape_and_alert(app: App) -> None:
    _prometheus(app)
    app.apply_example("zepsstream.yaml", **{"size: 20Gi": "size: 1Gi"})
    app.ready("zepsstream", "prices", timeout=240)
    ns = app.ns

    def up(namespace: str) -> bool:
        return _value(app, f'max(up{{job="zeps-pods",namespace="{namespace}"}})') == 1

    app.cluster.wait_for("Prometheus scraping the operator and the broker",
                         lambda: up(OPERATOR_NAMESPACE) and up(ns), timeout=120)  # fmt: skip

    publishes = " ; ".join(f"zeps stream publish prices eu.fr.cac40 {i}" for i in range(PUBLISHES))
    app.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "publisher"},
               "spec": {"backoffLimit": 0, "template": {"spec": App.pod_spec(f"set -e ; {publishes}")}}})  # fmt: skip
    counter = f'sum(zeps_broker_messages_in_total{{namespace="{ns}",stream="prices"}})'
    seen: list[float] = []

    def rising() -> bool:
        running = (app.get("job", "publisher").get("status") or {}).get("active", 0) > 0
        value = _value(app, counter)
        if running and value:
            seen.append(value)
        return len(seen) >= 2 and seen[-1] > seen[0]

    app.cluster.wait_for("the publish counter rising while the publisher Job runs", rising, timeout=180,
                         interval=2)  # fmt: skip
    app.cluster.kubectl("wait", "--for=condition=complete", "job/publisher", "-n", ns, "--timeout=180s", timeout=210)
    app.cluster.wait_for(f"the counter at {PUBLISHES}", lambda: _value(app, counter) == PUBLISHES, timeout=60)
    assert not _alerts(app, "ZepsBrokerNotReady"), "no alert while the broker serves"

    missing = "zeps.local/no-such-image:0"  # never pulled (pullPolicy Never on kind): the broker cannot start
    app.cluster.kubectl("patch", "zepsstream", "prices", "-n", ns, "--type=merge", "-p",
                        json.dumps({"spec": {"image": missing}}))  # fmt: skip
    began = time.monotonic()

    def firing() -> bool:
        return any(a["state"] == "firing" and a["labels"].get("stream") == "prices"
                   for a in _alerts(app, "ZepsBrokerNotReady"))  # fmt: skip

    app.cluster.wait_for("ZepsBrokerNotReady firing", firing, timeout=180, interval=2)
    print(json.dumps({"scenario": "alert", "broken_to_firing_s": round(time.monotonic() - began, 1)}))
    app.cluster.kubectl("patch", "zepsstream", "prices", "-n", ns, "--type=json", "-p",
                        json.dumps([{"op": "remove", "path": "/spec/image"}]))  # fmt: skip
    app.ready("zepsstream", "prices", timeout=240)
    app.cluster.wait_for("ZepsBrokerNotReady resolved", lambda: not _alerts(app, "ZepsBrokerNotReady"), timeout=120,
                         interval=2)  # fmt: skip
