"""The pure parts of webhooks: which change is which event, the signature, the retry schedule, where a webhook may post."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.store.models import Status
from jobs.webhooks import formats
from jobs.webhooks.events import job_event
from jobs.webhooks.ssrf import AllowList, Refused, check_url, refusal

# Each refused class with an example network; every address in it is refused, whatever its host name.
REFUSED_NETS = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10",
                "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8"]
hosts = st.sampled_from(["hooks.example.com", "localhost", "metadata.google.internal", "x"])


def _in(net: str) -> st.SearchStrategy[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    n = ipaddress.ip_network(net)
    return st.integers(0, n.num_addresses - 1).map(lambda i: n.network_address + i)


refused_ips = st.one_of(*[_in(n) for n in REFUSED_NETS])
public_v4 = st.sampled_from(["93.184.215.14", "8.8.8.8", "1.1.1.1", "151.101.1.69", "140.82.112.3"]).map(ipaddress.ip_address)


def test_each_status_change_is_its_event() -> None:
    assert job_event(Status.RUNNING) == "job.started"
    assert job_event(Status.SUCCEEDED) == "job.succeeded"
    assert job_event(Status.FAILED) == "job.failed"
    assert job_event(Status.CANCELLED) == "job.cancelled"
    assert job_event(Status.QUEUED, preempted=True) == "job.preempted"
    # A retry, a lost worker, a cancel request: no event (the cancelled that follows sends one).
    assert job_event(Status.QUEUED) is None and job_event(Status.CANCELLING) is None


@given(st.sampled_from(list(Status)), st.booleans())
def test_preempted_matters_only_for_a_return_to_the_queue(to: Status, preempted: bool) -> None:
    if to is not Status.QUEUED:
        assert job_event(to, preempted=preempted) == job_event(to)


@given(st.text(min_size=1, max_size=64), st.integers(0, 2**40).map(str), st.binary(max_size=512))
def test_signature_is_the_hmac_of_timestamp_dot_body(secret: str, timestamp: str, body: bytes) -> None:
    sig = formats.signature(secret, timestamp, body)
    expected = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert sig == f"sha256={expected}"
    assert formats.signature(secret + "x", timestamp, body) != sig  # another secret does not verify
    assert formats.signature(secret, timestamp, body + b" ") != sig  # nor a changed body


@given(st.integers(1, 60))
def test_retries_start_at_a_second_and_double_up_to_a_cap(tries: int) -> None:
    assert formats.retry_delay_s(1) == 1.0
    delay, following = formats.retry_delay_s(tries), formats.retry_delay_s(tries + 1)
    assert following == min(formats.RETRY_CAP_S, 2 * delay)
    assert 1.0 <= delay <= formats.RETRY_CAP_S


@given(st.integers(100, 599))
def test_only_server_errors_timeouts_and_throttling_are_retried(status: int) -> None:
    assert formats.retryable(None)
    assert formats.retryable(status) == (status >= 500 or status in (408, 429))


@given(hosts, refused_ips)
def test_loopback_private_link_local_and_reserved_addresses_are_refused(host: str, ip: ipaddress.IPv4Address) -> None:
    assert refusal(host, ip, AllowList()) is not None
    if ip.version == 4:  # the same address wrapped as IPv6 is no way around it
        assert refusal(host, ipaddress.ip_address(f"::ffff:{ip}"), AllowList()) is not None


@given(hosts, public_v4)
def test_public_addresses_may_be_posted_to(host: str, ip: ipaddress.IPv4Address) -> None:
    assert refusal(host, ip, AllowList()) is None


@given(hosts, refused_ips, st.integers(0, 32))
def test_the_operator_allows_a_network_or_a_host_name(host: str, ip: ipaddress.IPv4Address, prefix: int) -> None:
    net = ipaddress.ip_network(f"{ip}/{min(prefix, ip.max_prefixlen)}", strict=False)
    assert refusal(host, ip, AllowList.parse(str(net))) is None
    assert refusal(host, ip, AllowList.parse(f"other.example,{host.upper()}")) is None
    assert refusal(host, ip, AllowList.parse("other.example")) is not None


def test_metadata_addresses_are_named() -> None:
    why = refusal("metadata", ipaddress.ip_address("169.254.169.254"), AllowList())
    assert why is not None and "link-local" in why and "TORCHYARD_WEBHOOK_ALLOW_HOSTS" in why
    assert "metadata" in (refusal("m", ipaddress.ip_address("100.100.100.200"), AllowList()) or "")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/x", "http://10.1.2.3/", "https://169.254.169.254/latest",
                                 "http://[::1]:9/", "http://[::ffff:127.0.0.1]/", "ftp://hooks.example.com/",
                                 "https://user:pw@hooks.example.com/", "http:///nohost",
                                 # not URLs at all: a bracketed host that is no address, one never closed, a host
                                 # with characters no name has
                                 "http://^[^\\x00-\\x1f\\x7f]+$", "http://[::1/", "http://a b.example.com/",
                                 "http://-lead.example.com/", "http://x" + "a" * 64 + ".example.com/"])
def test_refused_urls_at_creation(url: str) -> None:
    with pytest.raises(Refused):
        check_url(url, AllowList())


def test_names_and_allowed_addresses_pass_creation() -> None:
    check_url("https://hooks.slack.com/services/T/B/x", AllowList())
    check_url("http://localhost:8080/", AllowList())  # a name: checked at each send, on the address it resolves to
    check_url("http://127.0.0.1:8080/", AllowList.parse("127.0.0.1"))
    check_url("https://bücher.example/hook", AllowList())  # a name in another script goes out as IDNA
    check_url("https://hooks_internal.example.com./x", AllowList())


def test_a_malformed_allow_list_says_which_entry() -> None:
    with pytest.raises(ValueError, match="10.0.0.0/33"):
        AllowList.parse("hooks.internal,10.0.0.0/33")


def test_slack_is_one_line_with_name_owner_status_error_and_link() -> None:
    payload = {"job": {"id": "j1", "name": "bert", "owner": "alice", "status": "failed",
                       "error": {"type": "oom", "message": "CUDA out of memory"}}}
    text = formats.slack_body("job.failed", payload, "https://ty.example/")["text"]
    assert "\n" not in text
    for part in ("bert", "alice", "failed", "oom", "CUDA out of memory", "https://ty.example/#/jobs/j1"):
        assert part in text
