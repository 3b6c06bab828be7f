"""Reading a zeps custom resource through the Kubernetes API: the SDK's only Kubernetes import.

In a pod it uses the in-cluster ServiceAccount; elsewhere the kubeconfig (``KUBECONFIG`` or
``~/.kube/config``). Every failure is one ConfigError naming the resource and the fix.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from zeps.errors import ConfigError
from zeps.resources import GROUP, PLURALS, VERSION

__all__ = ["list_resources", "read_resource", "read_secret"]


def _api(what: str, *, core: bool = False) -> Any:
    """A CustomObjectsApi (``core``: a CoreV1Api) from in-cluster config or the kubeconfig;
    ConfigError naming ``what``."""
    try:
        from kubernetes import client, config  # noqa: PLC0415 — the operator extra is optional
    except ImportError:
        raise ConfigError(
            f"{what}: settings were not given and the kubernetes package is missing; "
            "install zeps[operator], or set ZEPS_ZOOKEEPER (and ZEPS_STREAM_<NAME>_ENDPOINT for streams)"
        ) from None
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            # the client reads KUBECONFIG once, at import; read it now, as the user expects
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(
                f"{what}: no Kubernetes access to read it ({exc}); run in a pod, set KUBECONFIG, "
                "or pass the settings explicitly"
            ) from None
    return client.CoreV1Api() if core else client.CustomObjectsApi()


def read_secret(namespace: str, name: str, keys: tuple[str, ...], *, why: str) -> dict[str, str]:
    """``keys`` of the Secret, decoded: each must be there, UTF-8 and not empty. ``why`` says what
    needs it, in every error (with the fix: the permission to grant, or the keys to add)."""
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    api = _api(f"Secret {namespace}/{name} ({why})", core=True)
    try:
        secret = api.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise ConfigError(f"Secret {namespace}/{name} ({why}) does not exist: create it with the keys "
                              f"{', '.join(keys)}") from None  # fmt: skip
        if exc.status == 403:
            raise ConfigError(f"no permission to read Secret {namespace}/{name} ({why}): grant get on secrets "
                              f"(resourceNames: [{name}]) to this pod's ServiceAccount, or mount it with "
                              "envFrom") from None  # fmt: skip
        raise ConfigError(f"Secret {namespace}/{name}: the Kubernetes API answered {exc.status} {exc.reason}") from None
    data = secret.data or {}
    out = {}
    for key in keys:
        try:
            out[key] = base64.b64decode(data.get(key) or "", validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"Secret {namespace}/{name}: {key} is not UTF-8 text") from None
        if not out[key]:
            raise ConfigError(f"Secret {namespace}/{name} ({why}) has no {key}: add it (kubectl create secret "
                              f"generic {name} --from-literal={key}=…)")  # fmt: skip
    return out


def read_resource(plural: str, kind: str, name: str, namespace: str) -> dict[str, Any]:
    """The resource, which must exist and be Ready."""
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    api = _api(f"{kind} {namespace}/{name}")
    try:
        found = api.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            raise ConfigError(
                f"{kind} {namespace}/{name} does not exist: create it (kubectl apply -f …) or check the name "
                "and namespace"
            ) from None
        if exc.status == 403:
            raise ConfigError(
                f"no permission to read {plural}.zeps.dev in namespace {namespace}: grant get on {plural}.zeps.dev "
                "to this pod's ServiceAccount, or set the settings in the environment (ZEPS_ZOOKEEPER, …)"
            ) from None
        raise ConfigError(f"{kind} {namespace}/{name}: the Kubernetes API answered {exc.status} {exc.reason}") from None
    if not isinstance(found, dict):
        raise ConfigError(f"{kind} {namespace}/{name}: the Kubernetes API returned something unexpected")
    resource: dict[str, Any] = found
    conditions = (resource.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        why = f"{ready.get('reason')}: {ready.get('message')}" if ready else "the operator has not reconciled it yet"
        raise ConfigError(f"{kind} {namespace}/{name} is not Ready ({why}); see kubectl describe {plural} {name}")
    return resource


def list_resources(namespace: str | None) -> list[dict[str, Any]]:
    """Every Topic, Queue and ZepsStream in ``namespace`` (all namespaces when None)."""
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    api = _api("zeps status")
    out: list[dict[str, Any]] = []
    for plural in PLURALS.values():
        try:
            if namespace:
                found = api.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
            else:
                found = api.list_cluster_custom_object(GROUP, VERSION, plural)
        except ApiException as exc:
            if exc.status == 404:
                raise ConfigError("the zeps CRDs are not installed: kubectl apply -f crds/ (or helm install)") from None
            if exc.status == 403:
                raise ConfigError(
                    f"no permission to list {plural}.zeps.dev: grant list on it, or name a namespace"
                ) from None
            raise
        out.extend(found.get("items", []) if isinstance(found, dict) else [])
    return out
