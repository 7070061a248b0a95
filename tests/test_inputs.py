"""Issue 29: input edges. Encodings (byte-order marks, invalid bytes), line endings, config files broken in any
way, and listings that stay bounded.

Real parts: the installed `agent` binary as a subprocess on a real home and ledger (SQLite, or PostgreSQL under
--ledger=postgres), real git for a repository's own settings, real files tailed by a file source."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from agent.ledger import eventlog
from intake_payloads import JAVA_LOG, PY_LOG, sentry_python_event
from conftest import git

PY_TB = ('Traceback (most recent call last):\n  File "/app/svc/a.py", line 3, in pay\n    charge()\n'
         "KeyError: 'card'\n")
PY_TB2 = ('Traceback (most recent call last):\n  File "/app/svc/b.py", line 9, in ship\n    send()\n'
          "ValueError: no address\n")


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def inited(home, agent_proc):
    r = agent_proc("init")
    assert r.returncode == 0, r.stderr
    return home


def rows(run, *args) -> list[dict]:
    """A listing's JSON, through ``agent_proc`` (a process) or ``agent`` (in-process)."""
    r = run(*args, "--json")
    assert (r.returncode if hasattr(r, "returncode") else r.exit_code) == 0, r.stderr
    return json.loads(r.stdout)


# --------------------------------------------------------------------------- 1. a config that is not UTF-8

def test_1_a_config_that_is_not_utf8_leaves_status_task_list_and_doctor_working(inited, agent_proc):
    r = agent_proc("error", "ingest", "-", "--service", "pay", input=PY_TB)
    assert r.returncode == 0, r.stderr
    bad = b"repos: {}\n# caf\xe9 menu\nlimits: {round_cap: 3}\n"
    (inited / "config.yaml").write_bytes(bad)
    at = bad.index(b"\xe9")

    r = agent_proc("status")
    assert r.returncode == 0 and "errors open 1" in r.stdout
    assert f"config.yaml: not valid UTF-8 at byte {at}" in one_line(r.stderr)
    data = json.loads(agent_proc("status", "--json").stdout)
    assert f"byte {at}" in data["config_error"] and data["errors"]["open"] == 1

    r = agent_proc("task", "list")
    assert r.returncode == 0 and r.stdout.strip() == "no tasks"
    assert f"config.yaml: not valid UTF-8 at byte {at}" in one_line(r.stderr)
    assert len(rows(agent_proc, "error", "list")) == 1

    r = agent_proc("doctor")
    assert "Traceback" not in r.stderr + r.stdout
    assert r.returncode == 1 and f"FAIL  config: {inited / 'config.yaml'}: not valid UTF-8 at byte {at}" in r.stdout

    # a command that needs the config refuses with the one line: file, byte, fix
    r = agent_proc("watch", "errors")
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert str(inited / "config.yaml") in line and f"byte {at} (e9 20 6d 65)" in line and "save it as UTF-8" in line

    # UTF-16 and UTF-32 with a byte-order mark, and UTF-8 with one, are read
    text = "repos: {}\nlimits: {round_cap: 3}  # café\n"
    for data in (b"\xef\xbb\xbf" + text.encode(), "\ufeff".encode("utf-16-le") + text.encode("utf-16-le"),
                 "\ufeff".encode("utf-16-be") + text.encode("utf-16-be"),
                 "\ufeff".encode("utf-32-le") + text.encode("utf-32-le")):
        (inited / "config.yaml").write_bytes(data)
        r = agent_proc("watch", "errors")
        assert r.returncode == 0 and r.stderr == "", (data[:4], r.stderr)


# --------------------------------------------------------------------------- 2. oversized YAML

HUGE_INT = "limits: {round_cap: " + "9" * 5000 + "}\n"
DEEP = "repos: " + "[" * 5000 + "]" * 5000 + "\n"


@pytest.mark.parametrize("text, what", [(HUGE_INT, "a value cannot be read"), (DEEP, "nested too deep"),
                                        ("repos: {a: [1, 2}\n", "line 1: not valid YAML")])
