"""Helpers shared by commands: JSON output, the App from the click context."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Iterable

import click

from agent import AgentError

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")


def limit_option(what: str):
    from agent.ledger.listing import DEFAULT_LIMIT

    return click.option("--limit", type=click.IntRange(min=0), default=DEFAULT_LIMIT, show_default=True,
                        help=f"At most N {what}, with --json too; 0 for all of them (printed as they are read, "
                             "so memory stays flat). When the default leaves rows out, a line on stderr says so.")


def since_option(what: str):
    return click.option("--since", metavar="WHEN", help=f"Only {what} at or after WHEN: a duration back from now "
                                                        "(30m, 6h, 2d, 1w) or an ISO date/time (UTC).")


def listing_args(limit: int, since: str | None) -> dict:
    """--limit and --since as the ledger's listings take them (0: no limit; a timestamp)."""
    from agent.ledger.listing import since_ts

    return {"limit": limit or None, "since": since_ts(since) if since else None}


def emit_rows(rows: Iterable[dict], as_json: bool, line: Callable[[dict], None], empty: str, what: str) -> int:
    """Print a listing row by row as the ledger yields it: one JSON array (the same text ``emit`` prints for a
    list), or ``line(row)`` per row (``empty`` when there is none). Says on stderr when the default limit left rows
    out."""
    n = 0
    if as_json:
        out = sys.stdout
        out.write("[")
        for r in rows:
            text = json.dumps(r, indent=2, sort_keys=True, default=str).replace("\n", "\n  ")
            out.write(("\n  " if n == 0 else ",\n  ") + text)
            n += 1
        out.write("\n]\n" if n else "]\n")
        out.flush()
    else:
        for r in rows:
            line(r)
            n += 1
        if not n and empty:
            click.echo(empty)
    ctx = click.get_current_context(silent=True)
    default = ctx is None or ctx.get_parameter_source("limit") is click.core.ParameterSource.DEFAULT
    if default and getattr(rows, "more", False):   # (an explicit --limit N asked for N)
        click.echo(f"agent: more {what} than the {n} shown; pass --limit N (0 for all) or --since WHEN", err=True)
    return n


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
