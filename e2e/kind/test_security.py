"""The safety promises where they live, on kind: the journal kept by ``deletionPolicy: Retain``, CURVE
admitting only the listed clients (and cutting one off when it is taken off the list), its key
rotated by annotation under a running publisher, a namespace with ZooKeeper ACLs working from pods
and refusing other credentials, the operator unable to read a Secret it did not make, the
broker's metrics scraped from another pod, a process posing as a ZooKeeper server cut off by every
server of the ensemble, the servers peering over TLS with the chart's certificates, and the
ensemble's NetworkPolicy letting in only zeps's pods and labelled clients."""

from __future__ import annotations

import base64
import copy
import json
import secrets
from pathlib import Path
from typing import Any

from kindapp import CHROOT, OPERATOR_NAMESPACE, RELEASE, App, ZooKeeperShell, client_namespace, json_lines

from zeps.partitioning import partition_of
from zeps.resources import ZOOKEEPER_CLIENT_LABEL

WORKERS = Path(__file__).resolve().parent / "workers"

OPERATOR = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE}-operator"


def _stream(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": name},
            "spec": {"storage": {"size": "1Gi"}, **spec}}  # fmt: skip


def _pod(name: str, command: str, *, env: dict[str, Any] | None = None, secret: str | None = None) -> dict[str, Any]:
    """A client pod (the zeps image, ``sh -c command``) with a writable /tmp, more environment
    (a value, or a ``valueFrom``), and a Secret mounted at /etc/zeps/client."""
    spec = copy.deepcopy(App.pod_spec(command))
    container = spec["containers"][0]
    for key, value in (env or {}).items():
        container["env"].append(
            {"name": key, **({"valueFrom": value} if isinstance(value, dict) else {"value": value})}
        )
    spec["volumes"] = [{"name": "tmp", "emptyDir": {}}]
    container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    if secret:
        spec["volumes"].append({"name": "client", "secret": {"secretName": secret}})
        container["volumeMounts"].append({"name": "client", "mountPath": "/etc/zeps/client", "readOnly": True})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _job(app: App, name: str, command: str) -> None:
    app.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
               "spec": {"backoffLimit": 0, "template": {"spec": App.pod_spec(command)}}})  # fmt: skip
    app.cluster.kubectl("wait", "--for=condition=Complete", f"job/{name}", "-n", app.ns, "--timeout=180s", timeout=210)


def _finished(app: App, pod: str, timeout: float = 240) -> str:
    """The log of a pod that ran to its end, succeeded or not."""
    app.cluster.wait_for(f"pod {pod} to end", lambda: app.get("pod", pod)["status"].get("phase") in
                         ("Succeeded", "Failed"), timeout=timeout)  # fmt: skip
    return app.logs(pod)


def test_retain_keeps_the_journal_and_the_stream_made_again_continues_its_sequences(app: App) -> None:
    app.apply(_stream("ledger", deletionPolicy="Retain"))
    app.ready("zepsstream", "ledger", timeout=240)
    _job(app, "first", "zeps stream publish ledger k " + " ".join(f"a{i}" for i in range(30)))
    app.cluster.kubectl("delete", "zepsstream", "ledger", "-n", app.ns, "--timeout=120s", timeout=150)
    app.cluster.wait_for("the broker to go", lambda: not app.get("pods", "-l", "app.kubernetes.io/instance=ledger")
                         ["items"], timeout=120)  # fmt: skip
    pvc = app.get("pvc", "ledger-journal")
    assert not pvc["metadata"].get("ownerReferences"), "a retained journal has no owner to be collected with"
    assert pvc["metadata"]["labels"]["zeps.dev/stream"] == "ledger"

    app.apply(_stream("ledger", deletionPolicy="Retain"))  # made again: takes the journal over
    app.ready("zepsstream", "ledger", timeout=240)
    _job(app, "second", "zeps stream publish ledger k " + " ".join(f"b{i}" for i in range(10)))
    app.run_pod("reader", "zeps --json stream replay ledger --since 0 --count 40 --timeout 60")
    got = json_lines(app.wait_succeeded("reader"))
    assert [m["body"] for m in got] == [f"a{i}" for i in range(30)] + [f"b{i}" for i in range(10)]
    assert [m["sequence"] for m in got] == list(range(1, 41)), "sequences go on where the journal stopped"

    app.apply(_stream("ledger", deletionPolicy="Delete"))  # now it owns its journal, and takes it along
    app.cluster.wait_for("the stream to own its journal", lambda: bool(
        app.get("pvc", "ledger-journal")["metadata"].get("ownerReferences")), timeout=60)  # fmt: skip
    app.cluster.kubectl("delete", "zepsstream", "ledger", "-n", app.ns, "--timeout=120s", timeout=150)
    app.cluster.wait_for("the journal to go with it", lambda: "ledger-journal" not in app.cluster.kubectl(
        "get", "pvc", "-n", app.ns, "-o", "name", check=False), timeout=180)  # fmt: skip


