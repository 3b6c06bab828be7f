"""Where kopf keeps an object's last-handled configuration: in its status, not in an annotation.

kopf compares an object with the configuration it last handled to tell a change from a resume. By
default it keeps that in an annotation: a change's handler then costs two PATCHes, one for the
annotation (the object) and one for the status the handler writes (the status subresource). Kept in
``status.kopf`` (the CRDs let kopf keep fields there), both go in one PATCH: a new Topic costs two
PATCHes (its finalizer, then handled) instead of three, and kopf gets one watch event less to process.

Objects an earlier operator handled carry the annotation: it is read while the status has nothing
yet, left out of the comparison, and removed when the object next changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kopf

__all__ = ["StatusDiffBase"]


class StatusDiffBase(kopf.StatusDiffBaseStorage):
    """kopf's ``StatusDiffBaseStorage`` (``status.kopf.last-handled-configuration``), reading and then
    removing the annotation of kopf's default storage where an object still has it."""

    def __init__(self) -> None:
        super().__init__()
        self._annotation = kopf.AnnotationsDiffBaseStorage()

    def _annotation_keys(self, body: kopf.Body) -> set[str]:
        return set(self._annotation.make_keys(self._annotation.key, body=body))

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        self._annotation.remove_annotations(essence, self._annotation_keys(body))  # never part of a diff
        self._annotation.remove_empty_stanzas(essence)
        return essence

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return super().fetch(body=body) or self._annotation.fetch(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        super().store(body=body, patch=patch, essence=essence)
        for key in self._annotation_keys(body) & set(body.metadata.annotations):
            patch.metadata.annotations[key] = None  # the earlier operator's copy: one last PATCH removes it
