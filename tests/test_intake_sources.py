"""`agent watch errors` sources against real local servers and real files: Loki query_range and the
Sentry web API answered by http.server on 127.0.0.1 in their real JSON shapes, and tailed log files.
Each proves the cursor persists: a second pull ingests nothing new."""

import json
from urllib.parse import urlencode
import os
import time

from agent.intake.sources import pull_loki, scan
from agent.config import SourceConfig

from intake_payloads import JAVA_LOG, NODE_LOG, PY_LOG, sentry_api_event
from intake_support import LocalServer, make_app


class FakeLoki:
    """Answers GET /loki/api/v1/query_range like Loki 2.x/3.x: start/end in ns, limit, direction=forward."""

    def __init__(self, require: str | None = None):
        self.entries: list[tuple[int, str, dict]] = []
        self.require = require

    def __call__(self, method, path, query, headers):
        if self.require and headers.get("Authorization") != self.require:
            return 401, {}, b"no org id\n"
        if path != "/loki/api/v1/query_range":
            return 404, {}, b"404 page not found\n"
        start, end, limit = int(query["start"]), int(query["end"]), int(query.get("limit", 100))
        picked = sorted((e for e in self.entries if start <= e[0] <= end), key=lambda e: e[0])[:limit]
        streams: dict[str, dict] = {}
        for ts, line, labels in picked:
            s = streams.setdefault(json.dumps(labels, sort_keys=True), {"stream": labels, "values": []})
            s["values"].append([str(ts), line])
        return 200, {}, {"status": "success", "data": {
            "resultType": "streams", "result": list(streams.values()),
            "stats": {"summary": {"bytesProcessedPerSecond": 1, "linesProcessedPerSecond": 1,
                                  "totalBytesProcessed": 1, "totalLinesProcessed": len(picked), "execTime": 0.001}}}}

    def add_lines(self, text: str, labels: dict, t0: int) -> int:
        for i, line in enumerate(text.splitlines()):
            self.entries.append((t0 + i, line, labels))
        return t0 + len(text.splitlines())


def _loki_app(tmp_path, url, **extra):
    src = {"kind": "loki", "url": url, "query": '{app="widgets"}', "environment": "production", **extra}
    return make_app(tmp_path / "home", {"sources": [src]})


def test_loki_pull_groups_traces_keeps_errors_and_persists_cursor(tmp_path, monkeypatch):
    loki = FakeLoki(require="Bearer loki-tok-123")
    monkeypatch.setenv("LOKI_TOKEN", "loki-tok-123")
    t0 = time.time_ns() - 60 * 10**9
    labels = {"app": "widgets", "service_name": "widgets-api", "level": "error"}
    t = loki.add_lines(PY_LOG, labels, t0)                                   # one entry per line
    loki.entries.append((t + 1, JAVA_LOG.rstrip("\n"), {"app": "orders"}))     # one multi-line entry
    loki.entries.append((t + 2, json.dumps({"level": "error", "msg": "disk full", "service": "w"}), labels))
    loki.entries.append((t + 3, json.dumps({"level": "info", "msg": "ok"}), labels))
    with LocalServer(loki) as srv:
        app = _loki_app(tmp_path, srv.url, auth_env="LOKI_TOKEN")
        (item,) = scan(app)
        assert item["ok"], item
        assert (item["new"], item["deduplicated"], item["rejected"]) == (3, 0, 0)
        rows = {r["class"]: r for r in app.ledger.all("SELECT * FROM errors")}
        assert set(rows) == {"widgets.errors.CheckoutError", "java.lang.IllegalStateException", ""}
        assert rows["widgets.errors.CheckoutError"]["service"] == "widgets-api"
        assert rows["java.lang.IllegalStateException"]["service"] == "orders"
        assert all(r["environment"] == "production" for r in rows.values())
        cursor = app.ledger.scalar("SELECT value FROM cursors")
        assert cursor == str(t + 3)

        (item,) = scan(app)                                               # nothing new
        assert (item["new"], item["deduplicated"]) == (0, 0)
        assert srv.requests[-1][1]["start"] == str(t + 4)

        loki.add_lines(PY_LOG, labels, t + 10)                            # the same bug again
        (item,) = scan(app)
        assert (item["new"], item["deduplicated"]) == (0, 1)
        assert all(r[2].get("Authorization") == "Bearer loki-tok-123" for r in srv.requests)
        assert all(r[1]["direction"] == "forward" and r[1]["query"] == '{app="widgets"}' for r in srv.requests)


