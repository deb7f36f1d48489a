"""Who may read the status: the token rule, and without a token the exact-loopback ``Host``
rule that stops DNS rebinding."""
import hmac
import ipaddress
import socket
from typing import Any
from urllib.parse import parse_qs

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def is_loopback(host: str) -> bool:
    """True when ``host`` names only loopback addresses (``127.0.0.0/8``, ``::1``, localhost)."""
    h = host.strip().strip("[]").lower()
    if not h:
        return False  # "" means every interface
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    if h in _LOOPBACK_NAMES:
        return True
    try:
        infos = socket.getaddrinfo(h, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def _is_ip(h: str) -> bool:
    try:
        ipaddress.ip_address(h)
    except ValueError:
        return False
    return True


def _host_of(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8000`` -> ``::1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _is_loopback_host_header(value: str, names: frozenset[str]) -> bool:
    """True when a ``Host`` header addresses this server by a loopback IP literal
    (``127.0.0.0/8``, ``[::1]``) or by one of ``names`` (localhost, the bound name), exactly,
    with an optional numeric port.

    An exact match, not a prefix: ``127.evil.example`` or ``127.0.0.1.evil.example`` are DNS
    names an attacker controls and can point at 127.0.0.1 (DNS rebinding), while an IP literal
    (any of 127.0.0.0/8) names no DNS record at all, so it cannot be an attacker's."""
    h = value.lower()
    if h.startswith("["):  # an IPv6 literal, bracketed as a Host header requires
        end = h.find("]")
        host, rest = (h[1:end], h[end + 1:]) if end > 0 else ("", "")
        if not _port_ok(rest):
            return False
        try:
            return ipaddress.IPv6Address(host).is_loopback
        except ValueError:
            return False
    host, colon, port = h.partition(":")
    if colon and not _port_ok(":" + port):
        return False
    if host in names:
        return True
    try:
        return ipaddress.IPv4Address(host).is_loopback  # strict dotted quad: no "127.1", no "0x7f.1"
    except ValueError:
        return False


def _port_ok(rest: str) -> bool:
    """``rest`` is empty or ``:`` and a port number."""
    return rest == "" or (rest[:1] == ":" and rest[1:].isascii() and rest[1:].isdigit() and len(rest) <= 6
                          and int(rest[1:]) <= 65535)


def _host_refusal(hosts: list[str]) -> str:
    what = (f"host {hosts[0]!r} is" if len(hosts) == 1 else
            "a request without a Host header is" if not hosts else "several Host headers are")
    return (f"{what} not allowed: without a token this server answers only requests addressed to a loopback "
            f"name or address (localhost, 127.0.0.1, [::1]); open http://127.0.0.1:PORT/, or serve with a token")


class _Guard:
    """ASGI middleware: the token rule, and the loopback ``Host`` rule when there is no token."""

    def __init__(self, app: Any, token: str | None, bound_host: str):
        self.app, self.token = app, token
        bound = _host_of(bound_host)
        # The bound host counts when it is a name (an operator who binds "myhost" opens
        # http://myhost:PORT/); an address is covered by the literal rule already.
        self.names = frozenset({"localhost"} | ({bound} if bound and not _is_ip(bound) else set()))

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        raw = scope.get("headers", [])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        if self.token is None:
            hosts = [v.decode("latin-1") for k, v in raw if k.lower() == b"host"]
            if len(hosts) != 1 or not _is_loopback_host_header(hosts[0], self.names):
                resp = JSONResponse({"detail": _host_refusal(hosts)}, status_code=400)
                await resp(scope, receive, send)
                return
        elif not self._authorised(headers, scope.get("query_string", b"")):
            resp = JSONResponse({"detail": "missing or wrong token: send 'Authorization: Bearer TOKEN' or ?token=TOKEN"},
                                status_code=401, headers={"WWW-Authenticate": 'Bearer realm="auturi"'})
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorised(self, headers: dict[str, str], query: bytes) -> bool:
        assert self.token is not None
        want = self.token.encode()
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and hmac.compare_digest(auth[7:].strip().encode("latin-1"), want):
            return True
        try:
            given = parse_qs(query.decode("latin-1"), keep_blank_values=True).get("token", [])
        except ValueError:
            return False
        return any(hmac.compare_digest(g.encode("utf-8", "surrogateescape"), want) for g in given)
