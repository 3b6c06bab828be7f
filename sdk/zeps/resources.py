"""The custom resources' API coordinates: the one place the group, the version and each kind's plural
are written. The SDK (resolving a handle through the Kubernetes API), the operator (its handlers and
the CRD models) and the dev stack read them from here."""

from __future__ import annotations

from typing import Literal

__all__ = ["GROUP", "KIND_NAMES", "PLURALS", "VERSION", "Kind"]

GROUP = "zeps.dev"
VERSION = "v1alpha1"
Kind = Literal["Topic", "Queue", "ZepsStream"]
#: each kind's plural, as in its CRD's name (``<plural>.<group>``) and in API paths
PLURALS: dict[str, str] = {"Topic": "topics", "Queue": "queues", "ZepsStream": "zepsstreams"}
KIND_NAMES: tuple[str, ...] = tuple(PLURALS)