def test_loki_pages_forward_until_a_short_page(tmp_path):
    loki = FakeLoki()
    t0 = time.time_ns() - 10**9
    loki.add_lines(NODE_LOG, {"app": "web"}, t0)
    with LocalServer(loki) as srv:
        src = SourceConfig(kind="loki", url=srv.url, query='{app="web"}', service="web")
        pulled = pull_loki(src, None, env={}, limit=3)
        assert len(srv.requests) >= 3
        assert [e.cls for e in pulled.events] == ["TypeError"] and len(pulled.events[0].frames) == 3
        assert pulled.cursor == str(t0 + len(NODE_LOG.splitlines()) - 1)


def test_loki_netrc_and_refusals(tmp_path, monkeypatch):
    import base64

    loki = FakeLoki(require="Basic " + base64.b64encode(b"reader:netrc-pw-9").decode())
    loki.add_lines("2024-05-01 ERROR boom 1\n", {"app": "w"}, time.time_ns() - 10**9)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login reader password netrc-pw-9\n")
    os.chmod(netrc, 0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    with LocalServer(loki) as srv:
        app = _loki_app(tmp_path, srv.url)
        (item,) = scan(app)
        assert item["ok"] and item["new"] == 1
        netrc.write_text("machine 127.0.0.1 login reader password wrong-pw\n")
        app2 = _loki_app(tmp_path / "b", srv.url)
        (item,) = scan(app2)
        assert not item["ok"] and "HTTP 401" in item["line"] and "wrong-pw" not in item["line"]
        app3 = _loki_app(tmp_path / "c", srv.url, auth_env="NOT_SET_ANYWHERE")
        (item,) = scan(app3)
        assert not item["ok"] and "NOT_SET_ANYWHERE is not set" in item["line"]
    app4 = _loki_app(tmp_path / "d", srv.url)   # server gone
    (item,) = scan(app4)
    assert not item["ok"] and "reachable" in item["line"]


def test_file_source_tails_with_cursor_holds_unfinished_traces_and_follows_rotation(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    log.write_text(PY_LOG)
    (logs / "other.log").write_text(NODE_LOG)
    app = make_app(tmp_path / "home", {"sources": [{"kind": "file", "path": str(logs), "service": "widgets-api"}]})
    (item,) = scan(app)
    assert (item["new"], item["deduplicated"]) == (2, 0), item
    (item,) = scan(app)
    assert (item["new"], item["deduplicated"]) == (0, 0)

    java = JAVA_LOG.splitlines(keepends=True)
    with open(log, "a") as fh:
        fh.writelines(java[:4])          # header + 2 frames: the trace may go on
    (item,) = scan(app)
    assert item["new"] == 0
    with open(log, "a") as fh:
        fh.writelines(java[4:])
    (item,) = scan(app)
    assert item["new"] == 1
    java_row = app.ledger.one("SELECT * FROM errors WHERE class = 'java.lang.IllegalStateException'")
    assert java_row["excerpt"].count("\tat ") == 5 and "Caused by" in java_row["excerpt"]

    with open(log, "a") as fh:
        fh.write("2024-05-01 10:00:09 ERROR payment gateway timeout after 3000ms\n")
    (item,) = scan(app)
    assert item["new"] == 0              # at the end of a growing file: held back once
    (item,) = scan(app)
    assert item["new"] == 1              # the file did not grow since: it was complete

    log.unlink()                         # rotation: a new file (new inode) under the same name
    log.write_text(PY_LOG)
    (item,) = scan(app)
    assert (item["new"], item["deduplicated"]) == (0, 1)
    assert app.ledger.scalar("SELECT count FROM errors WHERE class = 'widgets.errors.CheckoutError'") == 2
    cur = json.loads(app.ledger.scalar("SELECT value FROM cursors"))["files"]
    assert cur[str(log)]["offset"] == len(PY_LOG.encode()) and cur[str(log)]["inode"] == log.stat().st_ino


def test_file_source_missing_path_is_a_failed_item(tmp_path):
    app = make_app(tmp_path / "home", {"sources": [{"kind": "file", "path": str(tmp_path / "nope.log")}]})
    (item,) = scan(app)
    assert not item["ok"] and "no such file" in item["line"]


class FakeSentry:
    """GET /api/0/projects/ORG/PROJECT/events/?full=true: newest first, pages of 2, Link cursor headers."""

    def __init__(self, token):
        self.events: list[dict] = []
        self.token = token

    def __call__(self, method, path, query, headers):
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {}, {"detail": "Invalid token"}
        if path != "/api/0/projects/acme/widgets/events/":
            return 404, {}, {"detail": "The requested resource does not exist"}
        ordered = sorted(self.events, key=lambda e: e["dateCreated"], reverse=True)
        offset = int((query.get("cursor") or "0:0:0").split(":")[1])
        page = ordered[offset:offset + 2]
        more = offset + 2 < len(ordered)
        base = f"http://{headers['Host']}{path}"
        link = (f'<{base}?&cursor=0:{max(offset - 2, 0)}:1>; rel="previous"; results="{str(offset > 0).lower()}"; '
                f'cursor="0:{max(offset - 2, 0)}:1", '
                f'<{base}?&cursor=0:{offset + 2}:0>; rel="next"; results="{str(more).lower()}"; '
                f'cursor="0:{offset + 2}:0"')
        return 200, {"Link": link}, page


def test_sentry_api_pull_pages_back_to_the_cursor(tmp_path, monkeypatch):
    sentry = FakeSentry("sntrys_tok_42")
    sentry.events = [sentry_api_event(f"{i:032x}", f"2024-05-01T10:00:0{i}Z", sku=f"sku-{i}") for i in range(5)]
    monkeypatch.setenv("SENTRY_TOKEN", "sntrys_tok_42")
    with LocalServer(sentry) as srv:
        app = make_app(tmp_path / "home", {"sources": [{
            "kind": "sentry", "url": srv.url, "org": "acme", "project": "widgets", "token_env": "SENTRY_TOKEN",
            "service": "widgets-api"}]})
        (item,) = scan(app)               # first pull: the newest page only
        assert item["ok"], item
        assert (item["new"], item["deduplicated"]) == (1, 1)
        assert srv.requests[0][1] == {"full": "true"}
        row = app.ledger.one("SELECT * FROM errors")
        assert (row["service"], row["environment"], row["class"]) == ("widgets-api", "production", "KeyError")
        assert row["last_seen"] == "2024-05-01T10:00:04.000000Z"

        (item,) = scan(app)
        assert (item["new"], item["deduplicated"]) == (0, 0)

        sentry.events += [sentry_api_event(f"{i:032x}", f"2024-05-01T10:01:0{i}Z") for i in range(5, 8)]
        n = len(srv.requests)
        (item,) = scan(app)               # three newer events: two pages, stop at the known one
        assert (item["new"], item["deduplicated"]) == (0, 3)
        assert len(srv.requests) - n == 2 and srv.requests[-1][1]["cursor"] == "0:2:0"
        assert app.ledger.scalar("SELECT count FROM errors") == 5
        assert all(r[2]["Authorization"] == "Bearer sntrys_tok_42" for r in srv.requests)


def test_loki_tenant_header_for_multi_tenant_setups(tmp_path):
    loki = FakeLoki()
    loki.add_lines(NODE_LOG, {"app": "web"}, time.time_ns() - 10**9)
    with LocalServer(loki) as srv:
        app = _loki_app(tmp_path, srv.url, tenant="team-widgets")
        (item,) = scan(app)
        assert item["ok"] and item["new"] == 1, item
        assert all(r[2].get("X-Scope-OrgID") == "team-widgets" for r in srv.requests)
        pull_loki(SourceConfig(kind="loki", url=srv.url, query='{app="web"}'), None, env={})
        assert "X-Scope-OrgID" not in srv.requests[-1][2]  # no tenant configured, no header


def test_loki_entries_of_the_wrong_shape_are_counted_and_the_rest_ingested(tmp_path):
    """A Loki answer with junk in it (issue 12): values that are not [ns timestamp, line] pairs, a 5,000-digit
    timestamp, streams that are numbers; the good entries are still ingested and the source does not fail."""
    t0 = time.time_ns() - 60 * 10**9

    def loki(method, path, query, headers):
        good = [str(t0), "2024-05-01 10:00:00 ERROR payment gateway timeout"]
        return 200, {}, {"status": "success", "data": {"resultType": "streams", "result": [
            5, {"stream": 7, "values": 9},
            {"stream": {"app": "web"}, "values": [good, ["9" * 5000, "ERROR x"], [str(t0 + 1), 42], "junk",
                                                  [str(t0 + 2), "2024-05-01 10:00:01 ERROR disk full"]]}]}}

    with LocalServer(loki) as srv:
        app = make_app(tmp_path / "home", {"sources": [{"kind": "loki", "url": srv.url, "query": '{app="web"}',
                                                        "service": "web"}]})
        (item,) = scan(app)
    assert item["ok"] is True and item["new"] == 2 and item["rejected"] == 1, item
    assert "3 loki entries not a [nanosecond timestamp, line] pair" in item["rejections"][0]["reason"]


def test_loki_redirect_to_another_origin_is_refused_and_a_same_origin_one_followed(tmp_path, monkeypatch):
    """Credentials go only to the configured origin: a redirect elsewhere is one failed line naming both origins
    and the other server sees no request at all; a redirect within the origin (a path prefix) still works."""
    loki = FakeLoki(require="Bearer loki-secret-1")
    loki.add_lines(NODE_LOG, {"app": "web"}, time.time_ns() - 10**9)
    monkeypatch.setenv("LOKI_TOKEN", "loki-secret-1")
    with LocalServer(lambda *a: (200, {}, [])) as collector, LocalServer(loki) as srv:
        where = {"to": collector.url}

        def front(method, path, query, headers):
            if path == "/loki/api/v1/query_range":
                return 307, {"Location": f"{where['to']}/moved{path}?{urlencode(query)}"}, b""
            return loki(method, path.removeprefix("/moved"), query, headers)

        srv.handler = front
        app = _loki_app(tmp_path, srv.url, auth_env="LOKI_TOKEN")
        (item,) = scan(app)
        assert not item["ok"] and "\n" not in item["line"] and "loki-secret-1" not in item["line"]
        assert collector.url.removeprefix("http://") in item["line"] and srv.url.removeprefix("http://") in item["line"]
        assert collector.requests == []
        where["to"] = srv.url                      # the same origin: followed, with the credentials
        (item,) = scan(app)
        assert item["ok"] and item["new"] == 1, item
        assert srv.requests[-1][0] == "/moved/loki/api/v1/query_range"


def test_sentry_next_page_on_another_origin_is_never_sent_the_token(tmp_path, monkeypatch):
    sentry = FakeSentry("sntrys_tok_42")
    sentry.events = [sentry_api_event(f"{i:032x}", f"2024-05-01T10:00:0{i}Z") for i in range(3)]
    monkeypatch.setenv("SENTRY_TOKEN", "sntrys_tok_42")
    with LocalServer(lambda *a: (200, {}, [])) as collector, LocalServer(sentry) as srv:
        def hostile(method, path, query, headers):
            status, extra, body = sentry(method, path, query, headers)
            link = extra.get("Link", "").replace(f"http://{headers['Host']}", collector.url)
            return status, {**extra, "Link": link}, body

        app = make_app(tmp_path / "home", {"sources": [{
            "kind": "sentry", "url": srv.url, "org": "acme", "project": "widgets", "token_env": "SENTRY_TOKEN"}]})
        (item,) = scan(app)                         # the newest page: sets the cursor
        assert item["ok"], item
        sentry.events += [sentry_api_event(f"{i:032x}", f"2024-05-01T10:01:0{i}Z") for i in range(3, 7)]
        srv.handler = hostile                       # the next page now points at another host
        (item,) = scan(app)
        assert not item["ok"] and "refusing to send credentials" in item["line"], item
        assert collector.url.removeprefix("http://") in item["line"] and "\n" not in item["line"]
        assert collector.requests == []
