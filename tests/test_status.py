"""`agent status`: counts, gate-blocked reasons with reset commands, and a self-contained HTML page."""

from __future__ import annotations

from html.parser import HTMLParser

from agent.domain import chain
from agent.ledger import Ledger, ledger_path
from agent.ledger.tasks import create_task, transition


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def seed(home):
    led = Ledger.open(ledger_path(home))
    a, _ = create_task(led, "acme/widgets", "Fix KeyError <script>alert(1)</script>")
    b, _ = create_task(led, "acme/widgets", "Fix TypeError")
    transition(led, a, chain.BLOCKED, "script", "implementer lane unavailable (codex): binary missing")
    transition(led, b, chain.FAILED, "script", "round cap 5 reached")
    led.close()
    return a, b


def test_status_json_and_text(agent, home):
    agent("init")
    a, b = seed(home)
    data = agent.json("status")
    assert data["tasks"]["gate-blocked"] == 1 and data["tasks"]["failed"] == 1 and data["tasks"]["open"] == 0
    blocked = data["gate_blocked"][0]
    assert blocked["id"] == a and "binary missing" in blocked["blocked_reason"]
    assert blocked["reset_command"].startswith(f"agent task reset {a} --reason")
    text = agent("status").output
    assert "needs a human" in text and f"agent task reset {a}" in text and "round cap 5 reached" in text


def test_status_html_is_self_contained_with_timelines(agent, home, tmp_path):
    agent("init")
    a, _ = seed(home)
    out = tmp_path / "status.html"
    r = agent("status", "--html", str(out))
    assert r.exit_code == 0, r.stderr
    page = Page()
    page.feed(out.read_text())
    tags = [t for t, _ in page.tags]
    assert "script" not in tags  # the hostile title is escaped, and the page has no scripts
    for tag, attrs in page.tags:  # no external assets
        for key in ("src", "href"):
            assert not (attrs.get(key) or "").startswith(("http://", "https://", "//")) or tag == "a"
        assert not (tag == "link" and attrs.get("rel") == "stylesheet")
    ids = [attrs.get("id") for _, attrs in page.tags]
    assert f"task-{a}" in ids and "blocked" in ids
    text = "".join(page.text)
    assert "task.created" in text and "task.state" in text  # the timeline from events
    assert "<script>alert(1)</script>" in text  # shown as text, not markup


def test_status_html_into_a_missing_folder_is_one_line(agent_proc, tmp_path):
    assert agent_proc("init").returncode == 0
    r = agent_proc("status", "--html", str(tmp_path / "no" / "such" / "status.html"))
    out = (r.stderr + r.stdout).strip()
    assert r.returncode != 0 and "Traceback" not in out, out
    assert out.splitlines()[-1].endswith("does not exist; create it or pick another path") and str(tmp_path) in out


def test_status_says_when_its_config_is_missing_or_broken(agent_proc, home, tmp_path):
    assert agent_proc("init").returncode == 0
    missing = agent_proc("--config", str(tmp_path / "nope.yaml"), "status")
    assert missing.returncode != 0 and "nope.yaml" in missing.stderr and "Traceback" not in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("limits: {lane_timeout: soon}\n")
    r = agent_proc("--config", str(broken), "status")
    assert r.returncode != 0 and "lane_timeout" in r.stderr and "Traceback" not in r.stderr
    (home / "config.yaml").write_text("limits: [\n")  # the default config broken: status still shows, and says so
    r = agent_proc("status")
    assert r.returncode == 0 and "tasks" in r.stdout
    assert r.stderr.startswith("status: config not loaded") and "config.yaml" in r.stderr
