"""A lane cannot read the users' homes through the sandbox's read-only root (DESIGN.md "Trust boundaries").

Real bubblewrap, a real git mirror and task worktree, real command-vendor lanes (small Python scripts).  The
user's HOME is a temporary directory OUTSIDE /tmp (under /var/tmp): the lane's private /tmp would otherwise hide
it by accident, and the test would prove nothing.  Secrets are planted there; the agent home, the task worktree
and a venv live under that HOME too, as they do for most users.  /root and /home are the machine's real ones: the
lane must see them empty; the test never reads a real file there (it only checks, outside, that one exists).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from agent.lanes.lane import LaneRequest, run_lane
from agent.lanes.sandbox import bwrap_path, check_argv, lane_plan, user_homes, with_argv_files, wrap
from conftest import git, remote_with_branch
from lane_helpers import make_config

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed; "
                                 "scripts/ci-bwrap installs it (apt-get install bubblewrap as root)")

SECRET = "SECRET-" + "k3y" * 8
SECRETS = (".ssh/id_rsa", ".aws/credentials", ".config/gh/hosts.yml", ".netrc", ".gnupg/private-keys-v1.d/k.key",
           ".bash_history", ".local/share/keyrings/login.keyring")

PROBE = r'''
import json, os, sys
from pathlib import Path

home = Path(os.environ["HOME"])
out = {"home": str(home), "reads": {}}
for rel in json.loads(sys.argv[1]):
    try:   # says whether it read the planted text, never prints it (the stored log is redacted anyway)
        out["reads"][rel] = "read planted text" if (home / rel).read_text().startswith("SECRET-") else "read"
    except OSError as exc:
        out["reads"][rel] = type(exc).__name__
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return type(exc).__name__
out["home_list"] = listing(home)
out["slash_home"] = listing("/home")
out["slash_root"] = listing("/root")
out["other"] = {p: os.path.exists(p) for p in json.loads(sys.argv[2])}
try:
    (home / ".lane-wrote-this").write_text("x")
    out["home_writable"] = True
except OSError as exc:
    out["home_writable"] = type(exc).__name__
state = Path(os.environ["PROBE_STATE"])
out["state_read"] = (state / "auth.json").read_text()
(state / "session.json").write_text("{\"turn\": 1}")
out["config_read"] = Path(os.environ["PROBE_CONFIG"]).read_text()
Path("app.py").write_text("def total(cart):\n    return sum(cart.get('items', []))\n")
(state / "probe.json").write_text(json.dumps(out))   # not the log: the runner redacts that
print("STATUS: complete\nSUMMARY: probed the home\n")
'''


@pytest.fixture
def user_home(monkeypatch):
    """HOME = a fresh directory under /var/tmp holding the usual secrets; removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="agent-home-test-", dir="/var/tmp"))
    home = base / "alice"
    for rel in SECRETS:
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(SECRET + " " + rel)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    yield home
    shutil.rmtree(base, ignore_errors=True)


def _world(home: Path):
    """A mirror and a task worktree inside the agent home inside the user's HOME (the default layout)."""
    from agent.git.workspace import ensure_worktree

    agent_home = home / ".local" / "share" / "agent"
    agent_home.mkdir(parents=True)
    (home / "src").mkdir()
    remote, work = remote_with_branch(home / "src", "feature")
    git(work, "checkout", "-q", "main")
    (work / "app.py").write_text("def total(cart):\n    return sum(cart['items'])\n")
    git(work, "add", ".")
    git(work, "commit", "-qm", "app")
    git(work, "push", "-q", str(remote), "main")
    ws = ensure_worktree(agent_home, "acme/app", str(remote), "main", "agent/fix-1", 1)
    spec = agent_home / "specs" / "1.md"
    spec.parent.mkdir()
    spec.write_text("fix it\n")
    return agent_home, ws, spec


