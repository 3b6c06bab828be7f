"""JSON that someone else may have written (a ZooKeeper node, an envelope's header), parsed within
bounds: a size, and a nesting depth checked before parsing, so a hostile value costs at most one
pass over its bytes and never a ``RecursionError`` (which no caller expects: a reconcile that met
one failed for good, and the object could be neither reconciled nor deleted)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "loads"]

MAX_DEPTH = 32  #: objects and arrays nested deeper are refused (zeps never writes more than 4)
_OPEN, _CLOSE, _QUOTE, _ESCAPE = frozenset(b"[{"), frozenset(b"]}"), ord('"'), ord("\\")


def loads(data: bytes | str, *, max_bytes: int = 1 << 20, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, or ValueError if ``data`` is larger than ``max_bytes``, nests deeper
    than ``max_depth`` or is not JSON."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise ValueError(f"{len(raw)} bytes of JSON, more than {max_bytes}")
    if raw.count(b"[") + raw.count(b"{") > max_depth and _depth(raw) > max_depth:
        raise ValueError(f"JSON nested deeper than {max_depth}")
    try:
        return json.loads(raw)
    except RecursionError:  # not reached after the depth check; kept so no caller ever sees one
        raise ValueError("JSON nested too deep") from None


def _depth(raw: bytes) -> int:
    """The deepest nesting of objects and arrays in ``raw`` (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _ESCAPE:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif byte in _CLOSE:
            depth -= 1
    return deepest
