"""Issue 23 case 3: a lane's network.  A prompt-injected lane (a real Python command vendor in real bubblewrap)
tries what it reached on the old main: the PostgreSQL ledger through its unix socket, the operator's ssh-agent,
`agent serve`'s status page and any other loopback, LAN or abstract-socket service; and the egress proxy it is
given lets through only the hosts on its allowlist.  The same script run without the sandbox (``sandbox: none``)
is the control: every attempt works there, so a refusal under the sandbox is the sandbox's doing.
(The real codex and claude CLIs through the proxy: tests/test_vendor_clis.py.)
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from agent.infra.proc import go_now
from agent.lanes import egress
from agent.lanes.lane import LaneRequest, run_lane
from agent.lanes.sandbox import bwrap_path
from agent.ledger import eventlog
from conftest import git
from lane_helpers import make_config

needs_sandbox = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed; scripts/ci-bwrap "
                                   "installs it (apt-get install bubblewrap as root)")

# Every way out the old main left open; each attempt prints "NAME: done ..." or "NAME: <error>".
EVIL_NET = r'''
import json, os, socket, sys, urllib.request
targets = json.loads(sys.argv[1])
out = {}
def attempt(name, fn):
    try:
        out[name] = "done " + str(fn())[:80]
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"[:200]
def pg(sockdir):
    import psycopg
    with psycopg.connect(host=sockdir, port=targets["pg_port"], dbname="postgres", user="postgres",
                         connect_timeout=3, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS pwned_by_lane (x int)")
        return "wrote the ledger"
for i, d in enumerate(targets["pg_dirs"]):
    attempt(f"pg{i}", lambda d=d: pg(d))
def ssh():
    s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect(targets["ssh"])
    s.sendall(b"\0\0\0\1\x0b")                       # SSH2_AGENTC_REQUEST_IDENTITIES
    reply = s.recv(4096)
    assert reply[4] == 12, reply[:8]                 # SSH2_AGENT_IDENTITIES_ANSWER
    return f"{int.from_bytes(reply[5:9], 'big')} identities"
attempt("ssh", ssh)
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
proxied = urllib.request.build_opener()             # HTTP(S)_PROXY from the environment, if any
attempt("serve", lambda: direct.open(targets["serve"] + "/", timeout=3).read()[:40])
attempt("serve_via_proxy", lambda: proxied.open(targets["serve"] + "/", timeout=3).read()[:40])
def tcp(host, port):
    s = socket.create_connection((host, port), timeout=3); s.close(); return "connected"
attempt("loopback", lambda: tcp("127.0.0.1", targets["tcp_port"]))
if targets.get("lan"):
    attempt("lan", lambda: tcp(targets["lan"], targets["tcp_port"]))
def abstract():
    s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect("\0" + targets["abstract"]); return "connected"
attempt("abstract", abstract)
def unix(path):
    s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect(path); return "connected"
for i, path in enumerate(targets["stray"]):
    attempt(f"stray{i}", lambda path=path: unix(path))
def connect_via_proxy(host_port):
    p = os.environ.get("HTTPS_PROXY", "")
    if not p:
        raise RuntimeError("no proxy given")
    host, port = p.rsplit("/", 1)[-1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=3)
    s.sendall(f"CONNECT {host_port} HTTP/1.1\r\nHost: {host_port}\r\n\r\n".encode())
    line = s.recv(4096).split(b"\r\n")[0].decode()
    if " 200 " not in line + " ":
        raise PermissionError(line)
    return line
attempt("connect_loopback", lambda: connect_via_proxy(f"127.0.0.1:{targets['tcp_port']}"))
attempt("connect_elsewhere", lambda: connect_via_proxy("example.com:443"))
attempt("allowed", lambda: proxied.open(targets["allowed"] + "/", timeout=5).read().decode())
attempt("ls_run", lambda: sorted(os.listdir("/run")))
with open(os.path.join(os.getcwd(), "net-results.json"), "w") as fh:
    json.dump(out, fh)
print("STATUS: complete\nSUMMARY: tried the network\n")
'''


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"allowed-model-server"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _lan_ip() -> str | None:
    """This machine's own non-loopback address (no packet is sent), or None without one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
        return None if ip.startswith("127.") else ip
    except OSError:
        return None


