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

bwrap applies it (``--seccomp FD``) as the last thing before it executes the lane's command, after the whole
sandbox is up: ``sandbox_filter`` gives the program, and the pipe it comes on is the agent's go for that command
(``agent.infra.proc.go_arg``: written once what must precede the lane is done; an agent gone before that leaves an
empty program, which bwrap refuses, so nothing starts).  With ``sandbox.unix_sockets: allow`` (or on an
architecture without a filter) the program allows everything and still carries the go.  No library: libseccomp's
Python binding is a Debian package outside the agent's venv (and the PyPI ones are unmaintained ctypes copies of
it); the program below is checked by the kernel when it loads and by the tests in tests/test_seccomp.py on real
bwrap.
"""

from __future__ import annotations

import platform
import struct

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


# A program that allows every system call: the go of a sandbox without the filter
ALLOW_ALL = _ins(BPF_RET_K, RET_ALLOW)

_warned: set[str] = set()


def sandbox_filter(filtered: bool = True) -> bytes:
    """The program bwrap applies to a lane's (or check's) command: the filter when ``filtered``; allow-all when not,
    or on an architecture without one (then with a warning, once per process, that lanes run without it)."""
    if not filtered:
        return ALLOW_ALL
    try:
        return program()
    except Unsupported as exc:
        if str(exc) not in _warned:
            _warned.add(str(exc))
            import logging

            logging.getLogger(__name__).warning("%s: lanes run without it and may connect to the host's unix "
                                                "sockets (sandbox.unix_sockets: deny)", exc)
        return ALLOW_ALL
