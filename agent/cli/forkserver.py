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

While no command runs, the next request's child is already forked (a spare, ``_fork_spare``) and has copied every
page it shares with the server (``madvise(MADV_POPULATE_WRITE)``): a request then waits for neither the fork nor,
while its command runs, a few thousand copy-on-write faults (~7 ms of a lane run's ~55 here, bench/RESULTS.md).
The server checks each request as before and hands the spare the client's connection, descriptors and request; a
request that comes while the spare is taken or not ready yet gets a child forked for it, as before.  The price is
the spare's own copy of the server's heap (~15 MB) while the daemon is idle.

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
MADV_POPULATE_WRITE = 23            # linux/mman.h
OWN_PAGES_MAX = 64 << 20            # the largest mapping a spare copies (``_own_pages``)


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


def _recv_message(conn: socket.socket, n_fds: int) -> tuple[bytes, list[int]]:
    """A 4-byte length, then that many bytes, with exactly ``n_fds`` file descriptors (``SCM_RIGHTS``) on the first
    part; ValueError (the descriptors closed) for anything else."""
    fds: list[int] = []
    data, anc, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(n_fds * 4))
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += list(struct.unpack(f"{len(raw) // 4}i", raw[:len(raw) - len(raw) % 4]))
    try:
        if len(fds) != n_fds or len(data) < 4:
            raise ValueError(f"expected a length and {n_fds} file descriptors")
        (n,) = struct.unpack("!I", data[:4])
        if n > MAX_REQUEST:
            raise ValueError("request too large")
        body = data[4:]
        while len(body) < n:
            chunk = conn.recv(min(65536, n - len(body)))
            if not chunk:
                raise ValueError("request cut short")
            body += chunk
        return body[:n], fds
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise


def _recv_request(conn: socket.socket) -> tuple[bytes, dict, list[int]]:
    """A client's request: (its body, the body decoded, its stdin, stdout, stderr and working directory)."""
    body, fds = _recv_message(conn, N_FDS)
    try:
        return body, decode_request(body), fds
    except (ValueError, UnicodeError):
        for fd in fds:
            os.close(fd)
        raise ValueError("request of the wrong shape") from None


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", raw)[1]


def _leave_server(closing: list[int]) -> None:
    """In a forked child: the server's signal handling undone and its own file descriptors closed."""
    import signal

    signal.set_wakeup_fd(-1)
    for name in ("SIGTERM", "SIGCHLD", "SIGHUP", "SIGQUIT"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in closing:
        os.close(fd)


def _child(conn: socket.socket, fds: list[int], req: dict, closing: list[int], run) -> None:
    """In the forked child: become the client's command, run it, report its exit status, exit."""
    _leave_server(closing)
    _run_request(conn, fds, req, run)


def _run_request(conn: socket.socket, fds: list[int], req: dict, run) -> None:
    """Take over the client's stdio, working directory, umask and environment, run its command, report its exit
    status on ``conn`` and exit."""
    import signal
    import threading

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


class _Spare:
    """A child forked before its request, waiting for it (``_fork_spare``); ``ready`` once it says so."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid, self.sock, self.ready = pid, sock, False

    def said_ready(self) -> bool:
        """Ready, or its ``r`` is waiting on the socket unread (a request and the ``r`` came in one select: the
        request must not fork a child of its own while the spare waits for it).  An end of the socket is left for
        the server's loop to see (it reads as the end again)."""
        if not self.ready:
            try:
                self.ready = self.sock.recv(1, socket.MSG_DONTWAIT) == b"r"
            except OSError:                         # nothing said yet
                pass
        return self.ready


def _fork_spare(closing: list[int], run) -> _Spare:
    """Fork the next request's child now, while the server is idle: it leaves the server, makes every page it
    inherited its own (``_own_pages``: the copy-on-write faults a child would otherwise take one by one while it
    runs the command), says ``r`` on its socket pair and waits there for a request the server has checked: the
    client's connection, its four descriptors and its body (``_handover``).  The end of that socket (the server is
    gone) ends it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _leave_server(closing)
            _own_pages()
            theirs.sendall(b"r")
            try:
                body, fds = _recv_message(theirs, N_FDS + 1)
            except (OSError, ValueError):
                os._exit(0)
            theirs.close()
            conn = socket.socket(fileno=fds[0])
            _run_request(conn, fds[1:], decode_request(body), run)
        finally:
            os._exit(1)
    theirs.close()
    return _Spare(pid, ours)


def _handover(spare: _Spare, conn: socket.socket, body: bytes, fds: list[int]) -> bool:
    """Give a checked request to the spare; False when it cannot take it (gone before any of it was sent).  A spare
    that ends with half of it sends the client nothing: the client runs the command itself, as for any server
    that closes before a child's pid."""
    msg = struct.pack("!I", len(body)) + body
    try:
        sent = spare.sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                           struct.pack(f"{N_FDS + 1}i", conn.fileno(), *fds))])
    except OSError:
        return False
    try:
        if sent < len(msg):
            spare.sock.sendall(msg[sent:])
    except OSError:
        pass
    return True


