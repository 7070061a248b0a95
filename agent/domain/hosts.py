"""An egress allowlist entry, parsed: config validates ``sandbox.allow_hosts`` and ``vendors.X.hosts`` with it, the
egress proxy (``agent.lanes.egress``) matches connections against it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostRule:
    """One allowlist entry: ``HOST`` (ports 443 and 80), ``HOST:PORT``, ``*.DOMAIN`` (any name under it),
    ``[V6]:PORT``.  ``named``: from config (not a built-in host), so a private address is the operator's choice."""
    host: str
    port: int | None = None
    named: bool = True

    @classmethod
    def parse(cls, text: str, named: bool = True) -> "HostRule":
        t = text.strip().lower()
        if not t or "/" in t or "@" in t or " " in t:
            raise ValueError("a host name or address, with an optional :PORT, no scheme or path")
        port = None
        if t.startswith("["):
            host, _, rest = t[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise ValueError("[IPV6]:PORT")
                port = rest[1:]
        elif t.count(":") == 1:
            host, port = t.split(":")
        else:
            host = t
        if port is not None:
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("the port must be a number 1-65535")
            port = int(port)
        if host.startswith("*."):
            if not host[2:] or "*" in host[2:]:
                raise ValueError("a wildcard is *.DOMAIN")
        elif "*" in host or not host:
            raise ValueError("a wildcard is *.DOMAIN")
        return cls(host=host.rstrip("."), port=port, named=named)

    def matches(self, host: str, port: int) -> bool:
        if self.port is None and port not in (443, 80):
            return False
        if self.port is not None and port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host