def test_curve_admits_the_listed_clients_only_and_cuts_one_off_without_a_restart(app: App) -> None:
    app.apply(_stream("vault", curve=True, curveClients=["orders", "audit"]))
    status = app.ready("zepsstream", "vault", timeout=240)["status"]
    broker = app.get("pods", "-l", "app.kubernetes.io/instance=vault")["items"][0]
    secret = app.get("secret", "vault-curve-orders")
    assert status["curvePublicKey"] in base64.b64decode(secret["data"]["server.key"]).decode()
    client = {"ZEPS_STREAM_VAULT_CURVE_CLIENT": "/etc/zeps/client/client.key_secret"}

    app.apply(_pod("orders", "zeps --json stream publish vault k one two && "
                   "zeps --json stream replay vault --since 0 --count 2 --timeout 30",
                   env=client, secret="vault-curve-orders"))  # fmt: skip
    assert [m["body"] for m in json_lines(app.wait_succeeded("orders")) if "body" in m] == ["one", "two"]

    made_up = (
        "python -c \"import zmq.auth; zmq.auth.create_certificates('/tmp', 'mine')\" && "
        "ZEPS_STREAM_VAULT_CURVE_CLIENT=/tmp/mine.key_secret zeps stream publish vault k x; echo exit=$?"
    )
    app.apply(_pod("impostor", made_up))
    app.apply(_pod("keyless", "zeps stream publish vault k x; echo exit=$?"))
    impostor, keyless = _finished(app, "impostor"), _finished(app, "keyless")
    assert "is not among the stream's clients" in impostor and "exit=4" in impostor, impostor
    assert "this client has no key of its own" in keyless and "exit=4" in keyless, keyless

    # a reader of the orders client waits; taking orders off the list ends it, the broker runs on
    app.apply(_pod("waiting", "zeps stream replay vault --since 2 --count 1 --timeout 300; echo exit=$?",
                   env=client, secret="vault-curve-orders"))  # fmt: skip
    app.cluster.wait_for("the reader to run", lambda: app.get("pod", "waiting")["status"].get("phase") == "Running")
    app.apply(_stream("vault", curve=True, curveClients=["audit"]))
    revoked = _finished(app, "waiting", timeout=240)  # the kubelet brings the Secret's new list within its sync period
    assert "was revoked" in revoked and "exit=4" in revoked, revoked
    after = app.get("pod", broker["metadata"]["name"])
    assert after["metadata"]["uid"] == broker["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0, "no broker restart"


def test_a_curve_key_rotated_by_annotation_under_a_publisher_loses_nothing(app: App, zk: ZooKeeperShell) -> None:
    """zeps.dev/rotate-curve-key on a replicated CURVE stream while an idempotent publisher and a
    subscriber run: the kubelet brings each phase's files into the pods (the coming key, the switch,
    the old key gone); every broker serves the new key at the end, a client started after it reaches
    them with the new key alone, and the publisher and subscriber lost nothing."""
    count = 1600  # 16 a second: 100 s at least, through the three phases (30 s apart) and the kubelet's syncs
    app.apply(_stream("vault", curve=True, curveClients=["teller"], replicas=3))
    app.ready("zepsstream", "vault", timeout=420)
    old = app.get("zepsstream", "vault")["status"]["curvePublicKey"]
    client = {"ZEPS_STREAM_VAULT_CURVE_CLIENT": "/etc/zeps/client/client.key_secret"}
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "publisher"},
               "data": {"publisher.py": (WORKERS / "ledger_publisher.py").read_text()}})  # fmt: skip
    publisher = _pod("publisher", f"exec python /worker/publisher.py vault {count} 16 4", env=client,
                     secret="vault-curve-teller")  # fmt: skip
    publisher["spec"]["volumes"].append({"name": "worker", "configMap": {"name": "publisher"}})
    publisher["spec"]["containers"][0]["volumeMounts"].append({"name": "worker", "mountPath": "/worker"})
    app.apply(publisher)
    app.apply(_pod("subscriber", f"exec zeps --json stream replay vault --since 0 --count {count} --timeout 600",
                   env=client, secret="vault-curve-teller"))  # fmt: skip
    app.cluster.wait_for("the publisher confirming", lambda: any(
        "confirmed" in m for m in json_lines(app.logs("publisher"))), timeout=120)  # fmt: skip
    app.cluster.kubectl("annotate", "zepsstream", "vault", "-n", app.ns, "zeps.dev/rotate-curve-key=first",
                        "zeps.dev/curve-rotation-window-seconds=30")  # fmt: skip

    def rotation() -> str:
        return str(app.get("zepsstream", "vault").get("status", {}).get("curveRotation", {}).get("phase"))

    app.cluster.wait_for("the rotation done", lambda: rotation() == "done", timeout=300)
    new = app.get("zepsstream", "vault")["status"]["curvePublicKey"]
    assert new != old

    def served() -> set[str]:  # what each broker says it serves (its facts, in its member node)
        keys = set()
        for i in range(3):
            out = zk.run("get", f"{CHROOT}/{app.ns}/streams/vault/brokers/vault-broker-{i}")
            line = next((x for x in out.splitlines() if x.startswith("{")), "{}")
            keys.add(json.loads(line).get("curvePublicKey", ""))
        return keys

    app.cluster.wait_for("every broker serving the new key", lambda: served() == {new}, timeout=180)
    app.apply(_pod("latecomer", "zeps --json stream replay vault --since 0 --count 1 --timeout 60", env=client,
                   secret="vault-curve-teller"))  # fmt: skip
    assert [m["body"] for m in json_lines(app.wait_succeeded("latecomer")) if "body" in m] == ["1"]  # new key alone
    confirmed = [m["confirmed"] for m in json_lines(app.wait_succeeded("publisher", timeout=600)) if "confirmed" in m]
    assert confirmed[-1] == count, confirmed[-3:]
    bodies = [m["body"] for m in json_lines(app.wait_succeeded("subscriber", timeout=300)) if "body" in m]
    assert bodies == [str(n) for n in range(1, count + 1)], (len(bodies), bodies[-3:])


