"""The Helm chart: linted, rendered, validated by values.schema.json, installed into the control plane."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from zeps.resources import ZOOKEEPER_CLIENT_LABEL
from zeps_dev import ControlPlane
from zeps_dev.controlplane import binaries_dir
from zeps_dev.process import wait_until

CHART = Path(__file__).resolve().parents[2] / "charts" / "zeps"
KUBE = "1.33.13"  # a helm built from source defaults to v1.20 when it renders without a cluster


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binaries_dir() / "helm"), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_lint_and_render() -> None:
    lint = _helm("lint", "--strict", str(CHART), "--set", "zookeeper.connect=zk:2181")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = _helm("template", "z", str(CHART), "--kube-version", KUBE, "--set", "zookeeper.ensemble.enabled=true")
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    # 3 dashboard ConfigMaps; the ensemble's PodDisruptionBudget
    # the ensemble's quorum password (a Secret)
    expected = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "ConfigMap", "ConfigMap", "Deployment", "Lease",
                "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount",
                "StatefulSet"]  # fmt: skip
    assert kinds == expected
    cluster_rules = next(d for d in docs if d["kind"] == "ClusterRole")["rules"]
    assert not any("leases" in r["resources"] for r in cluster_rules), "Leases only in the release's namespace"
    operator = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ZEPS_ZOOKEEPER"] == ",".join(f"z-zookeeper-{i}.z-zookeeper.default.svc:2181" for i in range(3))
    # the installation's one cleaner Lease: the chart makes it (helm uninstall removes it), the operator holds it
    lease = next(d for d in docs if d["kind"] == "Lease")
    assert env["ZEPS_CLEANER_LEASE"] == lease["metadata"]["name"] == "z-operator-cleaner"
    assert "POD_NAMESPACE" in env
    # an upgrade replaces the operator: never two versions at once, each setting the brokers' template
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    pod = operator["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
    rules = next(d for d in docs if d["kind"] == "ClusterRole")["rules"]
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules), "least privilege: no wildcards"
    budget = next(d for d in docs if d["kind"] == "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1, "one ZooKeeper server at a time: the quorum holds"
    assert budget["selector"]["matchLabels"]["app.kubernetes.io/name"] == "zookeeper"
    ensemble = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    assert ensemble["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "512Mi"}
    assert [c["topologyKey"] for c in ensemble["topologySpreadConstraints"]] == ["topology.kubernetes.io/zone"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == operator["spec"]["selector"]["matchLabels"]
    assert pod["containers"][0]["resources"]["requests"], "every pod the chart makes requests resources"
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == [
        "queues.zeps.dev.yaml", "topics.zeps.dev.yaml", "zepsstreams.zeps.dev.yaml"]  # fmt: skip


def test_the_zookeeper_servers_keep_to_nodes_of_their_own() -> None:
    """Preferred by default (a one-node cluster still runs its three servers); required on request."""

    def anti_affinity(*values: str) -> dict[str, object]:
        args = ["template", "z", str(CHART), "--kube-version", KUBE, "--set", "zookeeper.ensemble.enabled=true"]
        rendered = _helm(*args, *(a for v in values for a in ("--set", v)))
        assert rendered.returncode == 0, rendered.stderr
        zookeeper = next(d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "StatefulSet")
        return dict(zookeeper["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"])

    servers = {"matchLabels": {"app.kubernetes.io/name": "zookeeper", "app.kubernetes.io/instance": "z"}}
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": servers}
    assert anti_affinity() == {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
    }
    assert anti_affinity("zookeeper.ensemble.antiAffinity=required") == {
        "requiredDuringSchedulingIgnoredDuringExecution": [term]
    }
    bad = _helm("template", "z", str(CHART), "--kube-version", KUBE, "--set", "zookeeper.ensemble.enabled=true",
                "--set", "zookeeper.ensemble.antiAffinity=always")  # fmt: skip
    assert bad.returncode != 0 and "antiAffinity" in bad.stderr


def test_monitoring_objects_render_only_where_their_crds_exist() -> None:
    """The dashboards are ConfigMaps with Grafana's sidecar label. The PrometheusRule carries
    files/zeps-rules.yaml as it is (one source for the plain rules file
    and the CRD); the PodMonitors select the operator's pods and every broker pod; none of them is
    rendered for a cluster without monitoring.coreos.com/v1 (it would refuse them), and the pods keep
    their prometheus.io annotations either way."""
    base = ["template", "z", str(CHART), "--kube-version", KUBE, "--set", "zookeeper.connect=zk:2181"]
    plain = [d for d in yaml.safe_load_all(_helm(*base).stdout) if d]
    assert not [d for d in plain if d["kind"] in ("PrometheusRule", "PodMonitor")]
    operator = next(d for d in plain if d["kind"] == "Deployment")
    assert operator["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9101"
    apis = ("--api-versions", "monitoring.coreos.com/v1/PrometheusRule", "--api-versions",
            "monitoring.coreos.com/v1/PodMonitor")  # fmt: skip
    rendered = [
        d for d in yaml.safe_load_all(_helm(*base, *apis, "--set", "monitoring.labels.release=kps").stdout) if d
    ]
    rule = next(d for d in rendered if d["kind"] == "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "zeps-rules.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "kps"
    monitors = {d["metadata"]["name"]: d["spec"] for d in rendered if d["kind"] == "PodMonitor"}
    assert monitors["z-brokers"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "zeps-broker"
    assert monitors["z-brokers"]["namespaceSelector"] == {"any": True}
    # the operator's own namespace label (the resource's) wins over the target's (the operator pod's)
    assert monitors["z-operator"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics",
                                                              "honorLabels": True}]  # fmt: skip
    assert monitors["z-brokers"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics"}]
    dashboards = {
        d["metadata"]["name"]: d for d in plain if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    }
    assert sorted(dashboards) == ["z-dashboard-operator", "z-dashboard-queues-topics", "z-dashboard-streams"]
    for config_map in dashboards.values():
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        (body,) = config_map["data"].values()
        assert json.loads(body)["tags"] == ["zeps"]
    off = [d for d in yaml.safe_load_all(_helm(*base, *apis, "--set", "monitoring.rules=false").stdout) if d]
    assert not [d for d in off if d["kind"] == "PrometheusRule"]


def _objects(*args: str, chart: Path = CHART) -> list[dict[str, Any]]:
    rendered = _helm("template", "z", str(chart), "--kube-version", KUBE, *args)
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def test_the_ensemble_s_servers_authenticate_each_other_with_a_password_the_chart_makes() -> None:
    """quorumAuth (on by default): each server gets the quorum identity from the chart's Secret (a
    random password of 32 letters and digits), or from the one named; the mode goes to the launcher;
    off, neither the Secret nor the variables."""

    def quorum(*values: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        docs = _objects("--set", "zookeeper.ensemble.enabled=true", *(a for v in values for a in ("--set", v)))
        ensemble = next(d for d in docs if d["kind"] == "StatefulSet")
        env = {e["name"]: e for e in ensemble["spec"]["template"]["spec"]["containers"][0]["env"]}
        return env, [d for d in docs if d["kind"] == "Secret"]

    env, secrets = quorum()
    (secret,) = secrets
    assert secret["metadata"]["name"] == "z-zookeeper-quorum"
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert len(password) == 32 and password.isalnum()
    for name, key in (("ZOO_QUORUM_USER", "user"), ("ZOO_QUORUM_PASSWORD", "password")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "z-zookeeper-quorum", "key": key}
    assert env["ZOO_QUORUM_AUTH"]["value"] == "require"
    env, secrets = quorum(
        "zookeeper.ensemble.quorumAuth.existingSecret=mine", "zookeeper.ensemble.quorumAuth.mode=accept"
    )
    assert not secrets and env["ZOO_QUORUM_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "mine"
    assert env["ZOO_QUORUM_AUTH"]["value"] == "accept"
    env, secrets = quorum("zookeeper.ensemble.quorumAuth.enabled=false")
    assert not secrets and not any(name.startswith("ZOO_QUORUM") for name in env)


def test_a_release_from_before_quorum_authentication_upgraded_with_reuse_values_keeps_its_ensemble(
    tmp_path: Path,
) -> None:
    """``helm upgrade --reuse-values`` (the upgrade the docs give) renders the new chart with the old
    release's values alone: helm leaves the new chart's defaults out. A release from before
    ``quorumAuth`` (and ``tls``, ``networkPolicy``) then has none: the chart renders (no nil
    pointer), and its servers run as they did, without quorum authentication or TLS (turning either
    on takes the three steps of the CHANGELOG; straight to ``require``, the roll would wait for ever
    for the first restarted server)."""
    old = yaml.safe_load((CHART / "values.yaml").read_text())
    del old["zookeeper"]["ensemble"]["quorumAuth"], old["zookeeper"]["auth"]["required"]
    del old["zookeeper"]["ensemble"]["tls"], old["zookeeper"]["ensemble"]["networkPolicy"]
    old["zookeeper"]["ensemble"]["enabled"] = True
    chart = tmp_path / "zeps"
    shutil.copytree(CHART, chart)
    (chart / "values.yaml").write_text(yaml.safe_dump(old))  # what helm renders with: the old values only
    docs = _objects(chart=chart)
    ensemble = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    assert not any(e["name"].startswith(("ZOO_QUORUM", "ZOO_TLS")) for e in ensemble["containers"][0]["env"])
    assert not [d for d in docs if d["kind"] in ("Secret", "NetworkPolicy")]


def test_the_production_values_need_the_operator_s_identity_and_harden_the_ensemble() -> None:
    """values-production.yaml: without the operator's ZooKeeper identity the chart refuses to render,
    naming the values to set; with it, ACLs (the identity), quotas, the servers on nodes of their own,
    quorum authentication required, TLS between the servers and to them, the chart's own image only."""
    production = ("-f", str(CHART / "values-production.yaml"))
    refused = _helm("template", "z", str(CHART), "--kube-version", KUBE, *production)
    assert refused.returncode != 0 and "set zookeeper.auth.existingSecret" in refused.stderr, refused.stderr
    docs = _objects(*production, "--set", "zookeeper.auth.existingSecret=zeps-zookeeper-auth")
    ensemble = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in ensemble["containers"][0]["env"]}
    assert env["ZOO_SUPER_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "zeps-zookeeper-auth"
    assert env["ZOO_QUORUM_AUTH"]["value"] == "require"
    assert "requiredDuringSchedulingIgnoredDuringExecution" in ensemble["affinity"]["podAntiAffinity"]
    operator = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    values = {e["name"]: e.get("value") for e in operator["env"]}
    assert values["ZEPS_ALLOWED_BROKER_IMAGES"] == values["ZEPS_PRIVILEGED_NAMESPACES"] == ""
    assert values["ZEPS_NAMESPACE_QUOTA_NODES"] == "50000", values
    assert any(d["kind"] == "NetworkPolicy" for d in docs), "production keeps strangers' pods off ZooKeeper"
    assert env["ZOO_TLS_DIR"]["value"] == "/etc/zookeeper/tls" and env["ZOO_QUORUM_TLS"]["value"] == "require"
    assert env["ZOO_CLIENT_TLS"]["value"] == "require", "clients speak TLS to the servers too"
    assert values["ZEPS_ZOOKEEPER"].endswith(".svc:2281") and values["ZEPS_ZOOKEEPER_CA"], values


def test_the_ensemble_s_servers_peer_over_tls_with_certificates_the_chart_makes(tmp_path: Path) -> None:
    """zookeeper.ensemble.tls: a Secret with a CA and one certificate (Helm's genCA and
    genSignedCert) naming every server under the ensemble's Service, for server and client use, mounted
    read-only where zookeeper-run reads it; or the Secret named in existingSecret, and none made. The
    launcher's use of it runs against real servers: tests/integration/test_zookeeper_quorum_auth.py."""
    docs = _objects("--set", "zookeeper.ensemble.enabled=true", "--set", "zookeeper.ensemble.tls.enabled=true",
                    "--namespace", "zk")  # fmt: skip
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "z-zookeeper-tls"]
    assert secret["type"] == "kubernetes.io/tls"
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    extensions = ["-noout", "-ext", "subjectAltName,extendedKeyUsage"]
    shown = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "tls.crt"), *extensions],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "DNS:*.z-zookeeper.zk.svc, DNS:*.z-zookeeper.zk.svc.cluster.local" in shown, shown
    assert "TLS Web Server Authentication, TLS Web Client Authentication" in shown, shown
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")],
                              capture_output=True, text=True, check=False)  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    pod = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["ZOO_TLS_DIR"] == "/etc/zookeeper/tls" and env["ZOO_QUORUM_TLS"] == "require"
    assert {"name": "tls", "mountPath": "/etc/zookeeper/tls", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "z-zookeeper-tls", "defaultMode": 0o440}} in pod["volumes"]
    theirs = _objects("--set", "zookeeper.ensemble.enabled=true", "--set", "zookeeper.ensemble.tls.enabled=true",
                      "--set", "zookeeper.ensemble.tls.existingSecret=mine", "--set",
                      "zookeeper.ensemble.tls.quorumMode=accept")  # fmt: skip
    assert not [d for d in theirs if d["kind"] == "Secret" and "tls" in d["metadata"]["name"]]
    pod = next(d for d in theirs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "mine", "defaultMode": 0o440}} in pod["volumes"]
    assert {"name": "ZOO_QUORUM_TLS", "value": "accept"} in pod["containers"][0]["env"]


