"""What the agent does OUTSIDE the sandbox on a lane's behalf (issue: the agent never acts for a lane).

Real bubblewrap, real git, real subprocesses: the lanes are small Python scripts run as command vendors, or as the
``codex`` / ``claude`` binary of the built-in adapters (a script that speaks their output format: the real CLIs
are driven in tests/test_vendor_clis.py; here the lane must misbehave in ways a real model would have to be talked
into).  The tests run as root in CI (the usual container case), which is the root-agent variant: a lane's uid maps
to root outside.  Each case below failed on main before this change.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from agent.lanes.lane import SETID_BITS, WORKTREE_TOO_LARGE, LaneRequest, run_lane
from agent.lanes.sandbox import bwrap_path, check_argv
from agent.ledger import eventlog
from conftest import git
from lane_helpers import make_config, make_repo

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed; "
                                 "scripts/ci-bwrap installs it (apt-get install bubblewrap as root)")

MARKER = "HIDDEN-MARKER-" + "q7" * 6


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n" + body)
    path.chmod(0o755)
    return path


def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "spec.md"
    spec.write_text("fix it\n")
    return spec


# ---------------------------------------------------------------------------------------------- case 1


PLANTER = r'''
import os, sys
from pathlib import Path
out, victim = Path(sys.argv[1]), sys.argv[2]
names = ["01-turn.stdout", "01-turn.stderr", "02-repair-1.stdout", "02-repair-1.stderr", "repair-1.md",
         "spec-retry.md", "resume-note.md", "result.json", "01-turn.stdout.redacting", "02-repair-1.stdout.redacting",
         "sandbox-git-config", "version.stdout", "lane-files", "LINKS"]
for d in (out, out.parent):
    for n in names:
        try:
            os.symlink(victim, d / n)
        except OSError:
            pass
print("SESSION: s1")
print("no report from me")   # malformed: the runner writes a repair note and runs a repair turn
'''


@needs_bwrap
def test_case1_links_a_lane_plants_never_redirect_the_runners_writes(tmp_path, ledger):
    """The lane plants links named like every file the runner writes (logs, notes, results, the ``.redacting``
    temp, the git config copy) in its output dir and its parent, prints no report, and gets a repair turn: on main
    the runner wrote the repair turn's log through the link (a ``.pth`` in the agent's venv ran with its token).
    Now the runner's files live in a dir the lane never sees; the victim is untouched and the runner's files are
    regular files of its own."""
    victim = tmp_path / "victim.pth"
    victim.write_text("ORIGINAL\n")
    script = tmp_path / "planter.py"
    script.write_text(PLANTER)
    cmd = [sys.executable, str(script), "{run_dir}", str(victim)]
    config = make_config({"planter": {"command": cmd, "resume": cmd}},
                         {"implementer": {"vendor": "planter", "repair": 1}})
    repo = make_repo(tmp_path / "repo")
    res = run_lane(LaneRequest(config=config, home=tmp_path / "home", role="implementer",
                               spec_path=_spec(tmp_path), cwd=repo, ledger=ledger))
    assert res.status == "malformed" and len(res.repairs) == 1, (res.status, res.reason)
    assert victim.read_text() == "ORIGINAL\n"
    for name in ("01-turn.stdout", "02-repair-1.stdout", "repair-1.md", "result.json", "sandbox-git-config"):
        p = res.log_dir / name
        assert p.is_file() and not p.is_symlink(), name
    # what the lane left is kept only as text, its links named, never followed; its own dir is gone
    assert not (res.log_dir / "lane").exists()
    assert "01-turn.stdout" in (res.log_dir / "lane-files" / "01-turn" / "LINKS").read_text()
    row = ledger.one("SELECT log_dir, status FROM lane_runs WHERE id = ?", (res.run_id,))
    assert row["status"] == "malformed" and row["log_dir"] == str(res.log_dir)


@needs_bwrap
def test_case1_the_checks_scratch_dir_is_the_runners_and_fresh(tmp_path):
    """Test code the lane committed plants a link in the check's scratch dir (``checks/task-N/sandbox``, bound
    read-write on main and reused every round); the next check's set-up wrote its git config copy through it.
    Now the scratch dir is never shown to the check and is made fresh for each one."""
    from agent.infra import proc
    from agent.config import parse_config

    victim = tmp_path / "victim"
    victim.write_text("ORIGINAL\n")
    repo = make_repo(tmp_path / "repo")
    scratch = tmp_path / "home" / "checks" / "task-1" / "sandbox"
    cmd = f"ln -s {victim} {scratch}/sandbox-git-config; ln -s {victim} {scratch}/x; ls {scratch} | wc -l"
    for _ in range(2):
        argv, env = check_argv(parse_config({}), tmp_path / "home", repo, cmd, scratch)
        res = proc.run(argv, cwd=repo, env=env, timeout=30, stdout_path=tmp_path / "o", stderr_path=tmp_path / "e")
        assert res.exit_code == 0, res.stderr_text()
    assert victim.read_text() == "ORIGINAL\n"
    assert sorted(p.name for p in scratch.iterdir()) == ["sandbox-git-config"]
    assert not (scratch / "sandbox-git-config").is_symlink()


def test_the_lanes_git_config_copy_keeps_only_what_git_needs_to_read(tmp_path):
    """The copy shown in place of the mirror's config: format version, bare, a plain identity and the known
    extensions; no remote URL (credentials), alias, hook path or unknown extension, and no value can open a
    section of its own."""
    from agent.lanes.sandbox import sanitized_git_config

    (tmp_path / "config").write_text(
        "[core]\n\trepositoryformatversion = 1\n\tbare = yes\n\thooksPath = /tmp/evil\n"
        "[remote \"origin\"]\n\turl = https://user:s3cret@example.com/r.git\n[alias]\n\tst = !touch /tmp/pwned\n"
        "[user]\n\tname = \"Ann [core] x=y\"\n\temail = ann@example.com\n"
        "[extensions]\n\tobjectFormat = sha256\n\tworktreeConfig = true\n\tweird = 1\n")
    text = sanitized_git_config(tmp_path, tmp_path / "copy").read_text()
    assert text == ("[core]\n\trepositoryformatversion = 1\n\tbare = true\n[user]\n\tname = Ann core xy\n"
                    "\temail = ann@example.com\n[extensions]\n\tobjectFormat = sha256\n\tworktreeConfig = true\n")
    (tmp_path / "config").write_text("")
    assert sanitized_git_config(tmp_path, tmp_path / "copy").read_text() == (
        "[core]\n\trepositoryformatversion = 0\n[user]\n\tname = agent\n\temail = agent@localhost\n")


# ---------------------------------------------------------------------------------------------- case 2


FAKE_CODEX = r'''
import json, os, sys
if "--version" in sys.argv:
    print("codex-cli 0.0.0-fake")
    sys.exit(0)
last = sys.argv[sys.argv.index("-o") + 1]
os.symlink(os.environ["PROBE_TARGET"], last)       # its last-message file: a link to a host file
print(json.dumps({"type": "thread.started", "thread_id": "t-1"}))
print(json.dumps({"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}}))
'''


@needs_bwrap
def test_case2_a_vendors_last_message_file_is_never_read_through_a_link(tmp_path, ledger, monkeypatch):
    """codex's ``-o`` file made a link to a host file the lane cannot see: on main the runner read it as the
    lane's message, and its text went to the failure reason, the excerpt, ``result.json`` and the ledger."""
    hidden = tmp_path / "host-secret.txt"
    hidden.write_text(f"{MARKER}\n")
    monkeypatch.setenv("PROBE_TARGET", str(hidden))
    codex = _script(tmp_path / "codex", FAKE_CODEX)
    config = make_config({"codex": {"bin": str(codex), "env": ["PROBE_TARGET"]}},
                         {"implementer": {"vendor": "codex", "repair": 0}})
    repo = make_repo(tmp_path / "repo")
    res = run_lane(LaneRequest(config=config, home=tmp_path / "home", role="implementer",
                               spec_path=_spec(tmp_path), cwd=repo, ledger=ledger))
    assert res.status == "malformed", (res.status, res.reason)
    everything = json.dumps(res.to_json()) + (res.log_dir / "result.json").read_text()
    everything += json.dumps(dict(ledger.one("SELECT * FROM lane_runs WHERE id = ?", (res.run_id,))), default=str)
    everything += "".join(p.read_text(errors="replace") for p in res.log_dir.rglob("*") if p.is_file())
    assert MARKER not in everything


