"""`agent error ingest|list|show|decide`."""

from __future__ import annotations

import sys

import click

from agent import AgentError
from agent.cli.common import (emit, emit_rows, get_app, json_option, limit_option, listing_args, since_option,
                                   warn_broken_config)

STATES = ("open", "fixing", "resolved", "skipped")


@click.group()
def error():
    """Production errors: ingest, list, show, decide."""


@error.command("ingest")
@click.argument("file", required=False, default="-", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(("auto", "jsonl", "sentry", "traceback")), default="auto",
              show_default=True, help="Input format; auto sniffs it.")
@click.option("--service", help="Service for events that name none.")
@click.option("--env", "environment", help="Environment for events that name none.")
@click.option("--repo", help="OWNER/NAME for events that name none.")
@json_option
def error_ingest(file, fmt, service, environment, repo, as_json):
    """Ingest errors from a file or stdin; prints new, deduplicated and rejected counts (exit 1 if any rejected).

    \b
    Example:
      agent error ingest app.log --format traceback --service widgets-api --env production
    """
    from agent.config import repo_key_problem
    from agent.intake.formats import nothing_found
    from agent.intake.store import ingest_text
    from agent.infra.textio import decode

    if repo is not None and repo_key_problem(repo):
        raise click.BadParameter(repo_key_problem(repo), param_hint="--repo")
    name = file if file != "-" else "stdin"
    if file == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(file, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise AgentError(f"{file}: cannot read ({exc.strerror})") from None
    decoded = decode(data, name, strict=False)   # one bad byte must not cost the events around it
    del data
    note = decoded.note(name)
    if note:
        click.echo(f"agent: warning: {note}", err=True)
    result, used = ingest_text(get_app().ledger, decoded.text, fmt, service=service, environment=environment,
                              repo=repo, actor="human")
    for r in result.rejections:
        reason = " ".join(str(r.reason).split())[:300]
        click.echo(f"{name}: line {r.line}: rejected: {reason}", err=True)
    why, clean = nothing_found(decoded.text, used) if not (result.new or result.deduplicated or result.rejected) \
        else (None, True)
    emit({**result.to_json(), "format": used, "nothing_found": why}, as_json,
         lambda d: click.echo(f"new {d['new']}, deduplicated {d['deduplicated']}, rejected {d['rejected']}"))
    if result.rejected:
        raise AgentError(f"{result.rejected} line(s) or event(s) rejected; the rest was ingested")
    if why and not clean:
        raise AgentError(f"no error found in {name}: {why}")
    if why:
        click.echo(f"no error found in {name}: {why}", err=True)


@error.command("list")
@click.option("--state", type=click.Choice(STATES), help="Only errors in this state.")
@since_option("errors last seen")
@limit_option("errors, most recently seen first")
@json_option
def error_list(state, since, limit, as_json):
    """List errors, most recently seen first.

    \b
    Example:
      agent error list --state open --json
      agent error list --since 1d --limit 0
    """
    from agent.intake.formats import error_headline
    from agent.ledger.errors import iter_errors

    app = get_app()
    warn_broken_config(app)

    def line(r):
        click.echo(f"{r['id']}  {r['state']:<8} x{r['count']:<6} {r['service']}/{r['environment']}  "
                   f"{error_headline(r['class'], r['message'])[:100]}")

    emit_rows(iter_errors(app.ledger, state, **listing_args(limit, since)), as_json, line, "no errors", "errors")


@error.command("show")
@click.argument("error_id")
@json_option
def error_show(error_id, as_json):
    """Show one error (id or unique prefix) with its conclusion and task.

    \b
    Example:
      agent error show 3f2a9c1e
    """
    from agent.intake.store import error_detail
    from agent.ledger.errors import resolve_error
    from agent.intake.formats import error_headline

    app = get_app()
    e = error_detail(app.ledger, resolve_error(app.ledger, error_id)["id"])

    def human(e):
        click.echo(f"error {e['id']}  [{e['state']}]  seen {e['count']} times  {e['first_seen']} .. {e['last_seen']}")
        click.echo(f"service {e['service']}  environment {e['environment']}  fingerprint {e['fingerprint']}")
        click.echo(error_headline(e["class"], e["message"]))
        if e["frames"]:
            click.echo("frames (outermost first):")
            for f in e["frames"]:
                click.echo(f"  {f}")
        click.echo("excerpt (redacted):")
        for line in (e["excerpt"] or "").splitlines():
            click.echo(f"  {line}")
        c = e["conclusion"]
        if c:
            click.echo(f"conclusion: {c['kind']} by {c['decided_by']}: {c['brief'] or c['reason']}")
        if e["task"]:
            click.echo(f"task {e['task']['id']}: {e['task']['state']} {e['task']['repo']}")

    emit(e, as_json, human)


@error.command("decide")
@click.argument("error_id")
@click.option("--fix", "kind", flag_value="fix", help="Conclude: fix it (needs --brief).")
@click.option("--skip", "kind", flag_value="skip", help="Conclude: do not fix it (needs --reason).")
@click.option("--brief", help="For --fix: what is broken, likely cause, where to look.")
@click.option("--reason", help="For --skip: why not.")
@json_option
def error_decide(error_id, kind, brief, reason, as_json):
    """Record a human conclusion for an error: --fix --brief TEXT or --skip --reason TEXT.

    \b
    Example:
      agent error decide 3f2a9c1e --fix --brief "KeyError in checkout: missing SKU guard in prices.py"
    """
    from agent.flows.decide import decide
    from agent.ledger.errors import resolve_error

    if kind is None:
        raise click.UsageError("pass --fix --brief TEXT or --skip --reason TEXT")
    if kind == "fix" and reason:
        raise click.UsageError("--reason goes with --skip; a fix takes --brief")
    if kind == "skip" and brief:
        raise click.UsageError("--brief goes with --fix; a skip takes --reason")
    app = get_app()
    eid = resolve_error(app.ledger, error_id)["id"]
    cid = decide(app.ledger, app.config, eid, kind, brief=brief, reason=reason, decided_by="human")
    emit({"error_id": eid, "conclusion_id": cid, "kind": kind}, as_json,
         lambda d: click.echo(f"error {eid}: {kind} (conclusion {cid})"))