def test_2_oversized_or_broken_yaml_is_one_line_from_every_reader(inited, agent_proc, tmp_path, text, what):
    cfg = inited / "config.yaml"
    cfg.write_text(text)
    r = agent_proc("watch", "errors")                                   # config.py
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert line.startswith(f"agent: {cfg}") and what in line, line
    assert agent_proc("task", "list").returncode == 0                  # no ledger key: the ledger opens as ever

    cfg.write_text("ledger: {url: postgresql://agent@db.example/agent}\n" + text)
    r = agent_proc("status", env={"AGENT_LEDGER_URL": ""})             # ledger/backend.py, which reads ledger.url
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert str(cfg) in line and what.split(": ", 1)[-1] in line and "ledger.url" in line, line

    from agent.config import ConfigError                                # a repository's own .agent/config.yaml
    from agent.config.repo import load_repo_settings
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    (repo / ".agent").mkdir()
    (repo / ".agent" / "config.yaml").write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "settings")
    sha = git(repo, "rev-parse", "HEAD")
    with pytest.raises(ConfigError) as exc:
        load_repo_settings(repo / ".git", sha)
    assert str(exc.value).startswith(f".agent/config.yaml at {sha[:12]}") and what in str(exc.value)
    assert "\n" not in str(exc.value)