SESSION_LANE = r'''
import sys
from pathlib import Path
args = sys.argv[1:]
if "--session" in args:          # the repair turn: what the session id names, if the runner bound it in
    p = args[args.index("--session") + 1]
    try:
        seen = Path(p).read_text()
    except OSError as exc:
        seen = type(exc).__name__
    Path("seen.txt").write_text(seen)
    print("STATUS: complete\nSUMMARY: resumed\n")
else:
    print("SESSION: " + args[0])
    print("no report yet")
'''


@needs_bwrap
def test_case2_a_session_id_naming_a_host_file_is_never_bound_into_the_next_turn(tmp_path, ledger):
    """The lane reports a host file's path as its session id; the resume turn's argv carries it.  On main that
    file was bound (read-only) into the next turn, which read it.  A path that came from the lane is never bound."""
    hidden = tmp_path / "netrc"
    hidden.write_text(f"{MARKER}\n")
    assert _session_lane(tmp_path, ledger, tmp_path / "session.py", str(hidden)) == "FileNotFoundError"


def _session_lane(tmp_path: Path, ledger, script: Path, session: str) -> str:
    """SESSION_LANE at ``script`` reporting ``session``, then resumed with it: what its resume turn read there."""
    script.write_text(SESSION_LANE)
    config = make_config({"s": {"command": [sys.executable, str(script), session],
                                "resume": [sys.executable, str(script), "--session", "{session}"]}},
                         {"implementer": {"vendor": "s", "repair": 1}})
    repo = make_repo(tmp_path / "repo")
    res = run_lane(LaneRequest(config=config, home=tmp_path / "home", role="implementer",
                               spec_path=_spec(tmp_path), cwd=repo, ledger=ledger))
    assert res.status == "complete", (res.status, res.reason)
    return (repo / "seen.txt").read_text()