def _probe_lane(monkeypatch, home: Path, python: str, others: list[str]):
    agent_home, ws, spec = _world(home)
    script = home / "bin" / "probe.py"                 # a command vendor's script kept in the user's home
    script.parent.mkdir()
    script.write_text(PROBE)
    state = home / ".probe"                            # the vendor's session dir, passed deliberately
    state.mkdir()
    (state / "auth.json").write_text("vendor-login")
    config_file = home / ".config" / "probe" / "config.json"    # a file a vendors.X.env variable names
    config_file.parent.mkdir(parents=True)
    config_file.write_text("probe-config")
    monkeypatch.setenv("PROBE_STATE", str(state))
    monkeypatch.setenv("PROBE_CONFIG", str(config_file))
    config = make_config({"probe": {"command": [python, str(script), json.dumps(SECRETS), json.dumps(others)],
                                    "env": ["PROBE_STATE", "PROBE_CONFIG"], "writable": [str(state)]}},
                         {"implementer": {"vendor": "probe", "timeout": 120}})
    res = run_lane(LaneRequest(config=config, home=agent_home, role="implementer", spec_path=spec, cwd=ws.path))
    text = (res.log_dir / "01-turn.stdout").read_text()
    assert res.status == "complete", (res.status, res.reason, text, (res.log_dir / "01-turn.stderr").read_text())
    seen = json.loads((state / "probe.json").read_text())
    return res, seen, ws, state, text


@needs_bwrap
def test_lane_cannot_read_the_users_home_but_edits_its_worktree_under_it(user_home, monkeypatch):
    """The secrets planted in HOME are not there for the lane (on main before this change it read every one of
    them: the read-only root showed the whole home); its worktree, spec and run dir (inside the agent home inside
    HOME), its vendor's session dir and a config file named by its environment are bound back; HOME itself is a
    private writable tmpfs that leaves nothing behind."""
    res, seen, ws, state, text = _probe_lane(monkeypatch, user_home, sys.executable, [])
    assert seen["reads"] == {rel: "FileNotFoundError" for rel in SECRETS}, seen["reads"]
    assert seen["home"] == str(user_home)
    # what the home shows: only what was bound back into it (and the lane's own throwaway file)
    assert set(seen["home_list"]) <= {".local", "src", ".probe", ".config", "bin", ".lane-wrote-this"}, seen
    assert ".ssh" not in seen["home_list"] and ".bash_history" not in seen["home_list"]
    assert seen["home_writable"] is True
    assert not (user_home / ".lane-wrote-this").exists()           # private: nothing leaks out
    assert seen["state_read"] == "vendor-login" and json.loads((state / "session.json").read_text()) == {"turn": 1}
    assert seen["config_read"] == "probe-config"
    assert "cart.get('items', [])" in (ws.path / "app.py").read_text()   # the implementer's edit landed


@needs_bwrap
def test_lane_sees_home_and_root_empty(user_home, monkeypatch):
    """/home and /root are empty tmpfs mounts: other users' homes (one planted under the real /home when the tests
    run as root) and root's dotfiles are not listed and cannot be opened.  Only the path to what is bound back
    (the agent's interpreter under ~/.pyenv here) may show."""
    planted = None
    if os.access("/home", os.W_OK):
        planted = Path("/home") / f"agent-test-{uuid.uuid4().hex[:8]}"
        (planted / ".ssh").mkdir(parents=True)
        (planted / ".ssh" / "id_rsa").write_text(SECRET)
    try:
        real_root = [n for n in (".bashrc", ".profile", ".gitconfig", ".npmrc") if os.path.exists(f"/root/{n}")]
        others = [f"/root/{n}" for n in real_root] + ([str(planted / ".ssh" / "id_rsa")] if planted else [])
        res, seen, ws, state, text = _probe_lane(monkeypatch, user_home, sys.executable, others)
    finally:
        if planted is not None:
            shutil.rmtree(planted, ignore_errors=True)
    assert seen["other"] == {p: False for p in others}, seen["other"]
    bound = {Path(p) for p in (sys.prefix, sys.base_prefix)} | set(user_homes())    # the mount points may show
    allowed_root = {p.relative_to("/root").parts[0] for p in bound if Path("/root") in p.parents}
    allowed_home = {p.relative_to("/home").parts[0] for p in bound if Path("/home") in p.parents}
    if os.path.isdir("/root"):
        assert set(seen["slash_root"]) <= allowed_root, seen["slash_root"]
    if os.path.isdir("/home"):
        assert set(seen["slash_home"]) <= allowed_home, seen["slash_home"]
    if planted is not None:
        assert planted.name not in seen["slash_home"]
    if os.getuid() == 0 and real_root:
        assert not set(real_root) & set(seen["slash_root"] or [])


