"""The reads the test suites answer in their own process (:mod:`zeps_dev.apireads`) print what the
pinned kubectl prints, on the real API server: each shape the tests use, compared with kubectl run
as a process (``kubectl_argv``, which nothing intercepts)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from zeps.errors import SetupError
from zeps_dev import ControlPlane
from zeps_dev.apireads import ApiReadError


def _kubectl_json(plane: ControlPlane, *args: str) -> Any:
    out = subprocess.run([*plane.kubectl_argv, "get", *args, "-o", "json"], capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    return json.loads(out.stdout)


@pytest.fixture
def objects(crds: ControlPlane, namespace: str) -> str:
    topic = {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "news", "labels": {"a": "b"}}}
    crds.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(topic))
    crds.kubectl("create", "configmap", "settings", "-n", namespace, "--from-literal=k=v")
    crds.kubectl("label", "configmap", "settings", "-n", namespace, "app=yes")
    return namespace


@pytest.mark.parametrize(
    "args",
    [
        ("nodes",),
        ("topic", "news"),  # a CRD by its singular name
        ("topics",),
        ("zt",),  # a short name
        ("cm", "-l", "app=yes"),
        ("configmap", "settings"),
        ("events", "--field-selector", "reason=NoSuchReason"),
        ("leases", "-A", "-l", "app.kubernetes.io/managed-by=nobody"),
    ],
)
def test_a_read_is_what_kubectl_prints(crds: ControlPlane, objects: str, args: tuple[str, ...]) -> None:
    scoped = (*args, "-n", objects) if "-A" not in args else args
    assert crds.reads.get(scoped) == _kubectl_json(crds, *scoped)


def test_what_it_does_not_speak_is_left_to_kubectl_and_a_refusal_reads_as_kubectl_s(
    crds: ControlPlane, objects: str
) -> None:
    for args in (("pods,configmaps",), ("topics.zeps.dev", "news"), ("topic/news",), ("topics", "--sort-by=x")):
        assert crds.reads.get((*args, "-n", objects)) is None, args
    with pytest.raises(ApiReadError, match=r'Error from server \(NotFound\): topics.zeps.dev "gone" not found'):
        crds.reads.get(("topic", "gone", "-n", objects))
    with pytest.raises(SetupError, match="NotFound"):  # kubectl()'s own failure, as for any command
        crds.kubectl("get", "topic", "gone", "-n", objects, "-o", "json")
    assert crds.kubectl("get", "topic", "gone", "-n", objects, "-o", "json", check=False) == ""
