"""The cleaner Lease keeper's own rule (zeps_operator.leadership): lead only while a renewal succeeded
within two thirds of the Lease's duration. The API server is replaced by a stub here because a renewal
that fails on demand cannot be had from a real one; acquiring, renewing and handing over the Lease on
the real API server are tested in tests/cluster (test_kube_adapter.py, test_operator.py)."""

from __future__ import annotations

from typing import Any

import pytest

from zeps_operator.leadership import LeaseKeeper


class _Answers:
    """hold_lease answers from a list: a holder's name, or an exception to raise."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.released: list[str] = []

    def hold_lease(self, namespace: str, name: str, *, identity: str, duration: int) -> str:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def release_lease(self, namespace: str, name: str, *, identity: str) -> None:
        self.released.append(identity)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _keeper(kube: Any, clock: _Clock | None = None) -> LeaseKeeper:
    return LeaseKeeper(kube, "ops", "zeps-operator-cleaner", identity="me", duration=3, clock=clock or _Clock())


def test_it_leads_only_while_its_last_renewal_is_fresh() -> None:
    kube, clock = _Answers("me", ConnectionError("API server away")), _Clock()
    keeper = _keeper(kube, clock)
    assert not keeper.leading() and keeper.holder == ""
    assert keeper.try_once() == "me" and keeper.leading()
    clock.now += 1.0
    with pytest.raises(ConnectionError):
        keeper.try_once()
    assert keeper.leading()  # still within 2/3 of the 3 s duration since the renewal that succeeded
    clock.now += 0.99
    assert keeper.leading()
    clock.now += 0.02  # 2.01 s after it: another replica may take the Lease soon, stop cleaning first
    assert not keeper.leading()


def test_it_does_not_lead_when_another_replica_holds_the_lease() -> None:
    keeper = _keeper(_Answers("other"))
    assert keeper.try_once() == "other"
    assert not keeper.leading() and keeper.holder == "other"


def test_stopping_gives_the_lease_up_only_if_held() -> None:
    held = _Answers("me")
    keeper = _keeper(held)
    keeper.try_once()
    keeper.stop()  # its thread was never started: stop only releases
    assert held.released == ["me"] and not keeper.leading()
    other = _Answers("other")
    keeper = _keeper(other)
    keeper.try_once()
    keeper.stop()
    assert other.released == []
