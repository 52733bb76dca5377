"""Which host a request's ``git_url`` makes this machine connect to, checked before git runs.

A request is not the operator, so its git URL must not aim the host's own network: a host
that is, or resolves to, a loopback, private, link-local or otherwise non-public address is
refused unless ``allow_private_git_hosts=True``. The URL is parsed here, strictly (a host
never starts with ``-`` and is a DNS name or a bracketed IPv6 literal, a user never starts
with ``-``), so no option-looking host reaches git whatever git itself would check. The host
is resolved once, and git is made to connect to exactly the addresses checked (``GitPin``):
curl's resolve list for https, ``ssh -o HostName=`` for ssh, no redirects, no other transport.
So a name that answers differently on the next lookup (DNS rebinding) cannot lead git
elsewhere.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from osmosis_harbor.tasks.refs import fail

__all__ = ["GitPin", "GitRemote", "parse_git_remote", "pin_git_host"]

_USER = r"[A-Za-z0-9._~%!$&'()*+,;=][A-Za-z0-9._~%!$&'()*+,;=:-]*"  # never starts with '-'
_NAME = r"[A-Za-z0-9][A-Za-z0-9.-]*"  # a DNS name or an IPv4 spelling; never starts with '-'
_IPV6 = r"\[[0-9A-Fa-f:.]+\]"
_URL = re.compile(
    rf"^(?P<scheme>https|ssh)://(?:(?P<user>{_USER})@)?(?P<host>{_NAME}|{_IPV6})(?::(?P<port>\d{{1,5}}))?(?:/\S*)?$"
)
_SCP = re.compile(rf"^(?P<user>{_USER})@(?P<host>{_NAME}):[^\s-]\S*$")
_DEFAULT_PORT = {"https": 443, "ssh": 22}
_OPT_IN = "allow_private_git_hosts=True (OSMOSIS_HARBOR_ALLOW_PRIVATE_GIT_HOSTS=1)"


@dataclass(frozen=True)
class GitRemote:
    """The transport (``https`` or ``ssh``; scp-like ``user@host:path`` is ssh), the host as
    written (an IPv6 literal without brackets) and the port git will connect to."""

    transport: str
    host: str
    port: int


def parse_git_remote(url: str) -> GitRemote | None:
    """The remote a git URL names, or None when it is not one we accept (``ext::``, options,
    ``http://``, a host or user starting with ``-``, a bracketed host that is not IPv6...)."""
    if (match := _URL.match(url)) is not None:
        transport, host = match["scheme"], match["host"]
        port = int(match["port"]) if match["port"] else _DEFAULT_PORT[transport]
    elif (match := _SCP.match(url)) is not None:
        transport, host, port = "ssh", match["host"], 22
    else:
        return None
    if host.startswith("["):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
    return GitRemote(transport, host, port) if 0 < port <= 65535 else None


@dataclass(frozen=True)
class GitPin:
    """A checked remote and the addresses git must connect to for it."""

    remote: GitRemote
    addresses: tuple[str, ...]

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` plus what makes git connect only to ``addresses``, by ``remote``'s transport,
        and follow no redirect (its target was never checked)."""
        env = dict(base)
        config = [("http.followRedirects", "false")]
        remote = self.remote
        if remote.transport == "https" and not _is_literal(remote.host):  # a literal needs no lookup
            listed = ",".join(f"[{a}]" if ":" in a else a for a in self.addresses)
            config.append(("http.curloptResolve", f"{remote.host}:{remote.port}:{listed}"))
        else:
            ssh = env.get("GIT_SSH_COMMAND") or "ssh"
            env["GIT_SSH_COMMAND"] = f"{ssh} -o HostName={self.addresses[0]} -o HostKeyAlias={remote.host}"
        first = int(env.get("GIT_CONFIG_COUNT") or 0)  # after the operator's own, which stay
        for index, (key, value) in enumerate(config, first):
            env[f"GIT_CONFIG_KEY_{index}"], env[f"GIT_CONFIG_VALUE_{index}"] = key, value
        env["GIT_CONFIG_COUNT"] = str(first + len(config))
        env["GIT_ALLOW_PROTOCOL"] = remote.transport
        return env


def pin_git_host(remote: GitRemote, key: str, shown: str) -> GitPin:
    """Resolve ``remote``'s host once and refuse it unless every address is public. Blocking:
    call it off the event loop."""
    try:
        found = socket.getaddrinfo(remote.host, remote.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise fail(f"{key}={shown!r}: its host {remote.host!r} does not resolve ({reason})") from None
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in found))
    for address in addresses:
        if (kind := _not_public(address)) is not None:
            said = "is" if _is_literal(remote.host) else f"resolves to {address},"
            article = "an" if kind[0] in "aeiou" else "a"
            raise fail(
                f"{key}={shown!r}: its host {remote.host!r} {said} {article} {kind} address{_carrying(address)}, which "
                f"a request may not make this machine connect to; to fetch from such hosts, set {_OPT_IN}"
            )
    return GitPin(remote, addresses)


def _not_public(address: str) -> str | None:
    """What kind of non-public address ``address`` is (None: a public one). An IPv6 address that
    carries an IPv4 one (``_carried``) is judged as every IPv4 it carries."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _LOCAL_NAT64:
            return "private"  # its translation is the local network's, to any IPv4 it chose
        carried = _carried(ip)
        if carried:
            return next((kind for kind in map(_kind, carried) if kind is not None), None)
    return _kind(ip)


def _carrying(address: str) -> str:
    """`` (carrying 127.0.0.1)`` for an IPv6 address with IPv4 inside, to say why it was judged so."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    carried = _carried(ip) if isinstance(ip, ipaddress.IPv6Address) else ()
    return f" (carrying {', '.join(map(str, carried))})" if carried else ""


def _kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    for kind, flag in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
    ):
        if flag:
            return kind
    return None if ip.is_global and not ip.is_reserved else "reserved"


def _carried(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 one hands traffic to, by the forms that embed one: mapped
    (``::ffff:a.b.c.d``), translated (``::ffff:0:a.b.c.d``), compatible (``::a.b.c.d``, except
    ``::`` and ``::1``, which are IPv6's own), NAT64's well-known prefix (``64:ff9b::/96``), 6to4
    (``2002::/16``) and Teredo (``2001::/32``: its server and its client). Python's flags judge
    most of these as IPv6 (``::7f00:1`` and ``64:ff9b::7f00:1`` are "global"), so they are unpacked
    here; an empty tuple: no IPv4 inside."""
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None or ip in _TRANSLATED or ip in _NAT64:
        return (low,)
    if ip in _COMPATIBLE and int(ip) > 1:
        return (low,)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return ip.teredo
    return ()


_COMPATIBLE = ipaddress.IPv6Network("::/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: local use, never global


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
