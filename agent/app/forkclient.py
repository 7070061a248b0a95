"""The fork server's client: what the console script (``agent.__main__``) runs before it imports click.

``run_in_server(argv)`` checks whether the command is ``agent [--home H] [--config F] lane run ...`` and that home's
fork server (agent.cli.forkserver, started by ``agent daemon``) answers on ``HOME/run/forkserver.sock``; if so it
hands the server its argv, environment, umask, stdin/stdout/stderr and working directory (the last four as file
descriptors, ``SCM_RIGHTS``), forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to the child that runs the command, and
returns its exit status.  None means the server does not take it and the caller runs the command itself.

Imports only C modules of the standard library (``_socket``, ``_signal``, ``struct``; not ``socket``, ``signal``,
``json`` or ``pathlib``, ~9 ms of a fresh process) and agent.app.homedir (a leaf): nothing that would cost the start
it saves.  The request is one message, a 4-byte length then NUL-separated fields (no argument or environment string
can hold a NUL): ``MAGIC``, the umask, the interpreter, the ``agent/`` dir, the number of arguments, the arguments,
then ``NAME=value`` for each environment variable (bytes as the OS has them).
"""

from __future__ import annotations

import _socket
import os
import struct
import sys

SOCKET_NAME = "forkserver.sock"      # in HOME/run
N_FDS = 4                            # stdin, stdout, stderr, the working directory
MAGIC = b"agent-fork 1"
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


def _command_home(argv: list[str]) -> str | None | bool:
    """For ``[--home H | --home=H | --config F | --config=F]... lane run ...``: the --home value (None when not
    given); False for any other command line (which the server does not take)."""
    home = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--home", "--config"):
            if i + 1 >= len(argv):
                return False
            if a == "--home":
                home = argv[i + 1]
            i += 2
        elif a.startswith("--home="):
            home = a[len("--home="):]
            i += 1
        elif a.startswith("--config="):
            i += 1
        else:
            break
    rest = argv[i:]
    if rest[:2] != ["lane", "run"] or any(a in ("-h", "--help") for a in rest):
        return False
    return home


def run_in_server(argv: list[str]) -> int | None:
    """Run ``agent ARGV`` in the home's fork server: its exit status, or None when the server does not take it
    (the caller runs the command itself)."""
    home = _command_home(argv)
    if home is False:
        return None
    from agent.app.homedir import home_path

    try:
        where = os.open(os.path.join(home_path(home), "run"), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(f"/proc/self/fd/{where}/{SOCKET_NAME}")     # short, whatever the home's path length
        cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        conn.close()
        return None
    finally:
        os.close(where)
    umask = os.umask(0)
    os.umask(umask)
    body = encode_request(argv, os.environb, umask, _exe(), _package_dir())
    try:
        head = struct.pack("!I", len(body))
        sent = conn.sendmsg([head + body], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                             struct.pack(f"{N_FDS}i", 0, 1, 2, cwd))])
        conn.sendall((head + body)[sent:])
    except OSError:                 # a closed stdin, a server that just went away: run it here
        conn.close()
        return None
    finally:
        os.close(cwd)
    return _follow(conn)


def encode_request(argv: list[str], environb, umask: int, exe: str, agent_dir: str) -> bytes:
    """The request's body (after its length): see the module doc."""
    fields = [MAGIC, b"%d" % umask, os.fsencode(exe), os.fsencode(agent_dir), b"%d" % len(argv),
              *(os.fsencode(a) for a in argv), *(k + b"=" + v for k, v in environb.items())]
    return b"\0".join(fields)


def decode_request(body: bytes) -> dict:
    """The server's side of ``encode_request``: {argv, env, umask, exe, agent}; ValueError for anything else."""
    parts = body.split(b"\0")
    if len(parts) < 5 or parts[0] != MAGIC or not parts[1].isdigit() or not parts[4].isdigit():
        raise ValueError("request of the wrong shape")
    umask, n = int(parts[1]), int(parts[4])
    if umask > 0o777 or len(parts) < 5 + n:
        raise ValueError("request of the wrong shape")
    env = {}
    for item in parts[5 + n:]:
        name, eq, value = item.partition(b"=")
        if not name or not eq:
            raise ValueError("request of the wrong shape (an environment entry without NAME=)")
        env[os.fsdecode(name)] = os.fsdecode(value)
    return {"umask": umask, "exe": os.fsdecode(parts[2]), "agent": os.fsdecode(parts[3]),
            "argv": [os.fsdecode(a) for a in parts[5:5 + n]], "env": env}


def _follow(conn) -> int | None:
    """Read the server's lines: ``pid N`` (signals are forwarded to N from here on), then ``exit N`` or ``signal N``;
    ``fallback WHY`` before any pid means: run it yourself."""
    import _signal as signal

    buf = b""
    pid = None

    def forward(signum, frame):
        if pid is not None:
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    while True:
        while b"\n" not in buf:
            try:
                chunk = conn.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                conn.close()
                if pid is None:
                    return None
                sys.stderr.write("agent: the fork server's child ended without an exit status\n")
                return 1
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        word, _, arg = line.decode("ascii", "replace").partition(" ")
        if word == "fallback" and pid is None:
            conn.close()
            return None
        if word == "pid" and arg.isdigit() and pid is None:
            pid = int(arg)
            for name in FORWARDED:
                signal.signal(getattr(signal, name), forward)
        elif word == "exit" and arg.lstrip("-").isdigit():
            conn.close()
            return int(arg) & 0xFF
        elif word == "signal" and arg.isdigit():
            conn.close()
            sig = int(arg)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return 128 + sig


def _exe() -> str:
    return os.path.realpath(sys.executable or "")


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # agent/
