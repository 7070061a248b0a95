"""The lane's seccomp filter: ``socket(AF_UNIX, ...)`` and io_uring fail with EPERM (issue 23).

A lane in its own network namespace reaches no abstract unix socket of the host (those belong to a network
namespace), but a path socket is a file: one the sandbox neither hides nor blanks (a service's socket in ``/srv``,
``/opt``, deep in ``/var/lib``, or any dir a lane is shown) is connectable.  The filter closes that for every
socket a lane could name: creating an ``AF_UNIX`` socket fails, so nothing can ``connect()`` or ``bind()`` one.
``socketpair()`` is a different system call and stays allowed (node's and Python's child stdio, asyncio's self
pipe); a socket passed in already connected (none is) would keep working.  As in Anthropic's sandbox-runtime.
io_uring is refused too (``io_uring_setup``, ``_enter``, ``_register``): a ring's operations never pass through
the system-call entry the filter sees, and ``IORING_OP_SOCKET`` (Linux 5.19) would create the ``AF_UNIX`` socket
that ``socket()`` may not (as Docker's default profile does; libuv and the runtimes fall back to plain calls).

The program is classic BPF (``struct sock_filter``), 11 or 12 instructions, built here for the running architecture
(x86_64, aarch64): a system call of any other architecture (i386 through ``int 0x80``, 32-bit arm) or of the x32 ABI
kills the process, since its socket call has another number the filter would not see.  Only the low 32 bits of
``domain`` are compared: the kernel reads the argument as an ``int``, so ``1 | 1 << 32`` is ``AF_UNIX`` too.  On
any other architecture ``program()`` refuses (``Unsupported``) and the sandbox says it runs without the filter.

It is applied inside the sandbox by the lane's launcher, right before the lane's command: ``applier_argv`` is an
``exec`` through the agent's own interpreter, which first makes the lane's egress listeners (agent.lanes.egress: an
``AF_INET`` socket on the lane's loopback, handed to the agent over an inherited socket pair, so the filter need not
spare any bridge), checks its lifeline, sets the filter (``prctl(PR_SET_SECCOMP)``; bwrap already set no-new-privs)
and ``exec``s the command.  No library: libseccomp's Python binding is a Debian package outside the agent's venv (and
the PyPI ones are unmaintained ctypes copies of it); the program below is checked by the kernel when it loads and by
the tests in tests/test_seccomp.py on real bwrap.
"""

from __future__ import annotations

import os
import platform
import struct
import sys

from agent import AgentError

AF_UNIX = 1
EPERM = 1

# <linux/audit.h>: EM_X86_64 / EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000
# io_uring_setup, io_uring_enter, io_uring_register: the same numbers on both architectures (the generic table)
IO_URING = (425, 426, 427)

# (audit arch, socket's system call number), by platform.machine()
ARCHES = {"x86_64": (AUDIT_ARCH_X86_64, 41), "amd64": (AUDIT_ARCH_X86_64, 41),
          "aarch64": (AUDIT_ARCH_AARCH64, 198), "arm64": (AUDIT_ARCH_AARCH64, 198)}

# <linux/filter.h>, <linux/seccomp.h>
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_RET_K = 0x06
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
# struct seccomp_data {int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];}
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16      # args[0]'s low half: both architectures are little-endian


