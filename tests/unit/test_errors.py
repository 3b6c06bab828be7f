"""The error hierarchy: every error zeps raises sits in one category, and the CLI's exit code follows
the category, as zeps.errors documents."""

from __future__ import annotations

import importlib
import re

import click
import pytest
from click.testing import CliRunner

import zeps.errors
from zeps.broker.matching import PatternError
from zeps.cli_common import reporting_errors
from zeps.client import BrokerUnavailableError
from zeps.coordination.admin import PathConflictError, ZooKeeperUnavailableError
from zeps.coordination.queue import LockLostError
from zeps.errors import (
    EXIT_CONFIG,
    EXIT_DATA_LOSS,
    EXIT_UNAVAILABLE,
    ConfigError,
    CoordinationError,
    DataLossError,
    RemoteProtocolError,
    SetupError,
    UnavailableError,
    ZepsError,
    exit_code,
)


def test_the_documented_exit_codes_are_the_ones_used() -> None:
    """The module docstring lists each category with its code in brackets: they must agree."""
    documented = re.findall(r":class:`(\w+)` \[(\d)\]", zeps.errors.__doc__ or "")
    assert len(documented) == 6
    for name, code in documented:
        error = getattr(zeps.errors, name)
        assert exit_code(error("x")) == int(code), name


@pytest.mark.parametrize(
    ("error", "category", "code"),
    [
        (PatternError("bad regex"), ConfigError, EXIT_CONFIG),  # the user's pattern: fix the request
        (BrokerUnavailableError("silent for 60 s"), UnavailableError, EXIT_UNAVAILABLE),
        (ZooKeeperUnavailableError("no answer"), UnavailableError, EXIT_UNAVAILABLE),
        (ZooKeeperUnavailableError("no answer"), CoordinationError, EXIT_UNAVAILABLE),
        (LockLostError("taken since"), CoordinationError, EXIT_UNAVAILABLE),
        (PathConflictError("another uid"), CoordinationError, EXIT_UNAVAILABLE),
        (RemoteProtocolError("bad frame"), ZepsError, EXIT_UNAVAILABLE),
        (DataLossError("removed by retention"), DataLossError, EXIT_DATA_LOSS),
        (SetupError("no java"), SetupError, EXIT_CONFIG),
    ],
)
def test_each_error_has_its_category_and_code(error: ZepsError, category: type, code: int) -> None:
    assert isinstance(error, category)
    assert exit_code(error) == code


def test_data_loss_and_availability_are_not_configuration() -> None:
    """A query whose data retention removed, or a broker that went silent, is not the user's settings:
    neither may be caught as ConfigError (nor exit with its code)."""
    assert not issubclass(DataLossError, ConfigError)
    assert not issubclass(BrokerUnavailableError, ConfigError)
    assert not issubclass(UnavailableError, ConfigError)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("option x: use y"), EXIT_CONFIG),
        (BrokerUnavailableError("the broker sent nothing for 60 s"), EXIT_UNAVAILABLE),
        (DataLossError("sequences 1..9 were removed by retention"), EXIT_DATA_LOSS),
    ],
)
def test_the_cli_exits_with_the_category_code_and_one_line(error: ZepsError, code: int) -> None:
    @click.command()
    @reporting_errors
    def command() -> None:
        raise error

    result = CliRunner().invoke(command, [])
    assert result.exit_code == code
    assert result.stderr == f"zeps: {error}\n"
    assert "Traceback" not in result.output


def test_the_cli_module_has_no_code_of_its_own_for_categories() -> None:
    """One place decides: the CLI imports the codes from zeps.errors rather than defining them."""
    for name in ("zeps.cli", "zeps.cli_common"):
        module = importlib.import_module(name)
        assert not hasattr(module, "EXIT_CONFIG") and not hasattr(module, "EXIT_UNAVAILABLE")
