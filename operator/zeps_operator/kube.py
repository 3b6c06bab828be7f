"""The operator's Kubernetes adapter: every API call the handlers make besides kopf's own (kopf
patches the status and finalizers of the object being handled). Handlers decide; this module talks to
the API server, through the official client, and returns plain values.

Tested against a real API server in ``tests/cluster/test_kube_adapter.py``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.utils import parse_quantity

from zeps.resources import GROUP, PLURALS, VERSION
from zeps_operator.resize import Claim, restart_to_finish
from zeps_operator.roll import CONFIG_ANNOTATION, RollPod

__all__ = ["FIELD_MANAGER", "InvalidSecretError", "Kube"]

#: the field manager of the operator's server-side applies
FIELD_MANAGER = "zeps-operator"
_FORBIDDEN, _NOT_FOUND, _CONFLICT, _INVALID = 403, 404, 409, 422
#: The dynamic client's discovery cache stays in memory. By default the client reads and writes it as
#: ``osrcp-<hash of the server's address>.json`` in the shared temporary directory, where anyone on the
#: machine could plant one first (the operator trusts only what it made), and every API server the
#: tests start left one behind. Under /dev/null no file can be: nothing is read, and the client ignores
#: its failed write.
_NO_DISCOVERY_FILE = os.path.join(os.devnull, "zeps-operator-discovery.json")
T = TypeVar("T")


class InvalidSecretError(ValueError):
    """A Secret the operator reads lacks the keys it needs."""


class Kube:
    """One API client and what the handlers do with it."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self._dynamic: DynamicClient | None = None
        # The client imports an API's module at its first use: core/v1's took a second of CPU in the
        # middle of the first burst of Topics. Loaded here, at the operator's start.
        self._core = k8s.CoreV1Api(api)

    @classmethod
    def connect(cls) -> Kube:
        """In a pod, its ServiceAccount; elsewhere, the kubeconfig (``KUBECONFIG`` or ~/.kube/config)."""
        try:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(k8s.ApiClient())

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    # -- reads ------------------------------------------------------------------------------------
    def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """The Secret's data, base64-decoded (bytes: a Secret may hold anything); None when there is no
        such Secret."""
        secret = _unless_missing(lambda: self._core.read_namespaced_secret(name, namespace))
        if secret is None:
            return None
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    def credentials(self, namespace: str, secret: str) -> tuple[str, str] | None:
        """``(user, password)`` from the Secret's keys ``user`` and ``password``; None without the Secret;
        :class:`InvalidSecretError` saying what to fix when a key is missing, empty or not UTF-8 text,
        or the user holds a ':' (ZooKeeper's digest scheme cuts ``user:password`` at the first one, so
        such a user could never authenticate)."""
        data = self.secret_data(namespace, secret)
        if data is None:
            return None
        if not data.get("user") or not data.get("password"):
            raise InvalidSecretError(f"Secret {secret} needs the keys user and password")
        try:
            user, password = data["user"].decode(), data["password"].decode()
        except UnicodeDecodeError:
            raise InvalidSecretError(f"Secret {secret}: user and password must be UTF-8 text") from None
        if ":" in user:
            raise InvalidSecretError(f"Secret {secret}: the user must not contain ':' (ZooKeeper's digest scheme "
                                     "separates user and password with it)")  # fmt: skip
        return user, password

    def deployment_available(self, namespace: str, name: str) -> bool:
        """True when the Deployment exists and has at least one available replica."""
        deployment = _unless_missing(lambda: k8s.AppsV1Api(self.api).read_namespaced_deployment(name, namespace))
        return (
            deployment is not None
            and deployment.status is not None
            and (deployment.status.available_replicas or 0) >= 1
        )

    def statefulset_ready(self, namespace: str, name: str) -> int:
        """How many of the StatefulSet's pods are ready (0 when it does not exist)."""
        statefulset = _unless_missing(lambda: k8s.AppsV1Api(self.api).read_namespaced_stateful_set(name, namespace))
        if statefulset is None or statefulset.status is None:
            return 0
        return int(statefulset.status.ready_replicas or 0)

    def broker_pods(self, namespace: str, statefulset: str) -> tuple[str | None, list[RollPod]]:
        """A StatefulSet's update revision (None: not yet known) and its pods as the roll sees them."""
        apps = k8s.AppsV1Api(self.api)
        sts = _unless_missing(lambda: apps.read_namespaced_stateful_set(statefulset, namespace))
        if sts is None or sts.status is None or not sts.status.update_revision:
            return None, []
        revision = sts.status.update_revision
        selector = ",".join(f"{k}={v}" for k, v in sorted((sts.spec.selector.match_labels or {}).items()))
        pods = []
        for pod in self._core.list_namespaced_pod(namespace, label_selector=selector).items:
            meta = pod.metadata
            if meta is None or not meta.name:
                continue
            conditions = (pod.status.conditions if pod.status is not None else None) or []
            ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            labels, annotations = meta.labels or {}, meta.annotations or {}
            # a journal whose filesystem grows only unmounted (FileSystemResizePending) restarts as an old template's
            current = labels.get("controller-revision-hash") == revision and not self._filesystem_pending(
                namespace, f"journal-{meta.name}")  # fmt: skip
            config = annotations.get(CONFIG_ANNOTATION, "")
            node = (pod.spec.node_name if pod.spec is not None else None) or ""
            pods.append(RollPod(meta.name, current, ready, meta.deletion_timestamp is not None, config, node,
                                str(meta.uid or "")))  # fmt: skip
        return revision, pods

    def claim_size(self, namespace: str, kind: str, name: str) -> str | None:
        """The size a journal claim asks for (``kind`` PersistentVolumeClaim), or a StatefulSet's claim
        template (``kind`` StatefulSet); None when there is none."""
        if kind == "StatefulSet":
            sts = _unless_missing(lambda: k8s.AppsV1Api(self.api).read_namespaced_stateful_set(name, namespace))
            templates = (sts.spec.volume_claim_templates if sts is not None and sts.spec is not None else None) or []
            specs = [t.spec for t in templates if t.metadata is not None and t.metadata.name == "journal"]
        else:
            claim = self._claim(namespace, name)
            specs = [claim.spec] if claim is not None else []
        requests = [(s.resources.requests or {}).get("storage") for s in specs if s is not None and s.resources]
        return str(requests[0]) if requests and requests[0] else None

    def journal_claims(self, namespace: str, names: list[str]) -> list[Claim]:
        """The journal claims ``names`` as a resize sees them (those that exist)."""
        out, now = [], dt.datetime.now(dt.UTC)
        for name in names:
            pvc = self._claim(namespace, name)
            if pvc is None or pvc.spec is None:
                continue
            requested = ((pvc.spec.resources.requests if pvc.spec.resources else None) or {}).get("storage", "")
            status = pvc.status
            capacity = ((status.capacity if status is not None else None) or {}).get("storage", "")
            conditions = (status.conditions if status is not None else None) or []
            pending = any(c.type == "FileSystemResizePending" and c.status == "True"
                          and restart_to_finish(c.last_transition_time, now) for c in conditions)  # fmt: skip
            out.append(Claim(name, str(requested), str(capacity), _bytes(requested), _bytes(capacity), pending))
        return out

    def _filesystem_pending(self, namespace: str, claim: str) -> bool:
        return any(c.filesystem_pending for c in self.journal_claims(namespace, [claim]))

    def _claim(self, namespace: str, name: str) -> Any:
        return _unless_missing(lambda: self._core.read_namespaced_persistent_volume_claim(name, namespace))

    def claim_identity(self, namespace: str, name: str) -> tuple[str, bool] | None:
        """A claim's uid and whether its deletion was asked (it stays while a pod uses it); None: gone."""
        pvc = self._claim(namespace, name)
        if pvc is None or pvc.metadata is None:
            return None
        return str(pvc.metadata.uid or ""), pvc.metadata.deletion_timestamp is not None

    def grow_claim(self, namespace: str, name: str, size: str) -> str | None:
        """Ask for ``size`` on a claim (a volume grown in place); None once asked, else the API server's
        refusal (its StorageClass does not allow expansion, say)."""
        body = {"spec": {"resources": {"requests": {"storage": size}}}}
        try:
            self._core.patch_namespaced_persistent_volume_claim(name, namespace, body)
        except ApiException as exc:
            if exc.status in (_FORBIDDEN, _INVALID):
                return _api_message(exc)
            raise
        return None

    def statefulset_replicas(self, namespace: str, name: str) -> int | None:
        """The replicas a StatefulSet is set to run (None when it does not exist)."""
        sts = _unless_missing(lambda: k8s.AppsV1Api(self.api).read_namespaced_stateful_set(name, namespace))
        return None if sts is None or sts.spec is None else int(sts.spec.replicas or 0)

    # -- writes -----------------------------------------------------------------------------------
    def delete_pod(self, namespace: str, name: str, uid: str = "") -> bool:
        """Delete a pod (its StatefulSet makes it again, of its template now); gone already: nothing to
        do. ``uid``: only that pod, not one made again under its name since it was looked at (False:
        the API server refused, that pod is gone)."""
        options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid)) if uid else None
        try:
            _unless_missing(lambda: self._core.delete_namespaced_pod(name, namespace, body=options))
        except ApiException as exc:
            if exc.status == _CONFLICT and uid:
                return False
            raise
        return True

    def _resource(self, api_version: str, kind: str) -> Any:
        """The dynamic client's resource of ``kind`` (the client made, and the server's discovery read,
        at the first call)."""
        if self._dynamic is None:
            self._dynamic = DynamicClient(self.api, cache_file=_NO_DISCOVERY_FILE)  # type: ignore[no-untyped-call]
        return self._dynamic.resources.get(api_version=api_version, kind=kind)

    def apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply ``obj`` (namespaced) as the operator's field manager, taking over conflicts."""
        resource = self._resource(obj["apiVersion"], obj["kind"])
        resource.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"]["namespace"],
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete a namespaced object (gone already: nothing to do)."""
        resource = self._resource(api_version, kind)
        _unless_missing(lambda: resource.delete(name=name, namespace=namespace))

    def create_once(self, obj: dict[str, Any]) -> bool:
        """Create ``obj`` (a namespaced core/v1 Secret) unless one of its name exists: True if made. What
        exists is left as it is and never read (the operator may create Secrets, not read them)."""
        assert obj["apiVersion"] == "v1" and obj["kind"] == "Secret"
        body: Any = obj  # the client serialises a plain manifest as it does its models
        try:
            self._core.create_namespaced_secret(obj["metadata"]["namespace"], body)
        except ApiException as exc:
            if exc.status == _CONFLICT:
                return False
            raise
        return True

    def update_secret(
        self,
        namespace: str,
        name: str,
        change: Callable[[dict[str, str]], dict[str, str]],
        *,
        labels: dict[str, str],
        attempts: int = 10,
    ) -> dict[str, str]:
        """Read the Secret's data (empty if there is none), write ``change(data)`` back if it differs,
        as a compare-and-set on its resourceVersion (made, if missing), retried when another writer
        came first: two streams of a namespace never lose each other's keys. Returns the data written."""
        for _ in range(attempts):
            current = _unless_missing(lambda: self._core.read_namespaced_secret(name, namespace))
            data = {k: base64.b64decode(v).decode() for k, v in ((current.data if current else None) or {}).items()}
            wanted = change(dict(data))
            if wanted == data and (current is not None or not wanted):
                return data  # nothing to write (nor a Secret to make just to leave it empty)
            encoded: dict[str, Any] = {k: base64.b64encode(v.encode()).decode() for k, v in wanted.items()}
            try:
                if current is None:
                    body = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name, labels=labels), data=encoded)
                    self._core.create_namespaced_secret(namespace, body)
                else:
                    current.data = encoded
                    self._core.replace_namespaced_secret(name, namespace, current)  # resourceVersion: CAS
            except ApiException as exc:
                if exc.status != _CONFLICT:
                    raise
                continue  # another writer came first: read again
            return wanted
        raise RuntimeError(f"Secret {namespace}/{name}: {attempts} conflicting writers in a row; try again")

    def patch_secret_data(self, namespace: str, name: str, data: dict[str, str | None]) -> bool:
        """Set (or, for None, remove) items of a Secret the operator made, without reading it (it may
        not read it back: a CURVE client's); False if there is no such Secret."""
        encoded = {k: None if v is None else base64.b64encode(v.encode()).decode() for k, v in data.items()}
        body: Any = {"data": encoded}
        try:
            self._core.patch_namespaced_secret(name, namespace, body)
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return False
            raise
        return True

    def release_lease(self, namespace: str, name: str, *, identity: str) -> None:
        """Give the Lease up if ``identity`` holds it (another replica takes it at once, not after its
        duration); a compare-and-set like every Lease write, so a newer holder is never cleared."""
        api = k8s.CoordinationV1Api(self.api)
        lease = _unless_missing(lambda: api.read_namespaced_lease(name, namespace))
        if lease is None or lease.spec is None or lease.spec.holder_identity != identity:
            return
        lease.spec.holder_identity = None
        lease.spec.renew_time = None
        try:
            api.replace_namespaced_lease(name, namespace, lease)
        except ApiException as exc:
            if exc.status not in (_NOT_FOUND, _CONFLICT):
                raise

    def set_finalizers(self, kind: str, namespace: str, name: str, finalizers: list[str]) -> None:
        k8s.CustomObjectsApi(self.api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURALS[kind], name, {"metadata": {"finalizers": finalizers}}
        )

    def remove_annotation(self, kind: str, namespace: str, name: str, key: str, value: str) -> bool:
        """Remove the annotation ``key`` of a zeps object only if it still holds ``value``: one JSON
        Patch whose ``test`` the API server checks in the same write. A request someone annotated
        since (another replica to move, say) stays. False when it holds something else, or is gone."""
        pointer = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        body: Any = [{"op": "test", "path": pointer, "value": value}, {"op": "remove", "path": pointer}]
        try:
            k8s.CustomObjectsApi(self.api).patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURALS[kind], name, body, _content_type="application/json-patch+json"
            )
        except ApiException as exc:
            if exc.status in (_NOT_FOUND, _INVALID):  # _INVALID: the test failed (or no annotations at all)
                return False
            raise
        return True

    def patch_status(
        self, kind: str, namespace: str, name: str, changes: dict[str, Any], *, resource_version: str
    ) -> bool:
        """Merge ``changes`` into the object's status, only if it is still at ``resource_version``: a
        stale writer (a resync pass that began before a change) is refused, not applied. False when
        refused or when the object is gone."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": changes}
        try:
            k8s.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURALS[kind], name, body
            )
        except ApiException as exc:
            if exc.status in (_NOT_FOUND, _CONFLICT):
                return False
            raise
        return True

    def post_event(self, involved: dict[str, Any], *, type: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``involved`` (kind, namespace, name, uid), as kopf posts from a handler."""
        now = dt.datetime.now(dt.UTC)
        namespace = involved["namespace"]
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{involved['name']}.", namespace=namespace),
            involved_object=k8s.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}",
                kind=involved["kind"],
                name=involved["name"],
                namespace=namespace,
                uid=involved["uid"],
            ),
            type=type,
            reason=reason,
            message=message[:1024],
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=k8s.V1EventSource(component=FIELD_MANAGER),
            reporting_component=FIELD_MANAGER,
        )
        self._core.create_namespaced_event(namespace, event)

    def hold_lease(
        self,
        namespace: str,
        name: str,
        *,
        identity: str,
        owner: dict[str, str] | None = None,
        duration: int = 45,
        now: dt.datetime | None = None,
    ) -> str:
        """Acquire or renew the Lease (coordination.k8s.io/v1) for ``identity``; return its holder: ``identity``,
        or whoever holds it and has renewed it within its duration. Every write is a compare-and-set on
        the resourceVersion, so two replicas never both win. ``owner`` (apiVersion, kind, name, uid), if
        given, is set as the Lease's owner: Kubernetes deletes the Lease with it. ``now``: the time of
        this attempt (the wall clock unless given: the tests step it instead of waiting)."""
        api = k8s.CoordinationV1Api(self.api)
        now = dt.datetime.now(dt.UTC) if now is None else now
        references = [k8s.V1OwnerReference(**{_snake(k): v for k, v in owner.items()})] if owner else None
        lease = _unless_missing(lambda: api.read_namespaced_lease(name, namespace))
        if lease is None:
            fresh = k8s.V1Lease(
                metadata=k8s.V1ObjectMeta(
                    name=name, labels={"app.kubernetes.io/managed-by": FIELD_MANAGER}, owner_references=references
                ),
                spec=k8s.V1LeaseSpec(
                    holder_identity=identity, lease_duration_seconds=duration, acquire_time=now, renew_time=now
                ),
            )
            try:
                api.create_namespaced_lease(namespace, fresh)
                return identity
            except ApiException as again:
                if again.status != _CONFLICT:
                    raise
                lease = api.read_namespaced_lease(name, namespace)
        spec = lease.spec or k8s.V1LeaseSpec()
        lease.spec = spec
        renewed = spec.renew_time
        expired = renewed is None or renewed + dt.timedelta(seconds=spec.lease_duration_seconds or duration) < now
        if spec.holder_identity != identity and spec.holder_identity and not expired:
            return str(spec.holder_identity)
        if spec.holder_identity != identity:
            spec.acquire_time = now
        spec.holder_identity, spec.renew_time, spec.lease_duration_seconds = identity, now, duration
        if references and lease.metadata is not None and not lease.metadata.owner_references:
            lease.metadata.owner_references = references  # a Lease made before Leases had an owner
        try:
            api.replace_namespaced_lease(name, namespace, lease)  # resourceVersion: a compare-and-set
            return identity
        except ApiException as exc:
            if exc.status != _CONFLICT:
                raise
            current = api.read_namespaced_lease(name, namespace).spec
            return str(current.holder_identity if current else "")


def _unless_missing(read: Callable[[], T]) -> T | None:
    """``read()``, or None when the API server answers 404 Not Found."""
    try:
        return read()
    except ApiException as exc:
        if exc.status == _NOT_FOUND:
            return None
        raise


def _bytes(quantity: Any) -> int:
    """A Kubernetes quantity in bytes (0 for none, or one that is not a quantity)."""
    try:
        return int(parse_quantity(str(quantity))) if quantity else 0  # type: ignore[no-untyped-call]
    except ValueError:
        return 0


def _api_message(exc: ApiException) -> str:
    """The API server's message in a refusal (its Status body), else the exception's reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.reason or exc.status)[:500]


def _snake(key: str) -> str:
    """``apiVersion`` -> ``api_version``: the client's model takes Python names."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