def test_a_curve_stream_of_replicas_and_partitions_peers_encrypted_and_refuses_a_forged_replica(app: App) -> None:
    """Three replicas of each of two partitions, CURVE on: every replica in sync (they peer with
    certificates of their own, which a leader checks), the admitted client publishing to both
    partitions and reading it all back across a partition leader's deletion; the same client
    fetching as one of the replicas is refused (UNAUTHORIZED), so it can never count for minInSync."""
    app.apply(_stream("crypt", curve=True, curveClients=["orders"], replicas=3, partitions=2))
    app.ready("zepsstream", "crypt", timeout=420)

    def partitions() -> list[dict[str, Any]]:
        return list(app.get("zepsstream", "crypt").get("status", {}).get("partitions", []))

    app.cluster.wait_for("all six replicas in sync over CURVE", lambda: [len(p.get("inSync", [])) for p in
                         partitions()] == [3, 3], timeout=240)  # fmt: skip
    status = app.get("zepsstream", "crypt")["status"]
    client = {"ZEPS_STREAM_CRYPT_CURVE_CLIENT": "/etc/zeps/client/client.key_secret"}
    keys = {partition_of(k, 2): k for k in (f"k{i}" for i in range(20))}  # a key of each partition

    def publish(pod: str, first: int) -> None:
        bodies = " ".join(f"m{i}" for i in range(first, first + 20))
        app.apply(_pod(pod, " && ".join(f"zeps stream publish crypt {keys[p]} {bodies}" for p in (0, 1)),
                       env=client, secret="crypt-curve-orders"))  # fmt: skip
        app.wait_succeeded(pod)

    publish("before", 0)
    leader = status["partitions"][1]["leader"]
    app.cluster.kubectl("delete", "pod", leader, "-n", app.ns, "--wait=false")

    def led_anew() -> bool:
        parts = partitions()
        return len(parts) == 2 and parts[1].get("leader") not in ("", leader) and bool(parts[1].get("ready"))

    app.cluster.wait_for("partition 1 to have a new leader", led_anew, timeout=240)
    publish("after", 20)
    app.apply(_pod("reader", "zeps --json stream replay crypt --since '{\"last\": [0, 0]}' --count 80 --timeout 60",
                   env=client, secret="crypt-curve-orders"))  # fmt: skip
    got = [m for m in json_lines(app.wait_succeeded("reader")) if "body" in m]
    for partition in (0, 1):
        assert [m["body"] for m in got if m["partition"] == partition] == [f"m{i}" for i in range(40)], partition

    status = app.get("zepsstream", "crypt")["status"]
    member = next(r for r in status["replication"]["inSync"] if r != status["replication"]["leader"])
    address = app.get("pod", status["replication"]["leader"])["status"]["podIP"]
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "forged"},
               "data": {"forged_replica.py": (WORKERS / "forged_replica.py").read_text()}})  # fmt: skip
    forged = _pod("forged", f"python /worker/forged_replica.py tcp://{address}:5555 crypt "
                  f"{status['replication']['epoch']} {member} /etc/zeps/client/client.key_secret "
                  "/etc/zeps/client/server.key", secret="crypt-curve-orders")  # fmt: skip
    forged["spec"]["volumes"].append({"name": "worker", "configMap": {"name": "forged"}})
    forged["spec"]["containers"][0]["volumeMounts"].append({"name": "worker", "mountPath": "/worker"})
    app.apply(forged)
    answer = json_lines(app.wait_succeeded("forged"))[-1]
    assert answer == {"answer": "InvalidCode", "refused": "UNAUTHORIZED"}, answer


