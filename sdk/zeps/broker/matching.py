"""Subscription patterns: routing-key prefixes (a trie) and bounded regular expressions.

A pattern starting with ``~`` is a regular expression (``re.search`` on the key); anything else is
a prefix ("" matches every key). Regular expressions are validated before use: they must compile,
and a repeat inside a repeat (``(a+)+``, the usual catastrophic-backtracking shape) is refused.
"""

from __future__ import annotations

import re

# The regex parser's tree is the only way to see a pattern's structure; the standard library has
# no public API for it (and no type stubs for these modules).
import re._constants as _sre_constants  # type: ignore[import-not-found]
import re._parser as _sre_parser  # type: ignore[import-not-found]
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from zeps.errors import ConfigError

__all__ = ["Matcher", "PatternError", "PrefixTrie", "compile_pattern"]

REGEX_MARK = "~"


class PatternError(ConfigError):
    """A subscription pattern is refused; the message is fit for INVALID."""


@dataclass(frozen=True)
class Matcher:
    pattern: str
    prefix: str | None  # set for prefix patterns
    regex: re.Pattern[str] | None  # set for regular expressions

    def matches(self, key: str) -> bool:
        if self.regex is not None:
            return self.regex.search(key) is not None
        assert self.prefix is not None
        return key.startswith(self.prefix)


def _nested_repeat(tree: Any, inside_repeat: bool = False) -> bool:
    """True if a repeat (max > 1) sits inside another repeat in a parsed regex."""
    c = _sre_constants
    for op, arg in tree:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            _, high, sub = arg
            repeats = high is c.MAXREPEAT or high > 1
            if repeats and inside_repeat:
                return True
            if _nested_repeat(sub, inside_repeat or repeats):
                return True
        elif op is c.SUBPATTERN:
            if _nested_repeat(arg[-1], inside_repeat):
                return True
        elif (op is c.BRANCH and any(_nested_repeat(branch, inside_repeat) for branch in arg[1])) or (
            op in (c.ASSERT, c.ASSERT_NOT) and _nested_repeat(arg[1], inside_repeat)
        ):
            return True
    return False


def compile_pattern(pattern: str, *, allow_regex: bool = True) -> Matcher:
    """A matcher for a subscription pattern: a key prefix, or ``~`` and a regular expression. With
    ``allow_regex=False`` (a broker whose ZepsStream says ``matching: prefix``) a regular expression is
    refused with :class:`PatternError`."""
    if not pattern.startswith(REGEX_MARK):
        return Matcher(pattern, pattern, None)
    if not allow_regex:
        raise PatternError(
            f"pattern {pattern!r} is a regular expression; this stream accepts key prefixes only (matching: prefix)"
        )
    source = pattern[len(REGEX_MARK) :]
    try:
        tree = _sre_parser.parse(source)
        regex = re.compile(source)
    except (re.error, RecursionError, OverflowError) as exc:
        raise PatternError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
    if _nested_repeat(tree.data if hasattr(tree, "data") else tree):
        raise PatternError(f"pattern {pattern!r} nests a repeat inside a repeat, which can backtrack catastrophically")
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