def test_with_client_tls_the_operator_reaches_the_servers_on_their_tls_port_with_the_ca_alone() -> None:
    """zookeeper.ensemble.tls.clientMode (accept, require): the servers serve clients on 2281 too
    (ZOO_CLIENT_TLS; require keeps the plain port on 127.0.0.1), the Service and the NetworkPolicy
    open 2281, and the operator's connect string names 2281 with ZEPS_ZOOKEEPER_CA, the CA of the
    chart's Secret mounted alone (never the servers' key). Off, or without tls.enabled: 2181, no CA.
    An external ensemble's CA comes from the Secret ``zookeeper.caSecret`` names.
    The SDK, the brokers and the servers over TLS: tests/integration/test_zookeeper_client_tls.py and
    the kind suite, which runs with values-production.yaml (clientMode require)."""
    ensemble = ("--set", "zookeeper.ensemble.enabled=true", "--set", "zookeeper.ensemble.tls.enabled=true",
                "--set", "zookeeper.ensemble.networkPolicy.enabled=true", "--namespace", "zk")  # fmt: skip
    for mode in ("accept", "require"):
        docs = _objects(*ensemble, "--set", f"zookeeper.ensemble.tls.clientMode={mode}")
        servers = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in servers["env"]}
        assert (env["ZOO_CLIENT_TLS"], env["ZOO_SECURE_CLIENT_PORT"]) == (mode, "2281")
        assert {"name": "client-tls", "containerPort": 2281} in servers["ports"]
        service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "z-zookeeper")
        assert {"name": "client-tls", "port": 2281} in service["spec"]["ports"]
        _, clients = next(d for d in docs if d["kind"] == "NetworkPolicy")["spec"]["ingress"]
        assert clients["ports"] == [{"protocol": "TCP", "port": 2181}, {"protocol": "TCP", "port": 2281}]
        operator = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
        values = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
        assert values["ZEPS_ZOOKEEPER"] == ",".join(f"z-zookeeper-{i}.z-zookeeper.zk.svc:2281" for i in range(3))
        assert values["ZEPS_ZOOKEEPER_CA"] == "/etc/zeps/zookeeper-ca/ca.crt"
        only_the_ca = [{"key": "ca.crt", "path": "ca.crt"}]
        ca = {"name": "zookeeper-ca", "secret": {"secretName": "z-zookeeper-tls", "items": only_the_ca}}
        assert ca in operator["volumes"]
        mount = {"name": "zookeeper-ca", "mountPath": "/etc/zeps/zookeeper-ca", "readOnly": True}
        assert mount in operator["containers"][0]["volumeMounts"]
    tls_off = ("--set", "zookeeper.ensemble.tls.enabled=false", "--set", "zookeeper.ensemble.tls.clientMode=require")
    for off in (("--set", "zookeeper.ensemble.tls.clientMode=off"), tls_off):
        docs = _objects(*ensemble, *off)
        operator = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
        values = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
        assert values["ZEPS_ZOOKEEPER"].endswith(".svc:2181") and "ZEPS_ZOOKEEPER_CA" not in values, off
        servers = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
        assert "ZOO_CLIENT_TLS" not in {e["name"] for e in servers["env"]}, off
    refused = _helm("template", "z", str(CHART), "--kube-version", KUBE, *ensemble,
                    "--set", "zookeeper.ensemble.tls.clientMode=on")  # fmt: skip
    assert refused.returncode != 0 and "clientMode" in refused.stderr, refused.stderr
    # an external ensemble over TLS: its CA from the Secret zookeeper.caSecret names
    docs = _objects("--set", "zookeeper.connect=zk-0.zk:2281", "--set", "zookeeper.caSecret=zk-ca")
    operator = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    values = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
    assert (values["ZEPS_ZOOKEEPER"], values["ZEPS_ZOOKEEPER_CA"]) == ("zk-0.zk:2281", "/etc/zeps/zookeeper-ca/ca.crt")
    assert {"name": "zookeeper-ca", "secret": {"secretName": "zk-ca", "items": only_the_ca}} in operator["volumes"]