class Unsupported(AgentError):
    pass


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one's), as the bytes of a ``struct sock_filter`` array."""
    m = (machine or platform.machine()).lower()
    if m not in ARCHES:
        raise Unsupported(f"no seccomp filter for architecture {m or '?'} (x86_64 and aarch64 only)")
    arch, nr_socket = ARCHES[m]
    # (label, code, k, jump if true, jump if false): a jump names a label; None is the next instruction
    prog: list[tuple[str | None, int, int, str | None, str | None]] = [
        (None, BPF_LD_W_ABS, OFF_ARCH, None, None),
        (None, BPF_JEQ_K, arch, None, "kill"),                    # another architecture: kill
        (None, BPF_LD_W_ABS, OFF_NR, None, None)]
    if arch == AUDIT_ARCH_X86_64:
        prog.append((None, BPF_JGE_K, X32_SYSCALL_BIT, "kill", None))         # the x32 ABI: kill
    prog += [(None, BPF_JGE_K, IO_URING[0], None, "socket"),                 # below io_uring's numbers
             (None, BPF_JGE_K, IO_URING[-1] + 1, "socket", "eperm"),         # io_uring_setup/enter/register
             ("socket", BPF_JEQ_K, nr_socket, None, "allow"),                 # not socket(): allow
             (None, BPF_LD_W_ABS, OFF_ARG0, None, None),
             (None, BPF_JEQ_K, AF_UNIX, "eperm", "allow"),                  # socket() of another family: allow
             ("eperm", BPF_RET_K, RET_ERRNO | EPERM, None, None),
             ("allow", BPF_RET_K, RET_ALLOW, None, None),
             ("kill", BPF_RET_K, RET_KILL_PROCESS, None, None)]
    at = {label: i for i, (label, *_rest) in enumerate(prog) if label}

    def jump(i: int, to: str | None) -> int:
        return 0 if to is None else at[to] - i - 1

    return b"".join(_ins(code, k, jump(i, jt), jump(i, jf)) for i, (_, code, k, jt, jf) in enumerate(prog))


# Runs as `python -I -S -c APPLY PROGRAM_HEX_OR_- LC_CTYPE_OR_- argv...`: no site, no agent import, and only the
# modules it cannot do without (each extension module is a shared object to load; `array` alone imports
# collections.abc, ~3 ms, and `ctypes` ~3.5 ms more than `_ctypes`; issue 34).
# First the lane's egress (agent.lanes.egress, proxy mode): it listens on 127.0.0.1 at each port AGENT_EGRESS_PORTS
# names, in the lane's own network namespace, and sends those listening sockets with the port list as one message
# on the socket pair end AGENT_EGRESS_FD names (then closes its copies: the lane holds neither them nor the pair).
# Then it waits on its lifeline (agent.infra.proc.LIFELINE_ENV) for the agent's go: one byte, written once what must
# precede the lane is done (proc.run's gate: the worktree's picture, the git guard), so that work overlaps the
# sandbox's start.  End of file instead means the agent process that started the sandbox is gone (SIGKILLed, maybe
# before bwrap armed its parent-death signal, which then never comes): it ends its own process group instead of
# starting a lane nobody supervises.  Then the filter ("-": none, sandbox.unix_sockets: allow: `prctl` called through
# `_ctypes`, `struct sock_fprog` laid out by hand for the two 64-bit architectures `program()` knows), then the
# command.
# The command gets what it was given: Python's locale coercion may have set LC_CTYPE in its environment, and Python
# ignores SIGPIPE and SIGXFSZ (an ignored signal stays ignored across exec): both back to the default.
APPLY = r"""import _signal, os, sys
eg = os.environ.pop("AGENT_EGRESS_FD", "")
ports = os.environ.pop("AGENT_EGRESS_PORTS", "")
if eg.isdigit():
    import _socket
    socks = []
    ch = None
    try:
        ch = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, int(eg))
        for port in ports.split(","):
            s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            socks.append(s)
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", int(port)))
            s.listen(128)
        fds = b"".join(s.fileno().to_bytes(4, sys.byteorder) for s in socks)
        ch.sendmsg([ports.encode()], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    except (OSError, ValueError) as e:
        sys.stderr.write("agent-lane: egress: " + str(e) + "; the lane starts without its proxy\n")
    for s in socks + ([ch] if ch is not None else []):
        s.close()
line = os.environ.pop("AGENT_LIFELINE_FD", "")
if line.isdigit():
    try:
        go = os.read(int(line), 1)
    except OSError:
        go = b""
    if not go:
        sys.stderr.write("agent-lane: the agent process that started this sandbox is gone; the lane does not start\n")
        os.killpg(0, 9)
    os.close(int(line))
_signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
_signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
if sys.argv[2] == "-":
    os.environ.pop("LC_CTYPE", None)
else:
    os.environ["LC_CTYPE"] = sys.argv[2]
argv = sys.argv[3:]
if sys.argv[1] != "-":
    import _ctypes
    prog = bytes.fromhex(sys.argv[1])
    class Int(_ctypes._SimpleCData):
        _type_ = "i"
    class Ulong(_ctypes._SimpleCData):
        _type_ = "L"
    class Char(_ctypes._SimpleCData):
        _type_ = "c"
    class Fn(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int
    def buf(data):
        return type("Buf", (_ctypes.Array,), {"_type_": Char, "_length_": len(data)}).from_buffer_copy(data)
    code = buf(prog)
    # struct sock_fprog {unsigned short len; struct sock_filter *filter;}: the pointer at offset 8
    fprog = buf((len(prog) // 8).to_bytes(2, sys.byteorder) + bytes(6)
                + _ctypes.addressof(code).to_bytes(8, sys.byteorder))
    prctl = Fn(_ctypes.dlsym(_ctypes.dlopen(None, 2), "prctl"))
    if prctl(Int(38), Ulong(1), Ulong(0), Ulong(0), Ulong(0)) or prctl(
            Int(22), Ulong(2), Ulong(_ctypes.addressof(fprog)), Ulong(0), Ulong(0)):
        sys.stderr.write("agent-lane: seccomp: prctl failed (" + os.strerror(_ctypes.get_errno()) + "), so no exec: "
                         "sandbox.unix_sockets: allow runs lanes without the filter\n")
        os._exit(126)
try:
    os.execvp(argv[0], argv)
except OSError as e:
    sys.stderr.write("agent-lane: exec: " + argv[0] + ": " + (e.strerror or str(e)) + "\n")
    os._exit(127 if isinstance(e, FileNotFoundError) else 126)
"""


