"""`agent serve` and `agent notify test|list|retry`."""

from __future__ import annotations

import click

from agent.cli.common import emit, get_app, json_option


def host_port_options(fn):
    fn = click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
                      help="TCP port (0 picks a free one and prints it).")(fn)
    fn = click.option("--public", is_flag=True,
                      help="Allow a non-loopback --host without serve.read_token_env (the page and /metrics "
                           "open to anyone who reaches it; a warning is printed).")(fn)
    return click.option("--host", default="127.0.0.1", show_default=True,
                        help="Address to listen on; put a TLS proxy in front before exposing it.")(fn)


@click.command()
@host_port_options
def serve(host, port, public):
    """Serve webhooks (/hooks/events, /hooks/sentry, /hooks/alertmanager), the live status page, /metrics, /healthz.

    Also delivers pending notifications every few seconds. Stops on SIGTERM/SIGINT.

    \b
    Example:
      AGENT_HOOK_SECRET=... agent serve --host 127.0.0.1 --port 8080
    """
    from agent.app.serve import run_serve

    run_serve(get_app(), host, port, echo=click.echo, public=public)


@click.group()
def notify():
    """Notifications: see `notify:` in config.yaml; delivery runs in `watch all`, the daemon and `serve`."""


@notify.command("test")
@json_option
def notify_test(as_json):
    """Send one test message to every configured channel now; exit 1 if any channel failed.

    \b
    Example:
      agent notify test
    """
    from agent import AgentError
    from agent.flows.notify import send_tests

    results = send_tests(get_app().config)

    def human(rows):
        for r in rows:
            click.echo(f"{r['channel']} ({r['kind']}): " + ("sent" if r["ok"] else f"FAILED: {r['error']}"))

    emit(results, as_json, human)
    failed = [r["channel"] for r in results if not r["ok"]]
    if failed:
        raise AgentError(f"{len(failed)} channel(s) failed: {', '.join(failed)}; see the lines above")


@notify.command("list")
@click.option("--state", type=click.Choice(("pending", "sending", "delivered", "failed", "dead")),
              help="Only deliveries in this state (dead: its attempts were used up).")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True, help="At most this many, newest first.")
@json_option
def notify_list(state, limit, as_json):
    """List notification deliveries (one per event and channel), newest first.

    \b
    Example:
      agent notify list --state dead
    """
    from agent.flows.notify import list_deliveries

    def human(rows):
        for r in rows:
            err = f": {r['last_error']}" if r["last_error"] else ""
            click.echo(f"{r['key']} {r['state']} ({r['kinds']}, {r['attempts']} attempt(s)){err}")

    emit(list_deliveries(get_app().ledger, state, limit), as_json, human)


@notify.command("retry")
@click.argument("keys", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every failed or dead delivery.")
@json_option
def notify_retry(keys, every, as_json):
    """Send failed or dead deliveries again (at the next delivery pass), with a fresh attempt count.

    \b
    Example:
      agent notify retry agent-42-slack-1a2b3c4d
    """
    from agent.flows.notify import retry

    emit(retry(get_app().ledger, tuple(keys), every), as_json,
         lambda rows: [click.echo(f"{r['key']}: {r['was']} -> pending") for r in rows] or
         click.echo("nothing to retry"))
