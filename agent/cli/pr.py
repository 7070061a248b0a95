"""`agent pr list|show`, and the local forge's human side: `mark` (merge/close), `comment`, `checks`."""

from __future__ import annotations

import click

from agent.cli.common import (emit, emit_rows, get_app, json_option, limit_option, listing_args, since_option,
                                   warn_broken_config)


@click.group()
def pr():
    """Draft pull requests opened by agent (ID is the task id)."""


def get_pr(ledger, task_id: int) -> dict:
    from agent import AgentError
    from agent.ledger.prs import get_pr as find

    row = find(ledger, task_id)
    if row is None:
        raise AgentError(f"task {task_id} has no PR; see `agent pr list`")
    return row


@pr.command("list")
@click.option("--state", type=click.Choice(("open", "merged", "closed")), help="Only PRs in this state.")
@since_option("PRs updated")
@limit_option("PRs, the newest (still in task order)")
@json_option
def pr_list(state, since, limit, as_json):
    """List the PRs agent opened, with their state.

    \b
    Example:
      agent pr list --json
    """
    from agent.ledger.prs import iter_prs

    app = get_app()
    warn_broken_config(app)

    def line(r):
        kind = "draft" if r["draft"] else "ready"
        click.echo(f"task {r['task_id']:>4}  {r['forge']:<6} {r['repo']}#{r['number']}  {r['state']:<6} "
                   f"{kind}  {r['head']}  {r['url']}")

    emit_rows(iter_prs(app.ledger, state, **listing_args(limit, since)), as_json, line, "no PRs yet", "PRs")


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


def _local_forge(app, task_id: int):
    """The local forge holding a task's PR (the human side exists only there), and the PR row."""
    from agent import AgentError
    from agent.forge.local import LocalForge
    from agent.ledger.tasks import get_task

    get_task(app.ledger, task_id)
    row = get_pr(app.ledger, task_id)
    if row["forge"] != "local":
        raise AgentError(f"task {task_id}'s PR is on {row['forge']}: comment or report CI there ({row['url']})")
    return LocalForge(app.ledger, app.home, row["repo"]), row


@pr.command("comment")
@click.argument("task_id", type=int)
@click.argument("text")
@click.option("--path", default=None, help="File the comment is on (an inline review comment).")
@click.option("--line", type=int, default=None, help="Line in --path.")
@click.option("--author", default=None, help="Who writes it (default: you, the local forge's collaborator).")
@click.option("--request-changes", is_flag=True, help="Post it as a review that requests changes.")
@json_option
def pr_comment(task_id, text, path, line, author, request_changes, as_json):
    """Comment on a task's PR in the local forge, as a reviewer would (demo and tests).

    `agent watch pr-feedback` reads it: from someone with write access it starts the next round.

    \b
    Example:
      agent pr comment 3 "Name the default: DEFAULT_QTY" --path widgets/pricing.py --line 5
    """
    from agent import AgentError
    from agent.forge.local import local_user

    if not text.strip():
        raise AgentError("comment text is empty; say what should change")
    app = get_app()
    forge, row = _local_forge(app, task_id)
    if line is not None and not path:
        raise AgentError("--line needs --path (the file the line is in)")
    who = author or local_user()
    number = int(row["number"])
    if request_changes:
        note = forge.add_review(number, who, "changes_requested", "" if path else text,
                                [(path, line, text)] if path else [])
        kind = "review"
    else:
        kind = "inline" if path else "comment"
        note = forge.add_note(number, kind, who, text, path=path, line=line)
    data = {"task_id": task_id, "number": number, "id": note, "kind": kind, "author": who, "path": path,
            "line": line}
    emit(data, as_json, lambda d: click.echo(f"{row['repo']}#{number}: {kind} {note} by {who}; "
                                             "run `agent watch pr-feedback`"))


@pr.command("checks")
@click.argument("task_id", type=int)
@click.option("--pass", "passed", default=None, metavar="NAME", help="A check that passed.")
@click.option("--fail", "failed", default=None, metavar="NAME", help="A check that failed.")
@click.option("--pending", default=None, metavar="NAME", help="A check still running.")
@click.option("--summary", default="", help="What the check says (shown to the implementer on failure).")
@click.option("--url", default=None, help="Details URL of the run.")
@json_option
def pr_checks(task_id, passed, failed, pending, summary, url, as_json):
    """Record a CI result on the head of a task's PR in the local forge (demo and tests).

    `agent watch pr-feedback` reads it: a failure starts the next round, a success shows in the PR body.

    \b
    Example:
      agent pr checks 3 --fail ci/tests --summary "2 tests failed" --url https://ci.example/run/7
    """
    from agent import AgentError

    given = [(n, s) for n, s in ((passed, "success"), (failed, "failure"), (pending, "pending")) if n]
    if len(given) != 1:
        raise AgentError("give exactly one of --pass NAME or --fail NAME (or --pending NAME)")
    name, state = given[0]
    app = get_app()
    forge, row = _local_forge(app, task_id)
    sha = forge.state(int(row["number"])).head_sha
    cid = forge.record_check(sha, name, state, summary=summary, url=url)
    data = {"task_id": task_id, "number": row["number"], "id": cid, "name": name, "state": state, "head_sha": sha}
    emit(data, as_json, lambda d: click.echo(f"{row['repo']}#{row['number']}: {name} {state} at {sha[:12]}; "
                                             "run `agent watch pr-feedback`"))
