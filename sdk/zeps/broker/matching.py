"""Subscription patterns: routing-key prefixes (a trie) and regular expressions run by RE2.

A pattern starting with ``~`` is a regular expression (searched for anywhere in the key, as
``re.search`` does); anything else is a prefix ("" matches every key).

Regular expressions run on the broker's one thread, against keys any publisher chooses, so they are
compiled by RE2 (the ``google-re2`` wheel): an automaton, never backtracking, so matching a key costs
time linear in the key's length whatever the pattern (Python's ``re`` took 157 ms for ``(.|..)*x``
on a 26-character key, doubling with every few characters more). RE2's syntax is Perl's without
backreferences and lookaround (which need backtracking): such a pattern is refused, as is one whose
compiled program exceeds :data:`MAX_PROGRAM_SIZE` instructions (bounded repeats such as ``a{1000}``
grow it) or that needs more than :data:`MAX_REGEX_MEMORY` bytes. Matching a key costs at most the
program size times the key's length (255 bytes at most): bounded per key, per subscription.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import re2

from zeps.errors import ConfigError

__all__ = ["MAX_PROGRAM_SIZE", "MAX_REGEX_MEMORY", "Matcher", "PatternError", "PrefixTrie", "compile_pattern"]

REGEX_MARK = "~"
#: the largest RE2 program a subscription pattern may compile to (``.{255}`` is 2,044 instructions)
MAX_PROGRAM_SIZE = 5000
#: the memory RE2 may use for one pattern (its program and its lazily built automaton's cache)
MAX_REGEX_MEMORY = 1 << 20


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the peer's error, answered with INVALID: no stderr line
    options.max_mem = MAX_REGEX_MEMORY
    options.never_capture = True  # matches only: no submatch bookkeeping
    return options


_OPTIONS = _options()


class PatternError(ConfigError):
    """A subscription pattern is refused; the message is fit for INVALID."""


class _Regex:
    """One RE2 search: ``search(key)`` is true when the expression matches anywhere in ``key``. A
    one-pattern ``re2.Set`` matches (about 0.5 µs a key; ``re2.compile(...).search`` builds a match
    object each time and costs ten times more)."""

    __slots__ = ("_set", "program_size")

    def __init__(self, source: str) -> None:
        try:
            compiled = re2.compile(source, _OPTIONS)  # the parse errors worth reading come from here
        except re2.error as exc:
            raise PatternError(f"not a valid regular expression for RE2: {_reason(exc)}") from None
        self.program_size: int = max(compiled.programsize, compiled.reverseprogramsize)
        if self.program_size > MAX_PROGRAM_SIZE:
            raise PatternError(f"compiles to {self.program_size} RE2 instructions, more than the "
                               f"{MAX_PROGRAM_SIZE} allowed: use shorter bounded repeats")  # fmt: skip
        matcher = re2.Set.SearchSet(_OPTIONS)
        matcher.Add(source)
        matcher.Compile()
        self._set = matcher

    def search(self, key: str) -> bool:
        return self._set.Match(key) is not None


def _reason(exc: Exception) -> str:
    text = exc.args[0] if exc.args else exc
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)


@dataclass(frozen=True)
class Matcher:
    pattern: str
    prefix: str | None  # set for prefix patterns
    regex: _Regex | None  # set for regular expressions

    def matches(self, key: str) -> bool:
        if self.regex is not None:
            return self.regex.search(key)
        assert self.prefix is not None
        return key.startswith(self.prefix)


def compile_pattern(pattern: str, *, allow_regex: bool = True) -> Matcher:
    """A matcher for a subscription pattern: a key prefix, or ``~`` and a regular expression. With
    ``allow_regex=False`` (a broker whose ZepsStream says ``matching: prefix``) a regular expression is
    refused with :class:`PatternError`, as is one RE2 cannot run (see the module's notes)."""
    if not pattern.startswith(REGEX_MARK):
        return Matcher(pattern, pattern, None)
    if not allow_regex:
        raise PatternError(
            f"pattern {pattern!r} is a regular expression; this stream accepts key prefixes only (matching: prefix)"
        )
    try:
        regex = _Regex(pattern[len(REGEX_MARK) :])
    except PatternError as exc:
        raise PatternError(f"pattern {pattern!r} is refused: {exc}") from None
    return Matcher(pattern, None, regex)


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    members: set[Hashable] = field(default_factory=set)


class PrefixTrie:
    """Maps prefixes to members; :meth:`match` finds every member whose prefix starts a key."""

    def __init__(self) -> None:
        self._root = _Node()

    def add(self, prefix: str, member: Hashable) -> None:
        node = self._root
        for ch in prefix:
            node = node.children.setdefault(ch, _Node())
        node.members.add(member)

    def remove(self, prefix: str, member: Hashable) -> None:
        path = [self._root]
        for ch in prefix:
            nxt = path[-1].children.get(ch)
            if nxt is None:
                return
            path.append(nxt)
        path[-1].members.discard(member)
        for depth in range(len(prefix), 0, -1):  # prune empty branches
            node = path[depth]
            if node.members or node.children:
                break
            del path[depth - 1].children[prefix[depth - 1]]

    def match(self, key: str) -> Iterable[Hashable]:
        node = self._root
        yield from node.members
        for ch in key:
            node = node.children.get(ch)  # type: ignore[assignment]
            if node is None:
                return
            yield from node.members
