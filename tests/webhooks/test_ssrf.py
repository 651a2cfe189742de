"""The SSRF guard: every refused address class, names that resolve to them, and the
allowlist that lets them through."""

from __future__ import annotations

import ipaddress

import pytest

from core.errors import WebhookUrlRefused
from core.ssrf import address_class, check_url

CLASSES = [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.9", "private"), ("192.168.1.1", "private"),
    ("fd12:3456::1", "private"),
    ("169.254.10.20", "link-local"), ("fe80::1", "link-local"),
    ("100.64.0.1", "CGNAT"), ("100.127.255.254", "CGNAT"),
    ("224.0.0.251", "multicast"), ("239.1.1.1", "multicast"), ("ff02::1", "multicast"),
    ("169.254.169.254", "cloud-metadata"), ("fd00:ec2::254", "cloud-metadata"),
    ("100.100.100.200", "cloud-metadata"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.0.0.1", "private"),
    ("64:ff9b::a9fe:a9fe", "cloud-metadata"),  # NAT64 around 169.254.169.254
    ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"),
]


def _literal(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


@pytest.mark.parametrize(("ip", "reason"), CLASSES)
def test_each_address_class_is_refused(ip, reason):
    assert address_class(ipaddress.ip_address(ip)) == reason
    with pytest.raises(WebhookUrlRefused) as err:
        check_url(f"https://{_literal(ip)}:8443/hook", [])
    assert err.value.http_status == 400
    assert f"{reason} addresses are refused" in err.value.message
    assert err.value.code == "webhook_url_" + reason.lower().replace("-", "_")


@pytest.mark.parametrize("ip", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(ip):
    target = check_url(f"https://{_literal(ip)}/hook", [])
    assert target.addresses == (ip,) and target.port == 443


def test_localhost_resolves_to_loopback_and_is_refused():
    with pytest.raises(WebhookUrlRefused, match="'localhost' resolves to .*loopback"):
        check_url("http://localhost:9/hook", [])


def stub(mapping: dict[str, list[str]]):
    return lambda host, _port: mapping[host]


def test_a_name_is_judged_by_every_address_it_resolves_to():
    resolver = stub({"hooks.example": ["93.184.216.34", "10.0.0.7"],
                     "ok.example": ["93.184.216.34"],
                     "meta.example": ["169.254.169.254"]})
    with pytest.raises(WebhookUrlRefused, match="resolves to 10.0.0.7: private"):
        check_url("https://hooks.example/x", [], resolver)
    with pytest.raises(WebhookUrlRefused, match="cloud-metadata"):
        check_url("https://meta.example/x", [], resolver)
    assert check_url("https://ok.example/x", [], resolver).addresses == ("93.184.216.34",)


def test_allowed_networks_let_a_class_through_and_nothing_else():
    resolver = stub({"local.test": ["127.0.0.1"], "lan.test": ["10.2.3.4"]})
    allowed = ["127.0.0.0/8", "10.2.0.0/16"]
    assert check_url("http://local.test:8080/", allowed, resolver).addresses == ("127.0.0.1",)
    assert check_url("http://lan.test/", allowed, resolver).addresses == ("10.2.3.4",)
    assert check_url("http://[::ffff:127.0.0.1]/", allowed).addresses == ("::ffff:7f00:1",)
    with pytest.raises(WebhookUrlRefused, match="private"):
        check_url("http://10.3.0.1/", allowed)
    with pytest.raises(WebhookUrlRefused, match="cloud-metadata"):
        check_url("http://169.254.169.254/", allowed)


@pytest.mark.parametrize(("url", "match"), [
    ("ftp://example.com/x", "http or https"),
    ("file:///etc/passwd", "http or https"),
    ("https://user:pw@example.com/", "credentials"),
    ("https:///nohost", "no host"),
    ("https://example.com:99999/", "not a valid URL"),
    ("https://example.com/" + "a" * 2100, "longer than"),
    ("https://no-such-host.invalid/", "does not resolve"),
])
def test_malformed_urls(url, match):
    with pytest.raises(WebhookUrlRefused, match=match) as err:
        check_url(url, [], param="webhook_url")
    assert err.value.param == "webhook_url"