def _own_pages() -> None:
    """Break copy-on-write for every private writable mapping but the stack, in one call each
    (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14): the pages a command's run would fault in one at a time, a few
    thousand of them, are copied before its request comes.  An older kernel refuses it; nothing else changes."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        with open("/proc/self/maps") as fh:
            maps = fh.read().splitlines()
    except OSError:
        return
    for line in maps:
        fields = line.split()
        if len(fields) < 5 or fields[1][:2] != "rw" or fields[1][3:4] != "p" or fields[-1] == "[stack]":
            continue
        lo, _, hi = fields[0].partition("-")
        start, end = int(lo, 16), int(hi, 16)
        if end - start > OWN_PAGES_MAX:     # a reservation, not a heap (a lane run's are 1-4 MB): left as it is
            continue
        libc.madvise(start, end - start, MADV_POPULATE_WRITE)     # refused (an older kernel): as it was


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
    spare: _Spare | None = None
    served = 0

    def mine() -> list[int]:          # the server's own descriptors, which no child keeps
        return [listener.fileno(), wake_r, wake_w, where, *(c.fileno() for c in children.values()),
                *([spare.sock.fileno()] if spare is not None else [])]

    spares = True                     # False once a spare ended before its request (not the server's doing)

    def drop_spare() -> None:
        nonlocal spare
        if spare is not None:
            sel.unregister(spare.sock)
            spare.sock.close()
            if spare.pid not in children:          # unused: it holds nothing of anyone's
                try:
                    os.kill(spare.pid, signal.SIGKILL)
                    os.waitpid(spare.pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            spare = None

    try:
        while not stop:
            if spare is None and not children and spares:      # idle: the next request's child is forked now
                spare = _fork_spare(mine(), run)
                sel.register(spare.sock, selectors.EVENT_READ, "spare")
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
                elif key.data == "spare" and spare is not None:
                    try:
                        said = spare.sock.recv(1, socket.MSG_DONTWAIT)
                    except BlockingIOError:            # its ``r`` was read already (``said_ready``)
                        continue
                    except OSError:
                        said = b""
                    if said == b"r":
                        spare.ready = True
                    else:                              # it ended: no more of them (no fork loop), as before
                        log(f"a spare child ({spare.pid}) ended before its request; from now on each request's "
                            "child is forked when it comes")
                        spares = False
                        drop_spare()
                elif key.data == "accept":
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        continue
                    ready = spare if spare is not None and spare.said_ready() else None
                    why = _take(conn, loaded, children, mine(), run, ready)
                    if spare is not None and spare.pid in children:
                        drop_spare()                   # it took the request
                    if why is not None:
                        log(why)
                        if why.startswith("stale"):
                            stop.append(0)
                    else:
                        served += 1
            _reap(children)
    finally:
        drop_spare()
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


def _take(conn: socket.socket, loaded, children: dict[int, socket.socket], closing: list[int], run,
          spare: _Spare | None = None) -> str | None:
    """One request: hand it to the spare (forked before it came) or fork its child, or say why not (None when a
    child runs it)."""
    if _peer_uid(conn) != os.getuid():
        conn.close()
        return "refused a client of another user"
    conn.settimeout(5.0)
    try:
        body, req, fds = _recv_request(conn)
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
    if spare is not None and _handover(spare, conn, body, fds):
        pid = spare.pid
    else:
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
