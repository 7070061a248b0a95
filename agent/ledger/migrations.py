"""Append-only schema migrations. Never edit or reorder one that has shipped: add a new one.

Each migration is a function taking a ``sqlite_utils.Database``; its name is recorded in the
``_migrations`` table in the same transaction as its DDL, so a crash mid-migration rolls back.

The same list runs on PostgreSQL: there ``db`` is ``agent.ledger.pg.PgDatabase``, which implements the
sqlite-utils subset used here (``create``, ``create_index``, ``add_column``, ``execute``) in PostgreSQL DDL. A
migration that writes raw SQLite DDL (triggers) branches on ``is_postgres(db)``; what it does on SQLite never
changes (tests/data/schema.sql pins that).
"""

from __future__ import annotations

from typing import Any, Callable

from agent.ledger.pg import EVENTS_APPEND_ONLY, MIGRATIONS_OBJECTS, PgDatabase, is_postgres

MIGRATIONS: list[tuple[str, Callable]] = []


def migration(fn: Callable) -> Callable:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_initial(db) -> None:
    db["errors"].create({
        "id": str,                # 16 hex chars; branches use the first 8
        "fingerprint": str,
        "service": str,
        "environment": str,
        "class": str,
        "message": str,           # redacted
        "excerpt": str,           # redacted, latest occurrence
        "signature": str,         # normalised stack signature
        "frames": str,            # JSON list of redacted "file:function" frames
        "repo": str,              # OWNER/NAME if the event named one
        "level": str,
        "release": str,
        "count": int,
        "first_seen": str,
        "last_seen": str,
        "state": str,             # open | fixing | resolved | skipped
        "state_reason": str,
        "created_at": str,
    }, pk="id", not_null={"fingerprint", "service", "count", "state"}, defaults={"count": 1, "state": "open"})
    db["errors"].create_index(["fingerprint"])
    db["errors"].create_index(["state", "last_seen"])

    db["conclusions"].create({
        "id": int, "error_id": str, "kind": str, "brief": str, "reason": str,
        "decided_by": str, "lane_run_id": int, "created_at": str,
    }, pk="id", foreign_keys=[("error_id", "errors", "id")], not_null={"error_id", "kind", "decided_by"})
    db["conclusions"].create_index(["error_id"], unique=True)

    db["tasks"].create({
        "id": int,
        "error_id": str,
        "conclusion_id": int,
        "repo": str,
        "base": str,
        "base_sha": str,
        "branch": str,
        "worktree": str,
        "spec_path": str,
        "title": str,
        "state": str,             # open | working | gate-blocked | done | failed
        "round": int,
        "round_cap": int,
        "blocked_reason": str,
        "failed_reason": str,
        "head_sha": str,          # the task branch's current head
        "pushed_sha": str,        # the head last pushed to the remote (cost is derived from lane_runs)
        "claim_owner": str,
        "claim_pid": int,
        "claim_token": str,
        "lease_until": float,
        "created_at": str,
        "updated_at": str,
    }, pk="id", foreign_keys=[("error_id", "errors", "id"), ("conclusion_id", "conclusions", "id")],
        not_null={"repo", "state", "round", "round_cap"}, defaults={"round": 1, "round_cap": 5})
    db["tasks"].create_index(["error_id"], unique=True)   # never two tasks for one error (NULLs allowed)
    db["tasks"].create_index(["state"])

    db["steps"].create({
        "task_id": int, "key": str, "kind": str, "status": str, "evidence": str, "source": str,
        "head_sha": str, "round": int, "closed_at": str,
    }, pk=("task_id", "key"), foreign_keys=[("task_id", "tasks", "id")], not_null={"status", "kind"},
        defaults={"status": "pending"})

    db["lane_runs"].create({
        "id": int, "task_id": int, "error_id": str, "round": int, "role": str, "vendor": str,
        "attempt": int, "manifest_hash": str, "manifest": str, "session_id": str,
        "status": str,            # running | complete | partial | blocked | malformed | timeout | unavailable | rejected
        "findings_count": int, "findings_text": str, "summary": str, "lesson": str, "reason": str,
        "exit_code": int, "cost_usd": float, "usage": str, "repairs": str, "log_dir": str,
        "head_sha": str, "pid": int, "started_at": str, "ended_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"role", "vendor", "status"})
    db["lane_runs"].create_index(["task_id", "round", "role"])

    db["commits"].create({
        "id": int, "task_id": int, "round": int, "sha": str, "parent": str, "message": str, "created_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"task_id", "sha"})
    db["commits"].create_index(["task_id", "round"])

    db["checks"].create({
        "id": int, "task_id": int, "round": int, "command": str, "exit_code": int, "passed": int,
        "head_sha": str, "output_path": str, "duration_s": float, "created_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"task_id", "passed"})

    db["gates"].create({
        "id": int, "task_id": int, "round": int,
        "stage": str,             # review | pr
        "dimension": str,         # code | quality | logic
        "verdict": str,           # approve | reject
        "findings_count": int, "head_sha": str, "lane_run_id": int, "created_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id"), ("lane_run_id", "lane_runs", "id")],
        not_null={"task_id", "verdict", "head_sha", "lane_run_id"})

    db["prs"].create({
        "id": int, "task_id": int, "forge": str, "repo": str, "number": int, "url": str,
        "head_branch": str, "head_sha": str, "base": str, "state": str, "draft": int,
        "title": str, "body": str, "body_hash": str, "created_at": str, "updated_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"task_id", "forge", "repo", "state"},
        defaults={"draft": 1, "state": "open"})
    db["prs"].create_index(["task_id"], unique=True)

    db["lessons"].create({
        "id": int, "service": str, "fingerprint": str, "text": str, "task_id": int, "created_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"text"})
    db["lessons"].create_index(["service"])

    db["cursors"].create({"source": str, "value": str, "updated_at": str}, pk="source")

    db["events"].create({
        "id": int, "ts": str, "task_id": int, "error_id": str, "kind": str,
        "actor": str,             # script | lane | human
        "payload": str,           # JSON
    }, pk="id", not_null={"ts", "kind", "actor"})
    db["events"].create_index(["task_id", "id"])
    # The event log is append-only: the database itself refuses to change history.
    if is_postgres(db):  # a plpgsql function raising, for UPDATE, DELETE and TRUNCATE (agent/ledger/pg.py)
        for sql in EVENTS_APPEND_ONLY:
            db.execute(sql)
        return
    db.execute("CREATE TRIGGER events_no_update BEFORE UPDATE ON events "
               "BEGIN SELECT RAISE(ABORT, 'events are append-only'); END")
    db.execute("CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
               "BEGIN SELECT RAISE(ABORT, 'events are append-only'); END")


@migration
def m002_forge_local_prs(db) -> None:
    """The embedded local forge's own pull requests (what a hosted forge would keep on its side).

    ``prs`` stays agent's record of each task's PR for every forge; ``local_prs`` is the local
    forge's store, so a PR can be merged or closed there (`agent pr mark`) and followed up like any other.
    """
    db["local_prs"].create({
        "id": int, "repo": str, "number": int, "head": str, "head_sha": str, "base": str,
        "title": str, "body": str, "state": str, "draft": int,
        "labels": str,            # JSON list
        "comments": str,          # JSON list of {"at", "text"}
        "created_at": str, "updated_at": str,
    }, pk="id", not_null={"repo", "number", "head", "base", "state"}, defaults={"state": "open", "draft": 1})
    db["local_prs"].create_index(["repo", "number"], unique=True)
    db["local_prs"].create_index(["repo", "head"])


@migration
def m003_task_waits_and_forge_pending(db) -> None:
    """Why a working task waits, and forge calls that failed for now (retried on later scans).

    - ``tasks.wait_reason``: set when a task waits (PR limits, daily budget, a rate-limited forge, a lane still
      running) and cleared when it moves again; `agent status` shows it, and a scan prints a wait only when
      the reason changed (so cron mails only news).
    - ``forge_pending``: one row per thing owed to a forge: ``pr_text`` (a PR text update that failed all its
      in-pass retries; retried by `watch pr-merged` until it lands) and ``rate_limit`` (the time a forge's rate
      limit resets; no call to that forge is made before it).
    """
    db["tasks"].add_column("wait_reason", str)
    db["forge_pending"].create({
        "key": str,               # "pr_text:<task_id>" | "rate_limit:<forge> <api url>"
        "kind": str,              # pr_text | rate_limit
        "task_id": int,
        "until": float,           # epoch seconds: no call before (rate_limit)
        "reason": str,
        "attempts": int,
        "updated_at": str,
    }, pk="key", not_null={"kind"}, defaults={"attempts": 0})


@migration
def m004_pr_feedback(db) -> None:
    """PR feedback and CI (`agent watch pr-feedback`).

    The local forge's side (what a hosted forge keeps): ``local_pr_notes`` (reviews, inline review comments and
    conversation comments, ids allocated by SQLite) and ``local_pr_checks`` (CI results per commit).
    Agent's side: ``pr_watch`` (per task's PR: the feedback cursor and the CI head last read), ``pr_feedback``
    (every item read, with what was decided: taken, ignored, own, stop; unique per task and key) and
    ``pr_feedback_rounds`` (each round started by feedback or CI, the keys that started it, and its one reply).
    """
    db["local_pr_notes"].create({
        "id": int, "repo": str, "number": int,
        "kind": str,              # review | inline | comment
        "review_id": int, "author": str, "body": str,
        "state": str,             # reviews: changes_requested | commented | approved
        "path": str, "line": int, "created_at": str,
    }, pk="id", not_null={"repo", "number", "kind", "author"})
    db["local_pr_notes"].create_index(["repo", "number", "id"])
    db["local_pr_checks"].create({
        "id": int, "repo": str, "sha": str,
        "kind": str,              # status | check_run
        "name": str, "state": str, "conclusion": str, "summary": str, "url": str, "created_at": str,
    }, pk="id", not_null={"repo", "sha", "name", "state"})
    db["local_pr_checks"].create_index(["repo", "sha"])

    db["pr_watch"].create({
        "task_id": int,
        "cursor": str,            # the forge's opaque feedback cursor
        "ci_sha": str,            # the head whose CI results were last acted on
        "ci_state": str,          # pending | success | failure | neutral (for ci_sha)
        "ci_results": str,        # JSON list of {name, state, conclusion, url} for ci_sha
        "updated_at": str,
    }, pk="task_id", foreign_keys=[("task_id", "tasks", "id")])
    db["pr_feedback"].create({
        "id": int, "task_id": int, "number": int,
        "key": str,               # review:ID | inline:ID | comment:ID | ci:SHA:NAME
        "kind": str, "author": str, "path": str, "line": int, "state": str, "url": str,
        "body": str,              # redacted, capped; fenced wherever it goes
        "decision": str,          # taken | ignored | own | stop
        "reason": str,            # why ignored
        "round": int,             # the round it started (taken) or the round it was read in
        "created_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"task_id", "key", "kind", "decision"})
    db["pr_feedback"].create_index(["task_id", "key"], unique=True)
    db["pr_feedback_rounds"].create({
        "id": int, "task_id": int, "round": int,
        "trigger": str,           # review | ci
        "keys": str,              # JSON list of pr_feedback keys that started it
        "reply_key": str,         # the own-mark key of its reply
        "reply_id": str,          # the forge's comment id once posted
        "head_sha": str,          # the head the reply names
        "created_at": str, "replied_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"task_id", "round", "trigger"})
    db["pr_feedback_rounds"].create_index(["task_id", "round"], unique=True)


@migration
def m005_lane_pid_start(db) -> None:
    """A lane's process identity is its pid AND its start time (/proc/PID/stat field 22): the orphan killer
    signals a recorded lane only while both match, never a process that merely reuses the pid."""
    db["lane_runs"].add_column("pid_start", int)


@migration
def m006_tasks_with_worktrees(db) -> None:
    """Tasks that still have a worktree, found without reading every finished task: `watch pr-merged` looks for
    finished ones to remove on every tick (100,000 done tasks: 51 ms -> well under 1 ms)."""
    db.execute("CREATE INDEX idx_tasks_with_worktree ON tasks (id) WHERE worktree IS NOT NULL")


@migration
def m007_pr_replies(db) -> None:
    """Replies the agent owes on a PR, posted at most once, and what a feedback round started from.

    - ``pr_replies``: one row per comment the agent owes (``round``: what a feedback round changed, posted when the
      task is done again; ``cap``: a human must take over). ``key`` is the own-mark key the comment carries, so a
      reply posted just before a kill is found on the PR and recorded, never posted twice.
    - ``pr_feedback_rounds.base_head``: the pushed head the round started from (the reply lists the files changed
      since); ``resets``: how many human resets the task had then (``limits.feedback_rounds`` counts per reset).
    """
    db["pr_replies"].create({
        "id": int, "task_id": int,
        "key": str,               # task-N-round-R | task-N-cap-K
        "kind": str,              # round | cap
        "round": int, "text": str,
        "reply_id": str,          # the forge's comment id once posted (NULL: owed)
        "head_sha": str, "created_at": str, "posted_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"task_id", "key", "kind"})
    db["pr_replies"].create_index(["key"], unique=True)
    db["pr_replies"].create_index(["task_id"])
    db["pr_feedback_rounds"].add_column("base_head", str)
    db["pr_feedback_rounds"].add_column("resets", int)


@migration
def m008_notify_outbox(db) -> None:
    """Notifications and pushed intake.

    ``outbox``: one row per event a human may want to hear about, written by ``Ledger.event`` in the same
    transaction as the event (so a crash keeps both or neither). ``notify_deliveries``: one row per
    (outbox row, channel), created when a delivery pass expands the outbox against the configured channels; its
    ``key`` is the idempotency key every channel receives. ``hook_deliveries``: one row per webhook delivery
    accepted by `agent serve` (its id or body hash), written with the events it carried, so a replay changes nothing.
    """
    db["outbox"].create({
        "id": int, "event_id": int, "kinds": str,   # comma list: gate-blocked, failed, pr-opened, ...
        "task_id": int, "error_id": str, "payload": str, "created_at": str,
        "expanded": int,          # 1 once delivery rows exist for the channels configured then
    }, pk="id", not_null={"event_id", "kinds", "created_at", "expanded"}, defaults={"expanded": 0})
    db["outbox"].create_index(["event_id"], unique=True)
    db["outbox"].create_index(["expanded"])

    db["notify_deliveries"].create({
        "id": int, "outbox_id": int, "channel": str, "key": str,
        "state": str,             # pending | sending | delivered | failed (permanent, or retries exhausted)
        "attempts": int, "next_at": float, "lease_until": float, "claimed_by": str,   # host:pid:token while sending
        "last_error": str,
        "created_at": str, "delivered_at": str,
    }, pk="id", foreign_keys=[("outbox_id", "outbox", "id")],
        not_null={"outbox_id", "channel", "key", "state", "attempts"}, defaults={"state": "pending", "attempts": 0})
    db["notify_deliveries"].create_index(["outbox_id", "channel"], unique=True)
    db["notify_deliveries"].create_index(["key"], unique=True)
    db["notify_deliveries"].create_index(["state", "next_at"])

    db["hook_deliveries"].create({
        "id": int, "hook": str, "key": str, "events": int, "new": int, "deduplicated": int, "received_at": str,
    }, pk="id", not_null={"hook", "key", "received_at"})
    db["hook_deliveries"].create_index(["hook", "key"], unique=True)


@migration
def m009_runners_and_leases(db) -> None:
    """Many runners sharing one ledger (DESIGN.md "Runners, leases and fencing").

    - ``runners``: one row per runner (a home on a host), registered and beaten by every scan, daemon tick and
      lease keeper; ``heartbeat_at`` is epoch seconds (like ``tasks.lease_until``) so staleness is arithmetic.
    - ``tasks.fence``: the fencing counter, incremented by every new claim in the claiming UPDATE; the claim token
      is made from it, so a task's tokens strictly increase. ``tasks.claim_runner``: the runner id holding it.
    - ``leases``: named leases (a source's cursor, ``pr-open``) with a holder, an increasing token and an expiry.
    """
    db["runners"].create({
        "id": str, "host": str, "home": str, "pid": int, "pid_start": int, "version": str,
        "started_at": str, "heartbeat_at": float,
    }, pk="id", not_null={"host", "home", "heartbeat_at"})
    db["tasks"].add_column("fence", int)
    db["tasks"].add_column("claim_runner", str)
    db["tasks"].create_index(["claim_runner"])
    db["leases"].create({
        "name": str, "holder": str, "runner": str, "token": int, "until": float, "updated_at": str,
    }, pk="name", not_null={"token"})


@migration
def m010_lane_budget_reservations(db) -> None:
    """The daily budget holds across runners (DESIGN.md "The daily budget across runners").

    - ``lane_runs.reserved_usd``: what a fixer lane reserved of the daily budget when it was recorded ``running``
      (its estimate); while the run is ``running`` under a live claim the reservation counts as spent, after that
      its real ``cost_usd`` does. NULL for lanes that reserve nothing (the decider, `agent lane run`).
    - indexes for the two reads every lane start makes: the last 24 hours' spend (``started_at``) and the lane's
      recent costs (``role``, ``vendor``).
    """
    db["lane_runs"].add_column("reserved_usd", float)
    db["lane_runs"].create_index(["started_at"])
    db["lane_runs"].create_index(["role", "vendor"])


@migration
def m011_lessons_need_a_human(db) -> None:
    """A lane's lesson steers later lanes only once a human accepted its work (DESIGN.md "Trust boundaries").

    ``lessons.state``: ``candidate`` (its task's PR is not merged yet), ``accepted`` (the PR was merged, or
    `agent lesson accept`), ``refused`` (it held a URL, a pipeline, a command or was too long: never offered),
    ``discarded`` (its PR was closed unmerged, its task failed, or a later round left another lesson) or
    ``forgotten`` (`agent lesson forget`). Every lesson stored so far becomes a candidate: nothing learnt before
    steers a lane until a human accepts it. ``reason`` says why it is refused or discarded; ``lane_run_id`` is the
    implementer run that wrote it; ``decided_by`` the actor of the last change.
    """
    db["lessons"].add_column("state", str, not_null_default="candidate")
    db["lessons"].add_column("reason", str)
    db["lessons"].add_column("lane_run_id", int)
    db["lessons"].add_column("decided_by", str)
    db["lessons"].add_column("updated_at", str)
    db["lessons"].create_index(["state", "service"])
    db["lessons"].create_index(["task_id"])


@migration
def m012_runner_clock_and_liveness(db) -> None:
    """Runners share the ledger's clock and one truth about who is alive (DESIGN.md "Runners, leases and fencing").

    - ``runners.clock_offset_s``: the runner's clock minus the ledger's at its last heartbeat (flagged past 5 s);
      ``stopped_at``: the ledger's time of a clean stop (cleared by the next heartbeat); ``machine``: the machine
      id the runner id was made from; ``scope``: where its pid means something (boot id and pid namespace).
    - ``tasks.claim_scope`` and ``leases.scope``: the pid scope of a claim's or lease's holder, so only a holder in
      this very pid scope is judged by its pid (another machine with the same hostname is judged by its lease).
    """
    db["runners"].add_column("clock_offset_s", float)
    db["runners"].add_column("stopped_at", float)
    db["runners"].add_column("machine", str)
    db["runners"].add_column("scope", str)
    db["tasks"].add_column("claim_scope", str)
    db["leases"].add_column("scope", str)


@migration
def m013_ledger_keys(db) -> None:
    """Secrets that belong to one ledger (shared by every runner on it), made on first use: ``own-mark`` keys the
    hidden mark on the agent's own PR comments, so nobody without the ledger can sign as the agent."""
    db["ledger_keys"].create({"name": str, "value": str, "created_at": str}, pk="name",
                             not_null={"value", "created_at"})


@migration
def m015_errors_last_seen(db) -> None:
    """`agent error list` reads the most recently seen errors first, a page at a time: an index on ``last_seen``
    makes that a range read whatever the number of errors (``(state, last_seen)`` serves ``--state``)."""
    db["errors"].create_index(["last_seen"])


@migration
def m019_proofs(db) -> None:
    """The PR proves itself (DESIGN.md "The proof"): one row per proof run, bound to the head like a check.

    ``verdict``: ``proven`` (a test fails on the base plus the round's test changes and the head passes),
    ``unproven`` (none did, and the repository says ``proof: optional``), ``rejected`` (none did: the round is sent
    back) or ``off``. ``reproduces``: 1 when the base failure shows the production error's class and a frame of it,
    0 when not, NULL when nothing failed (``reproduces_why``: what matched or not).
    ``flipped``/``passed_on_base``/``skipped``/``removed``: JSON lists of test names; ``base_tail``: the redacted
    end of the base run's output.
    """
    db["proofs"].create({
        "id": int, "task_id": int, "round": int, "head_sha": str, "base_sha": str, "mode": str, "verdict": str,
        "reproduces": int, "reproduces_why": str, "command": str, "narrowed": int, "test_files": str,
        "flipped": str, "passed_on_base": str, "skipped": str, "removed": str, "base_exit": int, "base_status": str,
        "base_tail": str, "duration_s": float, "created_at": str,
    }, pk="id", foreign_keys=[("task_id", "tasks", "id")], not_null={"task_id", "verdict"})
    db["proofs"].create_index(["task_id", "head_sha"])


def expected_schema(version: int) -> dict[str, Any]:
    """What the first ``version`` migrations make on PostgreSQL, recorded without a database."""
    db = PgDatabase()
    for _, fn in MIGRATIONS[:version]:
        fn(db)
    return {**MIGRATIONS_OBJECTS, **db.objects}
