"""`agent error ...` and `agent watch errors` as real subprocesses: exit codes, stdout/stderr, --json."""

import json
import subprocess
import sys

import yaml

from intake_payloads import JAVA_LOG, sentry_javascript_event


def run(home, *args, stdin=None):
    env = {"AGENT_HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "agent", *args], input=stdin, env=env, capture_output=True,
                          text=True, timeout=60)


def test_ingest_list_show_decide_round_trip(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"repos": {"acme/orders": {
        "url": str(tmp_path / "orders.git"), "services": ["orders"]}}}))
    p = run(home, "error", "ingest", "-", "--service", "orders", "--env", "production", stdin=JAVA_LOG * 3)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "new 1, deduplicated 2, rejected 0"

    p = run(home, "error", "list", "--json")
    assert p.returncode == 0
    (item,) = json.loads(p.stdout)
    assert {"id", "fingerprint", "service", "environment", "class", "count", "first_seen", "last_seen",
            "state"} <= set(item)
    assert (item["count"], item["service"], item["class"]) == (3, "orders", "java.lang.IllegalStateException")
    eid = item["id"]

    p = run(home, "error", "show", eid[:6])
    assert p.returncode == 0 and "Caused by: java.sql.SQLException" in p.stdout
    p = run(home, "error", "show", eid, "--json")
    assert json.loads(p.stdout)["frames"][-1] == "com.acme.orders.OrderService:load"

    p = run(home, "error", "decide", eid[:8], "--fix")
    assert p.returncode == 1 and "a fix needs a brief" in p.stderr
    p = run(home, "error", "decide", eid[:8])
    assert p.returncode == 2
    p = run(home, "error", "decide", eid[:8], "--fix", "--brief", "Order lookup dies when the pool is down",
            "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kind"] == "fix"
    p = run(home, "error", "decide", eid[:8], "--skip", "--reason", "changed my mind")
    assert p.returncode == 1 and "one conclusion per error" in p.stderr
    p = run(home, "error", "list", "--state", "fixing", "--json")
    assert [x["id"] for x in json.loads(p.stdout)] == [eid]
    p = run(home, "error", "show", "ffffffff")
    assert p.returncode == 1 and "no error with id" in p.stderr


def test_ingest_rejections_named_and_exit_1(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    lines = [json.dumps({"service": "web", "message": "boom 1", "class": "Error"}), "{oops",
             json.dumps(sentry_javascript_event()), json.dumps({"level": "error"})]
    f = tmp_path / "events.jsonl"
    f.write_text("\n".join(lines) + "\n")
    p = run(home, "error", "ingest", str(f), "--json")
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert (doc["new"], doc["deduplicated"], doc["rejected"], doc["format"]) == (2, 0, 2, "jsonl")
    assert f"{f}: line 2: rejected: not valid JSON" in p.stderr
    assert f"{f}: line 4: rejected: record has neither a message nor an exception class" in p.stderr
    assert "2 line(s) or event(s) rejected" in p.stderr

    p = run(home, "error", "ingest", str(tmp_path / "missing.log"))
    assert p.returncode == 1 and "missing.log: cannot read" in p.stderr
    p = run(home, "error", "ingest", str(f), "--format", "xml")
    assert p.returncode == 2
    p = run(home, "error", "ingest", str(f), "--repo", "not-a-repo")
    assert p.returncode == 2


def test_watch_errors_and_error_decide_scans_are_registered(tmp_path):
    home = tmp_path / "home"
    logs = tmp_path / "app.log"
    logs.write_text(JAVA_LOG)
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"sources": [{"kind": "file", "path": str(logs),
                                                                   "service": "orders"}]}))
    p = run(home, "watch", "errors", "--json")
    assert p.returncode == 0, p.stderr
    (item,) = json.loads(p.stdout)
    assert item["scan"] == "errors" and item["new"] == 1
    p = run(home, "watch", "errors")   # nothing new: no news, so nothing printed (cron mails only news)
    assert p.returncode == 0 and p.stdout == ""
    p = run(home, "watch", "errors", "--json")
    (item,) = json.loads(p.stdout)
    assert item["quiet"] is True and "0 new, 0 deduplicated, 0 rejected" in item["line"]
    p = run(home, "watch", "error-decide", "--json")   # decide.auto is false: nothing to do
    assert p.returncode == 0 and json.loads(p.stdout) == []


def test_error_list_and_show_name_the_class_once(agent, tmp_path):
    from agent.intake.formats import error_headline

    assert agent("init").exit_code == 0
    src = tmp_path / "e.jsonl"
    src.write_text('{"message": "KeyError: \'qty\'", "class": "KeyError", "service": "widgets-api"}\n'
                   '{"message": "division by zero", "class": "ZeroDivisionError", "service": "widgets-api"}\n')
    assert agent("error", "ingest", str(src)).exit_code == 0
    listing = agent("error", "list").stdout
    assert "KeyError: 'qty'" in listing and "KeyError: KeyError" not in listing
    assert "ZeroDivisionError: division by zero" in listing
    first = agent.json("error", "list")[0]["id"]
    assert "KeyError: KeyError" not in agent("error", "show", first).stdout + agent("status").stdout
    assert error_headline("KeyError", "KeyError") == "KeyError" and error_headline(None, "boom") == "boom"