def test_2_repository_settings_honour_a_byte_order_mark(tmp_path):
    from agent.config.repo import load_repo_settings

    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    (repo / ".agent").mkdir()
    (repo / ".agent" / "config.yaml").write_bytes("\ufeff".encode("utf-16-le") +
                                                  "check: make test  # é\n".encode("utf-16-le"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "settings")
    assert load_repo_settings(repo / ".git", git(repo, "rev-parse", "HEAD")).check == "make test"


# --------------------------------------------------------------------------- 3. byte-order marks in intake

def _sentry_doc() -> str:
    return json.dumps(sentry_python_event(), indent=2)


def _jsonl(n: int = 3) -> str:
    return "".join(json.dumps({"service": "pay", "message": f"boom {i}", "class": f"Boom{i}Error"}) + "\n"
                   for i in range(n))


BOMS = {"utf-8-sig": b"\xef\xbb\xbf", "utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff",
        "utf-32-le": b"\xff\xfe\x00\x00", "utf-32-be": b"\x00\x00\xfe\xff"}


@pytest.mark.parametrize("kind", ["sentry", "jsonl", "traceback"])
def test_3_a_byte_order_mark_loses_no_event(inited, agent_proc, tmp_path, kind):
    text, expected = {"sentry": (_sentry_doc(), 1), "jsonl": (_jsonl(3), 3), "traceback": (PY_TB + PY_TB2, 2)}[kind]
    for n, (encoding, mark) in enumerate(BOMS.items()):
        f = tmp_path / f"in-{encoding}.txt"
        f.write_bytes(mark + text.encode("utf-8" if encoding == "utf-8-sig" else encoding))
        r = agent_proc("error", "ingest", str(f), "--json")
        assert r.returncode == 0, (encoding, r.stderr)
        out = json.loads(r.stdout)
        counts = (out["new"], out["deduplicated"], out["rejected"], out["format"])
        assert counts == ((expected, 0, 0, kind) if n == 0 else (0, expected, 0, kind)), (encoding, out)
    stored = rows(agent_proc, "error", "list")
    assert len(stored) == expected and sum(e["count"] for e in stored) == expected * len(BOMS)
    assert not any("\ufeff" in (e["message"] or "") + (e["class"] or "") for e in stored)


def test_3_stdin_with_a_bom_and_invalid_bytes_named_by_offset(inited, agent_proc, tmp_path):
    data = b"\xef\xbb\xbf" + _jsonl(2).encode() + b'{"service": "pay", "message": "bad \xff\xfe here"}\n'
    env = {**os.environ, "AGENT_HOME": str(inited)}
    from conftest import agent_bin

    r = subprocess.run([*agent_bin(), "error", "ingest", "-"], input=data, capture_output=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == "new 3, deduplicated 0, rejected 0"
    at = data.index(b"\xff\xfe")
    assert f"stdin: 2 invalid UTF-8 bytes replaced by U+FFFD, the first at byte {at}" in r.stderr.decode()
    assert any(e["message"] == "bad \ufffd\ufffd here" for e in rows(agent_proc, "error", "list"))


# --------------------------------------------------------------------------- 4. line endings

@pytest.mark.parametrize("eol", ["\r", "\r\n", "\n\r"])
def test_4_line_endings_lose_no_event(inited, agent_proc, tmp_path, eol):
    log = tmp_path / "app.log"
    log.write_bytes((PY_TB + "INFO ok\n" + PY_TB2 + JAVA_LOG).replace("\n", eol).encode())
    r = agent_proc("error", "ingest", str(log), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["new"], out["rejected"], out["format"]) == (3, 0, "traceback"), out
    classes = {e["class"] for e in rows(agent_proc, "error", "list")}
    assert classes == {"KeyError", "ValueError", "java.lang.IllegalStateException"}

    jsonl = tmp_path / "e.jsonl"
    jsonl.write_bytes(_jsonl(4).replace("\n", eol).encode())
    r = agent_proc("error", "ingest", str(jsonl), "--json")
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["new"], json.loads(r.stdout)["format"]) == (4, "jsonl")


def test_4_a_file_source_tails_cr_and_utf16_files_by_their_own_line_endings(tmp_path):
    from agent.intake.sources import scan
    from intake_support import make_app

    logs = tmp_path / "logs"
    logs.mkdir()
    cr, utf16 = logs / "cr.log", logs / "w.log"
    cr.write_bytes(PY_LOG.replace("\n", "\r").encode())
    utf16.write_bytes("\ufeff".encode("utf-16-le") + (PY_TB + "INFO ok\r\n").encode("utf-16-le"))
    app = make_app(tmp_path / "home", {"sources": [{"kind": "file", "path": str(logs), "service": "w"}]})
    (item,) = scan(app)
    assert (item["new"], item["rejected"]) == (2, 0), item      # CheckoutError (from KeyError), KeyError 'card'
    (item,) = scan(app)
    assert (item["new"], item["deduplicated"]) == (0, 0), item
    with open(cr, "ab") as fh:
        fh.write(PY_TB2.replace("\n", "\r").encode())
    with open(utf16, "ab") as fh:
        fh.write(JAVA_LOG.encode("utf-16-le"))
    scan(app)                                                    # both grew: their last lines wait one pull
    (item,) = scan(app)
    counts = {r["class"]: r["count"] for r in app.ledger.all("SELECT class, count FROM errors")}
    assert counts == {"KeyError": 1, "widgets.errors.CheckoutError": 1, "ValueError": 1,
                      "java.lang.IllegalStateException": 1}, counts
    cur = json.loads(app.ledger.scalar("SELECT value FROM cursors"))["files"]
    assert cur[str(cr)]["offset"] == cr.stat().st_size and cur[str(utf16)]["offset"] == utf16.stat().st_size

    from agent.intake.sources import _file_lines                 # a CRLF split across two pulls is one line end
    assert _file_lines(b"ERROR a\r", "utf-8", False) == ("ERROR a\r", [8])
    assert _file_lines(b"\nERROR b\r\nERR", "utf-8", False, after_cr=True) == ("ERROR b\r\n", [10])


@pytest.mark.parametrize("data, code, why", [
    (b"", 0, "the input is empty"),
    (b"INFO started\r\nINFO listening on :8080\r\n", 0, "2 lines of log text, none an error line"),
    ((PY_TB + PY_TB2).encode("utf-16-le"), 1, "NUL characters"),           # UTF-16 without a mark
    (b"error: connection refused\nretrying\n", 1, "mention errors, but none reads as an error line"),
    (b"[]", 0, "holding no event"),
])
def test_4_input_that_yields_nothing_says_so_in_one_line(inited, agent_proc, tmp_path, data, code, why):
    f = tmp_path / "in.log"
    f.write_bytes(data)
    r = agent_proc("error", "ingest", str(f))
    assert r.returncode == code, (r.stdout, r.stderr)
    assert r.stdout.strip() == "new 0, deduplicated 0, rejected 0"
    line = one_line(r.stderr)
    assert f"no error found in {f}: " in line and why in line, line


# --------------------------------------------------------------------------- 5. listings stay bounded

def _errors(ledger, n: int, ties: int = 1) -> None:
    """``n`` errors whose last_seen repeats ``ties`` times (keyset paging must not lose or repeat a tie)."""
    from agent.intake.formats import Event
    from agent.intake.store import ingest

    ingest(ledger, [Event(message=f"m{i}", cls=f"E{i}Error", service="svc",
                          timestamp=f"2024-05-01T10:{(i // ties) // 60 % 60:02d}:{(i // ties) % 60:02d}Z")
                    for i in range(n)])


def test_5_listings_page_by_keyset_and_never_read_more_than_a_page(ledger):
    from agent.ledger.errors import iter_errors
    from agent.ledger.listing import Listing, iter_events

    _errors(ledger, 230, ties=7)
    everything = ledger.all("SELECT id FROM errors ORDER BY last_seen DESC, id")
    seen: list[str] = []
    if not ledger.postgres:
        ledger.conn.set_trace_callback(seen.append)
    paged = iter_errors(ledger)
    paged.page = 9
    assert [r["id"] for r in paged] == [r["id"] for r in everything] and not paged.more
    if not ledger.postgres:
        ledger.conn.set_trace_callback(None)
        reads = [s for s in seen if s.lstrip().upper().startswith("SELECT")]
        assert len(reads) == 230 // 9 + 1 and all(s.rstrip().endswith("LIMIT 9") for s in reads), reads[:3]

    first = iter_errors(ledger, limit=100)
    got = [r["id"] for r in first]
    assert got == [r["id"] for r in everything[:100]] and first.more
    last = iter_errors(ledger, limit=230)
    assert len(list(last)) == 230 and not last.more
    since = everything[49]
    row = ledger.one("SELECT last_seen FROM errors WHERE id = ?", (since["id"],))
    expected = [r["id"] for r in ledger.all("SELECT id FROM errors WHERE last_seen >= ? ORDER BY last_seen DESC, id",
                                            (row["last_seen"],))]
    assert [r["id"] for r in iter_errors(ledger, since=row["last_seen"], limit=None)] == expected

    # a tail listing (events): the newest N, oldest first, from one bounded query and pages
    ids = [e["id"] for e in eventlog.events(ledger)]
    tail = iter_events(ledger, limit=25)
    tail.page = 4
    assert [e["id"] for e in tail] == ids[-25:] and tail.more
    assert isinstance(tail, Listing) and [e["id"] for e in iter_events(ledger, limit=len(ids))] == ids


def test_5_cli_listings_default_to_100_with_limit_since_state_and_say_what_they_left_out(ledger, agent):
    """In-process (click's runner, stdout and stderr apart): the listings' whole code path, without a process
    start per call."""
    from agent.ledger.tasks import create_task

    _errors(ledger, 130)
    for i in range(105):
        create_task(ledger, "acme/widgets", f"task {i}")
    with ledger.tx() as c:
        for tid in range(1, 106):
            c.execute("INSERT INTO prs (task_id, forge, repo, number, url, head_branch, state, draft, created_at, "
                      "updated_at) VALUES (?, 'local', 'acme/widgets', ?, 'u', 'b', ?, 1, ?, ?)",
                      (tid, tid, "open" if tid % 2 else "merged", f"2024-05-01T00:00:{tid % 60:02d}.{tid:06d}Z",
                       f"2024-05-0{1 + tid // 50}T00:00:00.000000Z"))

    r = agent("error", "list", "--json")
    assert r.exit_code == 0
    listed = json.loads(r.stdout)
    assert len(listed) == 100 and listed[0]["message"] == "m129" and listed[-1]["message"] == "m30"
    assert {"id", "fingerprint", "service", "environment", "class", "count", "first_seen", "last_seen",
            "state"} <= set(listed[0])
    assert one_line(r.stderr) == "agent: more errors than the 100 shown; pass --limit N (0 for all) or --since WHEN"
    r = agent("error", "list", "--limit", "0", "--json")
    assert len(json.loads(r.stdout)) == 130 and r.stderr == ""
    assert len(rows(agent, "error", "list", "--since", "2024-05-01T10:02:00")) == 10
    assert rows(agent, "error", "list", "--state", "fixing") == []
    r = agent("error", "list", "--limit", "3")
    assert [ln.split()[-1] for ln in r.stdout.splitlines()] == ["m129", "m128", "m127"] and r.stderr == ""
    r = agent("error", "list", "--since", "yesterday-ish")
    assert r.exit_code == 1 and "--since 'yesterday-ish': expected a duration" in one_line(r.stderr)

    tasks = rows(agent, "task", "list")
    assert [t["id"] for t in tasks] == list(range(6, 106))            # the newest 100, in id order
    assert {"id", "error_id", "repo", "branch", "state", "round", "pr_url", "blocked_reason"} <= set(tasks[0])
    assert [t["id"] for t in rows(agent, "task", "list", "--limit", "2")] == [104, 105]
    assert len(rows(agent, "task", "list", "--since", "1h", "--limit", "0")) == 105
    assert rows(agent, "task", "list", "--state", "done") == []

    prs = rows(agent, "pr", "list")
    assert [p["task_id"] for p in prs] == list(range(6, 106)) and prs[0]["draft"] is True
    assert {"task_id", "forge", "repo", "number", "url", "head", "state", "draft"} <= set(prs[0])
    merged = rows(agent, "pr", "list", "--state", "merged", "--since", "2024-05-03", "--limit", "0")
    assert [p["task_id"] for p in merged] == list(range(100, 106, 2))

    r = agent("events", "--limit", "5")                           # an explicit limit asked for that many
    assert len(r.stdout.splitlines()) == 5 and r.stderr == ""
    r = agent("events")
    assert len(r.stdout.splitlines()) == 100 and "more events than the 100 shown" in r.stderr


# --------------------------------------------------------------------------- 6. the benchmark measures the CLI

def test_6_bench_ingest_measures_the_cli_path_beside_the_in_process_one(tmp_path):
    """A small run of scripts/bench-ingest's `cli` and `list` parts (the numbers go to bench/RESULTS.md from a full
    run): a fresh `agent error ingest FILE` process whose stored counts are checked, its rate, CPU and peak RSS
    beside the in-process path's, and `error list --json` timed on two ledger sizes, default limit and all rows."""
    import sys
    from conftest import ROOT

    out = tmp_path / "RESULTS.md"
    out.write_text("# Benchmarks\n\n<!-- intake:begin (scripts/bench-ingest) -->\nkept\n<!-- intake:end -->\n")
    env = {k: v for k, v in os.environ.items() if k != "AGENT_LEDGER_URL"}
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench-ingest"), "--only", "cli,list", "--events", "300",
                        "--fingerprints", "30", "--runs", "1", "--list-errors", "20,300", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    text = out.read_text()
    assert "kept" in text, "the in-process section is left as it was"
    section = text.split("<!-- intake-cli:begin", 1)[1]
    for needed in ("error ingest FILE` (a fresh process", "**CLI median ", "events per CPU second; **peak RSS ",
                   "**CLI / in-process = ", "| 20 | ", "| 300 | ", "default limit, 300 / 20 errors: **time ", "x CPU; peak RSS "):
        assert needed in section, (needed, section)


def test_5_a_limit_of_exactly_one_page_still_knows_whether_there_are_more(ledger):
    from agent.ledger.errors import iter_errors

    _errors(ledger, 12)
    for limit, more in ((5, True), (11, True), (12, False), (13, False)):
        listing = iter_errors(ledger, limit=limit)
        listing.page = 5
        assert len(list(listing)) == min(limit, 12) and listing.more is more, limit
