"""A lane's network: its own network namespace, and one way out through the agent's allowlisting egress proxy.

``sandbox.network`` (config.yaml):
- ``proxy`` (default): the lane runs with ``--unshare-net`` (only its own loopback; the host's loopback services,
  LAN and abstract unix sockets are not there).  The agent serves an HTTP proxy (``CONNECT`` and plain HTTP) on a
  unix socket in a runner-only dir; the socket is bound into the sandbox and ``socat`` bridges it to
  ``127.0.0.1:PROXY_PORT`` inside the lane's namespace, and ``HTTP(S)_PROXY`` point there (the shape of
  Anthropic's sandbox-runtime on Linux).  The proxy lets through only ``HOST[:PORT]``s on the lane's allowlist:
  its built-in vendor's model API hosts (``VENDOR_HOSTS``), ``vendors.X.hosts`` and ``sandbox.allow_hosts``.
  A built-in host that resolves to a loopback, private or link-local address is refused (a poisoned resolver
  cannot turn it into a way to the LAN); an address, ``localhost`` or a name the config lists is the operator's
  word (that is how the scripted model server on 127.0.0.1 is reached in tests).  A loopback ``HOST:PORT`` the
  config names is also forwarded from the lane's own 127.0.0.1:PORT through the proxy (``bridge_script``), for
  CLIs that ignore the proxy variables (grok).
- ``none``: its own network namespace and no proxy (no network at all).
- ``host``: the host's network (explicitly only; doctor warns).

Whatever the mode (under bwrap), the lane never sees ``/run`` and ``/var/run`` (the PostgreSQL socket,
``/run/user/UID`` with the ssh-agent and D-Bus sockets), the directory of ``$SSH_AUTH_SOCK`` and the socket
directory of a configured PostgreSQL ledger (``hidden_socket_dirs``); sockets other services left in
``/var/lib`` and ``/var/spool`` are blanked (``host_sockets``); ``/var/tmp`` is a private tmpfs like ``/tmp``.
Repository checks run lane-written code: they get a network namespace with no proxy unless ``sandbox.network`` is ``host``.
"""

from __future__ import annotations

import ipaddress
import os
import selectors
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from agent import AgentError
from agent.domain.hosts import HostRule

PROXY_PORT = 3128                      # the bridge's port on the lane's own loopback
SOCKET_IN_LANE = "/run/agent-egress/proxy.sock"
INSTALL_FIX = ("install socat (`apt-get install socat`, or scripts/ci-bwrap), or set `sandbox: {network: none}` "
               "in config.yaml")

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


