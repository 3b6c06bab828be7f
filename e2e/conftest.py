"""The e2e suite's cluster.

* On kind (``make e2e``: ``ZEPS_E2E_KUBECONFIG`` is set by ``python -m zeps_dev.kind e2e``): real nodes,
  the chart installed with helm (operator and a 3-server ZooKeeper ensemble in pods), the images
  built here. Every test here runs, ``e2e/kind/`` included: pods, Services, PVCs and RBAC are real.
* Everywhere else (``make test``): the local control plane with ZooKeeper and the operator as local
  processes, the same ones the tests/ suite uses (fixtures of the root conftest.py, started once).
  ``e2e/kind/`` is not collected there — its tests need containers that really run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config as kubeconfig_loader
from kubernetes.client import ApiClient

from zeps_dev import ControlPlane
from zeps_dev.apireads import ApiReadError, ApiReads

ROOT = Path(__file__).resolve().parents[1]
KIND = bool(os.environ.get("ZEPS_E2E_KUBECONFIG"))

collect_ignore = [] if KIND else ["kind"]


def _client_request(client: ApiClient) -> Any:
    """:data:`zeps_dev.apireads.Request` through the kubernetes client (it reads kind's kubeconfig)."""

    def request(path: str, query: Sequence[tuple[str, str]], accept_json: bool) -> tuple[int, bytes]:
        accept = {"Accept": "application/json" if accept_json else "*/*"}
        method, url, headers, body, post = client.param_serialize("GET", path, query_params=list(query),
                                                                  header_params=accept)  # fmt: skip
        try:
            response = client.call_api(method, url, headers, body, post, _request_timeout=60)
            response.read()
        except Exception as exc:  # urllib3's errors: no answer, as kubectl fails
            raise OSError(str(exc)) from exc
        data = response.data
        return response.status, data if isinstance(data, bytes) else str(data).encode()

    return request


class Cluster:
    """kubectl (the pinned one) against the cluster under test, with a few waits tests share. Its
    reads (``kubectl get … -o json``, ``kubectl logs``) are answered in this process: the same GET to
    the API server without a kubectl process (:mod:`zeps_dev.apireads`)."""

    def __init__(self, kubectl: list[str], *, reads: ApiReads, plane: ControlPlane | None = None) -> None:
        self._kubectl = kubectl
        self._reads = reads
        self.plane = plane

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 300, check: bool = True) -> str:
        answered = self._reads.answer(args, check=check, error=AssertionError)
        if answered is not None:
            return answered
        result = subprocess.run(
            [*self._kubectl, *args], capture_output=True, text=True, input=input, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def apply(self, manifest: str, namespace: str) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

    def json(self, *args: str) -> Any:
        """``kubectl get *args -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def logs(self, target: str, namespace: str, *, previous: bool = False, check: bool = True) -> str:
        """``kubectl logs target -n namespace [--previous]``; ``check=False``: "" where kubectl fails."""
        try:
            found = self._reads.log(target, namespace, previous=previous)
        except ApiReadError as exc:
            if check:
                raise AssertionError(f"kubectl logs {target} -n {namespace} failed: {exc}") from exc
            return ""
        if found is not None:
            return found
        return self.kubectl("logs", target, "-n", namespace, *(["--previous"] if previous else []), check=check)

    def wait_for(self, what: str, check: Any, *, timeout: float = 180, interval: float = 1.0) -> Any:
        """Poll ``check()`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except AssertionError as exc:  # kubectl said no (not found yet, …)
                last = exc
            else:
                if last:
                    return last
            time.sleep(interval)  # the e2e tests' one way to wait: kubectl has no watch to block on here
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def _pinned_kubectl() -> str:
    for var in ("ZEPS_KINDBIN", "ZEPS_TESTBIN"):
        folder = os.environ.get(var)
        if folder and (Path(folder) / "kubectl").exists():
            return str(Path(folder) / "kubectl")
    raise RuntimeError("no pinned kubectl: run `make e2e` (ZEPS_KINDBIN) or `make setup` (ZEPS_TESTBIN)")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if KIND:
        kubeconfig = os.environ["ZEPS_E2E_KUBECONFIG"]
        reads = ApiReads(_client_request(kubeconfig_loader.new_client_from_config(config_file=kubeconfig)))
        yield Cluster([_pinned_kubectl(), f"--kubeconfig={kubeconfig}"], reads=reads)
        return
    # make test: the session's shared stack (the root conftest.py), not one of its own, and its reader
    plane: ControlPlane = request.getfixturevalue("crds")
    request.getfixturevalue("operator")
    yield Cluster([_pinned_kubectl(), f"--kubeconfig={plane.kubeconfig}"], reads=plane.reads, plane=plane)
