"""Helpers shared by commands: JSON output, the App from the click context."""

from __future__ import annotations

import json
from typing import Any, Callable

import click

from agent import AgentError

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")


def get_app(ctx: click.Context | None = None):
    ctx = ctx or click.get_current_context()
    return ctx.find_root().obj


def emit(data: Any, as_json: bool, human: Callable[[Any], None] | None = None) -> None:
    """Print ``data`` as exactly one JSON document, or call ``human(data)`` to print text."""
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    elif human is not None:
        human(data)


def fail(message: str) -> None:
    raise AgentError(message)


def warn_broken_config(app) -> str | None:
    """For a command that does not need the config: one line on stderr when the config is broken (the command
    goes on); returns that line's reason for a JSON field."""
    problem = app.config_problem()
    if problem:
        click.echo(f"agent: warning: the config is broken ({problem}); this command does not need it, others "
                   "refuse to run until it is fixed", err=True)
    return problem
