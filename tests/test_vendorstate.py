"""A vendor CLI's first-start state, primed once per binary and copied into fresh private states
(agent.lanes.vendorstate, issue 34).

Real bubblewrap and real processes.  The "vendor" here is a shell script standing in for a CLI's first start (it
writes into its state dir what a CLI would, and what it must not leave for others); the real codex is driven in
tests/test_vendor_clis.py (test_codex_starts_from_its_primed_state).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.config import parse_config
from agent.lanes import vendorstate
from agent.lanes.files import private_state
from agent.lanes.sandbox import bwrap_path

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed; scripts/ci-bwrap "
                                "installs it (apt-get install bubblewrap as root)")

PRIME = r"""#!/bin/sh
# a CLI's first start: its databases, a log, a link planted among them, and what it sees of the network
cd "$PRIMED_HOME" || exit 3
printf 'schema v7\n' > a.db
printf 'log line\n' > run.log
ln -s /etc/hostname b.db
tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " > net.db
cat login.txt > login-seen.db 2>/dev/null
printf '%s\n' "$PWD" > where.db
"""


class Primed:
    """A vendor adapter with a prime: ``bin`` is the script above (or one given)."""
    name = "primed"
    login_files = ("login.txt",)
    template_files = ("*.db",)

    def prime_argv(self, bin: str):
        return [bin]

    def state_paths(self, env):
        return [Path(env["PRIMED_HOME"])]


@pytest.fixture
def setup(tmp_path):
    user_state = tmp_path / "user" / ".primed"
    user_state.mkdir(parents=True)
    (user_state / "login.txt").write_text("token-of-the-user\n")
    (user_state / "history.db").write_text("the user's own sessions\n")      # never copied: not a login file
    script = tmp_path / "bin" / "primed"
    script.parent.mkdir()
    script.write_text(PRIME)
    script.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "user"), "PRIMED_HOME": str(user_state)}
    home = tmp_path / "agent-home"
    home.mkdir()
    return {"vendor": Primed(), "bin": str(script), "env": env, "home": home, "orig": [user_state],
            "config": parse_config({}), "tmp": tmp_path}


def _template(s):
    return vendorstate.template_for(s["vendor"], s["bin"], s["orig"], s["env"], s["home"], s["config"])


def test_the_prime_keeps_only_the_named_regular_files_made_without_network(setup):
    root = _template(setup)
    assert root is not None and root.parent == vendorstate.templates_root(setup["home"])
    (sub,) = list(root.iterdir())
    assert sub.name == "0-.primed"                     # named as the private dir a lane gets (files.private_state)
    names = sorted(p.name for p in sub.iterdir())
    assert names == ["a.db", "login-seen.db", "net.db", "where.db"], names     # no log, no link, nothing else
    assert (sub / "a.db").read_text() == "schema v7\n"
    assert (sub / "net.db").read_text().split() == ["lo"]                   # its own namespace: loopback only
    # it ran in a private state holding the login files only, bound where the vendor expects its state
    assert (sub / "login-seen.db").read_text() == "token-of-the-user\n"
    assert (sub / "where.db").read_text().strip() == str(setup["orig"][0])
    assert not (setup["orig"][0] / "a.db").exists()                         # the user's own state: untouched
    assert [p.name for p in vendorstate.templates_root(setup["home"]).iterdir()] == [root.name]   # scratch gone


def test_a_template_is_made_once_per_binary_and_again_when_it_changes(setup):
    root = _template(setup)
    (root / "0-.primed" / "a.db").write_text("from the first prime\n")
    assert _template(setup) == root
    assert (root / "0-.primed" / "a.db").read_text() == "from the first prime\n"   # not primed again
    st = os.stat(setup["bin"])
    os.utime(setup["bin"], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))     # an upgraded binary
    again = _template(setup)
    assert again is not None and again != root
    assert (again / "0-.primed" / "a.db").read_text() == "schema v7\n"


def test_a_prime_that_hangs_or_writes_nothing_leaves_none(setup, monkeypatch):
    monkeypatch.setattr(vendorstate, "PRIME_TIMEOUT", 1.0)
    Path(setup["bin"]).write_text("#!/bin/sh\ncd \"$PRIMED_HOME\" && printf x > a.db && exec sleep 30\n")
    t = time.monotonic()
    assert _template(setup) is None                                         # killed: what it wrote is not kept
    assert time.monotonic() - t < 15
    (marker,) = vendorstate.templates_root(setup["home"]).glob(f"*/{vendorstate.NONE}")
    assert not (marker.parent / "0-.primed").exists()
    t = time.monotonic()
    assert _template(setup) is None and time.monotonic() - t < 0.5         # remembered: no second prime

    other = dict(setup, bin=str(setup["tmp"] / "bin" / "quiet"))
    Path(other["bin"]).write_text("#!/bin/sh\nexit 0\n")
    Path(other["bin"]).chmod(0o755)
    assert _template(other) is None


def test_seed_fills_a_fresh_private_state_and_leaves_a_used_one_alone(setup):
    root = _template(setup)
    lanes = setup["tmp"] / "vendor-state"

    fresh = private_state(lanes / "task-1" / "primed", setup["orig"], ("login.txt",))
    assert vendorstate.seed(fresh, root) == 4
    priv = fresh[0][0]
    assert (priv / "a.db").read_text() == "schema v7\n" and not (priv / "a.db").is_symlink()
    assert (priv / "login.txt").read_text() == "token-of-the-user\n"
    assert not (priv / "history.db").exists()

    used = private_state(lanes / "task-2" / "primed", setup["orig"], ("login.txt",))
    (used[0][0] / "a.db").write_text("the task's own state\n")
    assert vendorstate.seed(used, root) == 0
    assert (used[0][0] / "a.db").read_text() == "the task's own state\n"
    assert not (used[0][0] / "net.db").exists()

    # a link a lane planted under a template name: never followed, nothing seeded
    target = setup["tmp"] / "outside.txt"
    target.write_text("keep me\n")
    planted = private_state(lanes / "task-3" / "primed", setup["orig"], ("login.txt",))
    (planted[0][0] / "where.db").symlink_to(target)
    assert vendorstate.seed(planted, root) == 0
    assert target.read_text() == "keep me\n" and (planted[0][0] / "where.db").is_symlink()


def test_a_vendor_without_a_prime_has_no_template(setup):
    class Plain(Primed):
        def prime_argv(self, bin):
            return None

    assert vendorstate.template_for(Plain(), setup["bin"], setup["orig"], setup["env"], setup["home"],
                                    setup["config"]) is None
    assert not vendorstate.templates_root(setup["home"]).exists()


def test_a_home_where_nothing_can_be_written_starts_the_lane_without_a_template(setup):
    templates = vendorstate.templates_root(setup["home"])
    templates.parent.mkdir(parents=True)
    templates.write_text("not a directory\n")         # what a full or read-only home looks like from here
    assert _template(setup) is None
    assert templates.read_text() == "not a directory\n"


def test_a_login_file_the_user_lacks_is_the_templates_again_at_each_lane_and_never_missing(tmp_path):
    """claude keeps per-project MCP servers (commands it runs) in ``.claude.json``, a login file its template holds
    too.  A user who logs in by API key has none, so the task's private copy held whatever the task's last lane
    left there.  Now each lane starts with the template's again (``obeyed``: what the CLI obeys comes from the user
    or no one), put back in one rename: a lane of the task running beside it (the PR reviewers run side by side)
    never finds the file missing.  Before: the lane's own copy stayed; removed and seeded, a reader saw it gone."""
    import json
    import threading

    user = tmp_path / "user" / ".primed"
    user.mkdir(parents=True)
    (user / "login.txt").write_text("token\n")
    root = tmp_path / "template"
    (root / "0-.primed").mkdir(parents=True)
    primed = json.dumps({"migrationVersion": 7}).encode()
    (root / "0-.primed" / "cfg.json").write_bytes(primed)
    login = ("login.txt", "cfg.json")
    pairs = private_state(tmp_path / "task-1", [user], login, template=root)
    vendorstate.seed(pairs, root)
    cfg = pairs[0][0] / "cfg.json"
    assert cfg.read_bytes() == primed
    cfg.write_text(json.dumps({"migrationVersion": 7, "projects": {"/w": {"mcpServers": {"x": {"command": "sh"}}}}}))
    misses: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                cfg.read_bytes()
            except FileNotFoundError:
                misses.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(300):
            pairs = private_state(tmp_path / "task-1", [user], login, template=root)
            vendorstate.seed(pairs, root)
    finally:
        stop.set()
        reader.join()
    assert cfg.read_bytes() == primed and (pairs[0][0] / "login.txt").read_text() == "token\n"
    assert misses == []