@needs_bwrap
def test_lane_runs_a_venv_kept_in_the_users_home(user_home, monkeypatch):
    """A command vendor run by a venv under HOME (made from the agent's own interpreter, itself maybe under
    ~/.pyenv): the venv and the interpreter it was made from are bound back read-only, the secrets stay hidden."""
    venv = user_home / "venvs" / "lane"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    res, seen, ws, state, text = _probe_lane(monkeypatch, user_home, str(venv / "bin" / "python"), [])
    assert seen["reads"] == {rel: "FileNotFoundError" for rel in SECRETS}
    assert "cart.get('items', [])" in (ws.path / "app.py").read_text()


@needs_bwrap
def test_repository_check_cannot_read_the_users_home(user_home, tmp_path):
    """The repository check (code a lane wrote) runs in the same sandbox: it gets a private HOME too."""
    from agent.infra import proc
    from agent.config import parse_config

    agent_home, ws, spec = _world(user_home)
    config = parse_config({})
    argv, env = check_argv(config, agent_home, ws.path, "cat \"$HOME/.ssh/id_rsa\" /root/.bashrc; ls -A /home; "
                           "echo ok > \"$HOME/x\" && cat \"$HOME/x\"; echo edit >> app.py", tmp_path / "scratch")
    res = proc.run(argv, cwd=ws.path, env=env, timeout=30, stdout_path=tmp_path / "o", stderr_path=tmp_path / "e")
    out = res.stdout_text() + res.stderr_text()
    assert SECRET not in out
    assert "No such file" in res.stderr_text()
    mount_points = {p.relative_to("/home").parts[0] for p in user_homes() if Path("/home") in p.parents}
    assert [w for w in res.stdout_text().split() if w not in mount_points] == ["ok"], out
    assert (ws.path / "app.py").read_text().endswith("edit\n")


def test_home_tmpfs_comes_before_what_is_bound_back_into_it(tmp_path):
    """bwrap applies mounts in argv order: every user's home is emptied before the worktree, run dir, spec and
    state dirs inside it are bound, or the tmpfs would cover them (or, the other way round, show nothing)."""
    home = tmp_path / "alice"
    agent_home = home / ".local" / "share" / "agent"
    wt, run_dir, state = agent_home / "worktrees" / "1", agent_home / "lanes" / "1", home / ".codex"
    lane_dir = run_dir / "lane"
    for d in (wt, lane_dir, state):
        d.mkdir(parents=True)
    spec = agent_home / "spec.md"
    spec.write_text("x")
    plan = lane_plan(cwd=wt, writable=True, agent_home=agent_home, run_dir=run_dir, spec_paths=[spec],
                     state_paths=[state], extra_writable=[], homes=[Path("/root"), home], lane_dir=lane_dir)
    argv, _ = wrap("bwrap", ["true"], with_argv_files(plan, ["true"], {"PATH": "/usr/bin"}), {})
    pos = {tuple(argv[i:i + 2]): i for i in range(len(argv) - 1)}
    home_at = argv.index(str(home)) - 1
    assert argv[home_at] == "--tmpfs" and argv.index("/root") < home_at < argv.index(str(agent_home))
    for p in (wt, lane_dir, state):
        assert home_at < pos[("--bind", str(p))], argv
    assert ("--bind", str(run_dir)) not in pos                   # the runner's own dir is never shown
    assert home_at < pos[("--ro-bind", str(spec))]


def test_user_homes_never_hides_a_system_directory(monkeypatch, tmp_path):
    """A service account's HOME of / or /var must not become a tmpfs (the lane could not run at all); a real
    home, /root and /home are hidden; a HOME that does not exist is skipped."""
    assert Path("/") not in user_homes({"HOME": "/"}) and Path("/var") not in user_homes({"HOME": "/var"})
    assert tmp_path in user_homes({"HOME": str(tmp_path)})
    assert tmp_path / "nope" not in user_homes({"HOME": str(tmp_path / "nope")})
    for p in ("/root", "/home"):
        assert (Path(p) in user_homes({})) == os.path.isdir(p)


