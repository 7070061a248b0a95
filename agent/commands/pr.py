"""`agent pr list`, `agent pr show`, `agent pr mark` (the local forge's merge/close button)."""

from __future__ import annotations

import click

from agent.commands.common import emit, get_app, json_option


@click.group()
def pr():
    """Draft pull requests opened by agent (ID is the task id)."""


def list_prs(ledger) -> list[dict]:
    rows = ledger.all("SELECT task_id, forge, repo, number, url, head_branch AS head, head_sha, base, state, "
                      "draft, title, updated_at FROM prs ORDER BY task_id")
    for r in rows:
        r["draft"] = bool(r["draft"])
    return rows


def get_pr(ledger, task_id: int) -> dict:
    from agent import AgentError

    row = ledger.one("SELECT * FROM prs WHERE task_id = ?", (task_id,))
    if row is None:
        raise AgentError(f"task {task_id} has no PR; see `agent pr list`")
    return row


@pr.command("list")
@json_option
def pr_list(as_json):
    """List the PRs agent opened, with their state.

    \b
    Example:
      agent pr list --json
    """
    rows = list_prs(get_app().ledger)

    def human(rows):
        if not rows:
            click.echo("no PRs yet")
        for r in rows:
            kind = "draft" if r["draft"] else "ready"
            click.echo(f"task {r['task_id']:>4}  {r['forge']:<6} {r['repo']}#{r['number']}  {r['state']:<6} "
                       f"{kind}  {r['head']}  {r['url']}")

    emit(rows, as_json, human)


@pr.command("show")
@click.argument("task_id", type=int)
@json_option
def pr_show(task_id, as_json):
    """Print a task's PR title and body as sent to the forge.

    \b
    Example:
      agent pr show 3
    """
    row = get_pr(get_app().ledger, task_id)
    data = {k: row[k] for k in ("task_id", "forge", "repo", "number", "url", "head_branch", "head_sha", "base",
                                "state", "title", "body")}
    data["draft"] = bool(row["draft"])
    emit(data, as_json, lambda d: click.echo(f"{d['title']}\n\n{d['body']}"))


@pr.command("mark")
@click.argument("task_id", type=int)
@click.argument("state", type=click.Choice(["merged", "closed"]))
def pr_mark(task_id, state):
    """Merge or close a task's PR in the local forge, as a reviewer would (demo and tests).

    `agent watch pr-merged` then follows it up.

    \b
    Example:
      agent pr mark 3 merged
    """
    from agent import AgentError
    from agent.forge import get_forge

    app = get_app()
    row = get_pr(app.ledger, task_id)
    if row["forge"] != "local":
        raise AgentError(f"task {task_id}'s PR is on {row['forge']}: merge or close it there ({row['url']})")
    repo_cfg = app.config.repos.get(row["repo"])
    if repo_cfg is None:
        from agent.config import RepoConfig

        repo_cfg = RepoConfig(name=row["repo"], url="", forge="local")
    forge = get_forge(repo_cfg, app.config, app.home, app.ledger)
    done = forge.mark(int(row["number"]), state)
    click.echo(f"{row['repo']}#{done.number} {done.state} in the local forge; run `agent watch pr-merged`")
