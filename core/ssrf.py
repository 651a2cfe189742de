"""SSRF guard for webhook URLs: which addresses the service may send a request to.

A webhook URL is the caller's choice, but the request comes from inside our network, so
an address that reaches our own hosts (loopback, private ranges, link-local, CGNAT,
multicast, the cloud metadata service) is refused unless an allowed network covers it.
The API checks at submit or registration; the delivery task checks again at every
attempt, because a name may resolve elsewhere by then (DNS rebinding), and connects to
the address it checked. ``resolver`` is the one seam: tests pass a stub.

An internationalised host (``bücher.example``) is checked, resolved and sent in its IDNA
form (``xn--bcher-kva.example``, UTS #46 as browsers map it): that is the name DNS, the
Host header and TLS SNI all carry.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import idna

from .errors import WebhookUrlRefused, clip

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

MAX_URL_LENGTH = 2048
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean
    "169.254.170.2",  # AWS ECS task metadata
    "fd00:ec2::254",  # AWS over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "192.0.0.192",  # Oracle Cloud
))
CGNAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")

# In order: the first class that matches names the refusal.
CLASSES: tuple[tuple[str, Callable[[IPAddress], bool]], ...] = (
    ("cloud-metadata", lambda ip: ip in METADATA),
    ("loopback", lambda ip: ip.is_loopback),
    ("link-local", lambda ip: ip.is_link_local),
    ("CGNAT", lambda ip: ip.version == 4 and ip in CGNAT),
    ("multicast", lambda ip: ip.is_multicast),
    ("unspecified", lambda ip: ip.is_unspecified),
    ("reserved", lambda ip: ip.is_reserved),
    ("private", lambda ip: ip.is_private),
    ("non-public", lambda ip: not ip.is_global),
)


@dataclass(frozen=True)
class Target:
    """A checked URL and the addresses its host resolved to (connect to these only).
    ``host`` is ASCII (IDNA for a name); ``explicit_port`` says the URL named its port."""

    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]
    explicit_port: bool = False

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return f"{name}:{self.port}" if self.explicit_port else name


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def _unwrap(ip: IPAddress) -> IPAddress:
    """An IPv6 address that carries an IPv4 one (mapped, NAT64) is judged by the latter."""
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def address_class(ip: IPAddress) -> str | None:
    """The refused class of an address, or None for a public one."""
    inner = _unwrap(ip)
    return next((name for name, test in CLASSES if test(inner)), None)


def _allowed(ip: IPAddress, networks: tuple[Network, ...]) -> bool:
    return any(a in n for a in {ip, _unwrap(ip)} for n in networks if a.version == n.version)


def refusal(address: str, networks: tuple[Network, ...]) -> str | None:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if _allowed(ip, networks):
        return None
    return address_class(ip)


def ascii_host(host: str) -> str:
    """The host as DNS, Host headers and SNI carry it: IDNA for an internationalised name."""
    if host.isascii():
        return host
    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError:
        raise WebhookUrlRefused(f"webhook host '{clip(host)}' is not a valid "
                                "internationalised name") from None


def _split(url: str) -> tuple[str, str, int | None]:
    if len(url) > MAX_URL_LENGTH:
        raise WebhookUrlRefused(f"webhook URL is longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookUrlRefused(f"webhook URL '{clip(url)}' is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookUrlRefused("webhook URL must use http or https")
    if not parts.hostname:
        raise WebhookUrlRefused(f"webhook URL '{clip(url)}' has no host")
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlRefused("webhook URL must not carry credentials")
    return parts.scheme, ascii_host(parts.hostname), port


def _resolve(host: str, port: int, resolver: Resolver) -> tuple[list[str], bool]:
    """The host's addresses, and whether the host was an address itself."""
    try:
        return [str(ipaddress.ip_address(host))], True
    except ValueError:
        pass
    try:
        addresses = resolver(host, port)
    except (OSError, UnicodeError):
        addresses = []
    if not addresses:
        raise WebhookUrlRefused(f"webhook host '{clip(host)}' does not resolve")
    return addresses, False


def check_url(url: str, allowed: Iterable[str] = (), resolver: Resolver = system_resolver,
              *, param: str = "url") -> Target:
    """Resolve the URL's host and refuse it if any address it resolves to is refused.

    Every address must pass, since a client may connect to any of them.
    """
    try:
        return _check(url, parse_networks(allowed), resolver)
    except WebhookUrlRefused as exc:
        exc.param = param
        raise


def _check(url: str, networks: tuple[Network, ...], resolver: Resolver) -> Target:
    scheme, host, explicit = _split(url)
    port = explicit if explicit is not None else (443 if scheme == "https" else 80)
    addresses, literal = _resolve(host, port, resolver)
    for address in addresses:
        reason = refusal(address, networks)
        if reason is not None:
            where = ":" if literal else f" resolves to {address}:"
            raise WebhookUrlRefused(
                f"webhook host '{clip(host)}'{where} {reason} addresses are refused "
                "(see OMNIJOBS_WEBHOOK_ALLOWED_NETWORKS)",
                code=f"webhook_url_{reason.lower().replace('-', '_')}")
    return Target(url=url, scheme=scheme, host=host, port=port, addresses=tuple(addresses),
                  explicit_port=explicit is not None)