class EgressUnavailable(AgentError):
    pass


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
    """An allowlisting HTTP proxy on a unix socket (one per lane turn); ``refused`` lists what it turned away."""

    def __init__(self, allow: Allowlist, path: Path):
        self.allow = allow
        self.path = Path(path)
        self.refused: list[str] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o600)               # only the agent's user (which the lane's uid maps to)
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._serve, name="egress-proxy", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                _reply(conn, 503, "Service Unavailable", "agent egress proxy: too many connections")
                try:
                    conn.shutdown(socket.SHUT_WR)
                    conn.setblocking(False)
                    conn.recv(HEAD_MAX)           # what already came: closing on unread data would reset the reply
                except OSError:
                    pass
                conn.close()
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _track(self, s: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(s)

    def _handle(self, conn: socket.socket) -> None:
        self._track(conn, True)
        up = None
        try:
            conn.settimeout(IO_TIMEOUT)
            head = _read_head(conn)
            if head is None:
                return _reply(conn, 400, "Bad Request", "agent egress proxy: no request head")
            line, _, rest = head.partition(b"\r\n")
            parts = line.decode("latin-1").split()
            tgt = _target(parts[0].upper(), parts[1]) if len(parts) == 3 else None
            if tgt is None:
                return _reply(conn, 400, "Bad Request",
                              "agent egress proxy: expected CONNECT host:port or an absolute http:// URL")
            host, port, path = tgt
            why, addrs = self.allow.check(host, port)
            if why is not None:
                with self._lock:
                    self.refused.append(f"{host}:{port}")
                return _reply(conn, 403, "Forbidden", f"agent egress proxy: refused: {why} (add it to "
                              "vendors.NAME.hosts or sandbox.allow_hosts in config.yaml)")
            up = self._connect(addrs)
            if up is None:
                return _reply(conn, 502, "Bad Gateway", f"agent egress proxy: cannot connect to {host}:{port}")
            self._track(up, True)
            body = rest.partition(b"\r\n\r\n")
            if parts[0].upper() == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if body[2]:
                    up.sendall(body[2])
            else:
                headers = [h for h in body[0].split(b"\r\n") if h and not h.lower().startswith(
                    (b"proxy-", b"connection:", b"keep-alive:"))]
                up.sendall(b"\r\n".join([f"{parts[0]} {path} {parts[2]}".encode("latin-1"), *headers,
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
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(2)
        try:
            self.path.unlink()
        except OSError:
            pass


# --------------------------------------------------------------------------- what the sandbox gets


def socat_path() -> str | None:
    from agent.infra.proc import system_binary

    return system_binary("socat")


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


@dataclass
class Net:
    """What ``sandbox.wrap`` adds for the network: ``--unshare-net``, the hidden socket dirs and, in proxy mode,
    the proxy's socket and the bridge in front of the lane's argv."""
    mode: str
    hide: list[Path] = field(default_factory=list)
    blank: list[Path] = field(default_factory=list)        # host socket files: /dev/null bound over each
    socket: Path | None = None
    socat: str | None = None
    proxy: EgressProxy | None = None
    forwards: list[tuple[str, int]] = field(default_factory=list)    # loopback (host, port) named in config
    _dir: Path | None = None

    def bwrap_args(self) -> list[str]:
        return ["--unshare-net"] if self.mode in ("proxy", "none") else []

    def mounts(self) -> list[tuple[Path, list[str]]]:
        """(destination, bwrap option) pairs, sorted with the plan's mounts by depth: an empty tmpfs over each
        hidden socket dir, then the proxy's socket bound in."""
        out = [(p, ["--tmpfs", str(p)]) for p in self.hide]
        out += [(p, ["--ro-bind", "/dev/null", str(p)]) for p in self.blank]
        if self.socket is not None:
            out.append((Path(SOCKET_IN_LANE), ["--ro-bind", str(self.socket), SOCKET_IN_LANE]))
            out.append((Path(READY_FIFO), ["--ro-bind", str(self.socket.parent / "ready"), READY_FIFO]))
        return out

    def argv(self, argv: list[str]) -> list[str]:
        if self.socket is None:
            return list(argv)
        return ["/bin/sh", "-c", bridge_script(self.socat, self.forwards), "agent-lane", *argv]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        env = dict(env)
        if self.socket is not None:
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
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "Net":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


READY_FIFO = "/run/agent-egress/ready"      # a fifo the agent makes per turn (no mkfifo process in the lane)


def bridge_script(socat: str, forwards: list[tuple[str, int]] = ()) -> str:
    """sh: start socat on the lane's 127.0.0.1:PROXY_PORT (to the bound proxy socket) and, for each loopback
    ``(host, port)`` the config names, on the lane's own 127.0.0.1:port through the proxy to that host's port (a
    CLI that ignores the proxy variables reaches a local model server that way, still only through the
    allowlist); block until each has logged "listening on" to the ready fifo, then exec the lane's argv.  socat
    starts with SIGPIPE ignored, so once the fifo has no reader its later notices just fail (EPIPE); the lane gets
    the default disposition back.  A socat that fails ends its log, so the lane starts anyway and finds no proxy."""
    lines = ["trap '' PIPE",
             f"{socat} -d -d TCP-LISTEN:{PROXY_PORT},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{SOCKET_IN_LANE} "
             f"</dev/null >/dev/null 2>{READY_FIFO} &"]
    ports = [PROXY_PORT]
    for host, port in forwards:
        if port in ports:
            continue
        ports.append(port)
        lines.append(f"{socat} -d -d TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr "
                     f"PROXY:127.0.0.1:{host}:{port},proxyport={PROXY_PORT} </dev/null >/dev/null 2>{READY_FIFO} &")
    return "\n".join(lines + [
        f"exec 3<{READY_FIFO}",
        "n=0",
        f'while [ $n -lt {len(ports)} ] && read -r line <&3; do case "$line" in *" listening on "*) n=$((n+1));; '
        "esac; done",
        "exec 3<&-",
        "trap - PIPE",
        'exec "$@"', ""])


def require(config) -> str | None:
    """socat for ``sandbox.network: proxy`` (None for the other modes); raises EgressUnavailable (one line with
    the fix)."""
    if mode(config) != "proxy":
        return None
    found = socat_path()
    if found is None:
        raise EgressUnavailable(f"sandbox.network: proxy needs socat, which is not installed; {INSTALL_FIX}")
    return found


def lane_network(config, vendor: str | None, *, environ=None) -> Net:
    """Start what one sandboxed lane turn's network needs (close it when the turn ends)."""
    m = mode(config)
    net = _hiding(m, config, environ)
    socat = require(config)
    if socat is None:
        return net
    # a short path (a unix socket's is at most 107 bytes; a long TMPDIR would not do), private to the agent's user
    net._dir = Path(tempfile.mkdtemp(prefix="agent-egress-", dir="/tmp" if os.access("/tmp", os.W_OK) else None))
    net.socket = net._dir / "proxy.sock"
    net.socat = socat
    allow = allowlist(config, vendor)
    net.forwards = [(r.host, r.port) for r in allow.rules       # IPv4 loopback only: socat's PROXY syntax
                    if r.named and r.port and (r.host == "localhost" or r.host.startswith("127.") and _ip(r.host))]
    try:
        os.mkfifo(net._dir / "ready", 0o600)
        net.proxy = EgressProxy(allow, net.socket)
    except OSError:
        net.close()
        raise
    return net


def check_network(config, environ=None) -> Net:
    """A repository check's network: none (its own namespace, no proxy) unless ``sandbox.network: host``."""
    m = "host" if mode(config) == "host" else "none"
    return _hiding(m, config, environ)


def _hiding(m: str, config, environ) -> Net:
    hide = hidden_socket_dirs(config, environ)
    return Net(mode=m, hide=hide, blank=host_sockets(hide))