def test_an_acl_namespace_works_from_pods_and_refuses_other_credentials(app: App) -> None:
    password = secrets.token_hex(8)
    app.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "zeps-zookeeper-auth"},
               "stringData": {"user": app.ns, "password": password}})  # fmt: skip
    app.apply(_stream("orders"))
    app.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "jobs"}, "spec": {}})
    app.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "news"}, "spec": {}})
    app.ready("zepsstream", "orders", timeout=240)
    for kind, name in (("queue", "jobs"), ("topic", "news")):
        app.ready(kind, name)
    own = {key: {"secretKeyRef": {"name": "zeps-zookeeper-auth", "key": key.split("_")[-1].lower()}}
           for key in ("ZEPS_ZOOKEEPER_USER", "ZEPS_ZOOKEEPER_PASSWORD")}  # fmt: skip
    app.apply(_pod("news-reader", "zeps --json topic subscribe news --count 1 --timeout 120", env=own))
    app.cluster.wait_for("the subscriber", lambda: app.get("topic", "news")["status"].get("subscribers") == 1)
    member_acl = (  # the broker registered with the namespace's identity: its member node has its ACL
        'python -c "import json; from zeps.config import resolve; from zeps.coordination import connect; '
        "from zeps.paths import StreamPaths; s = resolve('ZepsStream', 'orders', needs=('zookeeper',)); "
        "zk = connect(s.zookeeper, auth=s.auth, ca=s.zookeeper_ca); "
        "node = StreamPaths.of(s.namespace, 'orders', chroot=s.chroot).brokers.member('orders-0'); "
        "print(json.dumps({'acl': [a.id.id for a in zk.get_acls(node)[0]]}))\""
    )
    app.apply(_pod("worker", "zeps --json queue put jobs j1 && zeps --json queue take jobs --timeout 30 && "
                   "zeps --json topic publish news hello && zeps --json stream publish orders k o1 && "
                   f"zeps --json stream replay orders --since 0 --count 1 --timeout 30 && {member_acl}",
                   env=own))  # fmt: skip
    lines = json_lines(app.wait_succeeded("worker"))
    assert any(m.get("body") == "j1" for m in lines) and any(m.get("body") == "o1" for m in lines), lines
    (acl,) = [m["acl"] for m in lines if "acl" in m]
    assert len(acl) == 1 and acl[0].startswith(f"{app.ns}:"), acl
    assert [m["body"] for m in json_lines(app.wait_succeeded("news-reader"))] == ["hello"]

    other = {"ZEPS_ZOOKEEPER_USER": "someone-else", "ZEPS_ZOOKEEPER_PASSWORD": "not-this-namespaces"}
    app.apply(_pod("intruder", "zeps queue put jobs x; echo exit=$?", env=other))
    refused = _finished(app, "intruder")
    assert "ZooKeeper refused (NoAuth)" in refused and "exit=4" in refused, refused