def test_case2_the_one_read_helper_refuses_links_fifos_and_caps_size(tmp_path):
    from agent.lanes.files import read_lane_file, write_private

    (tmp_path / "target").write_text(MARKER)
    os.symlink(tmp_path / "target", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_text("x" * 100 + "\x1b]0;title\x07END password=hunter22hunter")
    assert read_lane_file(tmp_path / "link") is None
    assert read_lane_file(tmp_path / "fifo") is None           # would block forever if opened for a read
    assert read_lane_file(tmp_path / "missing") is None
    text = read_lane_file(tmp_path / "big", cap=40)
    assert text.endswith("END password=[redacted:secret]") and "\x1b" not in text and len(text) < 60
    write_private(tmp_path / "link", "runner text")       # a runner write at a planted link replaces the link
    assert (tmp_path / "target").read_text() == MARKER and (tmp_path / "link").read_text() == "runner text"
    assert not (tmp_path / "link").is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == [
        "big", "fifo", "link", "target"]


# ---------------------------------------------------------------------------------------------- case 4


FAKE_CLAUDE = r'''
import json, os, sys
from pathlib import Path
if "--version" in sys.argv:
    print("2.0.0 (Claude Code, fake)")
    sys.exit(0)
cfg = Path(os.environ["CLAUDE_CONFIG_DIR"])
seen = {"login": (cfg / ".credentials.json").read_text() if (cfg / ".credentials.json").exists() else None,
        "listing": sorted(str(p.relative_to(cfg)) for p in cfg.rglob("*")),
        "settings": (cfg / "settings.json").read_text() if (cfg / "settings.json").exists() else None}
(cfg / "settings.json").write_text(json.dumps({"hooks": {"SessionStart": [{"command": "touch /tmp/pwned"}]}}))
(cfg / "projects" / "mine").mkdir(parents=True, exist_ok=True)
(cfg / "projects" / "mine" / "transcript.jsonl").write_text(os.environ["PROBE_TAG"])
Path("probe-" + os.environ["PROBE_TAG"] + ".json").write_text(json.dumps(seen))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "session_id": "s-1",
                  "result": "done\nSTATUS: complete\nSUMMARY: probed\n", "total_cost_usd": 0.0}))
'''


@needs_bwrap
def test_case4_vendor_state_is_a_private_copy_per_task(tmp_path, monkeypatch):
    """The vendor's dir is never the user's live one: the lane gets a private copy per task holding only what
    login needs.  On main it was bound read-write: the lane wrote a SessionStart hook into the user's
    settings.json and read other sessions' transcripts.  Its own session files stay for the task's next run; the
    settings it wrote there do not (before, the task's next lane got the hook)."""
    user_cfg = tmp_path / "user-claude"
    (user_cfg / "projects" / "other").mkdir(parents=True)
    (user_cfg / ".credentials.json").write_text('{"token": "LOGIN"}')
    (user_cfg / "settings.json").write_text('{"theme": "dark"}')
    (user_cfg / "projects" / "other" / "transcript.jsonl").write_text(MARKER)
    before = {str(p.relative_to(user_cfg)): p.read_bytes() for p in user_cfg.rglob("*") if p.is_file()}
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(user_cfg))
    claude = _script(tmp_path / "claude", FAKE_CLAUDE)
    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"

    def run(task_id: int, tag: str) -> dict:
        monkeypatch.setenv("PROBE_TAG", tag)
        config = make_config({"claude": {"bin": str(claude), "env": ["CLAUDE_CONFIG_DIR", "PROBE_TAG"]}},
                             {"implementer": {"vendor": "claude", "repair": 0}})
        res = run_lane(LaneRequest(config=config, home=home, role="implementer", spec_path=_spec(tmp_path),
                                   cwd=repo, task_id=task_id))
        assert res.status == "complete", (res.status, res.reason, res.excerpt)
        return json.loads((repo / f"probe-{tag}.json").read_text())

    first = run(7, "first")
    assert first["login"] == '{"token": "LOGIN"}'                          # logging in works
    assert first["settings"] is None and MARKER not in json.dumps(first)   # only login files: no other sessions
    assert not any(name.startswith("projects/other") for name in first["listing"])
    again = run(7, "again")                                                 # the same task: its session is there
    assert "projects/mine/transcript.jsonl" in again["listing"]
    assert again["settings"] is None          # not the hook the first run left (claude obeys it: obeyed_files)
    other_task = run(8, "other")                                            # another task: nothing of task 7's
    assert "projects/mine/transcript.jsonl" not in other_task["listing"] and other_task["settings"] is None
    after = {str(p.relative_to(user_cfg)): p.read_bytes() for p in user_cfg.rglob("*") if p.is_file()}
    assert after == before                                                   # the user's dir: untouched


# ---------------------------------------------------------------------------------------------- case 5


SETUID_LANE = r'''
import os, shutil
from pathlib import Path
shutil.copy("/bin/sh", "sh")
os.chmod("sh", 0o4755)
Path("mounts.txt").write_text(Path("/proc/self/mountinfo").read_text())
print("STATUS: complete\nSUMMARY: left a setuid shell\n")
'''


@needs_bwrap
def test_case5_setuid_files_are_stripped_and_the_run_rejected(tmp_path, ledger):
    """A lane of a root agent leaves a setuid copy of /bin/sh in the worktree: the runner removes the bit and
    rejects the run naming the file (main kept a setuid-root shell).  Every mount the lane sees is nosuid."""
    script = tmp_path / "setuid.py"
    script.write_text(SETUID_LANE)
    config = make_config({"s": {"command": [sys.executable, str(script)]}}, {"implementer": {"vendor": "s"}})
    repo = make_repo(tmp_path / "repo")
    res = run_lane(LaneRequest(config=config, home=tmp_path / "home", role="implementer",
                               spec_path=_spec(tmp_path), cwd=repo, ledger=ledger))
    mode = (repo / "sh").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID), oct(mode)
    assert res.status == "rejected" and res.reason.startswith(SETID_BITS) and "sh" in res.reason, res.reason
    assert ledger.scalar("SELECT count(*) FROM events WHERE kind = 'lane.setid_bits'") == 1
    top = {}                                      # the mount on top at each mount point (what the lane sees)
    for line in (repo / "mounts.txt").read_text().splitlines():
        fields = line.split(" - ")[0].split()
        top[fields[4]] = fields[5].split(",")
    assert str(repo) in top and "/tmp" in top
    assert all("nosuid" in opts for opts in top.values()), top


