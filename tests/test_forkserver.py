"""The daemon's fork server (agent.cli.forkserver, agent.app.forkclient): `agent lane run` handed to a process that
has already imported what a lane run needs (issue 34).

Everything here is real: the daemon, the server it starts, the console script as a client process, lanes in bwrap.
Whether a run went through the server is read off the client's own imports (``python -X importtime``): a client the
server served never imports click; one it did not serve runs the command itself and does.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agent.app.forkclient import _command_home
from agent.lanes.sandbox import bwrap_path
from conftest import ledger_conn

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed; "
                                "scripts/ci-bwrap installs it")

REPORT = "printf 'done\\n\\nSTATUS: complete\\nSUMMARY: %s\\nFINDINGS: none\\n' \"$1\"\n"


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def lanes(tmp_path):
    """A home with three command vendors (sandboxed like any lane): ``rep`` reports the lane's working directory
    and $MARK, ``slow`` sleeps first, ``bad`` gives no report; and a git repo to run them in."""
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rep = _script(bin_dir / "rep.sh", 'set -- "cwd=$(pwd) mark=$MARK"\n' + REPORT)
    slow = _script(bin_dir / "slow.sh", "sleep 60\n" + REPORT)
    bad = _script(bin_dir / "bad.sh", "echo no report here\n")
    config = {"vendors": {"rep": {"command": [rep], "env": ["MARK"]}, "slow": {"command": [slow]},
                          "bad": {"command": [bad]}},
              "lanes": {"reviewer": {"vendor": "rep", "repair": 0}}, "limits": {"repair": 0}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "app.py").write_text("x = 1\n")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "init"], cwd=repo,
                   check=True)
    spec = tmp_path / "spec.md"
    spec.write_text("# Review app.py\n")
    return home, repo, spec


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_HOME", "PYTHONDONTWRITEBYTECODE")}
    env.update(extra)
    return env


def _wait(cond, timeout: float = 20.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Server:
    def __init__(self, proc: subprocess.Popen, log: Path, sock: Path):
        self.proc, self.log, self.sock = proc, log, sock

    @property
    def text(self) -> str:
        return self.log.read_text()

    def pid(self) -> int:
        """The fork server's pid: the process running `python -P -m agent --forkserver HOME`."""
        want = ["--forkserver", str(self.sock.parent.parent)]
        for d in Path("/proc").iterdir():
            try:
                argv = (d / "cmdline").read_bytes().decode().split("\0")
            except (OSError, ValueError):
                continue
            if argv[-3:-1] == want:
                return int(d.name)
        raise AssertionError("no fork server process")


def _start(argv: list[str], home: Path, log: Path, env: dict[str, str]) -> Server:
    fh = open(log, "wb")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=fh, stderr=fh, env=env)
    fh.close()
    server = Server(proc, log, home / "run" / "forkserver.sock")
    _wait(lambda: server.sock.exists() or proc.poll() is not None, what="the fork server")
    assert server.sock.exists(), server.text
    return server


@pytest.fixture
def daemon(lanes, tmp_path):
    """`agent daemon` for the home, with its fork server up; stopped (and checked to stop it) afterwards."""
    home = lanes[0]
    server = _start([sys.executable, "-m", "agent", "--home", str(home), "daemon", "--interval", "3600"], home,
                    tmp_path / "daemon.log", _env())
    yield server
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    assert "forkserver: stopped after" in server.text
    assert not server.sock.exists()