def test_the_operator_may_read_no_secret_it_did_not_make(app: App) -> None:
    app.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "database-password"},
               "stringData": {"password": "hunter2"}})  # fmt: skip

    def can(*what: str) -> bool:
        answer = app.cluster.kubectl("auth", "can-i", *what, "--as", OPERATOR, "-n", app.ns, check=False)
        return answer.strip().splitlines()[-1] == "yes"

    assert not can("get", "secret/database-password")
    assert not can("list", "secrets") and not can("watch", "secrets")
    assert not can("list", "secrets", "--all-namespaces")
    assert not can("delete", "secret/database-password") and not can("update", "secret/database-password")
    assert can("get", "secret/zeps-curve") and can("get", "secret/zeps-zookeeper-auth")  # its own, its input
    assert can("create", "secrets")  # each CURVE client's Secret, which it never reads back


def test_the_broker_metrics_are_scraped_from_another_pod(app: App) -> None:
    app.apply(_stream("metered"))
    app.ready("zepsstream", "metered", timeout=240)
    _job(app, "publish", "zeps stream publish metered k 1 2 3")
    broker = app.get("pods", "-l", "app.kubernetes.io/instance=metered")["items"][0]
    port = next(p["containerPort"] for p in broker["spec"]["containers"][0]["ports"] if p["name"] == "metrics")
    url = f"http://{broker['status']['podIP']}:{port}/metrics"
    app.run_pod("scraper", f"python -c \"import urllib.request; print(urllib.request.urlopen('{url}', timeout=30)"
                ".read().decode())\"")  # fmt: skip
    scraped = app.wait_succeeded("scraper")
    assert 'zeps_broker_messages_in_total{stream="metered"} 3.0' in scraped, scraped[-2000:]


def test_a_pod_posing_as_a_zookeeper_server_is_cut_off_by_every_server_of_the_ensemble(zk: ZooKeeperShell) -> None:
    """A process opens each server's election port with a server's handshake and vote
    (``workers/forged_zookeeper_peer.py``), as a stranger (id 1000) and as server 2. It runs inside
    server 0's own pod: the ensemble's NetworkPolicy lets no other pod reach the election port (the
    next test), so that is where an attacker who got past it would be. The chart's servers
    authenticate each other (``zookeeper.ensemble.quorumAuth``), so each cuts it off before reading its
    vote (without that, each answers with its own vote: the integration test
    ``test_zookeeper_quorum_auth.py`` shows both on real servers); the ensemble stays whole."""
    servers = zk.addresses(3888)
    answers = []
    for sid in (1000, 2):
        out = zk.python("forged_zookeeper_peer.py", str(sid), *servers)
        answers += [(line["server"], line["answer"]) for line in json_lines(out)]
    assert answers == [(server, "closed") for server in servers] * 2, answers
    assert zk.whole(), "the ensemble is not whole after the forgers"


def test_the_zookeeper_servers_peer_over_tls_with_the_chart_s_certificates(zk: ZooKeeperShell) -> None:
    """``zookeeper.ensemble.tls`` (on in values-production.yaml): from server 0's pod, with the
    certificate the chart made and mounted there (``workers/zookeeper_tls_peer.py``), a TLS handshake
    with each server's election port succeeds, the server presenting the ensemble's certificate;
    without a certificate of its own a peer is refused. (Plain TCP to those ports is cut off: the
    test before; the integration test ``test_zookeeper_quorum_auth.py`` runs the same worker.)"""
    servers = zk.addresses(3888)
    out = zk.python("zookeeper_tls_peer.py", "/etc/zookeeper/tls", *servers)
    got = {(line["server"], line["certificate"]): line for line in json_lines(out)}
    for server in servers:
        assert got[server, True]["answer"] == "open" and got[server, True]["peer"] == f"{RELEASE}-zookeeper", got
        assert got[server, False]["answer"] == "refused", got


