"""Subscription patterns (``zeps.broker.matching``): a hostile regular expression cannot stall the broker.

The broker matches every live ``~regex`` subscription against the key of every new record on its one
thread. Python's ``re`` backtracks: ``(.|..)*x`` took 157 ms on a 26-character key and doubles every
few characters (keys may have 255). The matcher runs RE2, an automaton whose work per key is at most
its program size times the key's length; patterns that need backtracking (backreferences,
lookaround) or compile to an oversized program are refused.

How "linear" is checked without timing anything: every accepted pattern is run by RE2 (never by a
backtracking engine) with a program within :data:`MAX_PROGRAM_SIZE`, which bounds the work per key.
The classic catastrophic patterns are then matched against 255-character adversarial keys under a
watchdog: a backtracking engine would need longer than the age of the universe for them, RE2 needs
microseconds, so the watchdog (seconds) only ever fires on a regression to backtracking.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeps.broker.matching import MAX_PROGRAM_SIZE, PatternError, _Regex, compile_pattern

#: patterns that make a backtracking engine exponential in the key's length
CATASTROPHIC = ["(.|..)*x", "(a+)+$", "(a|aa)+b", "(x+x+)+y", "([a-z]+)*!", "(a|a?)+b", "(.*a){12}z"]
KEYS = ["a" * 255, "x" * 254 + "!", ("ab" * 128)[:255], "a" * 200 + "." * 55]


@contextmanager
def watchdog(seconds: int) -> Iterator[None]:
    """Fail (rather than hang the suite) if the block runs longer than ``seconds``: a hang detector."""

    def expired(*_: object) -> None:
        raise AssertionError(f"matching ran past the {seconds}s watchdog: a backtracking engine is back")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("source", CATASTROPHIC)
def test_catastrophic_patterns_match_long_keys_at_once(source: str) -> None:
    matcher = compile_pattern("~" + source)
    assert isinstance(matcher.regex, _Regex)
    with watchdog(10):
        for _ in range(200):
            for key in KEYS:
                matcher.matches(key)
    for key in ("", "a", "ax", "aab", "xxy", "ab!", "aaaaaaaaz", "x.x"):  # short keys: re backtracks in time
        assert matcher.matches(key) == (re.search(source, key) is not None), key


def test_search_finds_a_match_anywhere_as_re_search_does() -> None:
    matcher = compile_pattern("~eu\\.(fr|de)\\.")
    assert matcher.matches("eu.fr.cac40") and matcher.matches("x.eu.de.dax")
    assert not matcher.matches("eu.it.mib")
    anchored = compile_pattern("~^eu\\.1[0-9]$")
    assert anchored.matches("eu.15") and not anchored.matches("xeu.15") and not anchored.matches("eu.150")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("~(a)\\1", "not a valid regular expression for RE2"),  # a backreference needs backtracking
        ("~a(?=b)", "not a valid regular expression for RE2"),  # lookahead likewise
        ("~(", "not a valid regular expression for RE2"),
        ("~(a{1000}){1000}", "not a valid regular expression for RE2"),
        ("~.{1000}", f"more than the {MAX_PROGRAM_SIZE} allowed"),
    ],
)
def test_patterns_that_need_backtracking_or_too_much_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(PatternError, match=why):
        compile_pattern(pattern)


def test_prefix_only_refuses_every_regex() -> None:
    with pytest.raises(PatternError, match="key prefixes only"):
        compile_pattern("~a", allow_regex=False)
    assert compile_pattern("eu.", allow_regex=False).matches("eu.fr")


# A grammar of regular expressions: atoms, then concatenation, alternation and repeats of any depth.
_ATOMS = st.sampled_from(["a", "b", "x", ".", "[a-z]", "[^.]", "\\d", "\\w", "\\.", "^", "$"])
_REPEATS = st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{0,20}", "*?", "+?"])


def _grow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, children).map("".join),
        st.tuples(children, children).map(lambda t: f"({t[0]}|{t[1]})"),
        st.tuples(children, _REPEATS).map(lambda t: f"(?:{t[0]}){t[1]}"),
    )


REGEXES = st.recursive(_ATOMS, _grow, max_leaves=12)


@settings(max_examples=300)
@given(source=REGEXES, key=st.sampled_from(KEYS))
def test_every_accepted_pattern_is_bounded_linear_work(source: str, key: str) -> None:
    """Whatever a peer sends: either a refusal naming why, or an RE2 program within the bound, whose
    work on a 255-character key is at most program size x 255 steps (the watchdog catches a hang)."""
    try:
        matcher = compile_pattern("~" + source)
    except PatternError as exc:
        assert "is refused" in str(exc)
        return
    assert isinstance(matcher.regex, _Regex), "a regex runs in RE2, never in a backtracking engine"
    assert 0 < matcher.regex.program_size <= MAX_PROGRAM_SIZE
    with watchdog(5):
        matcher.matches(key)