def test_the_ensemble_s_network_policy_admits_the_servers_the_operator_and_labelled_clients() -> None:
    """zookeeper.ensemble.networkPolicy: the servers on every port; on the client port only the
    operator, every pod of a namespace with the SDK's label (ZOOKEEPER_CLIENT_LABEL), pods with it in
    any namespace (unless labelledPods is false), and the peers listed in extraFrom. The operator's
    pods carry the label (the brokers get it from the operator: tests/unit/test_plan.py); the
    enforcement itself is tested on kind."""
    docs = _objects("--set", "zookeeper.ensemble.enabled=true")
    assert not any(d["kind"] == "NetworkPolicy" for d in docs), "off by default: it needs clients labelled"
    nodes = {"ipBlock": {"cidr": "172.18.0.0/16"}}
    policy_values = "zookeeper.ensemble.networkPolicy"
    docs = _objects("--set", "zookeeper.ensemble.enabled=true", "--set", f"{policy_values}.enabled=true",
                    "--set-json", f"{policy_values}.extraFrom=[{json.dumps(nodes)}]")  # fmt: skip
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")["spec"]
    servers = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"] == servers and policy["policyTypes"] == ["Ingress"]
    peers, clients = policy["ingress"]
    assert peers == {"from": [{"podSelector": {"matchLabels": servers}}]}, "servers reach each other on every port"
    label = {ZOOKEEPER_CLIENT_LABEL: "true"}
    operator = next(d for d in docs if d["kind"] == "Deployment")["spec"]
    namespaces = {"namespaceSelector": {"matchLabels": label}}
    labelled_pods = {"namespaceSelector": {}, "podSelector": {"matchLabels": label}}
    assert clients["from"] == [{"podSelector": operator["selector"]}, namespaces, labelled_pods, nodes]
    assert clients["ports"] == [{"protocol": "TCP", "port": 2181}]
    assert operator["template"]["metadata"]["labels"][ZOOKEEPER_CLIENT_LABEL] == "true"
    assert ZOOKEEPER_CLIENT_LABEL not in operator["selector"]["matchLabels"]
    # the stricter choice: namespaces only, whatever a tenant labels its pods
    strict = _objects("--set", "zookeeper.ensemble.enabled=true", "--set", f"{policy_values}.enabled=true",
                      "--set", f"{policy_values}.labelledPods=false")  # fmt: skip
    _, clients = next(d for d in strict if d["kind"] == "NetworkPolicy")["spec"]["ingress"]
    assert clients["from"] == [{"podSelector": operator["selector"]}, namespaces]