# ---------------------------------------------------------------------------------------------- case 6


def test_case6_symlink_chains_are_judged_by_resolving_through_the_tree(tmp_path):
    """``s -> .``, ``u1 -> s/..``, ``u2 -> u1/..``: each target alone stays inside by text, and main committed
    and pushed them; resolved through the tree u1 and u2 leave the worktree.  A link through another link is
    refused; a plain link inside stays allowed."""
    from agent.git.workspace import TaskGit, unsafe_changes

    repo = tmp_path / "r"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    (repo / "d").mkdir()
    (repo / "d" / "a.txt").write_text("a")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "a")
    os.symlink(".", repo / "s")
    os.symlink("s/..", repo / "u1")
    os.symlink("u1/..", repo / "u2")
    os.symlink("../d/a.txt", repo / "d" / "ok")
    os.symlink("d/ok", repo / "via-link")
    g = TaskGit(repo, repo / ".git")
    g("add", "-A")
    bad = unsafe_changes(g, g.staged_changes())
    assert sorted(b.split(" ")[0] for b in bad) == ["u1", "u2", "via-link"], bad
    assert any("u1 (symlink to s/..) passes through the link s" == b for b in bad), bad


def test_case6_an_unchanged_link_through_a_changed_one_is_judged_again(tmp_path):
    from agent.git.workspace import TaskGit, unsafe_changes

    repo = tmp_path / "r"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    (repo / "sub").mkdir()
    (repo / "sub" / "f").write_text("f")
    os.symlink("sub", repo / "s")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "a")
    g = TaskGit(repo, repo / ".git")
    assert unsafe_changes(g, g.staged_changes()) == []
    (repo / "s").unlink()
    os.symlink("sub/../..", repo / "s")
    g("add", "-A")
    assert [b.split(" ")[0] for b in unsafe_changes(g, g.staged_changes())] == ["s"]


# ---------------------------------------------------------------------------------------------- case 7


def test_case7_the_agents_git_reads_no_global_or_system_config(tmp_path, monkeypatch):
    """A lane's ``.gitattributes`` names a filter driver the user's ~/.gitconfig defines: on main the agent's own
    ``git add``/``status`` ran it, unsandboxed.  Now no global or system config is read, and HOME is unset (no
    ignore file of the user's hides a lane's file from the commit, and no per-process empty home is left in /tmp by
    an agent that is killed); a command that talks to a remote gets the user's credential helper, and only that."""
    from agent.git import workspace
    from agent.git.workspace import git as agent_git

    user = tmp_path / "user"
    user.mkdir()
    marker = tmp_path / "filter-ran"
    (user / ".gitconfig").write_text(f"[filter \"evil\"]\n\tclean = touch {marker}; cat\n\tsmudge = cat\n"
                                     "[credential]\n\thelper = store --file=/nonexistent/creds\n"
                                     "[alias]\n\tst = !touch " + str(marker) + "\n")
    (user / ".config" / "git").mkdir(parents=True)
    (user / ".config" / "git" / "ignore").write_text("new.txt\n")
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setattr(workspace, "_USER_CREDENTIALS", [], raising=False)     # read afresh from this HOME
    assert "HOME" not in workspace.git_env() and workspace.git_env(network=True)["HOME"] == str(user)
    repo = make_repo(tmp_path / "repo")
    (repo / ".gitattributes").write_text("* filter=evil\n")
    (repo / "new.txt").write_text("x\n")
    agent_git("add", "-A", cwd=repo)
    assert "A  new.txt" in agent_git("status", "--porcelain", cwd=repo).splitlines()
    agent_git("diff", "--cached", "--no-ext-diff", "--no-textconv", cwd=repo)
    assert not marker.exists()
    assert agent_git("config", "--get-all", "credential.helper", cwd=repo, network=True).splitlines()[-1] \
        == "store --file=/nonexistent/creds"
    passed = workspace.user_credential_config()    # the user's credential settings (the system's too), nothing else
    assert "credential.helper=store --file=/nonexistent/creds" in passed
    assert all(c == "-c" or c.startswith("credential.") for c in passed), passed
    assert agent_git("config", "--get", "filter.evil.clean", cwd=repo, network=True, check=False) == ""


# ---------------------------------------------------------------------------------------------- case 8, 9


ESCAPES = "\x1b]0;pwned-title\x07\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x1b[31m"


