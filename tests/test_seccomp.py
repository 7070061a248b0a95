"""Issue 23: no unix socket in a lane.  A path socket the mounts leave in view (here: one in a dir bound into the
lane read-write) was connectable from a lane; now ``socket(AF_UNIX)`` fails with EPERM inside the sandbox
(agent.lanes.seccomp), while ``socketpair()``, child processes with pipes and the egress proxy (on the lane's
loopback, its listening socket made before bwrap starts and served by the agent) still work.  ``sandbox:
{unix_sockets: allow}`` is the control: the same lane connects.  Real bubblewrap, a real listening socket and the
real lane runner."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from agent.config import ConfigError
from agent.infra.proc import go_arg, go_now
from agent.lanes import egress, seccomp
from agent.lanes.lane import LaneRequest, run_lane
from agent.lanes.sandbox import bwrap_path, check_argv
from lane_helpers import make_config, make_repo

needs_sandbox = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed; scripts/ci-bwrap "
                                   "installs it (apt-get install bubblewrap as root)")

PROBE = r'''
import json, os, socket, subprocess, sys
sock, out = sys.argv[1], sys.argv[2]
res = {}
try:
    s = socket.socket(socket.AF_UNIX)
except OSError as exc:
    res["socket"] = exc.errno
else:
    s.settimeout(5)
    s.connect(sock)
    res["socket"] = "connected: " + s.recv(16).decode()
a, b = socket.socketpair()
a.sendall(b"pair")
res["socketpair"] = b.recv(4).decode()
child = subprocess.run([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"],
                       input="piped", capture_output=True, text=True)
res["python_child"] = child.stdout
import shutil
if shutil.which("node"):
    node = subprocess.run(["node", "-e", "const c = require('child_process').spawnSync('node', ['-e', "
                           "'process.stdin.pipe(process.stdout)'], {input: 'nodepipe'}); "
                           "process.stdout.write(c.stdout.toString())"], capture_output=True, text=True)
    res["node_child"] = node.stdout or node.stderr[-300:]
proxy = os.environ.get("HTTP_PROXY")
if proxy:   # the proxy's port on the lane's loopback (egress.lane_setup's listening socket, served by the agent)
    c = socket.create_connection(("127.0.0.1", int(proxy.rsplit(":", 1)[1])), timeout=10)
    c.sendall(b"CONNECT 127.0.0.2:9 HTTP/1.1\r\nHost: 127.0.0.2:9\r\n\r\n")
    res["proxy"] = c.recv(200).decode(errors="replace").split("\r\n")[0]
json.dump(res, open(out, "w"))
print("Done.\n\nSTATUS: complete\nSUMMARY: probed\nLESSON: none\n")
'''


class Listener:
    """A real unix socket server in a short dir (a socket path has at most 107 bytes): says hello to each client."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="us-", dir="/tmp"))
        self.path = self.dir / "l.sock"
        self.srv = socket.socket(socket.AF_UNIX)
        self.srv.bind(str(self.path))
        self.srv.listen(4)
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.accepted += 1
            c.sendall(b"hello")
            c.close()

    def close(self):
        self.srv.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


def _lane(tmp_path, ledger, listener, sandbox: dict) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = tmp_path / "repo" / "probe.json"
    cmd = [sys.executable, str(script), str(listener.path), str(out)]
    config = make_config({"p": {"command": cmd, "writable": [str(listener.dir)]}},
                         {"implementer": {"vendor": "p", "repair": 0}}, sandbox=sandbox)
    repo = make_repo(tmp_path / "repo")
    spec = tmp_path / "spec.md"
    spec.write_text("probe\n")
    res = run_lane(LaneRequest(config=config, home=tmp_path / "home", role="implementer", spec_path=spec, cwd=repo,
                               ledger=ledger))
    assert res.status == "complete", (res.status, res.reason)
    return json.loads(out.read_text())


@needs_sandbox
def test_a_lane_cannot_create_a_unix_socket_but_pipes_socketpair_and_the_proxy_work(tmp_path, ledger, listener):
    res = _lane(tmp_path, ledger, listener, {"mode": "bwrap"})
    assert res["socket"] == 1, res                              # EPERM at socket(), before any connect
    assert listener.accepted == 0
    assert res["socketpair"] == "pair"
    assert res["python_child"] == "PIPED"
    if shutil.which("node"):
        assert res["node_child"] == "nodepipe", res
    # the egress proxy still answers (it refuses this host: an answer from the proxy itself)
    assert res["proxy"].startswith("HTTP/1.1 403"), res


@needs_sandbox
def test_unix_sockets_allow_is_the_control(tmp_path, ledger, listener):
    res = _lane(tmp_path, ledger, listener, {"mode": "bwrap", "unix_sockets": "allow"})
    assert res["socket"] == "connected: hello", res
    assert listener.accepted == 1
    assert res["socketpair"] == "pair" and res["python_child"] == "PIPED"