def _run_dir() -> Path | None:
    """A new directory under /run (root) or /run/user/UID (where Debian's PostgreSQL and ssh-agent put sockets)."""
    for base in ("/run", f"/run/user/{os.getuid()}"):
        if os.access(base, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="agent-test-", dir=base))
    return None


@pytest.fixture
def world(tmp_path, monkeypatch, home, ledger):
    """Real services on this host for a lane to attack: a PostgreSQL cluster whose sockets sit in /run and in a
    /var/tmp dir named by the ledger URL, an ssh-agent holding a key (socket in /var/tmp, $SSH_AUTH_SOCK), `agent
    serve` on 127.0.0.1, a TCP listener on every address, an abstract unix socket, and an HTTP server on loopback
    that the lane's vendor config names (the one allowed host)."""
    from pgserver import PgServer, Unavailable
    from agent.app.serve import HookApp, Server
    from agent.config import parse_config

    stops = []
    made = [d for d in (_run_dir(), Path(tempfile.mkdtemp(prefix="agent-test-pg-", dir="/var/tmp"))) if d]
    stops.append(lambda: [shutil.rmtree(d, ignore_errors=True) for d in made])
    for d in made:
        d.chmod(0o755)                        # as Debian's /run/postgresql: any local user may reach the socket
    try:
        pg = PgServer.start(socket_dirs=tuple(made))
    except Unavailable as exc:
        for s in stops:
            s()
        pytest.skip(str(exc))
    stops.append(pg.stop)

    ssh_dir = Path(tempfile.mkdtemp(prefix="agent-test-ssh-", dir="/var/tmp"))
    stops.append(lambda: shutil.rmtree(ssh_dir, ignore_errors=True))
    sock = ssh_dir / "agent.sock"
    agent_proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    stops.append(lambda: (agent_proc.kill(), agent_proc.wait()))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    for _ in range(100):
        if sock.exists():
            break
        threading.Event().wait(0.02)
    subprocess.run(["ssh-add", "-q", str(tmp_path / "key")], env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                   check=True, capture_output=True)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))

    serve = Server(HookApp(home, parse_config({}), {}), "127.0.0.1", 0).start()
    stops.append(serve.close)

    tcp = socket.socket()
    tcp.bind(("0.0.0.0", 0))
    tcp.listen(16)
    stops.append(tcp.close)
    abstract_name = f"agent-test-{os.getpid()}-{id(tcp)}"
    ab = socket.socket(socket.AF_UNIX)
    ab.bind("\0" + abstract_name)
    ab.listen(16)
    stops.append(ab.close)

    allowed = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=allowed.serve_forever, daemon=True).start()
    stops.append(lambda: (allowed.shutdown(), allowed.server_close()))

    # sockets services leave outside /run: one directly in /var/tmp, one in a /var/lib service dir (MySQL's place)
    lib = Path(tempfile.mkdtemp(prefix="agent-test-", dir="/var/lib" if os.access("/var/lib", os.W_OK) else "/var/tmp"))
    lib.chmod(0o755)
    stops.append(lambda: shutil.rmtree(lib, ignore_errors=True))
    stray = [Path(f"/var/tmp/agent-test-{os.getpid()}-{id(lib)}.sock"), lib / "mysqld.sock"]
    for path in stray:
        u = socket.socket(socket.AF_UNIX)
        u.bind(str(path))
        os.chmod(path, 0o777)
        u.listen(16)
        stops.append(lambda u=u, path=path: (u.close(), path.unlink(missing_ok=True)))

    targets = {"pg_dirs": [str(d) for d in made], "pg_port": pg.port, "ssh": str(sock), "serve": serve.url,
               "tcp_port": tcp.getsockname()[1], "lan": _lan_ip(), "abstract": abstract_name,
               "allowed": f"http://127.0.0.1:{allowed.server_address[1]}", "stray": [str(p) for p in stray]}
    try:
        yield targets, pg
    finally:
        for s in reversed(stops):
            s()