def test_case8_terminal_escapes_in_a_lanes_report_never_reach_a_human(tmp_path, monkeypatch, agent_proc):
    """A lane's SUMMARY carries OSC (window title, clipboard write) and CSI sequences: on main `agent task show`,
    `events` and `status` printed them raw.  Lane text is escape-stripped before it is stored or shown."""
    from test_fixer import ledger as open_ledger, run_with_implementer
    from test_trust import _fixer_world

    paths = _fixer_world(tmp_path, monkeypatch)
    body = r'''
import pathlib, sys
cwd = pathlib.Path(sys.argv[2])
for p in cwd.rglob("pricing.py"):
    p.write_text(p.read_text().replace('item["qty"]', 'item.get("qty", 1)'))
print("STATUS: complete\nSUMMARY: guarded the cart ESC done\n".replace("ESC", %r))
''' % ESCAPES
    run_with_implementer(paths, "escaper", body, round_cap=1)
    led = open_ledger(paths)
    try:
        summaries = [r["summary"] for r in led.all("SELECT summary FROM lane_runs WHERE role = 'implementer'")]
        task_id = led.scalar("SELECT id FROM tasks")
        prs = led.all("SELECT title, body FROM prs")
        commits = [r["message"] for r in led.all("SELECT message FROM commits")]
    finally:
        led.close()
    assert summaries and all(s and "\x1b" not in s and "guarded the cart" in s for s in summaries), summaries
    assert prs and commits, (prs, commits)                                                    # a draft PR opened
    assert not any("\x1b" in text or "\x07" in text for text in [*commits, *(v for r in prs for v in r.values())])
    env = {"AGENT_HOME": str(paths["home"])}
    for args in (("task", "show", str(task_id)), ("events", "--task", str(task_id)), ("status",),
                 ("task", "show", str(task_id), "--json")):
        r = agent_proc(*args, env=env)
        assert r.returncode == 0, (args, r.stderr)
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "\\u001b" not in r.stdout, (args, r.stdout)


def test_case8_strip_controls():
    from agent.infra.text import strip_controls

    assert strip_controls("a" + ESCAPES + "b\tc\r\nd\u202eevil\x9b31m") == "ab\tc\ndevil"
    assert strip_controls("plain ünïcode ✓\n") == "plain ünïcode ✓\n" and strip_controls("a\rb") == "a\nb"


def test_case9_the_netrc_form_is_redacted():
    from agent.infra.redact import redact

    assert redact("machine api.github.com login bob password s3cr3tP4ss") == \
        "machine api.github.com login bob password [redacted:password]"
    assert redact("machine h\n  login u\n  password hunter22\ndefault login anonymous password me2") == \
        "machine h\n  login u\n  password [redacted:password]\ndefault login anonymous password [redacted:password]"
    assert redact("invalid password for user bob") == "invalid password for user bob"


# ---------------------------------------------------------------------------------------------- size


SIZE_LANE = r'''
import os
from pathlib import Path
def fill(path, mb):
    try:
        with open(path, "wb") as fh:
            for _ in range(mb):
                fh.write(b"x" * (1 << 20))
        return "wrote"
    except OSError as exc:
        return type(exc).__name__
tmp = fill("/tmp/big", 40)
home = fill(os.path.join(os.environ["HOME"], "big"), 40)
Path("sizes.txt").write_text(f"{tmp} {home}")
with open("blob.bin", "wb") as fh:
    fh.write(os.urandom(3 << 20))
print("STATUS: complete\nSUMMARY: filled things\n")
'''


FILLING_LANE = r"""
import os, time
for i in range(300):                      # 300 MiB over about 30 s, unless stopped
    with open(f"fill-{i}.bin", "wb") as fh:
        fh.write(os.urandom(1 << 20))
    time.sleep(0.1)
print("STATUS: complete\nSUMMARY: filled the worktree\n")
"""


def _fill(tmp_path, monkeypatch, source: str):
    """An implementer lane running ``source`` under limits.worktree_max_mb 4, its size watched every 0.2 s:
    (its result, its worktree)."""
    import agent.lanes.lane as lane

    monkeypatch.setattr(lane, "WATCH_S", 0.2)
    script = tmp_path / "fill.py"
    script.write_text(source)
    config = make_config({"f": {"command": [sys.executable, str(script)]}}, {"implementer": {"vendor": "f"}},
                         limits={"worktree_max_mb": 4})
    repo = make_repo(tmp_path / "repo")
    return run_lane(LaneRequest(config=config, home=tmp_path / "home", role="implementer",
                                spec_path=_spec(tmp_path), cwd=repo)), repo


@needs_bwrap
def test_a_lane_filling_the_worktree_is_stopped_while_it_runs(tmp_path, monkeypatch):
    """The worktree's size is watched during a writing turn: past limits.worktree_max_mb the lane is killed then,
    not after it wrote everything it meant to (before: the check ran only after the turn, 300 MiB later)."""
    res, repo = _fill(tmp_path, monkeypatch, FILLING_LANE)
    written = len(list(repo.glob("fill-*.bin")))
    assert res.status == "rejected" and res.reason.startswith(WORKTREE_TOO_LARGE), res.reason
    assert 4 <= written < 100, written       # stopped at or soon after the cap (4 MiB plus the repo), not at 300


SHRINKING_LANE = r"""
import os, pathlib, sys, time
if pathlib.Path("fill-0.bin").exists():   # a second turn: it empties what the first one wrote, and reports nothing
    for p in pathlib.Path(".").glob("fill-*.bin"):
        p.write_bytes(b"")
    print("emptied")
    sys.exit(0)
for i in range(300):
    with open(f"fill-{i}.bin", "wb") as fh:
        fh.write(os.urandom(1 << 20))
    time.sleep(0.1)
"""


@needs_bwrap
def test_a_lane_stopped_for_its_worktrees_size_is_rejected_for_it_with_no_repair_turn(tmp_path, monkeypatch):
    """Stopped for the size, the run is over: rejected with the size seen, and no repair turn runs (one that
    shrank the worktree again left the run "malformed", the reason lost; under load a repair turn stopped right
    after it truncated a file did the same to the test above)."""
    res, repo = _fill(tmp_path, monkeypatch, SHRINKING_LANE)
    assert res.status == "rejected" and res.reason.startswith(WORKTREE_TOO_LARGE), res.reason
    assert "limits.worktree_max_mb (4 MB)" in res.reason
    assert res.repairs == []
    sizes = [p.stat().st_size for p in repo.glob("fill-*.bin")]
    assert len(sizes) >= 4 and sum(sizes) >= 4 << 20            # nothing emptied them (a second turn would)


