"""The installed `agent` binary as a real subprocess: exit codes, --json, --help examples."""

from __future__ import annotations

import json

from agent.cli import COMMANDS
from conftest import LANES_YAML, on_postgres


def test_binary_init_create_list_json(agent_proc, home):
    r = agent_proc("init", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["journal_mode"] == ("postgresql" if on_postgres() else "wal")
    r = agent_proc("task", "create", "--repo", "acme/widgets", "--title", "Fix checkout", "--json")
    assert r.returncode == 1 and "repository acme/widgets is not configured" in r.stderr
    (home / "config.yaml").write_text("repos: {acme/widgets: {url: /srv/git/widgets.git}}\n" + LANES_YAML)
    r = agent_proc("task", "create", "--repo", "acme/widgets", "--title", "Fix checkout", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == 1
    rows = json.loads(agent_proc("task", "list", "--json").stdout)
    assert len(rows) == 1
    for key in ("id", "error_id", "repo", "branch", "state", "round", "pr_url", "blocked_reason"):
        assert key in rows[0]
    shown = json.loads(agent_proc("task", "show", "1", "--json").stdout)
    assert [s["key"] for s in shown["steps"]][0] == "spec_written"
    events = json.loads(agent_proc("events", "--task", "1", "--json").stdout)
    assert events[0]["kind"] == "task.created" and events[0]["actor"] == "human"


def test_binary_exit_codes(agent_proc, home):
    agent_proc("init")
    r = agent_proc("task", "close-step", "99", "spec_written", "--evidence", "x")
    assert r.returncode == 1 and r.stderr.strip() == "agent: no task 99; see `agent task list`"
    r = agent_proc("task", "create", "--repo", "acme/widgets")
    assert r.returncode == 2 and "Missing option '--title'" in r.stderr
    r = agent_proc("checklist", "set", "1", "pushed", "--status", "maybe", "--evidence", "x")
    assert r.returncode == 2


def test_every_command_has_help_with_an_example(agent):
    import click

    from agent.cli import cli

    def walk(cmd, path):
        yield path, cmd
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), path + [name])

    seen = 0
    for path, cmd in walk(cli, []):
        if not path:
            continue
        r = agent(*path, "--help")
        assert r.exit_code == 0, path
        if not isinstance(cmd, click.Group) or path == ["watch"]:
            assert "Example" in r.output, f"`agent {' '.join(path)} --help` has no example"
        seen += 1
    assert seen >= len(COMMANDS)
