"""agent.infra.proc.run and agent.infra.env: real subprocesses, no mocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agent.infra import proc
from agent.infra.env import lane_env, secret_env_names


def _run(tmp_path, argv, **kw):
    kw.setdefault("timeout", 30)
    kw.setdefault("env", None)
    return proc.run(argv, cwd=tmp_path, stdout_path=tmp_path / "out.txt", stderr_path=tmp_path / "err.txt", **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); treat it as dead
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_success_captures_stdout_stderr_and_exit_code(tmp_path):
    res = _run(tmp_path, [sys.executable, "-c",
                          "import sys; print('hello'); print('oops', file=sys.stderr); sys.exit(3)"])
    assert res.exit_code == 3 and not res.timed_out and not res.missing
    assert res.status == "failed"
    assert res.stdout_text() == "hello\n"
    assert res.stderr_text() == "oops\n"
    assert res.pid and res.duration_s > 0


def test_timeout_kills_grandchildren(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    # child spawns a sleeping grandchild (not waited for), records its pid, then sleeps itself
    script = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(120)\n"
    )
    t0 = time.monotonic()
    res = _run(tmp_path, [sys.executable, "-c", script], timeout=1.5, grace=1.0)
    assert res.timed_out and res.status == "timeout"
    assert time.monotonic() - t0 < 15
    gpid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(gpid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(gpid), "grandchild survived the timeout"
    assert "started" in res.stdout_text()


def test_sigterm_ignoring_child_is_killed_after_grace(tmp_path):
    script = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "print('ready', flush=True)\ntime.sleep(60)\n")
    t0 = time.monotonic()
    res = _run(tmp_path, [sys.executable, "-c", script], timeout=1.0, grace=0.5)
    assert res.timed_out
    assert time.monotonic() - t0 < 10


def test_leftover_background_process_is_killed_when_child_exits(tmp_path):
    pidfile = tmp_path / "bg.pid"
    script = (
        "import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
    )
    res = _run(tmp_path, [sys.executable, "-c", script], timeout=20, grace=1.0)
    assert res.exit_code == 0 and not res.timed_out
    gpid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(gpid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(gpid)


def test_missing_binary_is_unavailable_not_an_exception(tmp_path):
    res = _run(tmp_path, ["definitely-not-a-binary-xyz", "--help"])
    assert res.missing and res.exit_code == 127 and res.status == "unavailable"
    assert "not found" in res.error
    assert res.stdout_text() == ""


def test_not_executable_is_unavailable(tmp_path):
    f = tmp_path / "script.sh"
    f.write_text("#!/bin/sh\necho hi\n")
    f.chmod(0o644)
    res = _run(tmp_path, [str(f)])
    assert res.missing and res.status == "unavailable"


def test_output_cap_keeps_head_and_tail(tmp_path):
    # 2 MB of output with a cap of 64 KB: the head and the final line survive, the middle is dropped
    script = ("import sys\nsys.stdout.write('HEAD\\n')\nsys.stdout.write('x' * 2_000_000 + '\\n')\n"
              "sys.stdout.write('FINAL LINE\\n')\n")
    res = _run(tmp_path, [sys.executable, "-c", script], max_bytes=64 * 1024, tail_bytes=1024)
    assert res.truncated
    size = res.stdout_path.stat().st_size
    assert size < 64 * 1024 + 1024 + 200
    text = res.stdout_text()
    assert text.startswith("HEAD\n")
    assert text.rstrip().endswith("FINAL LINE")
    assert "output truncated" in text


def test_no_truncation_under_cap(tmp_path):
    res = _run(tmp_path, [sys.executable, "-c", "print('a' * 1000)"], max_bytes=4096)
    assert not res.truncated and res.stdout_text() == "a" * 1000 + "\n"


def test_stdin_from_file_and_on_line_and_on_start(tmp_path):
    spec = tmp_path / "spec.md"
    spec.write_text("line one\nline two\n")
    lines, pids = [], []
    res = _run(tmp_path, [sys.executable, "-c", "import sys\nfor l in sys.stdin: print('got', l.strip(), flush=True)"],
               stdin_path=spec, on_line=lines.append, on_start=pids.append)
    assert res.stdout_text() == "got line one\ngot line two\n"
    assert pids == [res.pid]
    assert lines and lines[-1] == "got line two"


def test_a_child_filling_either_output_file_is_killed_at_the_hard_cap(tmp_path):
    """One follower thread watches both files: a child writing without end to stderr (stdout stays quiet) is
    killed once that file passes the cap, long before its timeout; its progress lines from both files arrive."""
    lines = []
    flood = ("import sys\nprint('from stdout', flush=True)\nsys.stderr.write('from stderr\\n'); sys.stderr.flush()\n"
             "import time; time.sleep(1.0)\nwhile True: sys.stderr.write('x' * 65536)")
    t = time.monotonic()
    res = _run(tmp_path, [sys.executable, "-c", flood], hard_cap=1 << 20, max_bytes=4096, on_line=lines.append,
               timeout=60)
    assert time.monotonic() - t < 30 and not res.timed_out
    assert res.exit_code == -signal.SIGKILL and res.truncated
    assert "from stdout" in lines and "from stderr" in lines


def test_env_is_exactly_what_was_given(tmp_path):
    res = _run(tmp_path, [sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
               env={"PATH": os.environ["PATH"], "ONLY_ME": "1"})
    env = json.loads(res.stdout_text())
    env.pop("LC_CTYPE", None)  # Python may set this itself for UTF-8 mode
    assert set(env) == {"PATH", "ONLY_ME"}


def test_lane_env_allowlist_drops_canary_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "canary-gh-1234567890")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-aws-abcdef")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "vendor-key-ok")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = lane_env(("ANTHROPIC_API_KEY", "NOT_SET_ANYWHERE"), {"CODEX_HOME": "/tmp/x"})
    assert "GITHUB_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["ANTHROPIC_API_KEY"] == "vendor-key-ok"
    assert env["CODEX_HOME"] == "/tmp/x" and env["LC_ALL"] == "C.UTF-8"
    assert "NOT_SET_ANYWHERE" not in env
    assert set(env) <= {"PATH", "HOME", "USER", "LANG", "TERM", "TMPDIR", "TZ", "ANTHROPIC_API_KEY", "CODEX_HOME"} | {
        k for k in env if k.startswith("LC_")}
    # a forge token named by the user under vendors.X.env is still refused
    env = lane_env(("GITHUB_TOKEN",), deny=("GITHUB_TOKEN",))
    assert "GITHUB_TOKEN" not in env
    # and the child really does not see it
    res = _run(tmp_path, [sys.executable, "-c", "import os; print(os.environ.get('GITHUB_TOKEN', 'absent'))"],
               env=env)
    assert res.stdout_text().strip() == "absent"


def test_secret_env_names_name_forge_and_source_tokens():
    from agent.config import parse_config

    cfg = parse_config({"github": {"token_env": "MY_GH"}, "gitlab": {"token_env": "MY_GL"},
                        "gitea": {"token_env": "MY_GT"},
                        "sources": [{"kind": "loki", "url": "http://127.0.0.1:1", "query": "{a=\"b\"}",
                                     "auth_env": "LOKI_TOKEN"}]})
    # every forge's token variable (and GitHub's fallbacks, which the forge reads too) plus source tokens
    names = set(secret_env_names(cfg))
    assert {"MY_GH", "GITHUB_TOKEN", "GH_TOKEN", "MY_GL", "MY_GT", "LOKI_TOKEN"} <= names
    assert "ANTHROPIC_API_KEY" not in names
    assert {"GITLAB_TOKEN", "GITEA_TOKEN"} <= set(secret_env_names(parse_config({})))


def test_missing_cwd_is_reported(tmp_path):
    res = proc.run(["true"], cwd=tmp_path / "nope", env=None, timeout=5,
                   stdout_path=tmp_path / "o", stderr_path=tmp_path / "e")
    assert res.missing and "does not exist" in res.error


def test_kill_all_ends_running_groups_from_another_thread(tmp_path):
    import threading

    box = {}
    t = threading.Thread(target=lambda: box.setdefault("res", _run(
        tmp_path, [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], timeout=60)))
    t0 = time.monotonic()
    t.start()
    deadline = time.monotonic() + 10
    while not proc.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(proc.running()) == 1
    assert proc.kill_all(grace=1.0) == 1
    t.join(15)
    res = box["res"]
    assert res.exit_code is not None and res.exit_code < 0 and not res.timed_out
    assert time.monotonic() - t0 < 15
    assert proc.running() == {}


# A child that waits for its go as bwrap does (``--seccomp FD``: the pipe read to its end right before the command),
# then runs the command only when the payload came whole
WAITER = ("import os, sys\nfd, data = int(sys.argv[1]), b''\nwhile True:\n    chunk = os.read(fd, 64)\n"
          "    if not chunk:\n        break\n    data += chunk\n"
          "if data != b'payload':\n    sys.exit('no go: %r' % data)\nos.execvp(sys.argv[2], sys.argv[2:])")


def _launched(cmd: str) -> tuple[list[str], dict[str, str]]:
    """``cmd`` behind a go (``proc.go_arg``): the child waits for run()'s payload before the command."""
    return [sys.executable, "-c", WAITER, proc.go_arg(b"payload"), "sh", "-c", cmd], lane_env(())