def test_only_the_operator_its_brokers_and_labelled_clients_reach_zookeeper(app: App) -> None:
    """The ensemble's NetworkPolicy (``zookeeper.ensemble.networkPolicy``, on in values-production.yaml),
    enforced on kind by kube-router. In a namespace the admin did not label: a stream's broker (the
    operator labels its pods) registers in ZooKeeper and serves a labelled client, which reaches the
    client port; an unlabelled pod there cannot open a connection to any server's client, quorum or
    election port. A pod of a labelled namespace (the ``app`` fixture's) reaches the client port
    unlabelled. The client port is the TLS one (``tls.clientMode: require``): no pod reaches the
    plain one, which listens on each server's 127.0.0.1 alone, and the labelled client above works
    with what the status gave it (the address of the TLS port and the CA)."""
    ports = {"client (TLS)": 2281, "client (plain)": 2181, "quorum": 2888, "election": 3888}
    targets = [ZooKeeperShell.addresses(port)[i] for i in range(3) for port in ports.values()]
    # a new pod's address reaches each node's firewall a moment after the pod starts, each node on its
    # own (as with any policy controller): until one port of a server answered, each of its ports is
    # tried again for up to 20 s from the start
    probe = ("import json, socket, sys, time\n"
             "deadline, known = time.monotonic() + 20, set()\n"
             "for target in sys.argv[1:]:\n"
             "    host, port = target.rsplit(':', 1)\n"
             "    while True:\n"
             "        try:\n"
             "            socket.create_connection((host, int(port)), timeout=3).close(); reached = True; break\n"
             "        except OSError:\n"
             "            reached = False\n"
             "        if host in known or time.monotonic() > deadline: break\n"
             "        time.sleep(0.5)  # refused at once: the next try in a moment, until the deadline\n"
             "    if reached: known.add(host)\n"
             "    print(json.dumps({'target': target, 'reached': reached}), flush=True)\n")  # fmt: skip
    command = f'python -c "$PROBE" {" ".join(targets)}'

    def reached(namespace: App, pod: str, labels: dict[str, str]) -> dict[str, bool]:
        spec = App.pod_spec(command)
        spec["containers"][0]["env"].append({"name": "PROBE", "value": probe})
        namespace.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": labels},
                         "spec": spec})  # fmt: skip
        return {line["target"]: line["reached"] for line in json_lines(namespace.wait_succeeded(pod))}

    closed = client_namespace(app.cluster, f"{app.ns}-closed", zookeeper=False)
    try:
        # a stream's broker registers in ZooKeeper before it is Ready; a queue is ZooKeeper's alone
        closed.apply(_stream("fenced"))
        closed.apply_example("queue.yaml")
        closed.ready("zepsstream", "fenced", timeout=240)
        closed.ready("queue", "crawl-links")
        labelled = {ZOOKEEPER_CLIENT_LABEL: "true"}
        pod = App.pod_spec("zeps --json queue put crawl-links a b c && "
                           "zeps --json queue take crawl-links --count 3 --timeout 60")  # fmt: skip
        closed.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "labels": labelled},
                      "spec": pod})  # fmt: skip
        got = sorted(m["body"] for m in json_lines(closed.wait_succeeded("client")) if "body" in m)
        assert got == ["a", "b", "c"], "a labelled client works where the policy applies"

        status = closed.get("queue", "crawl-links")["status"]
        assert status["zookeeper"].endswith(".svc:2281") and "BEGIN CERTIFICATE" in status["zookeeperCA"], status
        let_in = reached(closed, "labelled", labelled)
        assert let_in == {t: t.endswith(":2281") for t in targets}, let_in
        kept_out = reached(closed, "stranger", {})
        assert kept_out == dict.fromkeys(targets, False), kept_out
        opted_in = reached(app, "opted-in", {})
        assert opted_in == {t: t.endswith(":2281") for t in targets}, opted_in
    finally:
        app.cluster.kubectl("delete", "namespace", closed.ns, "--wait=false", check=False)
