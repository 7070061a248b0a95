"""The `agent` command line: a thin root that loads each command group only when it is used.

Commands live in ``agent/cli/``; each parses options, calls a library function and prints.
The registry below is the whole list; a cron tick imports only the command it runs.
"""

from __future__ import annotations

import importlib
import sqlite3
import sys

import click

from agent import AgentError, __version__

COMMANDS: dict[str, str] = {
    "init": "agent.cli.setup:init",
    "status": "agent.cli.setup:status",
    "demo": "agent.cli.setup:demo",
    "doctor": "agent.cli.setup:doctor",
    "task": "agent.cli.task:task",
    "checklist": "agent.cli.task:checklist",
    "events": "agent.cli.task:events",
    "watch": "agent.cli.watch:watch",
    "error": "agent.cli.error:error",
    "pr": "agent.cli.pr:pr",
    "daemon": "agent.cli.watch:daemon",
    "lane": "agent.cli.lane:lane",
    "lesson": "agent.cli.lesson:lesson",
    "notify": "agent.cli.serve:notify",
    "serve": "agent.cli.serve:serve",
    "runners": "agent.cli.runners:runners",
    "bench": "agent.cli.bench:bench",
}


class Refusal(click.ClickException):
    """An AgentError shown as one line on stderr with exit code 1 (also under CliRunner)."""

    exit_code = 1

    def show(self, file=None):
        click.echo(f"agent: {self.message}", err=True)


class LazyGroup(click.Group):
    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name in self.lazy:
            module, attr = self.lazy[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AgentError as exc:
            raise Refusal(str(exc)) from None
        except (OSError, sqlite3.OperationalError) as exc:  # a full or read-only disk, a busy ledger: one line
            fault = _storage_fault(ctx, exc)
            if fault is None:
                raise
            raise Refusal(str(fault)) from None


def _storage_fault(ctx, exc):
    from agent.ledger import sqlite_path, storage_fault

    app = ctx.obj   # (the SQLite file's path even for a PostgreSQL ledger: only the home's own files fill a disk then)
    return storage_fault(exc, sqlite_path(app.home) if app is not None else "ledger.db")


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agent")
@click.option("--home", type=click.Path(file_okay=False), envvar="AGENT_HOME", show_envvar=True,
              help="Home folder: ledger, config, mirrors, worktrees, logs. Default: the user data dir.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="Use this config file instead of HOME/config.yaml.")
@click.pass_context
def cli(ctx, home, config_file):
    """Turn production errors into reviewed draft pull requests.

    \b
    Quick start:
      agent demo                  # the whole path on an embedded example, offline
      agent init                  # create the home, ledger and a commented config
      agent watch all             # one pass of every scan (for cron)
    """
    from pathlib import Path

    from agent.app.context import App
    from agent.app.homedir import resolve_home

    app = App(home=resolve_home(home), config_file=Path(config_file).resolve() if config_file else None)
    ctx.obj = app
    ctx.call_on_close(app.close)


def main(argv: list[str] | None = None) -> None:
    try:
        # standalone_mode=False returns click's Exit code instead of exiting; keep it
        rv = cli.main(args=argv, prog_name="agent", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except AgentError as exc:  # raised outside a command (e.g. while opening the home)
        click.echo(f"agent: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)
