"""A lane's network: its own network namespace, and one way out through the agent's allowlisting egress proxy.

``sandbox.network`` (config.yaml):
- ``proxy`` (default): the lane runs in a network namespace of its own (only its own loopback; the host's loopback
  services, LAN and abstract unix sockets are not there), made in the sandbox's first process between its fork and
  bwrap's exec (``lane_setup``, through ``agent.infra.proc.setup_arg``: a user namespace owning a network namespace,
  ``lo`` brought up), which listens there on ``127.0.0.1:PROXY_PORT`` and hands that listening socket to the agent
  over a socket pair (``SCM_RIGHTS``); bwrap then runs in it (no ``--unshare-net``).  The agent's allowlisting HTTP
  proxy (``CONNECT`` and plain HTTP) accepts on it from outside, and ``HTTP(S)_PROXY`` point there.  No unix socket
  is bound into the lane, no bridge process runs in it and no program starts before bwrap (issue 34: a Python
  launcher in the sandbox made the listener before, ~10 ms of every lane start).  The proxy lets through only
  ``HOST[:PORT]``s on the lane's allowlist:
  its built-in vendor's model API hosts (``VENDOR_HOSTS``), ``vendors.X.hosts`` and ``sandbox.allow_hosts``.
  A built-in host that resolves to a loopback, private or link-local address is refused (a poisoned resolver
  cannot turn it into a way to the LAN); an address, ``localhost`` or a name the config lists is the operator's
  word (that is how the scripted model server on 127.0.0.1 is reached in tests).  A loopback ``HOST:PORT`` the
  config names is also listened on at the lane's own 127.0.0.1:PORT and forwarded there, still through the
  allowlist, for CLIs that ignore the proxy variables (grok).
- ``none``: its own network namespace and no proxy (no network at all).
- ``host``: the host's network (explicitly only; doctor warns).

Whatever the mode (under bwrap), the lane never sees ``/run`` and ``/var/run`` (the PostgreSQL socket,
``/run/user/UID`` with the ssh-agent and D-Bus sockets), the directory of ``$SSH_AUTH_SOCK`` and the socket
directory of a configured PostgreSQL ledger (``hidden_socket_dirs``); sockets other services left in
``/var/lib`` and ``/var/spool`` are blanked (``host_sockets``); ``/var/tmp`` is a private tmpfs like ``/tmp``.
Repository checks run lane-written code: they get a network namespace with no proxy unless ``sandbox.network`` is ``host``.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import os
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from agent import AgentError
from agent.domain.hosts import HostRule

PROXY_PORT = 3128                      # the proxy's port on the lane's own loopback

# The model API (and login refresh) hosts each built-in vendor needs; everything else is refused.
VENDOR_HOSTS: dict[str, tuple[str, ...]] = {
    "codex": ("api.openai.com", "chatgpt.com", "auth.openai.com"),
    "claude": ("api.anthropic.com", "console.anthropic.com"),
    "aider": ("api.openai.com", "api.anthropic.com"),
    "opencode": ("api.openai.com", "api.anthropic.com", "opencode.ai", "models.dev"),
    "gemini": ("generativelanguage.googleapis.com", "cloudcode-pa.googleapis.com", "oauth2.googleapis.com"),
    "grok": ("api.x.ai",),
}
HEAD_MAX = 65536
IO_TIMEOUT = 30.0
MAX_CONNECTIONS = 64                   # open at once per lane: more are refused (503), the agent keeps its threads


def mode(config) -> str:
    return getattr(config, "sandbox_network", "proxy") or "proxy"


def _ip(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _public(addr) -> bool:
    return addr.is_global and not addr.is_multicast


@dataclass
class Allowlist:
    rules: list[HostRule] = field(default_factory=list)

    def check(self, host: str, port: int) -> tuple[str | None, list]:
        """(None, addresses to connect to) or (why refused, [])."""
        host = host.strip().lower().rstrip(".")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        rule = next((r for r in self.rules if r.matches(host, port)), None)
        if rule is None:
            return f"{host}:{port} is not on this lane's allowlist", []
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return f"{host}: cannot resolve ({exc.strerror or exc})", []
        addrs = [info[4] for info in infos]
        if not rule.named:
            bad = [a[0] for a in addrs if not _public(ipaddress.ip_address(a[0].split("%")[0]))]
            if bad:
                return f"{host} resolves to a non-public address ({bad[0]})", []
        return None, addrs


def allowlist(config, vendor: str | None) -> Allowlist:
    """The hosts a lane of ``vendor`` may reach: its built-in model hosts, ``vendors.X.hosts`` and
    ``sandbox.allow_hosts``."""
    rules = [HostRule.parse(h, named=False) for h in VENDOR_HOSTS.get(vendor or "", ())]
    vc = (getattr(config, "vendors", {}) or {}).get(vendor or "")
    for h in [*(getattr(vc, "hosts", ()) or ()), *(getattr(config, "sandbox_allow_hosts", ()) or ())]:
        rules.append(HostRule.parse(h))
    return Allowlist(rules)


def unlisted_base_urls(config, vendors, environ) -> list[tuple[str, str, str]]:
    """(vendor, variable, HOST:PORT) for each base URL a vendor's lanes are given (a ``*_BASE_URL``/``*_API_BASE``
    variable ``vendors.X.env`` passes) that its allowlist would refuse: doctor says so before a lane fails."""
    out = []
    for vendor in vendors:
        vc = (getattr(config, "vendors", {}) or {}).get(vendor)
        allow = allowlist(config, vendor)
        for var in getattr(vc, "env", ()) or ():
            value = environ.get(var, "")
            if not var.endswith(("_BASE_URL", "_API_BASE")) or "://" not in value:
                continue
            parts = urlsplit(value)
            try:
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError:
                continue
            host = (parts.hostname or "").lower()
            if host and not any(r.matches(host, port) for r in allow.rules):
                out.append((vendor, var, f"{host}:{port}"))
    return out


# --------------------------------------------------------------------------- the proxy


def _read_head(conn: socket.socket) -> bytes | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > HEAD_MAX:
            return None
        chunk = conn.recv(4096)
        if not chunk:
            return None
        buf += chunk
    return buf


def _target(method: str, uri: str) -> tuple[str, int, str] | None:
    """(host, port, origin-form path) of a proxy request, or None."""
    if method == "CONNECT":
        host, sep, port = uri.rpartition(":")
        if not sep or not port.isdigit():
            return None
        return host, int(port), ""
    parts = urlsplit(uri)
    if parts.scheme != "http" or not parts.hostname:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, port, path


def _reply(conn: socket.socket, code: int, reason: str, text: str = "") -> None:
    body = (text + "\n").encode() if text else b""
    try:
        conn.sendall(f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + body)
    except OSError:
        pass


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until either side closes."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    open_sides = 2
    try:
        while open_sides:
            for key, _ in sel.select():
                src, dst = key.fileobj, key.data
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(src)
                    open_sides -= 1
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    continue
                try:
                    dst.sendall(data)
                except OSError:
                    return
    finally:
        sel.close()


class EgressProxy:
    """An allowlisting HTTP proxy for one lane turn, serving the listening sockets the sandbox's first process makes
    in the lane's network namespace (``lane_setup``) and hands over on ``lane_fd()``'s socket pair (one message:
    the ports, comma separated, and one listening socket each, checked to be exactly that before anything is
    accepted on them).
    A forwarded port's connections go to its configured loopback ``(host, port)``.  ``refused`` lists what it
    turned away."""

    def __init__(self, allow: Allowlist, forwards: list[tuple[str, int]] = (), port: int = PROXY_PORT):
        self.allow = allow
        self.ports = [port] + list(dict.fromkeys(p for _, p in forwards if p != port))
        self.targets = {p: h for h, p in forwards if p != port}
        self.refused: list[str] = []
        self._conns: set[socket.socket] = set()
        self._listeners: list[socket.socket] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._chan, self._lane_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="egress-proxy", daemon=True)
        self._thread.start()

    def lane_fd(self) -> int:
        """The lane's end of the socket pair (used by the sandbox's first process before bwrap's exec, which closes
        it: non-inheritable; the agent's copy closes with the turn)."""
        return self._lane_end.fileno()

    def _receive(self) -> list[socket.socket]:
        """``lane_setup``'s one message: its listening sockets, if they are what was asked for; else none."""
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self._chan, 256, len(self.ports) + 1)
        except OSError:
            return []
        got = [socket.socket(fileno=fd) for fd in fds]
        try:
            ports = [int(x) for x in msg.decode("ascii").split(",")] if msg else []
        except (UnicodeError, ValueError):
            ports = []
        ok = ports == self.ports and len(got) == len(ports)
        for sock, port in zip(got, ports) if ok else ():
            try:
                ok = ok and sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM \
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1 \
                    and sock.getsockname() == ("127.0.0.1", port)
            except OSError:
                ok = False
        if not ok:
            for sock in got:
                sock.close()
            return []
        return got

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._chan, selectors.EVENT_READ, "chan")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while True:
                for key, _ in sel.select():
                    if key.data == "wake":
                        return
                    if key.data == "chan":           # one message only: nothing later on the pair is read
                        sel.unregister(self._chan)
                        with self._lock:
                            self._listeners = self._receive()
                        for sock in self._listeners:
                            sock.setblocking(False)
                            sel.register(sock, selectors.EVENT_READ, sock.getsockname()[1])
                        continue
                    try:
                        conn, _ = key.fileobj.accept()
                    except OSError:
                        continue
                    conn.setblocking(True)
                    self._dispatch(conn, key.data)
        finally:
            sel.close()

    def _dispatch(self, conn: socket.socket, port: int) -> None:
        if not self._slots.acquire(blocking=False):
            _reply(conn, 503, "Service Unavailable", "agent egress proxy: too many connections")
            try:
                conn.shutdown(socket.SHUT_WR)
                conn.setblocking(False)
                conn.recv(HEAD_MAX)           # what already came: closing on unread data would reset the reply
            except OSError:
                pass
            conn.close()
            return
        target = (self.targets[port], port) if port in self.targets else None
        threading.Thread(target=self._handle, args=(conn, target), daemon=True).start()

    def _track(self, s: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(s)

    def _handle(self, conn: socket.socket, target: tuple[str, int] | None = None) -> None:
        """A proxy request on PROXY_PORT, or (``target``) a forwarded port's connection to its loopback host."""
        self._track(conn, True)
        up = None
        try:
            conn.settimeout(IO_TIMEOUT)
            if target is not None:
                method, (host, port), path, rest, version = "FORWARD", target, "", b"", ""
            else:
                head = _read_head(conn)
                if head is None:
                    return _reply(conn, 400, "Bad Request", "agent egress proxy: no request head")
                line, _, rest = head.partition(b"\r\n")
                parts = line.decode("latin-1").split()
                tgt = _target(parts[0].upper(), parts[1]) if len(parts) == 3 else None
                if tgt is None:
                    return _reply(conn, 400, "Bad Request",
                                  "agent egress proxy: expected CONNECT host:port or an absolute http:// URL")
                method, version = parts[0].upper(), parts[2]
                host, port, path = tgt
            why, addrs = self.allow.check(host, port)
            if why is not None:
                with self._lock:
                    self.refused.append(f"{host}:{port}")
                if target is not None:
                    return None
                return _reply(conn, 403, "Forbidden", f"agent egress proxy: refused: {why} (add it to "
                              "vendors.NAME.hosts or sandbox.allow_hosts in config.yaml)")
            up = self._connect(addrs)
            if up is None:
                if target is not None:
                    return None
                return _reply(conn, 502, "Bad Gateway", f"agent egress proxy: cannot connect to {host}:{port}")
            self._track(up, True)
            if method == "CONNECT":
                body = rest.partition(b"\r\n\r\n")
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if body[2]:
                    up.sendall(body[2])
            elif method != "FORWARD":
                body = rest.partition(b"\r\n\r\n")
                headers = [h for h in body[0].split(b"\r\n") if h and not h.lower().startswith(
                    (b"proxy-", b"connection:", b"keep-alive:"))]
                up.sendall(b"\r\n".join([f"{method} {path} {version}".encode("latin-1"), *headers,
                                         b"Connection: close", b"", b""]) + body[2])
            conn.settimeout(None)
            up.settimeout(None)
            _relay(conn, up)
        except (OSError, UnicodeError, IndexError):
            pass
        finally:
            for s in (conn, up):
                if s is not None:
                    self._track(s, False)
                    try:
                        s.close()
                    except OSError:
                        pass
            self._slots.release()

    @staticmethod
    def _connect(addrs: list) -> socket.socket | None:
        for addr in addrs:
            fam = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.settimeout(IO_TIMEOUT)
            try:
                s.connect(addr)
                return s
            except OSError:
                s.close()
        return None

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join(2)
        with self._lock:
            conns = list(self._conns)
            listeners, self._listeners = self._listeners, []
        for s in listeners + [self._chan, self._lane_end]:
            s.close()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        os.close(self._wake_r)
        os.close(self._wake_w)


# --------------------------------------------------------------------------- what the sandbox gets


def _pg_socket_dir(url: str | None) -> Path | None:
    """The unix socket directory a ``postgresql://`` URL connects through (``?host=/dir`` or a %2F host)."""
    if not url:
        return None
    parts = urlsplit(url)
    hosts = parse_qs(parts.query).get("host", []) + [unquote(parts.netloc.rpartition("@")[2].split(":")[0])]
    for h in hosts:
        if h.startswith("/"):
            return Path(h)
    return None


_KEEP = frozenset({"/", "/tmp", "/var", "/var/tmp", "/usr", "/etc", "/home", "/root", "/opt", "/srv", "/dev"})


def hidden_socket_dirs(config, environ=None) -> list[Path]:
    """Directories holding host sockets a lane must not reach: ``/run``, ``/var/run``, the ssh-agent's and the
    PostgreSQL ledger's socket dirs (``AGENT_LEDGER_URL``/``ledger.url``, ``PGHOST``).  A socket directly in
    ``/tmp`` is already behind the lane's private /tmp; a system directory itself is never hidden."""
    env = os.environ if environ is None else environ
    cands = [Path("/run"), Path("/var/run")]
    sock = env.get("SSH_AUTH_SOCK") or ""
    if sock.startswith("/"):
        cands.append(Path(sock).parent)
    for d in (_pg_socket_dir(env.get("AGENT_LEDGER_URL")), _pg_socket_dir(getattr(config, "ledger_url", None)),
              Path(env["PGHOST"]) if env.get("PGHOST", "").startswith("/") else None):
        if d is not None:
            cands.append(d)
    out: list[Path] = []
    for c in cands:
        p = c.resolve()                     # /var/run -> /run: a mount lands where the link leads
        if str(p) in _KEEP or any(p == q or q in p.parents for q in out) or not p.is_dir():
            continue
        out = [q for q in out if p not in q.parents] + [p]
    return out


# Shared places outside /run where services leave unix sockets (a MySQL socket in /var/lib/mysql, an ssh-agent or
# a tool's socket in /var/tmp): scanned this many levels down when a lane starts, each socket found blanked.
SOCKET_SCAN = (("/var/lib", 2), ("/var/spool", 2))    # /var/tmp is a private tmpfs in the sandbox (sandbox.wrap)


def host_sockets(hidden: list[Path], scan=SOCKET_SCAN) -> list[Path]:
    """Unix socket files in ``scan``'s directories (not inside ``hidden``), to bind ``/dev/null`` over: a socket
    stays connectable through a read-only mount, a device node in its place cannot be connected to."""
    import stat

    out: list[Path] = []

    def walk(d: str, depth: int) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            try:                        # the entry's type from the directory itself: a stat only for the odd ones
                if e.is_dir(follow_symlinks=False):
                    if depth > 1:
                        walk(e.path, depth - 1)
                elif not e.is_file(follow_symlinks=False) and not e.is_symlink() and \
                        stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode):
                    out.append(Path(e.path))
            except OSError:
                continue

    for root, depth in scan:
        walk(root, depth)
    return [p for p in out if not any(h == p.parent or h in p.parents for h in hidden)]


CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


@functools.cache
def _libc():
    """ctypes and libc (``unshare``: Python 3.11's ``os`` has none), loaded in the agent once, never in the child."""
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def lane_setup(proxy: "EgressProxy", libc=None):
    """The function that makes a proxied lane's network in the sandbox's first process, after its fork and before
    bwrap's exec (``agent.infra.proc.setup_arg``): a new user namespace (mapping only the agent's own uid and gid)
    owning a new network namespace, its ``lo`` up, a listening socket on ``127.0.0.1`` at each of the proxy's
    ports, sent with the port list as one message on the proxy's socket pair.  It runs in a forked copy of a
    threaded process: only system calls, no lock, no import.  No namespace: it says so on stderr and ends the child
    (exit 126; the lane is ``unavailable`` with that line), never lets bwrap run on the host's network; no
    listener: the lane starts without its proxy (its connections fail), as it says."""
    ctypes, lib = libc or _libc()
    uid, gid = os.geteuid(), os.getegid()
    chan = proxy._lane_end
    ports = list(proxy.ports)

    def say(text: str) -> None:
        os.write(2, ("agent-lane: egress: " + text + "\n").encode("utf-8", "replace"))

    def setup() -> None:
        try:
            if lib.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
                try:
                    os.write(fd, text.encode())
                finally:
                    os.close(fd)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                got = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16s24x", b"lo"))
                flags = struct.unpack_from("16sh", got)[1]
                fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))
        except OSError as exc:
            say(f"the lane's network namespace could not be made ({exc.strerror or exc}); the lane does not start")
            os._exit(126)
        socks: list[socket.socket] = []
        try:
            for port in ports:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen(128)
            socket.send_fds(chan, [",".join(map(str, ports)).encode()], [s.fileno() for s in socks])
        except OSError as exc:
            say(f"{exc.strerror or exc}; the lane starts without its proxy")
        for s in socks:
            s.close()

    return setup