def test_bad_values_are_refused_clearly() -> None:
    missing = _helm("template", "z", str(CHART), "--kube-version", KUBE)
    assert missing.returncode != 0 and "set zookeeper.connect" in missing.stderr
    bad = _helm("template", "z", str(CHART), "--kube-version", KUBE, "--set", "zookeeper.connect=zk:2181",
                "--set", "operator.replicas=9")  # fmt: skip
    assert bad.returncode != 0 and "/operator/replicas" in bad.stderr


def test_installs_into_the_control_plane(
    control_plane: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    kubeconfig = str(control_plane.kubeconfig)
    result = _helm("install", "zeps", str(CHART), "--namespace", namespace, "--kubeconfig", kubeconfig,
                   "--set", "zookeeper.connect=zk.example:2181", "--set", f"operator.cluster={namespace}",
                   "--wait", "--timeout", "90s")  # fmt: skip
    assert result.returncode == 0, result.stderr
    deployment = client.AppsV1Api(kube_api).read_namespaced_deployment("zeps-operator", namespace)
    assert deployment.status is not None and deployment.status.available_replicas == 1  # kwok runs the pod
    assert client.CoreV1Api(kube_api).read_namespaced_service_account("zeps-operator", namespace)
    for name in ("topics", "queues", "zepsstreams"):
        assert f"{name}.zeps.dev" in control_plane.kubectl("get", "crd", "-o", "name")
    # the operator's ServiceAccount may renew its installation's cleaner Lease, and no other Lease
    sa = f"system:serviceaccount:{namespace}:zeps-operator"
    can = control_plane.kubectl("auth", "can-i", "update", "lease/zeps-operator-cleaner", "-n", namespace, "--as", sa)
    assert can.strip() == "yes"
    other = control_plane.kubectl("auth", "can-i", "update", "lease/other", "-n", namespace, "--as", sa, check=False)
    assert other.strip() == "no"
    assert client.CoordinationV1Api(kube_api).read_namespaced_lease("zeps-operator-cleaner", namespace)
    _helm("uninstall", "zeps", "--namespace", namespace, "--kubeconfig", kubeconfig)
    assert not client.CoordinationV1Api(kube_api).list_namespaced_lease(namespace).items  # helm took it away


def test_the_operator_cannot_mint_a_service_account_token_through_a_secret_it_may_read(
    control_plane: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    """RBAC lets the operator create Secrets anywhere and read back two names: as its ServiceAccount,
    creating a kubernetes.io/service-account-token Secret named zeps-curve (the token controller would
    fill in another account's token, and the operator could read it) is refused by the chart's
    admission policy, as is an Opaque Secret without its label; its own kind of Secret is admitted.
    Before, the first two were created. It may patch only Secrets that carry its label already."""
    kubeconfig = str(control_plane.kubeconfig)
    result = _helm("install", "zeps", str(CHART), "--namespace", namespace, "--kubeconfig", kubeconfig,
                   "--set", "zookeeper.connect=zk.example:2181", "--set", f"operator.cluster={namespace}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    sa = f"system:serviceaccount:{namespace}:zeps-operator"

    def create(secret: dict[str, object]) -> str:
        """What kubectl says to creating ``secret`` as the operator's ServiceAccount (out and err)."""
        done = subprocess.run(
            [*control_plane.kubectl_argv, "create", "-n", namespace, "--as", sa, "-f", "-"],
            input=json.dumps(secret),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stdout + done.stderr

    probes = iter(range(1000))

    def in_force() -> bool:  # a policy applies a moment after it is made: probe with throwaway names
        probe = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"probe-{next(probes)}"}}
        return "carry app.kubernetes.io/managed-by=zeps-operator" in create(probe)

    try:
        wait_until(in_force, timeout=30, what="the chart's admission policy in force")
        token = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                 "metadata": {"name": "zeps-curve", "labels": {"app.kubernetes.io/managed-by": "zeps-operator"},
                              "annotations": {"kubernetes.io/service-account.name": "default"}}}  # fmt: skip
        assert "Opaque Secrets only" in create(token)
        unlabelled = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "zeps-curve"},
            "stringData": {"a": "b"},
        }
        assert "carry app.kubernetes.io/managed-by=zeps-operator" in create(unlabelled)
        labels = {"app.kubernetes.io/managed-by": "zeps-operator"}
        assert "created" in create({**unlabelled, "metadata": {"name": "zeps-curve", "labels": labels}})
        # RBAC lets it patch any Secret (a CURVE client's, during a key rotation): only its own are admitted
        control_plane.kubectl("create", "secret", "generic", "database", "-n", namespace, "--from-literal=pw=x")

        operator = client.ApiClient(kube_api.configuration)  # as the operator patches: no read first
        operator.set_default_header("Impersonate-User", sa)

        def patch(name: str, **meta: object) -> str:
            body = {"data": {"pw": "eQ=="}, **({"metadata": meta} if meta else {})}
            try:
                client.CoreV1Api(operator).patch_namespaced_secret(name, namespace, body)
            except client.ApiException as exc:
                return str(exc.body)
            return "patched"

        assert "it changes no other" in patch("database")
        assert "changes only the Secrets it made" in patch("database", labels=labels)  # labelling it is no way in
        assert "patched" in patch("zeps-curve")
    finally:
        _helm("uninstall", "zeps", "--namespace", namespace, "--kubeconfig", kubeconfig)