def interpreter() -> str:
    """The interpreter that applies the filter: the one the agent runs on, resolved past its venv's link (the
    sandbox shows it: the root read-only, or bound back by ``sandbox.runtime_paths``)."""
    found = os.path.realpath(sys.executable) if sys.executable else ""
    if not os.path.isfile(found):
        raise Unsupported(f"no interpreter to apply the seccomp filter with ({sys.executable!r})")
    return found


def applier_argv(argv: list[str], env: dict[str, str], machine: str | None = None, filtered: bool = True) -> list[str]:
    """``argv`` run through the launcher, under the filter when ``filtered`` (raises Unsupported on an unknown
    architecture)."""
    prog = program(machine).hex() if filtered else "-"
    return [interpreter(), "-I", "-S", "-c", APPLY, prog, env.get("LC_CTYPE", "-"), *argv]


_warned: set[str] = set()


def filtered_argv(argv: list[str], env: dict[str, str], filtered: bool = True) -> list[str]:
    """``argv`` through the launcher: the egress listeners ``env`` asks for, the lifeline and (``filtered``) the
    filter; on an architecture without one, without it and a warning (once per process) that lanes run without it.
    The launcher asks for a lifeline in ``env`` (``agent.infra.proc.run`` fills in its number)."""
    from agent.infra.proc import LIFELINE_ENV

    try:
        wrapped = applier_argv(argv, env, filtered=filtered)
    except Unsupported as exc:
        if str(exc) not in _warned:
            _warned.add(str(exc))
            import logging

            logging.getLogger(__name__).warning("%s: lanes run without it and may connect to the host's unix "
                                                "sockets (sandbox.unix_sockets: deny)", exc)
        wrapped = applier_argv(argv, env, filtered=False)
    env[LIFELINE_ENV] = ""
    return wrapped