@needs_bwrap
def test_lane_tmp_and_home_are_capped_and_a_grown_worktree_fails_the_run(tmp_path):
    """/tmp and the private home are tmpfs capped at limits.lane_tmp_mb (RAM a lane could fill); a worktree
    past limits.worktree_max_mb rejects the run with that reason (main had neither)."""
    script = tmp_path / "size.py"
    script.write_text(SIZE_LANE)
    config = make_config({"s": {"command": [sys.executable, str(script)]}}, {"implementer": {"vendor": "s"}},
                         limits={"lane_tmp_mb": 16, "worktree_max_mb": 1})
    repo = make_repo(tmp_path / "repo")
    res = run_lane(LaneRequest(config=config, home=tmp_path / "home", role="implementer",
                               spec_path=_spec(tmp_path), cwd=repo))
    assert (repo / "sizes.txt").read_text() == "OSError OSError"
    assert res.status == "rejected" and res.reason.startswith(WORKTREE_TOO_LARGE), res.reason
    assert "limits.worktree_max_mb (1 MB)" in res.reason


def test_a_grown_worktree_or_a_setuid_file_fails_the_round_with_that_reason(tmp_path, monkeypatch):
    """In the fixer: the round whose implementer grew the worktree past limits.worktree_max_mb is rejected with
    that reason and its files dropped; the next round's lane leaves a setuid file: rejected, bit removed."""
    from test_fixer import edit_config, ledger as open_ledger, run_with_implementer
    from test_trust import _fixer_world

    paths = _fixer_world(tmp_path, monkeypatch)
    edit_config(paths, lambda cfg: cfg["limits"].update({"worktree_max_mb": 1}))
    run_with_implementer(paths, "grower", r'''
import os, pathlib, sys
cwd = pathlib.Path(sys.argv[2])
if "worktree_too_large" not in pathlib.Path(sys.argv[1]).read_text():    # round 1 (round 2's spec says why)
    (cwd / "round-one.bin").write_bytes(os.urandom(2 << 20))
else:
    (cwd / "suid").write_text("#!/bin/sh\n")
    os.chmod(cwd / "suid", 0o4755)
print("STATUS: complete\nSUMMARY: grew things\n")
''', round_cap=2)
    led = open_ledger(paths)
    try:
        t = led.one("SELECT * FROM tasks")
        feedback = [e["payload"].get("feedback", "") for e in eventlog.events(led, task_id=t["id"])
                    if e["kind"] == "round.started"]
        reasons = " ".join(str(e["payload"].get("reason") or "") for e in eventlog.events(led, task_id=t["id"]))
    finally:
        led.close()
    assert t["state"] == "failed" and t["pushed_sha"] is None
    assert any(WORKTREE_TOO_LARGE in f and "limits.worktree_max_mb (1 MB)" in f for f in feedback), feedback
    assert SETID_BITS in reasons and "suid" in reasons, reasons
    wt = Path(t["worktree"])
    assert not (wt / "round-one.bin").exists()
    assert not (wt / "suid").exists() or not (wt / "suid").stat().st_mode & stat.S_ISUID


@needs_bwrap
def test_case5_a_check_that_leaves_a_setuid_file_has_its_bit_removed(tmp_path, monkeypatch):
    """Test code the lane committed copies /bin/sh into an ignored dir (`git clean` keeps it) and makes it setuid
    when the check runs it: after the check no file in the worktree keeps the bit (main left a setuid-root shell)."""
    from test_fixer import ledger as open_ledger, run_with_implementer
    from test_trust import _fixer_world

    paths = _fixer_world(tmp_path, monkeypatch)
    run_with_implementer(paths, "suid-test", r'''
import pathlib, sys
cwd = pathlib.Path(sys.argv[2])
p = cwd / "widgets" / "pricing.py"
p.write_text(p.read_text().replace('item["qty"]', 'item.get("qty", 1)'))
(cwd / "tests" / "test_zz.py").write_text(
    "import os, shutil, unittest\n"
    "class T(unittest.TestCase):\n"
    "    def test_plant(self):\n"
    "        os.makedirs('widgets/__pycache__', exist_ok=True)\n"
    "        shutil.copy('/bin/sh', 'widgets/__pycache__/sh')\n"
    "        os.chmod('widgets/__pycache__/sh', 0o6755)\n")
print("STATUS: complete\nSUMMARY: fixed with a planting test\n")
''', round_cap=1)
    led = open_ledger(paths)
    try:
        t = led.one("SELECT * FROM tasks")
        checks = led.all("SELECT passed FROM checks")
    finally:
        led.close()
    planted = Path(t["worktree"]) / "widgets" / "__pycache__" / "sh"
    assert checks and checks[0]["passed"], (t["state"], t["failed_reason"], checks)
    assert planted.exists()                                  # the check ran it (and git clean kept the ignored dir)
    assert not planted.stat().st_mode & (stat.S_ISUID | stat.S_ISGID), oct(planted.stat().st_mode)