def test_every_object_zeps_makes_passes_the_api_server_s_strict_validation(
    control_plane: ControlPlane, namespace: str
) -> None:
    """kubeconform's check, made by the API server of the control plane itself (its OpenAPI, its
    admission): the chart rendered with its optional parts (the ZooKeeper ensemble, the operator's
    ZooKeeper identity, the dashboards, the CRDs) and the objects the operator plans for a stream —
    alone, replicated with multicast, a partition — sent with ``--dry-run=server --validate=strict``:
    an unknown or misplaced field, a wrong type or a missing required field fails; nothing is stored.
    (The PrometheusRule and PodMonitors need the Prometheus operator's CRDs, which no tier here has.)"""
    from zeps_operator.models import StreamSpec  # noqa: PLC0415
    from zeps_operator.plan import Settings, stream_objects  # noqa: PLC0415

    rendered = _helm("template", "z", str(CHART), "--kube-version", KUBE, "--namespace", namespace, "--include-crds",
                     "--set", "zookeeper.ensemble.enabled=true", "--set", "zookeeper.auth.password=secret")  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    assert {"CustomResourceDefinition", "StatefulSet", "PodDisruptionBudget", "Secret", "Deployment"} <= kinds
    strict = ("--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-")
    out = control_plane.kubectl("apply", *strict, input=rendered.stdout)
    assert out.count("(server dry run)") == len([d for d in yaml.safe_load_all(rendered.stdout) if d])
    settings = Settings(zookeeper="zk:2181")
    plain = StreamSpec.model_validate({})
    multicast = {"transport": "epgm", "group": "239.192.0.7", "port": 5555}
    replicated = StreamSpec.model_validate({"replicas": 3, "minInSync": 2, "multicast": multicast})
    for objects in (stream_objects(namespace, "prices", plain, settings),
                    stream_objects(namespace, "orders", replicated, settings, zookeeper_auth=True),
                    stream_objects(namespace, "clicks", replicated, settings, partition=1)):  # fmt: skip
        manifest = yaml.safe_dump_all(objects)
        made = control_plane.kubectl("create", *strict, input=manifest)
        assert made.count("(server dry run)") == len(objects), made
    workload = next(o for o in objects if o["kind"] == "StatefulSet")
    broken = yaml.safe_dump({**workload, "spec": {**workload["spec"], "replicaz": 3}})
    refused = subprocess.run([*control_plane.kubectl_argv, "create", *strict], input=broken, capture_output=True,
                             text=True, timeout=120, check=False)  # fmt: skip
    assert refused.returncode != 0 and 'unknown field "spec.replicaz"' in refused.stderr, "a misspelt field fails"
