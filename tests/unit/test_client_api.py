"""The asyncio client's API is the blocking client's: compared on the sources (compiled, mypyc
exposes instance attributes and properties alike as descriptors of the class, so this runs pure)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from zeps.client import AsyncStreamClient, StreamClient


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any, Any, str]]:
    """A signature's parameters: name, kind, default and annotation (return types differ by nature)."""
    return [(p.name, p.kind, p.default, str(p.annotation)) for p in inspect.signature(function).parameters.values()]


@pytest.mark.pure
def test_async_client_has_the_same_api_as_the_blocking_one() -> None:
    """Same public names, same constructor, same parameters for every method (awaited, or async
    iterators where the blocking client returns iterators; alternate constructors are plain)."""
    sync_api = {n for n in dir(StreamClient) if not n.startswith("_")}
    async_api = {n for n in dir(AsyncStreamClient) if not n.startswith("_")}
    assert sync_api == async_api
    assert _parameters(StreamClient.__init__) == _parameters(AsyncStreamClient.__init__)
    for name in sorted(sync_api):
        blocking, awaited = getattr(StreamClient, name), getattr(AsyncStreamClient, name)
        if callable(blocking):
            assert _parameters(blocking) == _parameters(awaited), name
            if isinstance(inspect.getattr_static(AsyncStreamClient, name), classmethod):
                continue  # an alternate constructor (of): makes the client, awaits nothing
            assert inspect.iscoroutinefunction(awaited) or inspect.isasyncgenfunction(awaited), name
        else:
            assert type(blocking) is type(awaited), name
