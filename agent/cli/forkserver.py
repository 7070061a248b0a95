"""The fork server: `agent lane run` without paying Python's start and the agent's imports (issue 34).

``agent daemon`` starts one per home (``python -m agent --forkserver HOME``: agent.__main__ hands ``serve`` the
command line's entry point and what a lane run imports): a process that has imported what a lane run uses, then
waits on ``HOME/run/forkserver.sock``.  The console script's client (agent.app.forkclient)
hands it a ``lane run`` command line with the client's environment, umask, stdio and working directory, and the
server forks a child that takes them over and runs the command exactly as the console script would
(``agent.cli.main``).  The child's output goes straight to the client's own stdout and
stderr; the client forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to it and exits with its exit status (or is killed
by the same signal).  Anything else (another command, no server, a server of another interpreter or another copy of
``agent/``, a server whose loaded modules changed on disk since it started) runs in the client's own process as
before, so the server is only ever a shortcut.

Trust: the socket is a file in ``HOME/run`` (mode 0700, the socket 0600) and the server serves only its own user
(``SO_PEERCRED``).  A lane never reaches it: the home is hidden in the sandbox and a lane cannot create a unix
socket (agent.lanes.seccomp); with ``sandbox: none`` a lane already runs as the user.  The child dies with its client:
it watches the connection, and a client that is gone (SIGKILLed too) makes the child SIGKILL itself, which ends its
lanes (bwrap's ``--die-with-parent``) as it would end the console script's.  The server starts no thread and opens no
ledger or network connection before it forks, so each child starts as a clean process would (only imported).
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from agent.app.forkclient import N_FDS, SOCKET_NAME, _exe, _package_dir, decode_request

MAX_REQUEST = 4 << 20               # argv + environment


# ----------------------------------------------------------------------------------------------------------- server


def _fingerprint() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every loaded agent module's file: a change on disk means the loaded code is stale."""
    out = {}
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if (name == "agent" or name.startswith("agent.")) and path:
            try:
                st = os.stat(path)
            except OSError:
                st = None
            out[path] = (st.st_mtime_ns, st.st_size) if st else (0, -1)
    return out


def _stale(before: dict[str, tuple[int, int]]) -> str | None:
    for path, seen in before.items():
        try:
            st = os.stat(path)
            now = (st.st_mtime_ns, st.st_size)
        except OSError:
            now = (0, -1)
        if now != seen:
            return f"{path} changed since the server started"
    return None


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    fds: list[int] = []
    data, anc, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(N_FDS * 4))
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += list(struct.unpack(f"{len(raw) // 4}i", raw[:len(raw) - len(raw) % 4]))
    try:
        if len(fds) != N_FDS or len(data) < 4:
            raise ValueError("expected a length and 4 file descriptors")
        (n,) = struct.unpack("!I", data[:4])
        if n > MAX_REQUEST:
            raise ValueError("request too large")
        body = data[4:]
        while len(body) < n:
            chunk = conn.recv(min(65536, n - len(body)))
            if not chunk:
                raise ValueError("request cut short")
            body += chunk
        return decode_request(body[:n]), fds
    except (ValueError, UnicodeError):
        for fd in fds:
            os.close(fd)
        raise


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", raw)[1]


def _child(conn: socket.socket, fds: list[int], req: dict, closing: list[int], run) -> None:
    """In the forked child: become the client's command, run it, report its exit status, exit."""
    import signal
    import threading

    signal.set_wakeup_fd(-1)
    for name in ("SIGTERM", "SIGCHLD", "SIGHUP", "SIGQUIT"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in closing:
        os.close(fd)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target, inheritable=True)
    os.fchdir(fds[3])
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.umask(req["umask"])
    os.environ.clear()
    os.environ.update(req["env"])
    import time

    time.tzset()                    # TZ is the client's
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None       # TMPDIR too
    enc, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = open(0, "r", encoding=enc, errors=errors, closefd=False)
    sys.stdout = open(1, "w", encoding=enc, errors=errors, closefd=False, buffering=-1 if not os.isatty(1) else 1)
    sys.stderr = open(2, "w", encoding=enc, errors="backslashreplace", closefd=False, buffering=1)
    sys.argv = ["agent", *req["argv"]]

    def watch() -> None:            # the client is gone (killed, too): so is this command, as if it were the client
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    conn.sendall(f"pid {os.getpid()}\n".encode())
    threading.Thread(target=watch, name="forkserver-client", daemon=True).start()
    code = 1
    try:
        run(req["argv"])
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            sys.stderr.write(f"{exc.code}\n")
    except BaseException:
        import traceback

        traceback.print_exc()
    try:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    for fd in (0, 1, 2):            # the client's stdio ends with the client, not after this process's teardown
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        conn.sendall(f"exit {code}\n".encode())
    except OSError:
        pass
    os._exit(code & 0xFF)