def test_toolchain_under_a_home_is_bound_back_without_its_secrets(tmp_path):
    """A PATH entry in a hidden home brings back its tool directory (pyenv's shims need its versions), never a
    secret store, and blanks the credentials some tools keep there (cargo's registry token)."""
    from agent.lanes.sandbox import toolchain_paths

    home = tmp_path / "alice"
    entries = (".pyenv/shims", ".cargo/bin", ".local/bin", ".ssh", "bin", ".nvm/versions/node/v20/bin")
    for d in entries + (".nvm/versions/node/v20/etc",):
        (home / d).mkdir(parents=True)
    (home / ".cargo" / "credentials.toml").write_text(SECRET)
    (home / ".nvm/versions/node/v20/etc/npmrc").write_text(SECRET)
    binds, blanks = toolchain_paths(":".join(str(home / d) for d in entries) + ":/usr/bin", [home])
    assert binds == [home / ".pyenv", home / ".cargo", home / ".local" / "bin", home / "bin", home / ".nvm"]
    assert sorted(blanks) == [home / ".cargo" / "credentials.toml", home / ".nvm/versions/node/v20/etc/npmrc"]


@needs_bwrap
def test_root_only_system_secrets_are_blanked_when_the_agent_is_root(tmp_path):
    """Inside its user namespace a lane's uid maps to the agent's: when that is root, a root-only file such as
    /etc/shadow is readable through the read-only root (it was, before this change).  Each such file that exists
    is a /dev/null the lane cannot open, each such dir an empty one (the test only counts bytes read inside; it never
    reads the real file outside).  Not as root,
    there is nothing to blank: the lane cannot read them anyway."""
    from agent.infra import proc
    from agent.config import parse_config
    from agent.lanes.sandbox import system_secrets

    if os.getuid() != 0:
        assert system_secrets() == []
        return
    files = [p for p in system_secrets() if p.is_file()]
    assert Path("/etc/shadow") in files or not os.path.exists("/etc/shadow")
    wt = tmp_path / "wt"
    wt.mkdir()
    cmd = "; ".join(f"echo {p}=$(cat {p} 2>/dev/null | wc -c)" for p in files) + "; ls -A /etc/ssl/private | wc -l"
    argv, env = check_argv(parse_config({}), tmp_path / "agent-home", wt, cmd, tmp_path / "scratch")
    res = proc.run(argv, cwd=wt, env=env, timeout=30, stdout_path=tmp_path / "o", stderr_path=tmp_path / "e")
    lines = res.stdout_text().split()
    assert lines[:-1] == [f"{p}=0" for p in files], (lines, res.stderr_text())
    assert lines[-1] == "0"
    assert all(p.stat().st_size > 0 for p in files if p.name in ("shadow", "gshadow"))   # the real ones are not


def test_inside_is_pathlibs_parent_test_on_every_kind_of_path():
    """``_inside`` compares plain absolute paths as strings (a lane's start made a Path of every parent, ~2 ms);
    for every other kind (relative, pathlib's ``//`` root) it is pathlib's own test, and the answers are the same:
    a root that is a string prefix but not a parent (``/a/bc`` of ``/a/b``) never counts."""
    import itertools

    from agent.lanes.sandbox import _inside

    def parent_test(p, roots):
        return next((r for r in roots if p == r or r in p.parents), None)

    paths = [Path(n) for n in ("/", "/a", "/a/b", "/a/bc", "/ab", "/a/b/c", "a", "a/b", "/tmp", "/tmp/x",
                               "/a/b/..", "//a", "//a/b", "//", "/a b/c", ".", "a/../b")]
    for p in paths:
        for k in (1, 2, 3):
            for roots in itertools.permutations(paths, k):
                assert _inside(p, list(roots)) == parent_test(p, list(roots)), (p, roots)
    assert _inside(Path("/a/b"), [Path("/a/bc"), Path("/a")]) == Path("/a")
