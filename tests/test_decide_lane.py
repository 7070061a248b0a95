"""`agent watch error-decide`: the decider lane (a `command` vendor that is a small Python script, run
as a real subprocess by agent.lanes) concludes on errors past the thresholds; refusals are recorded."""

import importlib.util
import sys
import textwrap
from datetime import datetime, timedelta, timezone

import pytest

from agent.intake.formats import Event, Frame
from agent.intake.store import ingest
from agent.ledger import eventlog

from intake_support import make_app

HAVE_LANES = importlib.util.find_spec("agent.lanes") is not None

pytestmark = pytest.mark.skipif(not HAVE_LANES, reason="lanes not merged yet")

DECIDER = textwrap.dedent("""\
    import sys
    spec = open(sys.argv[1], encoding="utf-8").read()
    with open(sys.argv[2], "a", encoding="utf-8") as log:
        log.write(spec + "\\n=====\\n")
    print("I read the error facts.")
    if "noise_handler" in spec:
        print("STATUS: complete\\nDECISION: skip\\nREASON: a client sends garbage; the 400 is correct")
    elif "malformed_one" in spec:
        print("DECISION: fix")
    else:
        print("STATUS: complete\\nDECISION: fix\\nBRIEF: price_for indexes PRICES without a guard; "
              "check widgets/pricing.py")
""")


def _ev(service, fn, ts, msg="KeyError 'sku-1'"):
    return Event(message=msg, cls="KeyError", frames=[Frame(file="widgets/pricing.py", function=fn)],
                 service=service, environment="production", timestamp=ts, excerpt="RAW EXCERPT user=bob")


def test_decide_scan_runs_decider_lane_and_records_conclusions(tmp_path):
    script = tmp_path / "decider.py"
    script.write_text(DECIDER)
    seen = tmp_path / "specs.log"
    app = make_app(tmp_path / "home", {
        "repos": {"acme/widgets": {"url": str(tmp_path / "w.git"), "services": ["widgets-api"]}},
        "vendors": {"scripted": {"command": [sys.executable, str(script), "{spec}", str(seen)],
                                 "writable": [str(tmp_path)]}},    # it logs the specs it saw to `seen`
        "lanes": {"decider": {"vendor": "scripted", "repair": 0}},
        "decide": {"auto": True, "min_count": 2, "max_age_days": 14},
    })
    now = datetime.now(timezone.utc)
    recent = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    old = (now - timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    led = app.ledger
    ids = {}
    for name, service, fn, ts, n in (("fix", "widgets-api", "price_for", recent, 3),
                                     ("unmapped", "billing", "charge", recent, 2),
                                     ("skip", "widgets-api", "noise_handler", recent, 4),
                                     ("bad", "widgets-api", "malformed_one", recent, 2),
                                     ("rare", "widgets-api", "rare_one", recent, 1),
                                     ("old", "widgets-api", "old_one", old, 5)):
        ids[name] = ingest(led, [_ev(service, fn, ts) for _ in range(n)]).error_ids[0]

    from agent.flows.decide import decide_scan

    items = decide_scan(app)
    by_id = {i["error_id"]: i for i in items}
    assert set(by_id) == {ids["fix"], ids["unmapped"], ids["skip"], ids["bad"]}
    assert by_id[ids["fix"]]["ok"] and by_id[ids["fix"]]["decision"] == "fix"
    assert by_id[ids["skip"]]["ok"] and by_id[ids["skip"]]["decision"] == "skip"
    assert not by_id[ids["unmapped"]]["ok"] and "no repository" in by_id[ids["unmapped"]]["line"]
    assert not by_id[ids["bad"]]["ok"] and by_id[ids["bad"]]["lane_status"] != "complete"

    c = led.one("SELECT * FROM conclusions WHERE error_id = ?", (ids["fix"],))
    assert (c["kind"], c["decided_by"]) == ("fix", "lane") and "pricing.py" in c["brief"]
    assert c["lane_run_id"] == by_id[ids["fix"]]["lane_run_id"] is not None
    assert led.one("SELECT role, error_id FROM lane_runs WHERE id = ?", (c["lane_run_id"],)) == \
        {"role": "decider", "error_id": ids["fix"]}
    assert led.scalar("SELECT state FROM errors WHERE id = ?", (ids["skip"],)) == "skipped"
    assert led.scalar("SELECT count(*) FROM conclusions WHERE error_id IN (?, ?)",
                      (ids["unmapped"], ids["bad"])) == 0
    kinds = {e["kind"] for e in eventlog.events(led) if e["error_id"] == ids["unmapped"]}
    assert "error.decide_refused" in kinds

    specs = seen.read_text()
    assert "RAW EXCERPT" not in specs and "user=bob" not in specs
    assert "old_one" not in specs and "rare_one" not in specs

    # a concluded error and a refused lane decision are not run again; the malformed one is retried
    again = decide_scan(app)
    assert [i["error_id"] for i in again] == [ids["bad"]]


def test_decide_scan_does_nothing_unless_auto(tmp_path):
    from agent.flows.decide import decide_scan

    app = make_app(tmp_path / "home", {"decide": {"auto": False}})
    ingest(app.ledger, [_ev("widgets-api", "f", None) for _ in range(5)])
    assert decide_scan(app) == []
    app2 = make_app(tmp_path / "home2", {"decide": {"auto": True, "min_count": 1}})
    ingest(app2.ledger, [_ev("widgets-api", "f", None)])
    (item,) = decide_scan(app2)
    assert not item["ok"] and "lanes.decider is not configured" in item["line"]