def serve(home: Path, run: Callable[[list[str]], None], preload: Iterable[str] = (), log=None) -> int:
    """Import ``preload``, listen on ``HOME/run/forkserver.sock`` and fork a child per request that runs
    ``run(argv)`` (the console script's entry point), until SIGTERM/SIGINT, until stdin closes (the daemon that
    started it is gone) or until a loaded module changes on disk."""
    import importlib
    import selectors
    import signal

    log = log or (lambda line: print(f"forkserver: {line}", file=sys.stderr, flush=True))
    for name in preload:
        importlib.import_module(name)
    from agent.infra.redact import redact

    redact("warm the rules: password=x")              # its patterns compile once, here
    if _postgres_home(home):
        try:
            import psycopg  # noqa: F401  (a PostgreSQL ledger's driver: ~120 ms of import a child would pay)
        except ImportError:
            pass
    import gc

    gc.freeze()         # what is loaded stays out of every child's collections: no copy-on-write of it in each child
    loaded = _fingerprint()
    rundir = Path(home) / "run"
    try:
        rundir.mkdir(mode=0o700, exist_ok=True)
    except FileExistsError:
        pass
    where = os.open(rundir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(where)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        os.close(where)
        raise SystemExit(f"forkserver: {rundir} must be a directory of this user with mode 0700; fix or remove it")
    path = f"/proc/self/fd/{where}/{SOCKET_NAME}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(SOCKET_NAME, dir_fd=where)              # a dead server's socket
    except FileNotFoundError:
        pass
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    stop: list[int] = []
    signal.signal(signal.SIGCHLD, lambda s, f: None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stop.append(s))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    import stat

    if stat.S_ISFIFO(os.fstat(0).st_mode):
        sel.register(0, selectors.EVENT_READ, "parent")      # stdin: a pipe from the daemon; EOF = it is gone
    children: dict[int, socket.socket] = {}
    served = 0
    try:
        while not stop:
            for key, _ in sel.select(timeout=5.0):
                if key.data == "wake":
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                elif key.data == "parent":
                    if not os.read(0, 512):
                        stop.append(0)
                elif key.data == "accept":
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        continue
                    mine = [listener.fileno(), wake_r, wake_w, where, *(c.fileno() for c in children.values())]
                    why = _take(conn, loaded, children, mine, run)
                    if why is not None:
                        log(why)
                        if why.startswith("stale"):
                            stop.append(0)
                    else:
                        served += 1
            _reap(children)
    finally:
        sel.close()
        try:
            os.unlink(SOCKET_NAME, dir_fd=where)
        except OSError:
            pass
        listener.close()
        os.close(where)
        signal.set_wakeup_fd(-1)
        for conn in children.values():
            conn.close()
    if served:                        # quiet otherwise: a daemon that refuses its own start says only why
        log(f"stopped after {served} command(s)")
    return 0


def _postgres_home(home: Path) -> bool:
    """Whether the home's ledger is PostgreSQL, as the daemon sees it: only then is its driver preloaded (loaded, it
    makes each fork ~0.5 ms slower; a child that needs it anyway imports it itself)."""
    from agent.ledger import ledger_path
    from agent.ledger.backend import is_url

    try:
        return is_url(ledger_path(home))
    except Exception:               # a bad URL: the child's own open says so
        return False


def _take(conn: socket.socket, loaded, children: dict[int, socket.socket], closing: list[int], run) -> str | None:
    """One request: fork its child, or say why not (None when a child runs it)."""
    if _peer_uid(conn) != os.getuid():
        conn.close()
        return "refused a client of another user"
    conn.settimeout(5.0)
    try:
        req, fds = _recv_request(conn)
    except (OSError, ValueError) as exc:
        conn.close()
        return f"refused a request: {exc}"
    why = None
    if req["exe"] != _exe() or req["agent"] != _package_dir():
        why = f"a client of another install ({req['exe']}, {req['agent']})"
    else:
        changed = _stale(loaded)
        if changed:
            why = f"stale: {changed}; stopping (lane runs start on their own until the daemon restarts)"
    if why is not None:
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(f"fallback {why}\n".encode())
        except OSError:
            pass
        conn.close()
        return why
    conn.settimeout(None)
    pid = os.fork()
    if pid == 0:
        try:
            _child(conn, fds, req, closing, run)
        finally:
            os._exit(1)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    return None


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        if os.WIFSIGNALED(status):                       # an exit the child reported itself
            try:
                conn.sendall(f"signal {os.WTERMSIG(status)}\n".encode())
            except OSError:
                pass
        conn.close()


@contextmanager
def running(home: Path, echo, enabled: bool = True) -> Iterator[None]:
    """The home's fork server, for as long as the body runs (``agent daemon``)."""
    if not enabled:
        yield
        return
    from agent.infra.proc import Helper

    # -P: not the daemon's working directory first on sys.path (an `agent/` there is not this install)
    helper = Helper([sys.executable, "-P", "-m", "agent", "--forkserver", str(home)])
    try:
        yield
    finally:
        code = helper.stop()
        if code not in (0, None):
            echo(f"daemon: the fork server ended with exit status {code}")