def _repo(tmp_path: Path, name: str = "repo") -> Path:
    repo = tmp_path / name
    repo.mkdir()
    (repo / "app.py").write_text("x = 1\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "init")
    return repo


def _attack(tmp_path, home, ledger, targets, sandbox) -> dict:
    script = tmp_path / "evil_net.py"
    script.write_text(EVIL_NET)
    allowed = targets["allowed"].split("//", 1)[1]
    ledger_url = f"postgresql://postgres@/postgres?host={targets['pg_dirs'][-1]}"
    config = make_config({"evil": {"command": [sys.executable, str(script), json.dumps(targets)],
                                   "hosts": [allowed]}},
                         {"implementer": {"vendor": "evil"}}, sandbox=sandbox, ledger={"url": ledger_url})
    spec = tmp_path / "spec.md"
    spec.write_text("do it\n")
    repo = _repo(tmp_path, f"repo-{sandbox}")
    res = run_lane(LaneRequest(config=config, home=home, role="implementer", spec_path=spec, cwd=repo, ledger=ledger))
    assert res.status == "complete", (res.status, res.reason, res.excerpt)
    out = json.loads((repo / "net-results.json").read_text())
    out["_refused"] = [e["payload"] for e in eventlog.events(ledger)
                       if e["kind"] == "lane.egress_refused" and e["payload"]["run_id"] == res.run_id]
    return out


def _pwned(pg) -> bool:
    import psycopg

    with psycopg.connect(pg.url(), autocommit=True) as c:
        return c.execute("SELECT to_regclass('pwned_by_lane') IS NOT NULL").fetchone()[0]


@needs_sandbox
def test_a_lane_reaches_no_host_socket_loopback_or_lan_service(world, tmp_path, home, ledger):
    """Issue 23 case 3, each attack as the old main allowed it: the control run (no sandbox) reaches the PostgreSQL
    ledger through its sockets (in /run and in the dir the ledger URL names) and writes a table, lists the
    ssh-agent's key, connects to sockets other services left in /var/tmp and /var/lib, reads `agent serve`'s page,
    connects to loopback, LAN and abstract-socket services.  In the sandbox (default `sandbox.network: proxy`)
    every one fails, the proxy refuses CONNECT to loopback and to an unlisted host (and the runner records what it
    refused), and the one host the vendor's config names is reached through the proxy."""
    targets, pg = world
    control = _attack(tmp_path, home, ledger, targets, "none")
    pgs = [f"pg{i}" for i in range(len(targets["pg_dirs"]))]    # /run/... when this user may write there, /var/tmp
    strays = [f"stray{i}" for i in range(len(targets["stray"]))]
    for name in pgs + strays + ["ssh", "serve", "loopback", "abstract"] + (["lan"] if targets["lan"] else []):
        assert control[name].startswith("done"), (name, control)
    assert _pwned(pg), control
    with psycopg_admin(pg) as c:
        c.execute("DROP TABLE pwned_by_lane")

    got = _attack(tmp_path, home, ledger, targets, "bwrap")
    for name in pgs + strays + ["ssh", "serve", "serve_via_proxy", "loopback", "abstract", "connect_loopback",
                       "connect_elsewhere"] + (["lan"] if targets["lan"] else []):
        assert not got[name].startswith("done"), (name, got)
    assert not _pwned(pg), got
    assert "403" in got["serve_via_proxy"] and "403" in got["connect_loopback"], got
    assert "403" in got["connect_elsewhere"], got
    assert got["allowed"] == "done allowed-model-server", got
    assert got["ls_run"] == "done []", got           # /run is an empty tmpfs (no proxy socket in it either)
    refused = {h for ev in got["_refused"] for h in ev["hosts"]}
    assert {"example.com:443", f"127.0.0.1:{targets['tcp_port']}"} <= refused, got["_refused"]


class psycopg_admin:
    def __init__(self, pg):
        import psycopg

        self.conn = psycopg.connect(pg.url(), autocommit=True)

    def __enter__(self):
        return self.conn

    def __exit__(self, *exc):
        self.conn.close()


@needs_sandbox
@pytest.mark.parametrize("network,reached", [("none", False), ("host", True)])
def test_network_none_has_no_way_out_and_host_is_the_hosts(network, reached, tmp_path, home):
    """`sandbox.network: none`: not even the allowed host (no proxy, no route).  `host` (explicit only): the
    host's loopback is there, as before this issue (doctor warns about it: test_doctor_warns_on_host_network)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        probe = (f"import urllib.request as u\ntry:\n    print('GOT', u.build_opener(u.ProxyHandler({{}}))"
                 f".open('{url}/', timeout=3).read().decode())\nexcept Exception as e:\n    print('ERR', e)\n"
                 "print('STATUS: complete\\nSUMMARY: probed\\n')\n")
        script = tmp_path / "probe.py"
        script.write_text(probe)
        config = make_config({"p": {"command": [sys.executable, str(script)], "hosts": [url.split("//")[1]]}},
                             {"implementer": {"vendor": "p"}}, sandbox={"network": network})
        spec = tmp_path / "spec.md"
        spec.write_text("x\n")
        res = run_lane(LaneRequest(config=config, home=home, role="implementer", spec_path=spec, cwd=_repo(tmp_path)))
        stdout = (res.log_dir / "01-turn.stdout").read_text()
        assert ("GOT allowed-model-server" in stdout) is reached, stdout
    finally:
        srv.shutdown()
        srv.server_close()


def test_allowlist_rules():
    """What the proxy lets through: a built-in host on 443/80 only, an explicit HOST:PORT exactly, *.DOMAIN for
    names under it; a built-in name that resolves to a loopback address is refused (a poisoned resolver cannot
    make it a way to the host), while an address the config names is the operator's word."""
    from agent.config import ConfigError, parse_config

    allow = egress.Allowlist([egress.HostRule.parse("localhost", named=False),
                              egress.HostRule.parse("127.0.0.1:8080"), egress.HostRule.parse("*.corp.example")])
    why, _ = allow.check("localhost", 443)
    assert why and "non-public" in why
    assert allow.check("127.0.0.1", 8080)[0] is None
    assert "not on this lane's allowlist" in allow.check("127.0.0.1", 8081)[0]
    assert "not on this lane's allowlist" in allow.check("127.0.0.1", 443)[0]
    assert egress.HostRule.parse("*.corp.example").matches("llm.corp.example", 443)
    assert not egress.HostRule.parse("*.corp.example").matches("corp.example.evil", 443)
    assert not egress.HostRule.parse("api.openai.com").matches("api.openai.com", 22)
    rules = egress.allowlist(parse_config({"vendors": {"codex": {"hosts": ["llm.example:8443"]}},
                                           "sandbox": {"allow_hosts": ["pypi.org"]}}), "codex").rules
    assert [r.host for r in rules] == ["api.openai.com", "chatgpt.com", "auth.openai.com", "llm.example", "pypi.org"]
    for bad in ({"sandbox": {"network": "open"}}, {"sandbox": {"allow_hosts": ["https://x.example/"]}},
                {"vendors": {"codex": {"hosts": ["x.example:99999"]}}}):
        with pytest.raises(ConfigError) as err:
            parse_config(bad)
        assert "sandbox" in str(err.value) or "hosts" in str(err.value)
    assert parse_config({"sandbox": "none"}).sandbox == "none"                     # the old form still works
    assert parse_config({"sandbox": {"mode": "none", "network": "host"}}).sandbox_network == "host"


@needs_sandbox
def test_a_repository_check_has_no_network_and_no_host_sockets(tmp_path, home):
    """The check runs test code a lane committed: it gets its own network namespace with no proxy (it needs no model)
    and no /run, so a planted test cannot read `agent serve`, a loopback database or the ssh-agent either."""
    from agent.config import parse_config
    from agent.lanes.sandbox import check_argv

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        repo = _repo(tmp_path)
        probe = (f"{sys.executable} -c \"import urllib.request as u, os; print(sorted(os.listdir('/run'))); "
                 f"print(u.build_opener(u.ProxyHandler({{}})).open('http://127.0.0.1:{srv.server_address[1]}/', "
                 "timeout=3).read())\"")
        for network, reached in (("proxy", False), ("host", True)):
            argv, env = check_argv(parse_config({"sandbox": {"network": network}}), home, repo, probe,
                                   tmp_path / f"scratch-{network}")
            with go_now(argv) as (argv, fds, setup):
                r = subprocess.run(argv, env=env, cwd=repo, pass_fds=fds, preexec_fn=setup,
                                   capture_output=True, text=True, timeout=60)
            assert ("allowed-model-server" in r.stdout) is reached, (network, r.stdout, r.stderr[-500:])
            assert r.stdout.startswith("[]"), r.stdout              # /run is empty in every mode
    finally:
        srv.shutdown()
        srv.server_close()


def _ask(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def _listening(port: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    return s


def _hand_over(proxy, socks: list[socket.socket], ports: list[int]) -> None:
    """What the lane's set-up does (egress.lane_setup): one message on the pair, then its copies go."""
    with socket.socket(fileno=os.dup(proxy.lane_fd())) as chan:
        socket.send_fds(chan, [",".join(map(str, ports)).encode()], [s.fileno() for s in socks])
    for s in socks:
        s.close()


def _served(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
            return s.recv(100).startswith(b"HTTP/1.1 403")
    except OSError:
        return False


def test_the_proxy_itself(tmp_path):
    """The egress proxy on the listening socket the lane's set-up hands it (played here on the host's loopback):
    plain HTTP to an allowed host is forwarded in origin form without the Proxy-* headers; CONNECT to an allowed
    host is a tunnel; an unlisted host, or the allowed host on another port, is 403 and recorded; a request that is
    not a proxy request is 400; more connections at once than MAX_CONNECTIONS get 503 (the agent's threads stay
    bounded)."""
    seen = []

    class Echo(_Hello):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Proxy-Authorization")))
            super().do_GET()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    lst = _listening()
    pport = lst.getsockname()[1]
    proxy = egress.EgressProxy(egress.Allowlist([egress.HostRule.parse(f"127.0.0.1:{port}")]), port=pport)
    _hand_over(proxy, [lst], [pport])
    held = []
    try:
        got = _ask(pport, f"GET http://127.0.0.1:{port}/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                   "Proxy-Authorization: Basic eDp5\r\n\r\n".encode())
        assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"allowed-model-server"), got
        assert seen == [("/x?y=1", None)]
        with socket.create_connection(("127.0.0.1", pport), timeout=10) as s:
            s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 200 Connection established")
            s.sendall(b"GET /tunnel HTTP/1.0\r\n\r\n")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            assert reply.endswith(b"allowed-model-server"), reply
        assert seen[-1][0] == "/tunnel"
        for raw in (b"CONNECT example.com:443 HTTP/1.1\r\n\r\n", f"CONNECT 127.0.0.1:{port + 1} HTTP/1.1\r\n\r\n"
                    .encode(), b"GET http://10.0.0.1/ HTTP/1.1\r\n\r\n"):
            assert _ask(pport, raw).startswith(b"HTTP/1.1 403"), raw
        assert proxy.refused == ["example.com:443", f"127.0.0.1:{port + 1}", "10.0.0.1:80"]
        assert _ask(pport, b"GET /relative HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400")
        for _ in range(egress.MAX_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", pport), timeout=10))
        assert _ask(pport, b"").startswith(b"HTTP/1.1 503")
    finally:
        for s in held:
            s.close()
        proxy.close()
        srv.shutdown()
        srv.server_close()
    assert not _served(pport)                      # closed with the turn


def test_the_proxy_serves_only_what_it_asked_for(tmp_path):
    """Whatever comes over the pair is checked before anything is accepted on it: the ports it asked for, in
    order, each a listening TCP socket on 127.0.0.1 at that port. Anything else is closed unserved, and only the
    first message counts."""
    allow = egress.Allowlist([])
    cases = []
    a = _listening()
    cases.append(("another port than asked", [a], [a.getsockname()[1]], a.getsockname()[1] + 1))
    b = _listening()
    cases.append(("a socket missing", [b], [b.getsockname()[1], b.getsockname()[1] + 1], b.getsockname()[1]))
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.bind(("127.0.0.1", 0))                         # bound, not listening
    cases.append(("not listening", [c], [c.getsockname()[1]], c.getsockname()[1]))
    for why, socks, ports, asked in cases:
        proxy = egress.EgressProxy(allow, port=asked)
        real = socks[0].getsockname()[1]
        keep = socket.socket(fileno=os.dup(socks[0].fileno()))
        _hand_over(proxy, socks, ports)
        try:
            time.sleep(0.2)
            assert not proxy._listeners, why
            keep.close()                              # the test's last copy: now nobody holds it
            assert not _served(real), why
        finally:
            proxy.close()
    good = _listening()
    port = good.getsockname()[1]
    proxy = egress.EgressProxy(allow, port=port)
    _hand_over(proxy, [good], [port])
    try:
        assert _served(port)
        late = _listening()                          # a second message on the pair is never read
        with socket.socket(fileno=os.dup(proxy.lane_fd())) as chan:
            socket.send_fds(chan, [str(late.getsockname()[1]).encode()], [late.fileno()])
        time.sleep(0.2)
        assert len(proxy._listeners) == 1
        late.close()
    finally:
        proxy.close()


def test_the_socket_dirs_a_lane_never_sees(tmp_path):
    """/run (and /var/run, which leads there), the ssh-agent's dir, the socket dir of a PostgreSQL ledger however
    its URL names it (?host=, a %2F host, PGHOST); never a system dir itself (a socket directly in /tmp is behind
    the lane's private /tmp already), and a dir inside another hidden one only once."""
    from agent.config import parse_config

    dirs = {k: tmp_path / k for k in ("ssh", "pg-query", "pg-host", "pg-env")}
    for d in dirs.values():
        d.mkdir()
    environ = {"SSH_AUTH_SOCK": str(dirs["ssh"] / "agent.1"), "PGHOST": str(dirs["pg-env"]),
               "AGENT_LEDGER_URL": "postgresql://u@" + str(dirs["pg-host"]).replace("/", "%2F") + "/agent"}
    config = parse_config({"ledger": {"url": f"postgresql://u@/agent?host={dirs['pg-query']}"}})
    got = egress.hidden_socket_dirs(config, environ)
    assert Path("/run").resolve() in got and Path("/var/run") not in got
    assert set(dirs.values()) <= set(got), got
    assert egress.hidden_socket_dirs(parse_config({}), {"SSH_AUTH_SOCK": "/tmp/agent.1", "PGHOST": "/var"}) == \
        [Path("/run").resolve()]


@needs_sandbox
def test_the_proxy_port_keeps_serving_and_the_lane_keeps_its_sigpipe(tmp_path):
    """The lane's proxy port in a real sandbox: 150 connections through it all get their answer, and the lane runs
    with SIGPIPE at its default (the agent is Python, which ignores it)."""
    from agent.config import Config, VendorConfig
    from agent.lanes.sandbox import lane_plan, require, wrap

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    probe = (
        "import os, socket\n"
        "ok = 0\n"
        "for _ in range(150):\n"
        f"    s = socket.create_connection(('127.0.0.1', {egress.PROXY_PORT}), timeout=10)\n"
        f"    s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n')\n"
        "    ok += s.recv(100).startswith(b'HTTP/1.1 200')\n"
        "    s.close()\n"
        "print('ok', ok)\n"
        "print([l for l in open('/proc/self/status') if l.startswith('SigIgn')][0].split()[1])\n")
    (tmp_path / "wt").mkdir()
    config = Config(vendors={"x": VendorConfig(name="x", hosts=(f"127.0.0.1:{port}",))})
    plan = lane_plan(cwd=tmp_path / "wt", writable=True, agent_home=tmp_path / "home", run_dir=tmp_path / "wt",
                     spec_paths=[], state_paths=[], extra_writable=[])
    try:
        with egress.lane_network(config, "x") as net:
            argv, env = wrap(require(config), ["/bin/sh", "-c", f"grep SigIgn /proc/self/status; "
                                               f"exec {sys.executable} -c \"$0\"", probe], plan,
                             {"PATH": "/usr/bin:/bin"}, net)
            with go_now(argv) as (argv, fds, setup):
                r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, pass_fds=fds,
                                   preexec_fn=setup)
    finally:
        srv.shutdown()
        srv.server_close()
    assert "ok 150" in r.stdout, (r.stdout, r.stderr[-500:])
    # the lane's shell: SIGPIPE (signal 13, bit 12) not ignored.  Only that bit: what the harness itself ignores
    # (SIGHUP under nohup) is inherited as it would be by any child, and is not the agent's doing
    shell = next(line for line in r.stdout.splitlines() if line.startswith("SigIgn:"))
    assert not int(shell.split()[1], 16) & (1 << (signal.SIGPIPE - 1)), r.stdout


def test_a_lane_whose_network_namespace_cannot_be_made_never_starts(tmp_path):
    """Fail closed: when the set-up cannot make the lane's namespace, the child ends before its exec (exit 126, one
    line that `sandbox_exec_failure` reports as the lane's `unavailable` cause); it never runs on the host's network.
    The kernel refusing unshare cannot be arranged here without breaking every other sandbox on the machine, so
    that one call is played by a stand-in libc (the rest is real: proc.run, the fork, the child's stderr)."""
    import ctypes

    from agent.infra import proc
    from agent.lanes.sandbox import sandbox_exec_failure

    class NoUnshare:
        def unshare(self, flags):
            ctypes.set_errno(1)          # EPERM, as with user namespaces disabled
            return -1

    proxy = egress.EgressProxy(egress.Allowlist([]))
    mark = tmp_path / "ran"
    try:
        setup = proc.setup_arg("test-no-unshare", egress.lane_setup(proxy, libc=(ctypes, NoUnshare())))
        res = proc.run([setup, "sh", "-c", f"touch {mark}"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                       timeout=30, stdout_path=tmp_path / "o", stderr_path=tmp_path / "e")
    finally:
        proc.drop_setup("test-no-unshare")
        proxy.close()
    assert res.exit_code == 126 and not mark.exists(), res.stderr_text()
    cause = sandbox_exec_failure(res.stderr_text())
    assert cause and "network namespace could not be made" in cause and cause.endswith("the lane does not start")
    # its owner gone, an argv naming the set-up is not started at all
    gone = proc.run([setup, "sh", "-c", f"touch {mark}"], cwd=tmp_path, env=None, timeout=30,
                    stdout_path=tmp_path / "o", stderr_path=tmp_path / "e")
    assert gone.missing and "set-up is gone" in gone.error and not mark.exists()