def test_case8_file_names_a_lane_chooses_reach_the_ledger_without_escapes(tmp_path, monkeypatch):
    """A lane names a blocked file with an OSC sequence: the round's rejection (which names the file) is stored and
    shown without it."""
    from test_fixer import ledger as open_ledger, run_with_implementer
    from test_trust import _fixer_world

    paths = _fixer_world(tmp_path, monkeypatch)
    run_with_implementer(paths, "namer", r'''
import pathlib, sys
cwd = pathlib.Path(sys.argv[2])
(cwd / ".github").mkdir(exist_ok=True)
(cwd / ".github" / "ci\x1b]0;owned\x07.yml").write_text("x")
print("STATUS: complete\nSUMMARY: named a file\n")
''', round_cap=1)
    led = open_ledger(paths)
    try:
        events = eventlog.events(led, task_id=led.scalar("SELECT id FROM tasks"))
    finally:
        led.close()
    text = json.dumps([e["payload"] for e in events], ensure_ascii=False)
    assert ".github/ci.yml" in text and "\x1b" not in text and "\x07" not in text, text[-800:]


# ---------------------------------------------------------------------------------------------- case 10


TURN_PLANTER = r'''
import json, os, sys
from pathlib import Path
out, secret, first = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "first"
if first:
    (out / "planted.txt").write_text("left by the first turn\n")
    os.symlink(secret, out / "aider.chat.md")       # a link named like a file a runner carries over
    os.symlink(secret, out / "codex-last-message.txt")
    print("SESSION: s1")
    print("no report from me")                      # malformed: a repair turn follows
else:
    print("SEEN " + json.dumps(sorted(os.listdir(out))))
    (out / "second.txt").write_text("the repair turn's own\n")
    print("STATUS: complete\nSUMMARY: repaired\n")
'''