def _client(home: Path, repo: Path, spec: Path, *extra: str, vendor: str = "rep", cwd: Path | None = None,
            env: dict | None = None, popen: bool = False, pythonpath: Path | None = None):
    """`agent lane run` as a fresh client process (with -X importtime: its imports are on stderr)."""
    argv = [sys.executable, "-X", "importtime", "-m", "agent", "--home", str(home), "lane", "run", "--role",
            "reviewer", "--vendor", vendor, "--spec-file", str(spec), "--cwd", str(repo), *extra]
    e = env or _env()
    if pythonpath is not None:
        e = {**e, "PYTHONPATH": str(pythonpath)}
    if popen:
        return subprocess.Popen(argv, cwd=cwd or repo, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(argv, cwd=cwd or repo, env=e, capture_output=True, text=True, timeout=120)


def _imported(stderr: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", stderr, re.M)}


def _messages(stderr: str) -> str:
    return "\n".join(line for line in stderr.splitlines() if not line.startswith("import time:"))


def _running_lane_pid(home: Path, timeout: float = 30.0) -> int:
    def pid():
        try:
            with ledger_conn(home) as c:
                row = c.execute("SELECT pid FROM lane_runs WHERE status = 'running' AND pid IS NOT NULL").fetchone()
        except Exception:                       # the ledger not made yet
            return None
        return row[0] if row else None

    _wait(lambda: pid() is not None, timeout, "the lane to start")
    return pid()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_lane_run_goes_to_the_daemons_fork_server_with_the_clients_env_cwd_stdio_and_exit_status(lanes, daemon):
    home, repo, spec = lanes
    res = _client(home, Path("."), spec, "--json", cwd=repo, env=_env(MARK="from-the-client"))
    assert res.returncode == 0, res.stderr[-2000:]
    imported = _imported(res.stderr)
    assert "agent.app.forkclient" in imported and "click" not in imported      # the server ran it
    import json

    doc = json.loads(res.stdout)
    assert doc["status"] == "complete"
    # the lane ran in the client's working directory (--cwd .) with the client's $MARK, not the daemon's
    assert doc["summary"] == f"cwd={repo} mark=from-the-client"

    bad = _client(home, repo, spec, vendor="bad")                              # exit 1 and its one line
    assert bad.returncode == 1 and "click" not in _imported(bad.stderr)
    assert _messages(bad.stderr).startswith("agent: lane malformed")
    missing = spec.with_name("missing.md")
    usage = _client(home, repo, missing)                                        # click's usage error, exit 2
    assert usage.returncode == 2 and f"'{missing}' does not exist" in usage.stderr
    assert "click" not in _imported(usage.stderr)

    # without the server the same command runs in the client itself (and the assertions above could fail)
    daemon.proc.send_signal(signal.SIGTERM)
    daemon.proc.wait(30)
    alone = _client(home, repo, spec, "--json", env=_env(MARK="m"))
    assert alone.returncode == 0 and "click" in _imported(alone.stderr)
    assert json.loads(alone.stdout)["summary"] == f"cwd={repo} mark=m"


def test_a_client_killed_mid_lane_takes_its_command_and_lane_with_it(lanes, daemon):
    home, repo, spec = lanes
    client = _client(home, repo, spec, vendor="slow", popen=True)
    lane = _running_lane_pid(home)
    child = int(open(f"/proc/{lane}/stat").read().rsplit(")", 1)[1].split()[1])     # the lane's parent
    assert int(open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[1]) == daemon.pid()
    client.kill()
    client.wait(10)
    _wait(lambda: _gone(lane) and _gone(child), 15, "the served command and its lane to end")


def test_sigint_to_the_client_reaches_the_command_and_ends_its_lane(lanes, daemon):
    home, repo, spec = lanes
    client = _client(home, repo, spec, vendor="slow", popen=True)
    lane = _running_lane_pid(home)
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=30)
    # what the console script does with a Ctrl-C (click's Abort), now in the served command
    assert client.returncode == 1 and _messages(err).strip() == "Aborted.", err[-2000:]
    assert "click" not in _imported(err)
    _wait(lambda: _gone(lane), 15, "the lane to end")


def _children(pid: int) -> list[int]:
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def _ppid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def _rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup's kB figures."""
    out = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            out[name] = int(rest.split()[0])
    return out


def _spare(server: int, timeout: float = 20.0, *, not_one_of: tuple[int, ...] = ()) -> int:
    """The server's one child while it runs none: the next request's, forked before it came (not one of
    ``not_one_of``, the spares that took their request: reaped, or a zombie yet)."""
    def one():
        kids = _children(server)
        return kids[0] if len(kids) == 1 and kids[0] not in not_one_of and not _gone(kids[0]) else None

    _wait(lambda: one() is not None, timeout, "the server's spare child")
    return one()


def _ready_spare(server: int, timeout: float = 30.0) -> int:
    """The server's spare once it waits for its request: its pages copied (``_own_pages``) and asleep (in its
    ``recvmsg``, having said ``r``).  A request before that gets a child forked for it, as it should."""
    spare = _spare(server, timeout)

    def waiting():
        state = open(f"/proc/{spare}/stat").read().rsplit(")", 1)[1].split()[0]
        pages = _rollup(spare)
        return state == "S" and pages["Private_Dirty"] >= 0.8 * pages["Anonymous"]

    _wait(waiting, timeout, "the spare to wait for its request")
    return spare


def test_a_spare_whose_ready_word_is_unread_yet_is_taken_and_one_that_has_not_said_it_is_not():
    """A request and the spare's ``r`` can come in one select, the request first: the spare is still taken (before:
    the request forked a child of its own while the spare waited)."""
    from agent.cli.forkserver import _Spare
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    spare = _Spare(0, ours)
    assert not spare.said_ready()                       # nothing said: not taken, and the server does not block
    theirs.sendall(b"r")
    assert spare.said_ready() and spare.said_ready()    # read once, then remembered
    ours.setblocking(False)
    with pytest.raises(BlockingIOError):                # the word is gone from the socket: the loop must not wait
        ours.recv(1)
    ours.close()
    theirs.close()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.close()
    ended = _Spare(0, ours)
    assert not ended.said_ready() and ours.recv(1) == b""    # an end stays for the loop to see
    ours.close()


def test_the_next_requests_child_is_forked_with_its_own_pages_before_the_request_comes(lanes, daemon):
    """An idle server keeps the next request's child forked and its pages copied (issue 34): a request no longer
    waits for the fork, nor its command for a few thousand copy-on-write faults.  Before: no child until a request
    came."""
    home, repo, spec = lanes
    server = daemon.pid()
    spare = _ready_spare(server)        # its pages are its own before any request: copied, not shared with the server
    client = _client(home, repo, spec, vendor="slow", popen=True)
    lane = _running_lane_pid(home)
    assert _ppid(lane) == spare                 # the command runs in the child that was waiting for it
    assert _children(server) == [spare]         # no other child while it runs: the next spare waits for idle
    client.kill()
    client.wait(10)
    _wait(lambda: _gone(lane) and _gone(spare), 15, "the command and its lane to end")
    again = _spare(server, not_one_of=(spare,))                   # the next one, once this one is reaped
    res = _client(home, repo, spec, "--json")
    assert res.returncode == 0 and "click" not in _imported(res.stderr), res.stderr[-2000:]
    _spare(server, not_one_of=(spare, again))


def test_a_request_while_the_spare_is_taken_gets_a_child_forked_for_it_and_the_spare_ends_with_the_server(
        lanes, daemon):
    home, repo, spec = lanes
    server = daemon.pid()
    spare = _ready_spare(server)
    slow = _client(home, repo, spec, vendor="slow", popen=True)
    lane = _running_lane_pid(home)
    assert _ppid(lane) == spare
    res = _client(home, repo, spec, "--json", env=_env(MARK="second"))         # forked when it came, as before
    assert res.returncode == 0 and "click" not in _imported(res.stderr), res.stderr[-2000:]
    assert '"summary": "cwd=%s mark=second"' % repo in res.stdout
    slow.kill()
    slow.wait(10)
    _wait(lambda: _gone(lane), 15, "the slow lane to end")
    idle = _spare(server, not_one_of=(spare,))
    daemon.proc.send_signal(signal.SIGTERM)
    daemon.proc.wait(30)
    _wait(lambda: _gone(idle) and _gone(server), 15, "the spare to end with its server")


def test_a_spare_that_dies_unused_is_not_forked_again_and_requests_are_still_served(lanes, daemon):
    """A spare ended by someone else (or by a fault of its own) is not replaced: no fork loop; each request's child
    is forked when it comes, as before spares."""
    home, repo, spec = lanes
    server = daemon.pid()
    spare = _spare(server)
    os.kill(spare, signal.SIGKILL)
    _wait(lambda: "ended before its request" in daemon.text, 10, "the server to say so")
    res = _client(home, repo, spec, "--json")
    assert res.returncode == 0 and "click" not in _imported(res.stderr), res.stderr[-2000:]
    _wait(lambda: not _children(server), 10, "the served child to be reaped")
    time.sleep(0.5)
    assert _children(server) == []


def test_a_server_steps_aside_for_another_copy_and_stops_when_its_code_changes(lanes, tmp_path):
    home, repo, spec = lanes
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "agent", copy / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    env = _env(PYTHONPATH=str(copy))
    server = _start([sys.executable, "-P", "-m", "agent", "--forkserver", str(home)], home, tmp_path / "server.log",
                    env)
    try:
        served = _client(home, repo, spec, pythonpath=copy)
        assert served.returncode == 0 and "click" not in _imported(served.stderr), served.stderr[-2000:]
        other = _client(home, repo, spec)                      # this checkout's agent/: not the server's copy
        assert other.returncode == 0 and "click" in _imported(other.stderr)
        assert "a client of another install" in server.text and server.proc.poll() is None
        lane_py = copy / "agent" / "lanes" / "lane.py"
        os.utime(lane_py, ns=(time.time_ns(), lane_py.stat().st_mtime_ns + 10**9))
        changed = _client(home, repo, spec, pythonpath=copy)   # runs itself, right
        assert changed.returncode == 0 and "click" in _imported(changed.stderr)
        assert server.proc.wait(15) == 0
        assert "stale:" in server.text and "lanes/lane.py changed" in server.text
        assert not server.sock.exists()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_a_request_of_the_wrong_shape_is_refused_and_the_server_goes_on(lanes, daemon):
    home, repo, spec = lanes
    where = os.open(home / "run", os.O_PATH)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(f"/proc/self/fd/{where}/forkserver.sock")
        s.sendall(b"\x00\x00\x00\x05hello")                    # no file descriptors, not JSON
        assert s.recv(100) == b""                               # closed, nothing run
        s.close()
    finally:
        os.close(where)
    _wait(lambda: "refused a request" in daemon.text, 10, "the refusal in the log")
    res = _client(home, repo, spec)
    assert res.returncode == 0 and "click" not in _imported(res.stderr)


@pytest.mark.parametrize("argv,home", [
    (["lane", "run", "--role", "reviewer"], None),
    (["--home", "/h", "lane", "run"], "/h"),
    (["--home=/h", "--config", "c.yaml", "lane", "run"], "/h"),
    (["--config=c.yaml", "lane", "run", "--json"], None),
    (["lane", "list"], False),
    (["watch", "all"], False),
    (["--home", "/h", "lane", "run", "--help"], False),
    (["--home"], False),
    (["--version"], False),
])
def test_only_a_lane_run_command_line_goes_to_the_server(argv, home):
    assert _command_home(argv) == home


def test_the_request_round_trips_what_the_os_gave_and_refuses_any_other_shape():
    from agent.app.forkclient import MAGIC, decode_request, encode_request

    env = {b"PATH": b"/bin", b"ODD": b"caf\xe9=x", b"EMPTY": b""}          # not UTF-8, an '=' in a value
    argv = ["lane", "run", "", "--spec-file", os.fsdecode(b"/tmp/\xff.md")]
    req = decode_request(encode_request(argv, env, 0o027, "/usr/bin/python3", "/src/agent"))
    assert req == {"argv": argv, "umask": 0o027, "exe": "/usr/bin/python3", "agent": "/src/agent",
                   "env": {"PATH": "/bin", "ODD": os.fsdecode(b"caf\xe9=x"), "EMPTY": ""}}
    assert os.fsencode(req["env"]["ODD"]) == b"caf\xe9=x"
    good = encode_request(["a"], {b"X": b"1"}, 18, "/py", "/agent")
    assert decode_request(good)["argv"] == ["a"]
    for bad in (b"hello", good.replace(MAGIC, b"agent-fork 9"), good.replace(b"\x0018\x00", b"\x00-1\x00"),
                good.replace(b"\x0018\x00", b"\x00999\x00"), good.replace(b"\x001\x00a", b"\x007\x00a"),
                good + b"\x00NOEQUALS", good + b"\x00=value"):
        with pytest.raises(ValueError):
            decode_request(bad)


def test_the_postgresql_driver_is_preloaded_only_for_a_postgresql_home(tmp_path, monkeypatch):
    """Loaded, psycopg makes every fork of the server slower (~0.5 ms): only a home whose ledger is PostgreSQL
    (``ledger.url``, ``AGENT_LEDGER_URL``) gets it preloaded."""
    from agent.cli.forkserver import _postgres_home

    monkeypatch.delenv("AGENT_LEDGER_URL", raising=False)
    assert not _postgres_home(tmp_path)
    (tmp_path / "config.yaml").write_text("ledger:\n  url: postgresql://agent@127.0.0.1:5/agent\n")
    assert _postgres_home(tmp_path)
    monkeypatch.setenv("AGENT_LEDGER_URL", "postgresql://agent@127.0.0.1:5/other")
    assert _postgres_home(tmp_path / "elsewhere")