@needs_sandbox
@pytest.mark.parametrize("unix_sockets", ["deny", "allow"])
def test_a_repository_check_is_filtered_too(tmp_path, listener, unix_sockets):
    config = make_config({}, sandbox={"mode": "bwrap", "unix_sockets": unix_sockets})
    repo = make_repo(tmp_path / "repo")
    code = ("import socket,sys\ntry:\n s=socket.socket(socket.AF_UNIX)\nexcept OSError as e:\n print(e.errno)\n"
            " sys.exit()\ns.connect(sys.argv[1]); print(s.recv(5).decode())")
    cmd = f"{sys.executable} -c '{code}' {listener.path}"
    argv, env = check_argv(config, tmp_path / "home", repo, cmd, tmp_path / "scratch")
    # the check's worktree is bound; the socket's dir is not: bind it as a lane's writable dir would be
    i = argv.index("--chdir")
    argv[i:i] = ["--bind", str(listener.dir), str(listener.dir)]
    with go_now(argv) as (argv, fds, setup):
        out = subprocess.run(argv, env=env, cwd=repo, pass_fds=fds, preexec_fn=setup,
                             capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == ("1" if unix_sockets == "deny" else "hello"), (out.stdout, out.stderr)


def _bwrap(argv: list[str], cwd: Path, payload: bytes | None = None) -> list[str]:
    """``argv`` in a minimal bwrap whose go carries ``payload`` (default: the filter), as ``sandbox.wrap`` gives it."""
    payload = seccomp.sandbox_filter() if payload is None else payload
    return [bwrap_path(), "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc",
            "/proc", "--seccomp", go_arg(payload), "--chdir", str(cwd), "--", *argv]


def _under_filter(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` run by this interpreter under the filter, which bwrap applies right before the command."""
    with go_now(_bwrap([sys.executable, "-c", code], cwd)) as (argv, fds, setup):
        return subprocess.run(argv, cwd=cwd, pass_fds=fds, preexec_fn=setup,
                              capture_output=True, text=True, timeout=60)


@needs_sandbox
def test_the_filter_itself_on_this_kernel(tmp_path):
    code = r'''
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": 41, "aarch64": 198}[__import__("platform").machine()]
def raw(domain):
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_ulong(domain), ctypes.c_ulong(1), ctypes.c_ulong(0))
    return fd if fd >= 0 else -ctypes.get_errno()
print(raw(1), raw(1 | 1 << 32), raw(1 | 0xffffffff << 32) , raw(2) >= 0, raw(10) >= 0)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
print(a.family == socket.AF_UNIX)
'''
    out = _under_filter(code, tmp_path)
    # the kernel reads domain as an int: the high half of the register never hides AF_UNIX
    assert out.stdout.split() == ["-1", "-1", "-1", "True", "True", "True"], out


IO_URING_PROBE = r'''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    return r if r < 0 else (os.close(r) if nr == 425 else None) or "ok"
params = ctypes.create_string_buffer(120)                 # struct io_uring_params, zeroed
def setup():
    r = libc.syscall(ctypes.c_long(425), ctypes.c_ulong(4), params)
    if r >= 0:
        os.close(r)
        return "ring"
    return errno.errorcode[ctypes.get_errno()]
def other(nr):
    libc.syscall(ctypes.c_long(nr), ctypes.c_ulong(2 ** 31), ctypes.c_ulong(0), ctypes.c_ulong(0),
                 ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    return errno.errorcode[ctypes.get_errno()]
print(setup(), other(426), other(427), other(424), other(428))
'''


@needs_sandbox
def test_io_uring_is_refused_under_the_filter(tmp_path):
    """A ring's operations never pass the system-call entry the filter sees: IORING_OP_SOCKET would make the
    AF_UNIX socket socket() may not, so no ring can be set up or used.  The control: outside the filter this kernel
    sets a ring up (where it does not, io_uring_disabled or an old kernel, the control says so and the refusal under
    the filter is then the kernel's as much as ours)."""
    outside = subprocess.run([sys.executable, "-c", IO_URING_PROBE], capture_output=True, text=True, timeout=60)
    under = _under_filter(IO_URING_PROBE, tmp_path)
    assert under.returncode == 0, under
    # 426/427 on a bad fd: EBADF without the filter; 424 (pidfd_send_signal) and 428 (open_tree) are not io_uring:
    # the filter leaves them to the kernel, which answers as it does outside (EBADF, EFAULT: never EPERM)
    assert under.stdout.split()[:3] == ["EPERM", "EPERM", "EPERM"], under
    assert under.stdout.split()[3:] == outside.stdout.split()[3:] and "EPERM" not in under.stdout.split()[3:], \
        (under, outside)
    if Path("/proc/sys/kernel/io_uring_disabled").is_file() and \
            Path("/proc/sys/kernel/io_uring_disabled").read_text().strip() == "0":
        assert outside.stdout.split()[:3] == ["ring", "EBADF", "EBADF"], outside


@needs_sandbox
@pytest.mark.skipif(seccomp.platform.machine() != "x86_64", reason="the x32 ABI exists on x86_64 only")
def test_x32_system_calls_are_killed(tmp_path):
    # socket() through the x32 ABI (number | 0x40000000) would carry another number than the one checked
    out = _under_filter("import ctypes; ctypes.CDLL(None).syscall(ctypes.c_long(0x40000000 | 41), 1, 1, 0); "
                        "print('survived')", tmp_path)
    assert out.returncode == 128 + signal.SIGSYS and "survived" not in out.stdout, out   # bwrap: 128 + signal


def test_the_program_per_architecture_and_a_refusal_elsewhere(caplog):
    x86, arm = seccomp.program("x86_64"), seccomp.program("aarch64")
    assert len(x86) == 12 * 8 and len(arm) == 11 * 8
    assert (0xC000003E).to_bytes(4, "little") in x86 and (0xC00000B7).to_bytes(4, "little") in arm
    with pytest.raises(seccomp.Unsupported, match="riscv64"):
        seccomp.program("riscv64")
    seccomp.platform.machine, real = (lambda: "riscv64"), seccomp.platform.machine
    try:
        with caplog.at_level(logging.WARNING):
            assert seccomp.sandbox_filter() == seccomp.ALLOW_ALL      # still a go for bwrap: without the filter
    finally:
        seccomp.platform.machine = real
    assert "lanes run without it" in caplog.text
    assert seccomp.sandbox_filter() == seccomp.program()
    assert seccomp.sandbox_filter(filtered=False) == seccomp.ALLOW_ALL and len(seccomp.ALLOW_ALL) == 8


def test_config_key():
    assert make_config({}).sandbox_unix_sockets == "deny"
    assert make_config({}, sandbox={"unix_sockets": "allow"}).sandbox_unix_sockets == "allow"
    with pytest.raises(ConfigError, match="sandbox.unix_sockets"):
        make_config({}, sandbox={"unix_sockets": "no"})


@needs_sandbox
def test_a_filter_the_kernel_refuses_runs_nothing(tmp_path):
    """Fail closed: when the filter cannot be set (here: an empty program, which the kernel refuses), the command
    never runs, and the line says what to do (the lane is `unavailable` with it)."""
    from agent.lanes.sandbox import sandbox_exec_failure

    marker = tmp_path / "ran"
    with go_now(_bwrap(["touch", str(marker)], tmp_path, payload=b"")) as (argv, fds, setup):
        out = subprocess.run(argv, pass_fds=fds, preexec_fn=setup,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and not marker.exists(), out
    assert "system call filtering" in out.stderr and sandbox_exec_failure(out.stderr), out


@needs_sandbox
@pytest.mark.parametrize("network", ["proxy", "none"])
def test_a_sandbox_whose_agent_is_already_gone_ends_before_the_lane_starts(tmp_path, network):
    """A runner SIGKILLed in the first moments of a lane's start dies before bwrap arms its parent-death signal,
    and the sandbox would run on unsupervised.  bwrap reads the lane's filter from the go pipe to its end right
    before the command (agent.infra.proc.go_arg): with the agent gone (the pipe's only write end closed, nothing
    written) the program is empty, bwrap refuses it and the lane never starts; with the agent there, the sandbox
    waits for the go, then the same argv runs it. Real bwrap and the egress proxy."""
    from agent.config import parse_config
    from agent.infra.env import lane_env
    from agent.infra.proc import GO_PREFIX, take_setup
    from agent.lanes.sandbox import lane_plan, wrap

    repo = make_repo(tmp_path / "repo")
    home, scratch = tmp_path / "home", tmp_path / "scratch"
    home.mkdir()
    scratch.mkdir()
    config = parse_config({"sandbox": {"network": network}})
    plan = lane_plan(cwd=repo, writable=True, agent_home=home, run_dir=scratch, spec_paths=[], state_paths=[],
                     extra_writable=[])
    mark = repo / "lane-started"
    with egress.lane_network(config, None) as net:
        argv, env = wrap(bwrap_path(), ["sh", "-c", f"touch {mark}; echo started"], plan, lane_env(()),
                         net if network == "proxy" else None)
        argv, setup, _ = take_setup(argv)          # the proxy's: the lane's network namespace and its listener
        assert (setup is None) is (network == "none")
        at = next(i for i, a in enumerate(argv) if a.startswith(GO_PREFIX))
        assert argv[at - 1] == "--seccomp"
        for agent_alive in (False, True):
            r, w = os.pipe()
            if not agent_alive:
                os.close(w)                          # what the kernel does when the agent is SIGKILLed
            p = subprocess.Popen([*argv[:at], str(r), *argv[at + 1:]], env=env, pass_fds=(r,), preexec_fn=setup,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
            os.close(r)
            try:
                if agent_alive:
                    # the sandbox waits for the agent's go (proc.run writes it after its gate): not started yet
                    with pytest.raises(subprocess.TimeoutExpired):
                        p.communicate(timeout=1.5)
                    assert not mark.exists()
                    os.write(w, seccomp.sandbox_filter())
                    os.close(w)
                    w = None
                out, err = p.communicate(timeout=30)  # returns only once bwrap's init ended
            finally:
                if agent_alive and w is not None:
                    os.close(w)
            if agent_alive:
                assert p.returncode == 0 and "started" in out and mark.exists(), (p.returncode, err)
            else:
                assert p.returncode != 0 and not mark.exists(), (p.returncode, out, err)
                assert "system call filtering" in err, err