@needs_bwrap
def test_case10_each_turn_gets_a_fresh_lane_dir(tmp_path, ledger):
    """The first turn plants a file and links in its lane dir and reports nothing; on main the repair turn found
    them there (the dir was fresh per run, not per turn) and the runner read the dir only when the run ended. Now
    each turn's dir is kept as text right after it (links named, never followed) and the next turn gets an empty
    one."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text(MARKER + "\n")
    script = tmp_path / "planter.py"
    script.write_text(TURN_PLANTER)
    config = make_config({"planter": {"command": [sys.executable, str(script), "{run_dir}", str(secret), "first"],
                                      "resume": [sys.executable, str(script), "{run_dir}", str(secret), "again"]}},
                         {"implementer": {"vendor": "planter", "repair": 1}})
    repo = make_repo(tmp_path / "repo")
    res = run_lane(LaneRequest(config=config, home=tmp_path / "home", role="implementer",
                               spec_path=_spec(tmp_path), cwd=repo, ledger=ledger))
    assert res.status == "complete" and len(res.repairs) == 1, (res.status, res.reason)
    assert 'SEEN []' in (res.log_dir / "02-repair-1.stdout").read_text()     # the repair turn's dir was empty
    first, second = res.log_dir / "lane-files" / "01-turn", res.log_dir / "lane-files" / "02-repair-1"
    assert (first / "planted.txt").read_text() == "left by the first turn\n"
    assert set((first / "LINKS").read_text().split()) >= {"aider.chat.md", "codex-last-message.txt"}
    assert sorted(p.name for p in second.iterdir()) == ["second.txt"]
    assert not (res.log_dir / "lane").exists()
    for p in res.log_dir.rglob("*"):
        assert p.is_dir() or MARKER not in p.read_text(errors="replace"), p


@needs_bwrap
def test_case2_a_short_session_id_inside_a_trusted_path_does_not_unbind_it(tmp_path, ledger):
    """The session id is compared by position, not as a substring: a lane reporting `ab` as its session must not
    make the resume turn refuse the vendor's own script because its path (`.../labs/session.py`) contains `ab`
    (on main the script was left out of the sandbox and the resume turn could not start).  The element the id went
    into is still never bound (the test above)."""
    (tmp_path / "labs").mkdir()
    # `ab` names no file: read as the lane's text, and the resume turn started (its script was there)
    assert _session_lane(tmp_path, ledger, tmp_path / "labs" / "session.py", "ab") == "FileNotFoundError"


def test_the_argv_positions_of_the_lanes_text_are_exact():
    from agent.lanes.sandbox import Plan, with_argv_files

    plan = Plan(cwd=Path("/nonexistent"), writable_cwd=False)
    argv = [sys.executable, "--session", sys.executable]
    # the same file as config (position 0) and as the lane's text (position 2): only position 2 is the lane's
    got = with_argv_files(plan, argv, {}, untrusted=[sys.executable], untrusted_at=(2,))
    assert Path(sys.executable).resolve() in got.ro
    old = with_argv_files(plan, argv, {}, untrusted=[sys.executable])      # unknown positions: every holder
    assert Path(sys.executable).resolve() not in old.ro


# ---------------------------------------------------------------------------------------------- mounts


@needs_bwrap
def test_the_sandbox_binds_nothing_the_lane_already_sees_read_only_and_keeps_what_it_needs(tmp_path):
    """A read-only bind of a path onto itself is left out where the lane already sees it read-only as it is (bwrap
    re-reads its mount table for each; issue 34): a read-only worktree's ``.git``, a file outside every hidden tree.
    It stays where it matters: a writable worktree's ``.git`` is still read-only, a file in a hidden home is still
    shown, and the lane sees the same files either way."""
    from agent.infra import proc
    from agent.lanes.sandbox import lane_plan, with_argv_files, wrap

    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True)
    user = tmp_path / "user"
    (user / "bin").mkdir(parents=True)
    tool = user / "bin" / "tool.sh"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    outside = Path(__file__).resolve()                       # in the checkout: visible through the read-only root

    def argv_for(writable: bool, script: str) -> list[str]:
        plan = lane_plan(cwd=repo, writable=writable, agent_home=home, run_dir=home / "run", spec_paths=[],
                         state_paths=[], extra_writable=[], homes=[user])
        plan = with_argv_files(plan, [str(tool), str(outside)], {"PATH": "/usr/bin:/bin"})
        argv, env = wrap(bwrap_path(), ["/bin/sh", "-c", script], plan, {"PATH": "/usr/bin:/bin"})
        return argv, env

    def binds(argv: list[str]) -> set[str]:
        return {argv[i + 1] for i in range(len(argv) - 2) if argv[i] == "--ro-bind" and argv[i + 1] == argv[i + 2]}

    script = (f"{tool}; head -c 10 {outside}; echo; touch .git/planted 2>/dev/null && echo git-written; "
              "touch new.txt 2>/dev/null && echo worktree-written; true")
    for writable in (False, True):
        argv, env = argv_for(writable, script)
        shown = binds(argv)
        assert str(tool.parent) in shown and str(outside) not in shown
        assert (str(repo / ".git") in shown) is writable        # a read-only worktree shows its .git as it is
        with proc.go_now(argv) as (run_argv, fds, setup):
            import subprocess

            out = subprocess.run(run_argv, cwd=repo, env=env, pass_fds=fds, preexec_fn=setup, capture_output=True,
                                 text=True, timeout=60).stdout
        assert "tool ran" in out and outside.read_text()[:10] in out
        assert "git-written" not in out and not (repo / ".git" / "planted").exists()
        assert ("worktree-written" in out) is writable


def test_a_read_only_state_dir_holds_only_what_the_agent_wrote_and_the_lane_cannot_write_it(tmp_path):
    """A vendor state dir its adapter names in ``read_only_state`` (opencode's config dir: it loads plugins from
    it, and a task's lanes share their private state; issue 34) is bound read-only: the lane reads the agent's files
    there and writes nothing (EROFS), while the vendor's other state dirs stay writable.  What an earlier lane left
    in that private copy (a plugin, a config file the user does not have) is gone before the next lane starts; the
    user's login file is copied as before.  In the writable dirs, what the CLI obeys or runs (``obeyed``) and a login
    file the user does not have are gone too, its session state stays.  Before: every state dir was bound read-write
    and nothing was removed."""
    from agent.infra import proc
    from agent.lanes.files import private_state
    from agent.lanes.sandbox import lane_plan, wrap
    import subprocess

    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "agent-home"
    (home / "run").mkdir(parents=True)
    user = tmp_path / "user"
    config, data = user / ".config" / "opencode", user / ".local" / "share" / "opencode"
    config.mkdir(parents=True)
    data.mkdir(parents=True)
    (config / "opencode.jsonc").write_text('{"provider": {}}')
    root = home / "vendor-state" / "task-1" / "opencode"
    fixed = {config: {".gitignore": b"node_modules"}}
    private_state(root, [data, config], ("opencode.json", "opencode.jsonc"), fixed=fixed)
    priv = root / "1-opencode"
    (priv / "plugin").mkdir()
    (priv / "plugin" / "evil.js").write_text("export const P = async () => ({})")    # an earlier lane's plant
    (priv / "opencode.json").write_text('{"plugin": ["evil"]}')                    # a name the user has no file of
    (priv / "elsewhere").symlink_to(tmp_path)
    (root / "0-opencode" / "bin").mkdir()
    (root / "0-opencode" / "bin" / "rg").write_text("#!/bin/sh\n")       # a tool it would run, left by a lane
    (root / "0-opencode" / "opencode.json").write_text("{}")             # a login name the user has no file of
    (root / "0-opencode" / "opencode.db").write_text("sessions")         # its session state: kept
    pairs = private_state(root, [data, config], ("opencode.json", "opencode.jsonc"), fixed=fixed,
                          obeyed=("bin",))
    assert sorted(p.name for p in priv.iterdir()) == [".gitignore", "opencode.jsonc"]
    assert sorted(p.name for p in (root / "0-opencode").iterdir()) == ["opencode.db"]
    assert tmp_path.is_dir() and (priv / ".gitignore").read_bytes() == b"node_modules"

    plan = lane_plan(cwd=repo, writable=True, agent_home=home, run_dir=home / "run", spec_paths=[],
                     state_paths=[p for p in pairs if p[1] not in fixed], extra_writable=[], homes=[user],
                     read_only_state=[p for p in pairs if p[1] in fixed])
    script = (f"cat {config}/.gitignore; echo; cat {config}/opencode.jsonc; echo; "
              f"mkdir {config}/plugin 2>&1; {{ echo x > {config}/.gitignore; }} 2>&1; "
              f"echo session > {data}/s.json && echo data-written")
    argv, env = wrap(bwrap_path(), ["/bin/sh", "-c", script], plan, {"PATH": "/usr/bin:/bin"})
    with proc.go_now(argv) as (run_argv, fds, setup):
        out = subprocess.run(run_argv, cwd=repo, env=env, pass_fds=fds, preexec_fn=setup, capture_output=True,
                             text=True, timeout=60).stdout
    assert "node_modules" in out and '{"provider": {}}' in out, out
    assert out.lower().count("read-only file system") == 2, out
    assert "data-written" in out and (root / "0-opencode" / "s.json").read_text() == "session\n"
    assert sorted(p.name for p in priv.iterdir()) == [".gitignore", "opencode.jsonc"]
    assert (priv / ".gitignore").read_bytes() == b"node_modules"