@dataclass
class Net:
    """What ``sandbox.wrap`` adds for the network: its own network namespace (``--unshare-net``, or in proxy mode
    the set-up ``lane_setup`` that also makes the proxy's listening sockets), the hidden socket dirs and the proxy."""
    mode: str
    hide: list[Path] = field(default_factory=list)
    blank: list[Path] = field(default_factory=list)        # host socket files: /dev/null bound over each
    proxy: EgressProxy | None = None
    setup_key: str | None = None

    def bwrap_args(self) -> list[str]:
        if self.proxy is not None:
            from agent.infra.proc import setup_arg

            # bwrap runs in the namespace lane_setup made (where the listeners are): no --unshare-net
            self.setup_key = self.setup_key or f"egress-{id(self)}"
            return [setup_arg(self.setup_key, lane_setup(self.proxy))]
        return ["--unshare-net"] if self.mode in ("proxy", "none") else []

    def mounts(self) -> list[tuple[Path, list[str]]]:
        """(destination, bwrap option) pairs, sorted with the plan's mounts by depth: an empty tmpfs over each
        hidden socket dir, /dev/null over each host socket file."""
        out = [(p, ["--tmpfs", str(p)]) for p in self.hide]
        out += [(p, ["--ro-bind", "/dev/null", str(p)]) for p in self.blank]
        return out

    def pass_fds(self) -> tuple[int, ...]:
        return ()                        # lane_setup uses the pair's end before the exec; nothing is inherited

    def env(self, env: dict[str, str]) -> dict[str, str]:
        env = dict(env)
        if self.proxy is not None:
            # everything goes to the proxy: an exception list would only lead to connections that fail
            env = {k: v for k, v in env.items() if k.lower() not in ("no_proxy", "all_proxy")}
            url = f"http://127.0.0.1:{PROXY_PORT}"
            for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[k] = url
            env["NODE_USE_ENV_PROXY"] = "1"          # node >= 24 honours the variables above with it
        return env

    def refused(self) -> list[str]:
        """HOST:PORTs the proxy turned away (each once)."""
        return list(dict.fromkeys(self.proxy.refused)) if self.proxy is not None else []

    def close(self) -> None:
        if self.setup_key is not None:
            from agent.infra.proc import drop_setup

            drop_setup(self.setup_key)
            self.setup_key = None
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None

    def __enter__(self) -> "Net":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lane_network(config, vendor: str | None, *, environ=None) -> Net:
    """Start what one sandboxed lane turn's network needs (close it when the turn ends)."""
    m = mode(config)
    net = _hiding(m, config, environ)
    if m != "proxy":
        return net
    allow = allowlist(config, vendor)
    forwards = [(r.host, r.port) for r in allow.rules       # IPv4 loopback only
                if r.named and r.port and (r.host == "localhost" or r.host.startswith("127.") and _ip(r.host))]
    net.proxy = EgressProxy(allow, forwards)
    return net


def check_network(config, environ=None) -> Net:
    """A repository check's network: none (its own namespace, no proxy) unless ``sandbox.network: host``."""
    m = "host" if mode(config) == "host" else "none"
    return _hiding(m, config, environ)


def no_network(config, environ=None) -> Net:
    """No network at all, whatever ``sandbox.network`` says (its own namespace, the host's sockets hidden): a vendor
    binary's state prime (agent.lanes.vendorstate)."""
    return _hiding("none", config, environ)


def _hiding(m: str, config, environ) -> Net:
    hide = hidden_socket_dirs(config, environ)
    return Net(mode=m, hide=hide, blank=host_sockets(hide))
