"""The ``zeps`` command line's conventions, shared by its commands and by ``zeps dev`` (:mod:`zeps_dev.cli`):
output as a human line or, with ``--json``, a JSON line; errors as one line on stderr and the exit
code of their category (:func:`zeps.errors.exit_code`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from zeps.errors import ZepsError, exit_code

__all__ = ["EXIT_EMPTY", "emit", "reporting_errors"]

EXIT_EMPTY = 1  # the other codes follow the error hierarchy: zeps.errors.exit_code


def emit(ctx: click.Context, human: str, data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, sort_keys=True, default=str) if ctx.obj["json"] else human)


def reporting_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn zeps errors into one line on stderr and their category's exit code (:func:`zeps.errors.exit_code`)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ZepsError as exc:
            click.echo(f"zeps: {exc}", err=True)
            sys.exit(exit_code(exc))

    return wrapper