def test_the_go_pipe_carries_its_payload_and_ends_with_the_agent(tmp_path):
    """The go element is the read end of a pipe (its number in argv, passed to the child): run() writes the payload
    and closes it; a caller that starts the child itself (``go_now``) gets the payload written already.  An agent
    gone before the go (the write end closed with nothing written) gives the child an empty payload."""
    mark = tmp_path / "ran"
    argv, env = _launched(f"touch {mark}")
    assert "\0" in argv[3]
    with pytest.raises(ValueError):          # the element cannot reach a program by mistake
        subprocess.run(argv, env=env)
    with proc.go_now(argv) as (now, fds, _):
        assert now[3] == str(fds[0]) and now[:3] == argv[:3]
        out = subprocess.run(now, env=env, pass_fds=fds, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and mark.exists(), out
    mark.unlink()
    r, w = os.pipe()
    os.close(w)                              # what the kernel does when the agent is SIGKILLed before its go
    try:
        out = subprocess.run([*argv[:3], str(r), *argv[4:]], env=env, pass_fds=(r,), capture_output=True,
                             text=True, timeout=30)
    finally:
        os.close(r)
    assert out.returncode == 1 and "no go: b''" in out.stderr and not mark.exists(), out


def test_gate_overlaps_the_start_and_the_command_waits_for_it(tmp_path):
    """The gate (a lane's worktree picture and git guard) runs while the sandbox comes up; the command starts
    only after it, on the go."""
    mark = tmp_path / "ran"
    argv, env = _launched(f"touch {mark}")
    seen = []

    def gate():
        time.sleep(0.5)                  # the child is up by now, and waiting
        seen.append(mark.exists())

    res = proc.run(argv, cwd=tmp_path, env=env, timeout=30, stdout_path=tmp_path / "o", stderr_path=tmp_path / "e",
                   gate=gate)
    assert res.exit_code == 0, res.stderr_text()
    assert seen == [False] and mark.exists()


def test_a_gate_that_raises_starts_no_command(tmp_path):
    mark = tmp_path / "ran"
    for with_go in (True, False):
        argv, env = _launched(f"touch {mark}") if with_go else (["sh", "-c", f"touch {mark}"], lane_env(()))
        pids = []

        def gate():
            raise RuntimeError("the worktree could not be read")

        try:
            proc.run(argv, cwd=tmp_path, env=env, timeout=30, stdout_path=tmp_path / "o", stderr_path=tmp_path / "e",
                     gate=gate, on_start=pids.append)
        except RuntimeError as exc:
            assert "could not be read" in str(exc)
        else:
            raise AssertionError("the gate's error was swallowed")
        time.sleep(0.3)
        assert not mark.exists(), with_go
        assert proc.running() == {}
        if with_go:                # started, held at its go, then its group killed
            assert len(pids) == 1 and not proc._group_alive(pids[0])
        else:                            # no go to hold it back: the gate ran before any start
            assert pids == []
