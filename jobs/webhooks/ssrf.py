"""Where a webhook may post: never to the service's own neighbourhood unless the operator allows it.

``refusal`` is the whole policy, a pure function of a host name, the address actually connected to, and
TORCHYARD_WEBHOOK_ALLOW_HOSTS. The sender resolves a name once and connects to that very address (``pin``),
so a name that resolves to a public address at the check and to 127.0.0.1 at the connect cannot slip through.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata services that are not link-local (169.254.169.254 and fe80::a9fe:a9fe are, and refused as such).
METADATA = frozenset(ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254", "192.0.0.192"))

# A DNS name as it goes on the wire: dot-separated labels of letters, digits, '-' and '_' (after IDNA encoding).
_HOST_NAME = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(?:\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?$")

_NOT_A_URL = "is not a URL: its host is neither a name nor an address"


class Refused(ValueError):
    """The webhook's URL, or the address its host resolves to, is one the service does not post to."""


@dataclass(frozen=True)
class AllowList:
    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, items: list[str] | str) -> AllowList:
        """Host names and CIDRs (a bare address is its own /32 or /128); ValueError naming a malformed CIDR."""
        parts = [p.strip() for p in (items.split(",") if isinstance(items, str) else items) if p.strip()]
        hosts, networks = set(), []
        for part in parts:
            if any(c.isdigit() for c in part) and ("/" in part or ":" in part or is_address(part)):
                try:
                    networks.append(ipaddress.ip_network(part.strip("[]"), strict=False))
                except ValueError:
                    raise ValueError(f"TORCHYARD_WEBHOOK_ALLOW_HOSTS: {part!r} is neither a host name nor a CIDR") from None
            else:
                hosts.add(part.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _kind(ip: IPAddress) -> str | None:
    """Why the address is not one to post to, or None for a public one."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return _kind(ip.ipv4_mapped)
    checks = (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified), ("metadata", ip in METADATA),
              ("link-local", ip.is_link_local), ("multicast", ip.is_multicast), ("private", ip.is_private),
              ("reserved", ip.is_reserved), ("non-public", not ip.is_global))
    return next((name for name, hit in checks if hit), None)


def refusal(host: str, ip: IPAddress, allow: AllowList) -> str | None:
    """Why posting to ``ip`` (reached as ``host``) is refused, or None when it may go ahead."""
    if host.lower().rstrip(".") in allow.hosts or any(ip in net for net in allow.networks if net.version == ip.version):
        return None
    kind = _kind(ip)
    if kind is None:
        return None
    shown = f"{host} resolves to {ip}" if host.strip("[]") != str(ip) else str(ip)
    return (f"{shown}, a {kind} address; webhooks post to public addresses only "
            "(an operator may allow it in TORCHYARD_WEBHOOK_ALLOW_HOSTS)")


def check_url(url: str, allow: AllowList) -> None:
    """The checks a URL passes when the webhook is created: http(s), a host, and no refused literal address.
    Names are resolved, and checked, at each send instead (their addresses may change)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a bracketed host that is no IPv6 address, an unclosed bracket
        raise Refused(_NOT_A_URL) from None
    if parts.scheme not in ("http", "https"):
        raise Refused("must be an http:// or https:// URL")
    if not parts.hostname:
        raise Refused("has no host")
    if not is_address(parts.hostname) and not _is_host_name(parts.hostname):
        raise Refused(_NOT_A_URL)
    if parts.username or parts.password:
        raise Refused("must not carry a user or password (the signature authenticates the service)")
    try:
        _ = parts.port
    except ValueError:
        raise Refused("has an invalid port") from None
    if is_address(parts.hostname):
        why = refusal(parts.hostname, ipaddress.ip_address(parts.hostname), allow)
        if why:
            raise Refused(why)


def _is_host_name(host: str) -> bool:
    try:
        wire = host.encode("idna").decode("ascii")  # a name in any script, as DNS is asked for it
    except UnicodeError:
        return False
    return len(wire) <= 253 and _HOST_NAME.match(wire) is not None


def pin(host: str, port: int, allow: AllowList) -> IPAddress:
    """Resolve ``host`` once and return the first address to connect to; Refused when that address is refused.
    OSError when the name does not resolve (a connection error: retried)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    ip = ipaddress.ip_address(str(infos[0][4][0]).split("%")[0])
    why = refusal(host, ip, allow)
    if why:
        raise Refused(why)
    return ip
